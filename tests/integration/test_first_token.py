"""A first start (no GATE_BOOTSTRAP_TOKEN) of a real `gate api` process shows the admin token
it made last, framed, naming the exact file it saved it to, which `gate admin token-path`
names too (tests/e2e/test_first_token_serve.py: the same with `gate serve`'s worker process).

`gate api` runs on a fresh database of the test server, without Docker.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from gate_service.cli import app
from tests.fixtures.auth import bearer
from tests.fixtures.ports import free_port
from tests.fixtures.processes import ends_with_this_process


def first_start(
    command: str, data_dir: Path, **settings: str
) -> tuple[subprocess.Popen[bytes], Path]:
    """`gate <command>` with no GATE_ setting but GATE_DATA_DIR and ``settings`` (so no
    GATE_BOOTSTRAP_TOKEN), its stdout and stderr in one log, as a terminal would show them."""
    log_path = data_dir.parent / f"{command}.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("GATE_")}
    if "GATE_BASE_IMAGE_SOURCE" in os.environ:  # the base the tests pin (tests/conftest.py)
        env["GATE_BASE_IMAGE_SOURCE"] = os.environ["GATE_BASE_IMAGE_SOURCE"]
    env.update({"GATE_DATA_DIR": str(data_dir), **settings})
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "gate_service.cli", command],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            preexec_fn=ends_with_this_process(),
        )
    return proc, log_path


@dataclass(frozen=True)
class Notice:
    before: list[str]  # the log's lines before the box
    inside: list[str]  # the box's text lines, without the frame
    after: list[str]  # the log's lines after it


def notice_in(log: str) -> Notice | None:
    """The framed block in ``log`` once it is there whole, else None."""
    lines = log.splitlines()
    rules = [i for i, line in enumerate(lines) if line.startswith("+-") and not line.strip("+-")]
    if len(rules) < 2:
        return None
    top, bottom = rules[0], rules[1]
    box = lines[top : bottom + 1]
    assert all(len(line) == len(box[0]) for line in box), "\n".join(box)
    assert all(line.startswith("| ") and line.endswith(" |") for line in box[1:-1])
    inside = [line[2:-2].strip() for line in box[1:-1]]
    return Notice(lines[:top], inside, lines[bottom + 1 :])


def wait_for_notice(proc: subprocess.Popen[bytes], log_path: Path, seconds: float) -> Notice:
    deadline = time.monotonic() + seconds
    while True:
        log = log_path.read_text()
        notice = notice_in(log)
        if notice is not None:
            return notice
        if proc.poll() is not None:
            pytest.fail(f"{proc.args!r} exited with {proc.returncode}:\n{log[-4000:]}")
        if time.monotonic() > deadline:
            pytest.fail(f"no framed token in {seconds} s:\n{log[-4000:]}")
        time.sleep(0.2)


def check_notice(notice: Notice, data_dir: Path) -> str:
    """The token the notice shows, once it is checked against the file it names."""
    path = data_dir / "admin-token"
    token = notice.inside[2]
    assert notice.inside[0].startswith("FIRST START: the admin token of project 'default'")
    assert token.startswith("gate_") and " " not in token
    assert str(path) in notice.inside  # the exact, absolute file, on a line of its own
    assert path.read_text() == token + "\n"
    assert path.stat().st_mode & 0o777 == 0o600
    assert f"export GATE_TOKEN=$(cat {path})" in notice.inside
    # `gate admin token-path` names the same file, by the same logic as the service.
    named = CliRunner().invoke(app, ["admin", "token-path"], env={"GATE_DATA_DIR": str(data_dir)})
    assert named.exit_code == 0 and named.stdout == f"{path}\n"
    return token


def stop(proc: subprocess.Popen[bytes]) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def test_gate_api_shows_its_first_token_last_framed_with_its_file(
    empty_database_url: str, tmp_path: Path
) -> None:
    data_dir = tmp_path / "data"
    port = free_port()
    proc, log_path = first_start(
        "api", data_dir, GATE_DATABASE_URL=empty_database_url, GATE_PORT=str(port)
    )
    try:
        notice = wait_for_notice(proc, log_path, seconds=120)
        time.sleep(1.5)  # anything start-up printed after it would be in the log by now
        notice = notice_in(log_path.read_text()) or notice
        log = log_path.read_text()
        # Last: after the server listens, and nothing after it.
        assert any(f"Uvicorn running on http://127.0.0.1:{port}" in line for line in notice.before)
        assert any("Application startup complete" in line for line in notice.before)
        assert [line for line in notice.after if line.strip()] == [], log[-3000:]
        token = check_notice(notice, data_dir)
        assert log.count(token) == 1  # in the box alone: never in a log line
        answer = httpx.get(
            f"http://127.0.0.1:{port}/v1/projects/default/tokens", headers=bearer(token), timeout=10
        )
        assert answer.status_code == 200
        assert [t["name"] for t in answer.json()["items"]] == ["first start"]
    finally:
        stop(proc)
    assert log_path.read_text().count(token) == 1  # stopping does not show it again

    # A later start makes nothing and shows nothing.
    proc, log_path = first_start(
        "api", data_dir, GATE_DATABASE_URL=empty_database_url, GATE_PORT=str(free_port())
    )
    try:
        deadline = time.monotonic() + 120
        while "Uvicorn running on" not in log_path.read_text():
            assert proc.poll() is None and time.monotonic() < deadline, log_path.read_text()
            time.sleep(0.2)
        time.sleep(1.0)
    finally:
        stop(proc)
    log = log_path.read_text()
    assert notice_in(log) is None and token not in log
    assert (data_dir / "admin-token").read_text() == token + "\n"
