"""Benchmark: a warm 20-case gate, POST to verdict (run: python -m tests.bench.bench_gate).

Starts `gate serve` (on GATE_TEST_DATABASE_URL, else its embedded Postgres) with its default
settings and warms it with a first gate. Then, for two projects of 20 tool-agent cases, one
whose code does not import `connic` and one whose tool module does, it submits the bundle
once (timing the first gate, which builds its test image) and then times further
submissions from POST to the verdict read by long-polling, as a pipeline sees them.

Two floors, measured in the same run between those gates, say what any one-container-per-
case design must spend here: 20 bare runs of the same test image (`docker run --rm --network
none --entrypoint python3 IMAGE -c pass`) started N at a time (N being the gate's case
concurrency), and 20 containers created as the gate creates its case containers (the same
create parameters, from the worker's own `case_container`, so with the same isolation and
limits) that do nothing but `python -I -c "import connic"` (the format's SDK and pydantic),
also N at a time. The same containers without the case's isolation, as sessions before
2026-12-04 measured this floor, are printed beside it.
The targets: the first kind's gate within 1.25x of the bare floor, the second's within 1.15x
of the import-only floor, and a first gate at most 1 s over a warm one.

For each it also prints the CPU one case took, machine-wide (from /proc/stat: the engine,
the containers, Postgres, the server and this client), and how much of it was `gate serve`'s.

Then the first gate after a start, twice: `gate serve` is stopped and started again on the
same data dir and database (its images and the first kind's test image cached, as when a CI
job restarts the service), /healthz and /readyz are asked every 20 ms from the moment the
process starts, each in a thread of its own, and the first kind's bundle is submitted the
moment /readyz first answers 200 (`gate serve` answers it once a worker can claim a gate).
It prints the verdict's time from /readyz's first 200 and from /healthz's, the gap between
the two, each against the median warm gate of the same bundle (target: from /readyz at most
1 s over it), the next two gates on the restarted server, and when the log says each step
of the start happened.

Last, the cost of gVisor (issue 42): the first kind's bundle again under runsc. It starts the
engine of `.ci/runsc-engine start` (a second dockerd with runsc registered; reused if it is
running, and then left running; stopped at the end if this run started it), a second `gate
serve` on it (DOCKER_HOST, GATE_CASE_RUNTIME=runsc, its own data dir and database), warms
it, times the first gate (which builds the test image on that engine, its build step under
runsc) and REPEATS warm gates, each followed by the bare floor there under runsc (the same
20 `docker run`s, with `--runtime runsc`) and, as a control, under runc; then prints runc's
and runsc's figures side by side and what runsc costs. Only the first kind, for time.
GATE_BENCH_RUNSC=0 skips it; it says why it is skipped when runsc or the script is missing.

GATE_CASE_CONCURRENCY and GATE_LONG_POLL_SETTLE_SECONDS, if set, are passed on, to compare
other values with the default. It prints figures and asserts nothing about timing: they depend on the machine (its CPU
count is the default GATE_CASE_CONCURRENCY) and on what else runs on it.
"""

from __future__ import annotations

import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path
from typing import Any

import docker
import httpx

from gate_service.client.api import GateClient
from gate_service.config import Settings
from gate_service.sandbox import ModelChannel
from gate_service.sandbox.docker.cases import case_container
from gate_service.worker.handler import case_limits
from tests.e2e.conftest import start, stop, wait_ready
from tests.fixtures.auth import ADMIN_TOKEN
from tests.fixtures.db import create_database, drop_database
from tests.fixtures.ports import free_port
from tests.fixtures.projects import bundle_of, tool_cases_project

CASES = 20
REPEATS = 5
BARE_RUN = ["docker", "run", "--rm", "--network", "none", "--entrypoint", "python3"]
RUNNER_PYTHON = "/opt/gate-runner/bin/python"  # the runner's interpreter, with the SDK
FORMAT = "{{.Repository}}:{{.Tag}}"


def server_settings(port: int, database: str | None) -> dict[str, str]:
    """`gate serve`'s defaults on ``port`` (its embedded Postgres unless ``database``)."""
    settings = {"GATE_PORT": str(port)}
    if database:
        settings["GATE_DATABASE_URL"] = database
    for name in ("GATE_CASE_CONCURRENCY", "GATE_LONG_POLL_SETTLE_SECONDS"):
        if name in os.environ:  # to compare with the default
            settings[name] = os.environ[name]
    return settings


def serve(
    data_dir: Path, database: str | None, **extra: str
) -> tuple[subprocess.Popen[bytes], str, Path]:
    """`gate serve` on its defaults (its embedded Postgres unless ``database`` is given), with
    ``extra`` in its environment (the runsc pass: DOCKER_HOST and GATE_CASE_RUNTIME)."""
    port = free_port()
    proc, log_path = start("serve", data_dir, **server_settings(port, database), **extra)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url, proc, log_path)  # a first start may bootstrap the base image
    except BaseException:
        stop(proc)
        raise
    return proc, url, log_path


TICKS = os.sysconf("SC_CLK_TCK")


# The long-lived processes whose CPU is told apart; the rest (the containers, their shims
# and runc, this client) is what the machine spent beyond them.
GROUPS = {"engine": ("dockerd", "containerd"), "postgres": ("postgres",)}


def process_stat(pid: int) -> tuple[str, int, float]:
    """(name, parent pid, CPU seconds so far) of a live process; ("", 0, 0) once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            head, rest = f.read().rsplit(")", 1)
    except OSError:
        return "", 0, 0.0
    fields = rest.split()
    return head.split("(", 1)[1], int(fields[1]), (int(fields[11]) + int(fields[12])) / TICKS


# Where the engine's containers' CPU use adds up, by cgroup layout (cgroupfs driver):
# (path, seconds per unit). A parent cgroup's counter holds its children's use, and keeps
# that of the children already gone (v1's cpuacct charges every ancestor as it runs; v2
# folds a removed child's use into its parent), so reading it before and after a gate
# gives all of its containers' CPU, to the end of each, with nothing polled in between.
# Under the systemd driver the containers' parent (system.slice) holds the engine as well,
# so the figure is NaN there.
CONTAINERS_CGROUP = (
    ("/sys/fs/cgroup/cpuacct/docker/cpuacct.usage", 1e-9),  # v1
    ("/sys/fs/cgroup/docker/cpu.stat", 1e-6),  # v2: usage_usec, its first line
)


def containers_cpu_seconds() -> float:
    """The CPU-seconds the engine's containers have used, gone ones with the rest; NaN where
    their parent cgroup is not found."""
    for path, unit in CONTAINERS_CGROUP:
        try:
            text = Path(path).read_text()
        except OSError:
            continue
        if text.startswith("usage_usec"):
            text = text.split()[1]
        return int(text.split()[0]) * unit
    return float("nan")


def cpu_seconds(server: int) -> dict[str, float]:
    """CPU seconds so far: the whole machine busy ("total"), `gate serve` and the processes it
    started, its embedded workers ("server"), each of GROUPS, summed over its live
    processes, and the engine's containers, gone ones too ("containers")."""
    with open("/proc/stat") as f:
        fields = [int(v) for v in f.readline().split()[1:]]
    found = {"total": (sum(fields) - fields[3] - fields[4]) / TICKS}  # all but idle, iowait
    found["containers"] = containers_cpu_seconds()
    for group in GROUPS:
        found[group] = 0.0
    stats = {int(e): process_stat(int(e)) for e in os.listdir("/proc") if e.isdigit()}
    for name, _, seconds in stats.values():
        for group, names in GROUPS.items():
            if name.startswith(names):
                found[group] += seconds
    # `gate serve` and its children (the embedded workers), but not the embedded Postgres,
    # which GROUPS counts.
    tree, grown = {server}, True
    while grown:
        more = {
            pid
            for pid, (name, parent, _) in stats.items()
            if parent in tree and pid not in tree and not name.startswith(GROUPS["postgres"])
        }
        tree |= more
        grown = bool(more)
    found["server"] = sum(stats[pid][2] for pid in tree if pid in stats)
    return found


class CpuMeter:
    """CPU used between entering and leaving, summed over runs, by each part of cpu_seconds."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.used = dict.fromkeys(("total", "server", "containers", *GROUPS), 0.0)
        self._mark: dict[str, float] = {}

    def __enter__(self) -> CpuMeter:
        self._mark = cpu_seconds(self.pid)
        return self

    def __exit__(self, *_: object) -> None:
        now = cpu_seconds(self.pid)
        for key in self.used:
            self.used[key] += now[key] - self._mark[key]


def judge(client: GateClient, bundle: bytes) -> tuple[float, dict[str, Any]]:
    """Seconds from POST to the verdict, and the finished gate."""
    started = time.monotonic()
    gate = client.submit(bundle)
    done = client.wait(gate["id"], timeout_s=600)
    elapsed = time.monotonic() - started
    if done["status"] != "passed" or done["total_cases"] != CASES:
        raise RuntimeError(f"the gate did not pass all {CASES} cases: {done}")
    return elapsed, done


def docker_env(host: str | None) -> dict[str, str] | None:
    """The environment of a `docker` CLI call on the engine at ``host`` (None: DOCKER_HOST's)."""
    return {**os.environ, "DOCKER_HOST": host} if host else None


def bare_runs(
    image: str, *, at_once: int = 1, host: str | None = None, runtime: str | None = None
) -> float:
    """Seconds for CASES bare `docker run` of ``image``, ``at_once`` at a time, on the engine
    at ``host`` (None: DOCKER_HOST's) under ``runtime`` (None: the engine's default)."""
    argv = [*BARE_RUN, *(["--runtime", runtime] if runtime else []), image, "-c", "pass"]
    env = docker_env(host)

    def one(_: int) -> None:
        subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, env=env)

    started = time.monotonic()
    with ThreadPoolExecutor(at_once) as pool:
        list(pool.map(one, range(CASES)))
    return time.monotonic() - started


def import_only_runs(
    client: docker.DockerClient, image: str, *, at_once: int, isolated: bool, channel: Path
) -> float:
    """Seconds for CASES containers that only import the SDK, ``at_once`` at a time, created
    through the API with no network (NetworkDisabled). ``isolated``: with everything else of
    a case container too, from the worker's own `case_container` on `gate serve`'s default
    settings (capabilities, init, read-only root, /tmp tmpfs, ulimits, memory, pids, CPUs,
    the log cap and the model gateway's read-only bind mount), as the gate makes them; not:
    the plain containers earlier sessions measured."""
    settings = Settings()
    limits = case_limits(settings, 60)

    def one(_: int) -> None:
        argv = ["-I", "-c", "import connic"]
        if isolated:
            host, create = case_container(
                argv,
                limits=limits,
                labels={},
                model_channel=ModelChannel.in_folder(channel) if settings.model_gateway else None,
            )
            # Not labelled as a case: `gate serve`'s reaper would take it for an orphan.
            create["labels"] = {"gate.bench": "import-floor"}
            created = client.api.create_container(
                image,
                host_config=client.api.create_host_config(**host),
                entrypoint=RUNNER_PYTHON,
                **create,
            )
            container = client.containers.prepare_model({"Id": created["Id"]})
        else:
            container = client.containers.create(
                image,
                argv,
                entrypoint=RUNNER_PYTHON,
                network_mode="none",
                network_disabled=True,
            )
        try:
            container.start()
            if container.wait()["StatusCode"] != 0:
                raise RuntimeError(f"`import connic` failed: {container.logs()[-2000:]!r}")
        finally:
            container.remove(force=True)

    started = time.monotonic()
    with ThreadPoolExecutor(at_once) as pool:
        list(pool.map(one, range(CASES)))
    return time.monotonic() - started


def test_image_of(sha256: str, host: str | None) -> str:
    out = subprocess.run(
        ["docker", "images", "--filter", f"label=gate.bundle={sha256}", "--format", FORMAT],
        capture_output=True,
        text=True,
        check=True,
        env=docker_env(host),
    ).stdout.split()
    if not out:
        raise RuntimeError(f"no test image labelled gate.bundle={sha256}")
    return out[0]


def seconds_between(start: str, end: str) -> float:
    return (datetime.fromisoformat(end) - datetime.fromisoformat(start)).total_seconds()


RESTARTS = 2
GATES_AFTER = 2  # gates judged after the first one on each restarted server
POLL_SECONDS = 0.02  # how often /healthz and /readyz are asked while `gate serve` starts
RESTART_SECONDS = 300.0  # cached images: a start takes seconds
LOG_LINE = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) \w+ [\w.]+: (.*)$")
# What `gate serve`'s log says as it starts, in the order it happens: (label, what the line
# contains, which occurrence). The API's process migrates first, then its worker process.
START_EVENTS = (
    ("API migrates", "migrating the database", 1),
    ("worker process spawned", "embedded worker process", 1),
    ("API's change listener", "gate change listener: listening", 1),
    ("worker process migrates", "migrating the database", 2),
    ("worker's runner image checked", "runner image gate-runner", 2),
    ("worker started", "gate_service.worker.loop: worker ", 1),
    ("'ready on'", "ready on http", 1),
    ("gate claimed", " judging gate ", 1),
)


def start_events(log_path: Path, wall_start: float) -> list[tuple[str, float]]:
    """START_EVENTS found in the log, as seconds after ``wall_start`` (the log's clock is
    the wall clock, local time, to the millisecond)."""
    seen: dict[str, int] = {}
    found: list[tuple[str, float]] = []
    wanted = list(START_EVENTS)
    for line in log_path.read_text(errors="replace").splitlines():
        if not (m := LOG_LINE.match(line)):
            continue
        for label, text, nth in list(wanted):
            if text in line:
                seen[text] = seen.get(text, 0) + 1
                if seen[text] == nth:
                    at = datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
                    found.append((label, at - wall_start))
                    wanted.remove((label, text, nth))
                break
    return found


def first_gate_after_start(
    data_dir: Path, database: str | None, bundle: bytes
) -> tuple[subprocess.Popen[bytes], Path, dict[str, Any]]:
    """Start `gate serve` on ``data_dir`` and ``database`` (its images and the bundle's test
    image cached), ask /healthz and /readyz every POLL_SECONDS from the moment the process
    starts, each in a thread of its own, and submit ``bundle`` the moment /readyz first
    answers 200, then GATES_AFTER more times. Returns the process (still serving), its log
    and the moments, in seconds after the start (each endpoint's first 200, the first POST,
    its verdict), the first gate, and the POST-to-verdict seconds of the later ones."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    wall_start, started = time.time(), time.monotonic()
    proc, log_path = start("serve", data_dir, **server_settings(port, database))
    firsts: dict[str, float] = {}
    ready = threading.Event()
    deadline = started + RESTART_SECONDS

    def poll(path: str) -> None:
        with httpx.Client(timeout=2) as http:
            while time.monotonic() < deadline and proc.poll() is None:
                try:
                    if http.get(f"{url}{path}").status_code == 200:
                        firsts[path] = time.monotonic() - started
                        break
                except httpx.HTTPError:
                    pass
                time.sleep(POLL_SECONDS)
        if path == "/readyz":
            ready.set()  # or it never will: the process ended, or the deadline passed

    pollers = [
        threading.Thread(target=poll, args=(path,), name=f"poll{path}", daemon=True)
        for path in ("/healthz", "/readyz")
    ]
    for poller in pollers:
        poller.start()
    # Made before /readyz answers: an httpx client loads its TLS context as it is made
    # (30 ms here, 140 ms for a process's first), which is no part of the start.
    client = GateClient(url, token=ADMIN_TOKEN)
    try:
        ready.wait()
        if "/readyz" not in firsts:
            raise RuntimeError(
                f"/readyz did not answer 200 in {RESTART_SECONDS:.0f} s (exit status {proc.poll()})"
            )
        posted = time.monotonic() - started
        _, done = judge(client, bundle)
        verdict = time.monotonic() - started
        # The same gate again on this server, now warm: what the first is to them says the
        # same as what it is to the earlier warm gates, without the drift between the two.
        after = [judge(client, bundle)[0] for _ in range(GATES_AFTER)]
        for poller in pollers:
            poller.join(timeout=RESTART_SECONDS)
    except BaseException:
        stop(proc)
        raise
    finally:
        client.close()
    return (
        proc,
        log_path,
        {
            "healthz": firsts.get("/healthz", float("nan")),
            "readyz": firsts["/readyz"],
            "posted": posted,
            "verdict": verdict,
            "gate": done,
            "after": after,
            "events": start_events(log_path, wall_start),
        },
    )


def claim_wait(gate: dict[str, Any]) -> float:
    """Seconds from the gate's creation to its start (the server's clock)."""
    return seconds_between(gate["created_at"], gate["started_at"])


KINDS = (
    ("project code without `import connic`", "", 1.25, "bare"),
    (
        "project code that imports `connic`",
        "import connic  # the SDK, as user code does\n",
        1.15,
        "import",
    ),
)


def kind_project(root: Path, header: str) -> Path:
    """The 20-case calc project; ``header`` goes at the top of its tool module, with a mark
    of this run: a bundle no earlier run submitted, so its first gate builds its image."""
    tool_cases_project(root, CASES)
    tool = root / "tools" / "math_ops.py"
    tool.write_text(f"# bench run {uuid.uuid4().hex}\n{header}{tool.read_text()}")
    return root


def main() -> None:
    server_url = os.environ.get("GATE_TEST_DATABASE_URL")
    database = create_database(server_url) if server_url else None
    data_dir = Path(tempfile.mkdtemp(prefix="gate-bench-gate-"))
    src = Path(tempfile.mkdtemp(prefix="gate-bench-src-"))
    # What the import-only floor's containers mount where a case's model gateway socket goes.
    channel = Path(tempfile.mkdtemp(prefix="gate-bench-channel-"))
    proc, url, log_path = serve(data_dir, database)
    client = GateClient(url, token=ADMIN_TOKEN)
    engine = docker.from_env()
    at_once = int(os.environ.get("GATE_CASE_CONCURRENCY") or Settings().case_concurrency)
    figures: list[dict[str, Any]] = []
    restarts: list[dict[str, Any]] = []
    load_before = os.getloadavg()[0]
    try:
        # A first gate of another bundle: the server, its worker and their connections are
        # warm before anything is timed, so a first build is timed as a build.
        warm_up = bundle_of(tool_cases_project(src / "warm-up", CASES))
        judge(client, warm_up)
        for label, header, target, floor_kind in KINDS:
            bundle = bundle_of(kind_project(src / floor_kind, header))
            cold, first = judge(client, bundle)  # builds and caches the test image
            image = test_image_of(first["bundle"]["sha256"], None)
            gates: list[float] = []
            bare: list[float] = []
            importing: list[float] = []
            plain: list[float] = []
            last: dict[str, Any] = {}
            meters = {k: CpuMeter(proc.pid) for k in ("gate", "bare", "importing", "plain")}
            for _ in range(REPEATS):
                with meters["gate"]:
                    elapsed, last = judge(client, bundle)
                gates.append(elapsed)
                with meters["bare"]:
                    bare.append(bare_runs(image, at_once=at_once))
                with meters["importing"]:
                    importing.append(
                        import_only_runs(
                            engine, image, at_once=at_once, isolated=True, channel=channel
                        )
                    )
                with meters["plain"]:
                    plain.append(
                        import_only_runs(
                            engine, image, at_once=at_once, isolated=False, channel=channel
                        )
                    )
            figures.append(
                {
                    "label": label,
                    "target": target,
                    "floor_kind": floor_kind,
                    "cold": cold,
                    "gates": gates,
                    "bare": bare,
                    "importing": importing,
                    "plain": plain,
                    "last": last,
                    "cpu": {k: m.used for k, m in meters.items()},
                    "bundle": bundle,
                }
            )
        # The first gate after a start: `gate serve` stopped and started again on the same
        # data dir and database (its images and the first kind's test image cached), as a CI
        # job that restarts the service, and that kind's bundle submitted at once.
        client.close()
        for n in range(RESTARTS):
            stop(proc)
            log_path.rename(data_dir / f"serve-{n}.log")
            log_path = data_dir / "serve.log"
            proc, log_path, moments = first_gate_after_start(
                data_dir, database, figures[0]["bundle"]
            )
            restarts.append(moments)
    except Exception:
        print_log_tail(log_path)
        raise
    finally:
        client.close()
        engine.close()
        stop(proc)
        if server_url and database:
            drop_database(server_url, database)
        shutil.rmtree(src, ignore_errors=True)
        shutil.rmtree(channel, ignore_errors=True)
        shutil.rmtree(data_dir, ignore_errors=True)
    print(
        f"{CASES}-case tool-agent gates, `gate serve` defaults "
        f"(GATE_CASE_CONCURRENCY={at_once}, {os.cpu_count()} CPUs), medians of {REPEATS}; "
        f"load average {load_before:.1f} -> {os.getloadavg()[0]:.1f} over the runc part"
    )
    for f in figures:
        gate_s = statistics.median(f["gates"])
        bare_s = statistics.median(f["bare"])
        import_s = statistics.median(f["importing"])
        plain_s = statistics.median(f["plain"])
        last = f["last"]
        durations = [c["duration_ms"] / 1000 for c in last["cases"] if c.get("duration_ms")]
        floors = f["bare"] if f["floor_kind"] == "bare" else f["importing"]
        floor_s = statistics.median(floors)
        # Each gate against the floor measured right after it, the median of those: the
        # machine's speed drifts by 10-20% within a run (a shared VM), and neighbours drift
        # together. The ratio of the medians is printed beside it.
        ratio = statistics.median(g / fl for g, fl in zip(f["gates"], floors, strict=True))
        print(f"  {f['label']}:")
        print(
            f"    warm gate, POST to verdict: {gate_s:.2f} s  "
            f"({', '.join(f'{g:.2f}' for g in f['gates'])})"
        )
        print(
            f"    first gate (builds the test image): {f['cold']:.2f} s, "
            f"{f['cold'] - gate_s:+.2f} s over warm (target <= +1 s: "
            f"{'met' if f['cold'] - gate_s <= 1 else 'NOT met'})"
        )
        print(
            f"    floor: {CASES} bare `docker run --rm --network none` of its image, {at_once} "
            f"at a time: {bare_s:.2f} s (the gate is {gate_s / bare_s:.2f}x this)"
        )
        print(
            f"    floor: {CASES} containers made as the gate makes them that only "
            f"`import connic`, {at_once} at a time: {import_s:.2f} s "
            f"(the gate is {gate_s / import_s:.2f}x this)"
        )
        print(
            f"    (the same without the case's isolation, as sessions before 2026-12-04 "
            f"measured it: {plain_s:.2f} s; the gate is {gate_s / plain_s:.2f}x this)"
        )
        print(
            f"    target: within {f['target']:.2f}x of the {f['floor_kind']} floor: "
            f"{ratio:.2f}x (median of each gate over the floor run after it; ratio of the "
            f"medians {gate_s / floor_s:.2f}x), {'met' if ratio <= f['target'] else 'NOT met'}"
        )
        ms = {k: {part: 1000 * s / REPEATS / CASES for part, s in used.items()}
              for k, used in f["cpu"].items()}  # fmt: skip
        gate_ms = ms["gate"]
        rest = gate_ms["total"] - gate_ms["server"] - gate_ms["engine"] - gate_ms["postgres"]
        print(
            f"    CPU per case, the whole machine: gate {gate_ms['total']:.0f} ms (`gate serve` and "
            f"its workers "
            f"{gate_ms['server']:.0f}, Postgres {gate_ms['postgres']:.0f}, dockerd and "
            f"containerd {gate_ms['engine']:.0f}, the rest {rest:.0f}: containers, shims, "
            f"runc, this client); bare floor {ms['bare']['total']:.0f} ms (dockerd and "
            f"containerd {ms['bare']['engine']:.0f}); import floor "
            f"{ms['importing']['total']:.0f} ms (dockerd and containerd "
            f"{ms['importing']['engine']:.0f}; without the isolation "
            f"{ms['plain']['total']:.0f} ms, {ms['plain']['engine']:.0f})"
        )
        print(
            f"    last warm gate: started to finished "
            f"{seconds_between(last['started_at'], last['finished_at']):.2f} s; runner-reported "
            f"case time median {statistics.median(durations):.3f} s"
        )
    print_restarts(figures[0], restarts)
    runsc_pass(server_url, figures[0], warm_up, at_once)


def print_restarts(kind: dict[str, Any], restarts: list[dict[str, Any]]) -> None:
    """The first gate after each start against the median warm gate of the same bundle."""
    if not restarts:
        return
    warm = statistics.median(kind["gates"])
    warm_wait = claim_wait(kind["last"])
    print(
        f"  first gate after a start ({kind['label']}; `gate serve` stopped and started "
        f"again on the same data dir and database, its test image cached; /healthz and "
        f"/readyz asked every {POLL_SECONDS * 1000:.0f} ms from the process's start, the gate "
        f"submitted at /readyz's first 200; the warm gate {warm:.2f} s, created to started "
        f"{warm_wait:.2f} s in the last one):"
    )
    for n, r in enumerate(restarts, 1):
        from_ready = r["verdict"] - r["readyz"]
        from_health = r["verdict"] - r["healthz"]
        gate = r["gate"]
        print(
            f"    start {n}: /healthz 200 at {r['healthz']:.2f} s, /readyz 200 at "
            f"{r['readyz']:.2f} s ({r['readyz'] - r['healthz']:+.2f} s), POST at "
            f"{r['posted']:.2f} s, verdict at {r['verdict']:.2f} s: {from_ready:.2f} s from "
            f"/readyz ({from_ready - warm:+.2f} s over warm), {from_health:.2f} s from /healthz "
            f"({from_health - warm:+.2f} s); created to started {claim_wait(gate):.2f} s, "
            f"started to finished {seconds_between(gate['started_at'], gate['finished_at']):.2f} s"
        )
        print(
            f"      the next {len(r['after'])} gates on it: "
            f"{', '.join(f'{a:.2f}' for a in r['after'])} s (the first from /readyz is "
            f"{from_ready - statistics.median(r['after']):+.2f} s over their median)"
        )
        print(
            "      its log, s after the start: "
            + ", ".join(f"{label} {at:.2f}" for label, at in r["events"])
        )
    over_ready = [r["verdict"] - r["readyz"] - warm for r in restarts]
    over_health = [r["verdict"] - r["healthz"] - warm for r in restarts]
    gaps = [r["readyz"] - r["healthz"] for r in restarts]
    print(
        f"  first gate after a start: from /readyz {', '.join(f'{o:+.2f}' for o in over_ready)} "
        f"s over the warm gate ({warm:.2f} s), from /healthz "
        f"{', '.join(f'{o:+.2f}' for o in over_health)} s; /readyz "
        f"{', '.join(f'{g:.2f}' for g in gaps)} s after /healthz; target ≤ +1 s from "
        f"/readyz: {'met' if max(over_ready) <= 1 else 'NOT met'}"
    )


# The same gate under gVisor: a second engine with the runsc runtime registered, started (or
# reused) by the script CI's runsc pass uses, and a second `gate serve` on it.
RUNSC = "runsc"
RUNSC_SCRIPT = Path(__file__).resolve().parents[2] / ".ci" / "runsc-engine"
# Where the script's engine listens (its GATE_RUNSC_ENGINE_ROOT), to tell whether it was
# running before this run: only an engine this run started is stopped at its end.
RUNSC_HOST = (
    f"unix://{os.environ.get('GATE_RUNSC_ENGINE_ROOT', '/var/tmp/gate-runsc-engine')}/docker.sock"
)
RUNSC_OFF = ("0", "no", "false", "off")


def runsc_skipped() -> str | None:
    """Why the runsc pass is skipped (GATE_BENCH_RUNSC=0, no script, no runsc), or None."""
    if os.environ.get("GATE_BENCH_RUNSC", "1").strip().lower() in RUNSC_OFF:
        return "GATE_BENCH_RUNSC=0"
    if not RUNSC_SCRIPT.is_file():
        return f"{RUNSC_SCRIPT} is missing: it starts the engine with the runsc runtime"
    if shutil.which(RUNSC) is None:
        return "runsc is not installed (apt-get install runsc; see docs/threat-model.md)"
    return None


def engine_answers(host: str) -> bool:
    """Whether a Docker engine answers at ``host``."""
    try:
        client = docker.DockerClient(base_url=host, timeout=5)
        try:
            return bool(client.ping())
        finally:
            client.close()
    except Exception:  # no socket, refused, not an engine: not running
        return False


def print_log_tail(log_path: Path) -> None:
    """`gate serve`'s last log lines, without the health probes, on stderr."""
    if log_path.exists():
        lines = log_path.read_text(errors="replace").splitlines()
        lines = [x for x in lines if "GET /healthz" not in x and "GET /readyz" not in x]
        print("gate serve's log, last lines:\n" + "\n".join(lines[-60:]), file=sys.stderr)


def measure_runsc(
    host: str, database_server: str | None, bundle: bytes, warm_up: bytes, at_once: int
) -> dict[str, Any]:
    """On the engine at ``host``: a `gate serve` with GATE_CASE_RUNTIME=runsc (its own data
    dir, and its own database on ``database_server``, else its embedded Postgres), warmed
    with ``warm_up``; the first gate of ``bundle`` (builds its test image on that engine,
    its build step under runsc), then REPEATS warm gates, each followed by the bare floor
    under runsc on that engine and, as a control, the same floor there under runc."""
    database = create_database(database_server) if database_server else None
    data_dir = Path(tempfile.mkdtemp(prefix="gate-bench-runsc-"))
    proc: subprocess.Popen[bytes] | None = None
    log_path = data_dir / "serve.log"
    client: GateClient | None = None
    try:
        proc, url, log_path = serve(data_dir, database, DOCKER_HOST=host, GATE_CASE_RUNTIME=RUNSC)
        client = GateClient(url, token=ADMIN_TOKEN)
        judge(client, warm_up)  # the server, its worker and the engine warm before timing
        cold, first = judge(client, bundle)
        runtime = (first.get("sandbox") or {}).get("runtime")
        if runtime not in (None, RUNSC):  # None: a server that does not say it yet
            raise RuntimeError(f"the gate's cases ran under {runtime!r}, not {RUNSC}")
        image = test_image_of(first["bundle"]["sha256"], host)
        gates: list[float] = []
        bare: list[float] = []
        bare_runc: list[float] = []
        last: dict[str, Any] = {}
        meters = {k: CpuMeter(proc.pid) for k in ("gate", "bare")}
        for _ in range(REPEATS):
            with meters["gate"]:
                elapsed, last = judge(client, bundle)
            gates.append(elapsed)
            with meters["bare"]:
                bare.append(bare_runs(image, at_once=at_once, host=host, runtime=RUNSC))
            bare_runc.append(bare_runs(image, at_once=at_once, host=host))
    except Exception:
        print_log_tail(log_path)
        raise
    finally:
        if client is not None:
            client.close()
        if proc is not None:
            stop(proc)
        if database_server and database:
            drop_database(database_server, database)
        shutil.rmtree(data_dir, ignore_errors=True)
    return {
        "cold": cold,
        "gates": gates,
        "bare": bare,
        "bare_runc": bare_runc,
        "last": last,
        "runtime": runtime,
        "cpu": {k: m.used for k, m in meters.items()},
    }


def runsc_pass(
    database_server: str | None, runc: dict[str, Any], warm_up: bytes, at_once: int
) -> None:
    """The first kind's gate again under runsc, on the runsc engine (started if it is not
    running, and then stopped at the end), and the comparison with ``runc``'s figures."""
    print(f"runc vs runsc (gVisor), {runc['label']} only (the second kind is left out for time):")
    if why := runsc_skipped():
        print(f"  runsc: skipped ({why})")
        return
    was_running = engine_answers(RUNSC_HOST)
    load_before = os.getloadavg()[0]
    started = subprocess.run(
        [str(RUNSC_SCRIPT), "start"], capture_output=True, text=True, timeout=600, check=False
    )
    try:
        if started.returncode != 0 or not started.stdout.strip():
            print(
                f"  runsc: skipped (`{RUNSC_SCRIPT.name} start` exited {started.returncode}: "
                f"{started.stderr.strip()[-600:]})"
            )
            return
        host = started.stdout.strip().splitlines()[-1]
        f = measure_runsc(host, database_server, runc["bundle"], warm_up, at_once)
    finally:
        if not was_running:  # started by this run (or half-started): not left behind
            subprocess.run(
                [str(RUNSC_SCRIPT), "stop"], capture_output=True, timeout=300, check=False
            )
    print_runsc(runc, f, at_once)
    print(
        f"  the runsc engine ({host}): "
        + ("running before this run, left running" if was_running else "started, then stopped")
        + f"; load average {load_before:.1f} -> {os.getloadavg()[0]:.1f} over this pass"
    )


def print_runsc(runc: dict[str, Any], runsc: dict[str, Any], at_once: int) -> None:
    """runc's and runsc's warm gate, bare floor, first gate and CPU a case, side by side."""
    rows: dict[str, dict[str, float]] = {}
    for name, f in (("runc", runc), ("runsc", runsc)):
        gate_s = statistics.median(f["gates"])
        bare_s = statistics.median(f["bare"])
        durations = [c["duration_ms"] / 1000 for c in f["last"]["cases"] if c.get("duration_ms")]
        rows[name] = {
            "gate": gate_s,
            "bare": bare_s,
            "ratio": statistics.median(g / b for g, b in zip(f["gates"], f["bare"], strict=True)),
            "cold": f["cold"],
            "case": statistics.median(durations) if durations else float("nan"),
            "cpu_gate": 1000 * f["cpu"]["gate"]["total"] / REPEATS / CASES,
            "cpu_bare": 1000 * f["cpu"]["bare"]["total"] / REPEATS / CASES,
        }
        r = rows[name]
        print(
            f"  {name:5}: warm gate {gate_s:.2f} s ({', '.join(f'{g:.2f}' for g in f['gates'])}), "
            f"bare floor {bare_s:.2f} s ({gate_s / bare_s:.2f}x; median of each gate over the "
            f"floor after it {r['ratio']:.2f}x), first gate (builds its test image) "
            f"{r['cold']:.2f} s ({r['cold'] - gate_s:+.2f} s over warm); runner-reported case "
            f"time {r['case']:.3f} s; CPU a case, machine-wide, {r['cpu_gate']:.0f} ms (a bare "
            f"floor container {r['cpu_bare']:.0f} ms)"
        )
    a, b = rows["runc"], rows["runsc"]
    print(
        f"  runsc costs {b['gate'] - a['gate']:+.2f} s per warm gate ({b['gate'] / a['gate']:.2f}x "
        f"runc's; {(b['gate'] - a['gate']) / CASES:+.3f} s a case, {at_once} at a time), "
        f"{(b['bare'] - a['bare']) / CASES * at_once:+.3f} s per bare container in its slot (the floor "
        f"{b['bare'] - a['bare']:+.2f} s, {b['bare'] / a['bare']:.2f}x, {CASES} containers "
        f"{at_once} at a time), {b['cold'] - a['cold']:+.2f} s on the first gate, "
        f"{b['case'] - a['case']:+.3f} s of runner-reported case time, "
        f"{b['cpu_gate'] - a['cpu_gate']:+.0f} ms of CPU a case"
    )
    control = statistics.median(runsc["bare_runc"])
    print(
        f"  control: the same bare floor on the runsc engine under runc: {control:.2f} s "
        f"({', '.join(f'{c:.2f}' for c in runsc['bare_runc'])}; the main engine's "
        f"{a['bare']:.2f} s): the engine itself, not the runtime, is {control - a['bare']:+.2f} s "
        f"of the floor's difference"
    )
    # Each runsc floor against the runc floor run right after it on the same engine: the
    # runtime's own cost, without the two engines' difference (the main engine may be busier).
    same = [r / c for r, c in zip(runsc["bare"], runsc["bare_runc"], strict=True)]
    print(
        f"  runsc over runc on the same engine: {b['bare'] - control:+.2f} s per bare floor "
        f"({statistics.median(same):.2f}x, median of each runsc floor over the runc floor "
        f"after it), {(b['bare'] - control) / CASES * at_once:+.3f} s per bare container in "
        f"its slot"
    )


if __name__ == "__main__":
    main()
