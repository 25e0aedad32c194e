"""Fetching a bundle's (or the runner's) wheels on the host, within a time and byte budget.

pip runs here, on the worker's host, never in the engine: the wheels it fetches go into a
build context that the image builder then installs offline (``--no-index --find-links``).
Only wheels are fetched (no package code runs on the host), pip sees none of the service's
environment, and the job's halt event kills it at once. It imports nothing of the sandbox
(whose Docker backend fetches the runner's wheels with it), so its errors are its own.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from ..config import Settings
from ..scratch import scratch_dir

# Seconds between looks at a pip download's size and age (and at the job's halt event).
PIP_POLL_SECONDS = 0.1
_NO_WHEEL = (
    re.compile(r"No matching distribution found for ([A-Za-z0-9][A-Za-z0-9._-]*)"),
    re.compile(r"satisfies the requirement ([A-Za-z0-9][A-Za-z0-9._-]*)"),
)


class WheelDownloadError(Exception):
    """pip could not fetch a bundle's or the runner's requirements as wheels."""


class DownloadHalted(Exception):
    """The job's halt event was set while pip ran: pip was killed and nothing was kept.

    The download's counterpart of the sandbox's Halted: the worker treats both alike (the
    gate was cancelled or the job's lease lost, so nothing is judged and nothing retried).
    """


def pip_environment() -> dict[str, str]:
    """Only what pip needs: the service's secrets must never reach it (or its messages)."""
    keep = {
        "PATH", "HOME", "LANG", "LC_ALL", "SSL_CERT_FILE", "SSL_CERT_DIR",
        "REQUESTS_CA_BUNDLE", "PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_TRUSTED_HOST",
        "PIP_CERT", "PIP_CONFIG_FILE", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY",
        "http_proxy", "https_proxy", "no_proxy",
    }  # fmt: skip
    return {k: v for k, v in os.environ.items() if k in keep}


def pip_sources(settings: Settings) -> list[str]:
    args: list[str] = []
    if settings.wheelhouse_dir:
        args += ["--find-links", str(settings.wheelhouse_dir)]
    if settings.pip_offline:
        args.append("--no-index")
    elif settings.pip_index_url:
        args += ["--index-url", settings.pip_index_url]
    return args


def _tree_bytes(path: Path) -> int:
    """Bytes of the regular files under ``path`` (racing pip, which adds and moves them)."""
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                continue
    return total


def fetch_wheels(
    settings: Settings,
    requirements: Sequence[str],
    dest: Path,
    halt: threading.Event | None = None,
) -> None:
    """Fetch the wheels of parsed requirements into ``dest`` on the host, within limits.

    ``--only-binary=:all:`` means no package code runs here (a package with no wheel is
    refused, never built), and pip sees none of the service's environment. The requirements
    are separate arguments after ``--``, never a file pip would read as its own language.
    pip runs in its own process group with its temporary files in a directory of ours, and is
    killed (with anything it started) once it runs past GATE_PIP_DOWNLOAD_TIMEOUT_SECONDS or
    what it fetched passes GATE_PIP_DOWNLOAD_MAX_BYTES, or at once when ``halt`` is set (the
    job was cancelled or its lease lost), which raises DownloadHalted.
    """
    dest.mkdir(parents=True, exist_ok=True)
    if not requirements:
        return
    timeout = settings.pip_download_timeout_seconds
    budget = settings.pip_download_max_bytes
    with scratch_dir(settings, "pip-") as scratch:
        tmp, log_path = scratch / "tmp", scratch / "pip.log"
        tmp.mkdir()
        empty = scratch / "cwd"
        empty.mkdir()
        argv = [
            # -I: not the working directory on sys.path (nor PYTHONPATH or user site).
            sys.executable, "-I", "-m", "pip", "download",
            "--disable-pip-version-check", "--no-input", "--no-cache-dir",
            "--progress-bar", "off",
            "--only-binary=:all:",
            "--dest", str(dest),
            *pip_sources(settings),
            "--", *requirements,
        ]  # fmt: skip
        refused: str | None = None
        halted = False
        with log_path.open("wb") as out:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env={**pip_environment(), "TMPDIR": str(tmp)},
                # An empty working directory: pip reads a requirement that names an existing
                # path as a file, so nothing of the service's may be reachable relative to it.
                cwd=empty,
                start_new_session=True,  # its own process group, killed as one
            )
            deadline = time.monotonic() + timeout
            try:
                while True:
                    try:
                        proc.wait(timeout=PIP_POLL_SECONDS)
                        break
                    except subprocess.TimeoutExpired:
                        pass
                    if halt is not None and halt.is_set():
                        halted = True
                        break
                    if time.monotonic() > deadline:
                        refused = f"downloading requirements took longer than {timeout:g} s"
                        break
                    if _tree_bytes(dest) + _tree_bytes(tmp) > budget:
                        refused = f"requirements' wheels exceed {budget} bytes"
                        break
            finally:
                if proc.returncode is None:
                    try:
                        os.killpg(proc.pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                    proc.wait()
        if halted:
            shutil.rmtree(dest, ignore_errors=True)
            raise DownloadHalted(
                "the job was halted while its requirements downloaded; pip was stopped"
            )
        if refused is None and _tree_bytes(dest) > budget:
            refused = f"requirements' wheels exceed {budget} bytes"
        if refused is not None:
            shutil.rmtree(dest, ignore_errors=True)
            raise WheelDownloadError(refused)
        output = log_path.read_text(errors="replace")
    if proc.returncode != 0:
        for pattern in _NO_WHEEL:
            match = pattern.search(output)
            if match:
                raise WheelDownloadError(
                    f"no wheel for {match.group(1)}: only wheels are installed, never source "
                    "distributions (check the name and version, and that the index or "
                    "wheelhouse has a wheel for this platform and Python)"
                )
        raise WheelDownloadError(output.strip()[-2000:])
