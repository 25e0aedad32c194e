"""Driving the repository's Dockerfile and docker-compose.yml from tests, as a user would.

- ``buildkit_docker()``: a docker CLI whose `docker build` runs BuildKit (build secrets and
  `RUN --mount` need it): one with the buildx plugin, or a classic client older than 23
  with DOCKER_BUILDKIT=1 (Debian's docker.io 20.10 is one).
- ``compose_command()``: `docker compose` (v2) if present, else `docker-compose` (v1).
- ``Compose``: one project (`-p`) over the repository's compose file plus an override, and
  its default network.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
COMPOSE_FILE = ROOT / "docker-compose.yml"
HOST_CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")


def _ok(argv: Sequence[str], env: Mapping[str, str] | None = None) -> str | None:
    """The command's stdout if it succeeds, else None."""
    try:
        proc = subprocess.run(
            list(argv), capture_output=True, text=True, timeout=60, env=env, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout if proc.returncode == 0 else None


def _docker_clis() -> list[str]:
    """The `docker` on PATH, then Debian's (a newer client may shadow it without buildx)."""
    unique: dict[str, str] = {}
    for exe in (shutil.which("docker"), "/usr/bin/docker"):
        if exe and Path(exe).exists():
            unique.setdefault(os.path.realpath(exe), exe)
    return list(unique.values())


def buildkit_docker() -> str | None:
    """A docker CLI that builds with BuildKit when DOCKER_BUILDKIT=1, or None."""
    for exe in _docker_clis():
        if _ok([exe, "buildx", "version"]) is not None:
            return exe
        version = _ok([exe, "version", "--format", "{{.Client.Version}}"])
        if version:
            try:
                major = int(version.strip().split(".")[0])
            except ValueError:
                continue
            if major < 23:  # BuildKit built into the classic client; 23+ needs buildx
                return exe
    return None


# docker-compose v1 (Debian's 1.29) breaks with docker-py 7 ("kwargs_from_env() got an
# unexpected keyword argument 'ssl_version'"), which a pip install of this project into the
# system Python puts first on its path (/usr/local). Run it with Debian's own docker-py.
_V1_WITH_DEBIANS_DOCKER_PY = (
    "import sys; "
    "sys.path[:] = [p for p in sys.path if not p.startswith('/usr/local/')]; "
    "sys.argv[0] = 'docker-compose'; "
    "from compose.cli.main import main; main()"
)


def _v1_command(script: str) -> list[str]:
    with open(script, "rb") as fh:
        first = fh.readline().decode(errors="replace")
    if first.startswith("#!") and "python" in first:
        interpreter = first[2:].split()[0]
        return [interpreter, "-c", _V1_WITH_DEBIANS_DOCKER_PY]
    return [script]


def compose_environment(env: Mapping[str, str]) -> dict[str, str]:
    """The environment compose runs in: no PYTHONPATH to shadow a v1's own packages."""
    return {k: v for k, v in env.items() if k != "PYTHONPATH"}


def compose_command() -> list[str] | None:
    for exe in _docker_clis():
        if _ok([exe, "compose", "version"]) is not None:
            return [exe, "compose"]
    v1 = shutil.which("docker-compose")
    if v1:
        command = _v1_command(v1)
        if _ok([*command, "version"], env=compose_environment(os.environ)) is not None:
            return command
    return None


def _image_id(tag: str) -> str | None:
    return (_ok(["docker", "image", "inspect", "--format", "{{.Id}}", tag]) or "").strip() or None


def build_service_image(docker: str, tag: str, *, extra_ca: Path | None) -> str:
    """`docker build` of the repository's Dockerfile, the extra CA as the build secret.

    The image this tag named before (this test's own, from older sources) is removed, so
    rebuilds do not pile up untagged images.
    """
    previous = _image_id(tag)
    argv = [docker, "build", "--progress=plain", "-t", tag]
    if extra_ca is not None:
        argv += ["--secret", f"id=extra_ca,src={extra_ca}"]
    proc = subprocess.run(
        [*argv, str(ROOT)],
        capture_output=True,
        text=True,
        timeout=1200,
        env={**os.environ, "DOCKER_BUILDKIT": "1"},
        check=False,
    )
    if proc.returncode != 0:
        raise AssertionError(f"building {tag} failed:\n{(proc.stdout + proc.stderr)[-6000:]}")
    if previous is not None and previous != _image_id(tag):
        subprocess.run(["docker", "rmi", previous], capture_output=True, check=False)
    return proc.stdout + proc.stderr


@dataclass
class Compose:
    command: list[str]
    project: str
    files: list[Path]
    env: dict[str, str]

    def argv(self, *args: str) -> list[str]:
        files = [arg for path in self.files for arg in ("-f", str(path))]
        return [*self.command, "-p", self.project, *files, *args]

    def run(self, *args: str, timeout: float = 600, check: bool = True) -> str:
        proc = subprocess.run(
            self.argv(*args),
            capture_output=True,
            text=True,
            timeout=timeout,
            env=compose_environment(self.env),
            cwd=ROOT,
            check=False,
        )
        if check and proc.returncode != 0:
            raise AssertionError(
                f"{' '.join(args)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
            )
        return proc.stdout

    def container_ids(self, service: str) -> list[str]:
        return self.run("ps", "-q", service).split()

    @property
    def network(self) -> str:
        """The project's default network, which every service joins (compose v1 and v2 both
        name it so)."""
        return f"{self.project}_default"

    def logs(self) -> str:
        try:
            return self.run("logs", "--no-color", "--tail", "300", check=False, timeout=120)
        except subprocess.TimeoutExpired:
            return "(compose logs timed out)"


def container_state(container_id: str) -> dict[str, str]:
    """Status, restart count and exit code of one container."""
    out = subprocess.run(
        [
            "docker",
            "inspect",
            "--format",
            "{{.State.Status}} {{.RestartCount}} {{.State.ExitCode}}",
            container_id,
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    return {"status": out[0], "restarts": out[1], "exit_code": out[2]}
