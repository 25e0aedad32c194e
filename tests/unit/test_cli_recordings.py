"""`gate recordings` writes only inside its folder; `gate submit` prints the model totals."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from rich.console import Console

from gate_service.client.recordings import RecordingRefused, write_recordings
from gate_service.client.render import model_calls_line, render_results

KEY = "ab" * 32


def recording(path: str) -> dict[str, object]:
    return {"path": path, "content": {"key": KEY, "request": None, "response": {"content": "x"}}}


def test_recordings_are_written_under_the_folder_counted_per_agent(tmp_path: Path) -> None:
    answer = {
        "recordings": [
            recording(f"tests/recordings/calc/{KEY[:24]}.json"),
            recording("tests/recordings/calc/other.json"),
            recording("tests/recordings/doubler/one.json"),
        ]
    }
    assert write_recordings(answer, tmp_path) == {"calc": 2, "doubler": 1}
    written = tmp_path / "tests" / "recordings" / "calc" / f"{KEY[:24]}.json"
    assert json.loads(written.read_text())["key"] == KEY


@pytest.mark.parametrize(
    "path",
    [
        "../outside.json",
        "tests/recordings/../../../outside.json",
        "/tmp/absolute.json",
        "tests\\recordings\\x.json",
        "",
    ],
)
def test_a_path_leaving_the_folder_is_refused_and_nothing_is_written(
    tmp_path: Path, path: str
) -> None:
    out = tmp_path / "project"
    answer = {"recordings": [recording("tests/recordings/calc/fine.json"), recording(path)]}
    with pytest.raises(RecordingRefused):
        write_recordings(answer, out)
    assert not out.exists()


def test_a_symbolic_link_in_the_folder_does_not_lead_out(tmp_path: Path) -> None:
    out, elsewhere = tmp_path / "project", tmp_path / "elsewhere"
    out.mkdir()
    elsewhere.mkdir()
    (out / "tests").symlink_to(elsewhere)
    with pytest.raises(RecordingRefused):
        write_recordings({"recordings": [recording("tests/recordings/calc/a.json")]}, out)
    assert list(elsewhere.iterdir()) == []


def test_an_item_that_is_not_a_recording_is_refused(tmp_path: Path) -> None:
    with pytest.raises(RecordingRefused):
        write_recordings({"recordings": [{"path": "tests/x.json", "content": None}]}, tmp_path)


def test_the_results_print_the_model_call_totals_when_there_were_calls() -> None:
    totals = {"calls": 12, "tokens_in": 3400, "tokens_out": 900, "cost_usd": 0.0123}
    assert model_calls_line(totals) == "model calls: 12, tokens 3,400 in / 900 out, cost $0.01230"
    assert model_calls_line({"calls": 0, "tokens_in": 0, "tokens_out": 0, "cost_usd": 0}) is None
    assert model_calls_line(None) is None

    def printed(gate: dict[str, object]) -> str:
        buffer = io.StringIO()
        render_results(Console(file=buffer, width=120), gate)
        return buffer.getvalue()

    gate: dict[str, object] = {"id": "g", "status": "passed", "cases": []}
    assert "model calls" not in printed(gate)
    assert "model calls: 12, tokens 3,400 in / 900 out" in printed({**gate, "model_calls": totals})
