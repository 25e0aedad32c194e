"""`gate coverage DIR [--json]`: the format CLI's `connic test --coverage` (spec §11)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gate_service.cli import main
from gate_service.coverage import compute_coverage
from tests.fixtures.projects import calculator_project, write


def test_json_is_the_report_and_exits_0(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    project = calculator_project(tmp_path / "p", failing=False)
    code = main(["coverage", str(project), "--json"])
    out, _ = capsys.readouterr()
    assert code == 0
    assert json.loads(out) == json.loads(json.dumps(compute_coverage(project)))
    assert {row["name"] for row in json.loads(out)["agents"]} >= {"calc", "pipeline"}


def test_json_exits_1_when_a_suite_does_not_parse_as_the_format_cli_does(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    project = calculator_project(tmp_path / "p", failing=False)
    write(project, {"tests/calc.yaml": "tests: [unclosed\n"})
    assert main(["coverage", str(project), "--json"]) == 1
    assert "parse_error" in capsys.readouterr().out  # the report is printed all the same
    assert main(["coverage", str(project)]) == 1


def test_table_for_people(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    project = calculator_project(tmp_path / "p", failing=False)
    code = main(["coverage", str(project)])
    out, _ = capsys.readouterr()
    assert code == 0 and "calc" in out and "%" in out


def test_a_missing_folder_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["coverage", str(tmp_path / "nowhere")]) == 2
