"""A Docker engine that restarts while a case runs is an infrastructure fault (SandboxError:
the job is retried, then `error`), never a case that "ran past its hard deadline".

The machine's own engine is shared (other tests, CI), so it is never restarted here: each test
starts a PRIVATE dockerd beside it (its own data root, exec root, socket and managed
containerd; no bridge, no iptables), imports a tiny image into it (/bin/sleep and its
libraries), runs a case container through DockerSandbox pointed at that daemon, and kills or
stops that daemon mid-run.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tarfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import docker
import pytest

from gate_service.config import Settings
from gate_service.sandbox import RunLimits, RunResult, SandboxError
from gate_service.sandbox.docker import DockerSandbox

pytestmark = pytest.mark.docker

IMAGE = "gate-test:engine-restart"
LIMITS = RunLimits(
    memory_mb=128, cpus=1, pids=64, wall_seconds=60, tmpfs_mb=16, output_limit_bytes=100_000
)


def libraries(binary: str) -> list[str]:
    out = subprocess.run(["ldd", binary], capture_output=True, text=True, check=True).stdout
    return [w for line in out.splitlines() for w in line.split() if w.startswith("/")]


def tiny_image_tar(dest: Path) -> Path:
    """A root filesystem holding only /bin/sleep and the libraries it loads."""
    sleep = shutil.which("sleep")
    assert sleep is not None
    tar_path = dest / "rootfs.tar"
    with tarfile.open(tar_path, "w") as tar:
        tar.add(os.path.realpath(sleep), arcname="bin/sleep")
        for lib in libraries(sleep):
            tar.add(os.path.realpath(lib), arcname=lib.lstrip("/"))
        for empty in ("tmp", "bundle"):
            info = tarfile.TarInfo(empty)
            info.type, info.mode = tarfile.DIRTYPE, 0o1777
            tar.addfile(info)
    return tar_path


class PrivateDaemon:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.sock = root / "docker.sock"
        self.url = f"unix://{self.sock}"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        log = (self.root / "dockerd.log").open("ab")
        # Its own network namespace: a dockerd started with `--bridge none` deletes the
        # interface docker0 it finds, which in the host's namespace is the main engine's
        # bridge (every bridged container after it then fails to start).
        argv = [
            "unshare", "--net", "--",
            "dockerd",
            "--data-root", str(self.root / "data"),
            "--exec-root", str(self.root / "exec"),
            "--pidfile", str(self.root / "dockerd.pid"),
            "-H", self.url,
            "--bridge", "none",
            "--iptables=false",
            "--ip6tables=false",
        ]  # fmt: skip
        self.proc = subprocess.Popen(
            argv,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()
        deadline = time.monotonic() + 60
        while True:
            try:
                client = docker.DockerClient(base_url=self.url, timeout=5)
                client.ping()
                client.close()
                return
            except Exception:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"the private dockerd did not start: {self.log()}") from None
                time.sleep(0.2)

    def kill(self) -> None:
        """SIGKILL the daemon and its containerd (a crash); the containers' shims live on."""
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait()
        # Its containerd dies with it (parent-death signal), but not at once: a daemon started
        # while it lingers would adopt it from its pid file and time out connecting to it.
        deadline = time.monotonic() + 20
        while self.reap_containerd(only="containerd") and time.monotonic() < deadline:
            time.sleep(0.1)
        # Dead, it may stay a zombie nobody reaps (its parent is gone), which the next daemon
        # would take for a live containerd; without the pid file it starts a new one.
        (self.root / "exec" / "containerd" / "containerd.pid").unlink(missing_ok=True)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def log(self) -> str:
        return (self.root / "dockerd.log").read_text(errors="replace")[-3000:]

    def reap_containerd(self, only: str | None = None) -> int:
        """What this daemon started under its exec root (containerd, shims): they outlive a
        SIGKILLed dockerd. ``only``: just the processes of that name. Returns how many."""
        marker = str(self.root / "exec").encode()
        found = 0
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                if only is not None and (entry / "comm").read_text().strip() != only:
                    continue
                stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
                if stat[0] != "Z" and marker in (entry / "cmdline").read_bytes():
                    os.kill(int(entry.name), signal.SIGKILL)
                    found += 1
            except (OSError, ProcessLookupError):
                continue
        return found


def unmount_under(root: Path) -> None:
    """What the daemon mounted under its roots (network namespaces, overlays), deepest first."""
    prefix = str(root) + "/"
    points = [
        line.split()[1]
        for line in Path("/proc/self/mounts").read_text().splitlines()
        if line.split()[1].startswith(prefix)
    ]
    for point in sorted(points, key=len, reverse=True):
        subprocess.run(["umount", "-l", point], capture_output=True, check=False)


@pytest.fixture
def private_daemon(docker_engine: None) -> Iterator[PrivateDaemon]:
    if os.geteuid() != 0 or shutil.which("dockerd") is None:
        pytest.skip("a private dockerd needs root and the dockerd binary")
    # A short path: the daemon's unix sockets must fit in 108 bytes.
    root = Path(f"/tmp/gate-pd-{os.getpid()}-{time.monotonic_ns() % 10**6}")
    root.mkdir()
    daemon = PrivateDaemon(root)
    host_interfaces = {entry.name for entry in Path("/sys/class/net").iterdir()}
    try:
        daemon.start()
        client = docker.DockerClient(base_url=daemon.url, timeout=60)
        repo, tag = IMAGE.split(":")
        client.api.import_image_from_file(str(tiny_image_tar(root)), repository=repo, tag=tag)
        client.close()
        yield daemon
    finally:
        daemon.stop()
        daemon.reap_containerd()
        unmount_under(root)
        shutil.rmtree(root, ignore_errors=True)
    # The private daemon must leave the host's network alone (docker0 above all).
    assert host_interfaces <= {entry.name for entry in Path("/sys/class/net").iterdir()}


def run_in_thread(daemon: PrivateDaemon) -> tuple[threading.Thread, list[object]]:
    client = docker.DockerClient(base_url=daemon.url, timeout=120)
    sandbox = DockerSandbox(Settings(), client=client)
    outcome: list[object] = []

    def target() -> None:
        try:
            outcome.append(
                sandbox.run(IMAGE, ["/bin/sleep", "300"], limits=LIMITS, labels={"t": "restart"})
            )
        except Exception as exc:
            outcome.append(exc)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    # Until the container runs.
    deadline = time.monotonic() + 60
    while not client.containers.list(
        filters={"label": "t=restart", "status": "running"}, ignore_removed=True
    ):
        assert time.monotonic() < deadline, daemon.log()
        time.sleep(0.2)
    return thread, outcome


def assert_infrastructure(outcome: list[object], started: float) -> None:
    assert len(outcome) == 1
    result = outcome[0]
    assert not isinstance(result, RunResult), f"judged as a case outcome: {result}"
    assert isinstance(result, SandboxError), repr(result)
    # Reported when the engine went away, not at the case's wall deadline.
    assert time.monotonic() - started < LIMITS.wall_seconds


def test_an_engine_killed_and_restarted_mid_case_is_a_sandbox_error(
    private_daemon: PrivateDaemon,
) -> None:
    started = time.monotonic()
    thread, outcome = run_in_thread(private_daemon)
    private_daemon.kill()
    private_daemon.start()
    thread.join(timeout=LIMITS.wall_seconds + 30)
    assert not thread.is_alive()
    assert_infrastructure(outcome, started)


def test_an_engine_stopped_mid_case_is_a_sandbox_error(private_daemon: PrivateDaemon) -> None:
    # A clean daemon stop (systemctl restart docker) stops the containers first: wait()
    # may answer with their exit code before the connection goes.
    started = time.monotonic()
    thread, outcome = run_in_thread(private_daemon)
    private_daemon.stop()
    private_daemon.start()
    thread.join(timeout=LIMITS.wall_seconds + 30)
    assert not thread.is_alive()
    assert_infrastructure(outcome, started)
