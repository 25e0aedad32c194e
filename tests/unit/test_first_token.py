"""A first start's admin token: its framed notice, shown last and once, and `gate admin
token-path`, which names the file the service saves it to (tests/integration/
test_first_token.py starts a real `gate api`)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gate_service.cli import app
from gate_service.cli.server import FirstTokenNotice
from gate_service.main import first_token_notice

TOKEN = "gate_Zm9yIHRlc3RzIG9ubHksIG5vdCBhIHJlYWwgdG9rZW4uLi4uLi4"


def framed(notice: str) -> list[str]:
    """The notice's box: its lines from the first rule to the last, all as wide."""
    lines = notice.strip("\n").splitlines()
    assert lines[0].startswith("+-") and lines[-1] == lines[0], notice
    assert all(len(line) == len(lines[0]) for line in lines), notice
    assert all(line.startswith("| ") and line.endswith(" |") for line in lines[1:-1]), notice
    return [line[2:-2].rstrip() for line in lines[1:-1]]


def test_the_notice_frames_the_token_and_the_exact_path_never_wrapped() -> None:
    # Deeper than any terminal is wide: the box grows instead of cutting the path.
    path = Path("/var/lib/" + "a-long-folder-name/" * 8 + "gate data") / "admin-token"
    inside = framed(first_token_notice(TOKEN, path))
    assert f"    {TOKEN}" in inside
    assert f"    {path}" in inside
    assert f"    export GATE_TOKEN=$(cat '{path}')" in inside  # quoted: the path has a space
    assert inside[0].startswith("FIRST START")


def test_a_held_notice_waits_for_the_workers_then_shows_once(
    capsys: pytest.CaptureFixture[str],
) -> None:
    notice = FirstTokenNotice()
    notice.hold(first_token_notice(TOKEN, Path("/data/admin-token")))
    ready = threading.Event()
    notice.show_when(ready, timeout=30)
    time.sleep(0.3)
    assert capsys.readouterr().err == ""  # the workers have not started yet
    ready.set()
    deadline = time.monotonic() + 10
    shown = ""
    while TOKEN not in shown and time.monotonic() < deadline:
        time.sleep(0.05)
        shown += capsys.readouterr().err
    assert shown.count(TOKEN) == 1 and shown.startswith("\n+-")
    notice.show()  # as the server stops: nothing more
    assert capsys.readouterr().err == ""


def test_a_held_notice_is_shown_after_the_wait_or_when_the_server_stops(
    capsys: pytest.CaptureFixture[str],
) -> None:
    late = FirstTokenNotice()
    late.hold(first_token_notice(TOKEN, Path("/data/admin-token")))
    late.show_when(threading.Event(), timeout=0.2)  # a worker process that never says ready
    time.sleep(1.0)
    assert TOKEN in capsys.readouterr().err

    stopped = FirstTokenNotice()
    stopped.hold(first_token_notice(TOKEN, Path("/data/admin-token")))
    stopped.show_when(threading.Event(), timeout=30)
    stopped.show()  # the server stopped first: shown now, whatever the wait
    assert TOKEN in capsys.readouterr().err

    nothing = FirstTokenNotice()  # a later start: nothing was made, nothing is shown
    nothing.show_when(None)
    nothing.show()
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("columns", [120, 80])
def test_token_path_with_gate_data_dir(tmp_path: Path, columns: int) -> None:
    env = {"GATE_DATA_DIR": str(tmp_path / "data dir"), "COLUMNS": str(columns)}
    result = CliRunner().invoke(app, ["admin", "token-path"], env=env)
    assert result.exit_code == 0, result.output
    assert result.stdout == f"{tmp_path / 'data dir' / 'admin-token'}\n"
    assert "there is no" in result.stderr  # none made there yet: said on stderr only
    (tmp_path / "data dir").mkdir()
    (tmp_path / "data dir" / "admin-token").write_text("gate_x\n")
    result = CliRunner().invoke(app, ["admin", "token-path"], env=env)
    assert result.exit_code == 0 and result.stderr == ""
    assert Path(result.stdout.strip()).read_text() == "gate_x\n"


def test_token_path_with_a_relative_gate_data_dir_is_absolute(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, ["admin", "token-path"], env={"GATE_DATA_DIR": "state"})
    assert result.exit_code == 0, result.output
    assert result.stdout == f"{tmp_path / 'state' / 'admin-token'}\n"


def test_token_path_without_gate_data_dir_is_the_default_data_dir() -> None:
    result = CliRunner().invoke(app, ["admin", "token-path"], env={"GATE_DATA_DIR": None})
    assert result.exit_code == 0, result.output
    expected = Path.home() / ".local" / "share" / "gate" / "admin-token"
    assert result.stdout == f"{expected}\n"
