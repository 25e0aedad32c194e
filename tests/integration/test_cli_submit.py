"""`gate submit --wait --json --junit` against the real API (uvicorn, Postgres) and a worker
that runs the real runner in-process (FakeSandbox): the verdict is the exit code."""

from __future__ import annotations

import json
import threading
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path

import pytest
import xmlschema

from gate_service.cli import main
from gate_service.worker.loop import Worker
from tests.fixtures.auth import ADMIN_TOKEN
from tests.fixtures.live import live_server  # noqa: F401 (fixture)
from tests.fixtures.projects import calculator_project, unknown_agent_project

SCHEMA = xmlschema.XMLSchema(str(Path(__file__).parents[1] / "fixtures" / "junit.xsd"))


@pytest.fixture
def running_worker(worker: Worker) -> Iterator[Worker]:
    thread = threading.Thread(target=worker.run, name="cli-test-worker", daemon=True)
    thread.start()
    try:
        yield worker
    finally:
        worker.ctx.stop.set()
        thread.join(timeout=60)


def submit(
    capsys: pytest.CaptureFixture[str], url: str, project: Path, junit: Path, *extra: str
) -> tuple[int, str, str]:
    code = main(
        ["submit", str(project), "--wait", "--json", "--junit", str(junit), "--url", url,
         "--token", ADMIN_TOKEN, "--timeout", "300", *extra]
    )  # fmt: skip
    out, err = capsys.readouterr()
    return code, out, err


def test_a_passing_project_exits_0(
    live_server: tuple[str, int],  # noqa: F811
    running_worker: Worker,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    url = "http://{}:{}".format(*live_server)
    project = calculator_project(tmp_path / "p", failing=False)
    junit = tmp_path / "reports" / "junit.xml"
    code, out, err = submit(capsys, url, project, junit, "--label", "commit=abc123")
    assert code == 0, err
    result = json.loads(out)
    assert result["status"] == "passed"
    assert {c["test_name"] for c in result["cases"]} == {
        "adds_two_numbers",
        "slow_call_times_out",
        "adds_then_doubles",
        "two_of_three_at_66_percent",
    }
    assert all(c["passed"] for c in result["cases"])
    assert result["labels"] == {"commit": "abc123"}
    # The service answers a path (no GATE_PUBLIC_URL); the client completes it with its URL.
    assert result["html_url"] == f"{url}/ui/gates/{result['test_run_id']}"
    SCHEMA.validate(str(junit))
    root = ET.parse(junit).getroot()
    links = {p.get("value") for p in root.iter("property") if p.get("name") == "gate.html_url"}
    assert links == {result["html_url"]}
    assert (root.get("tests"), root.get("failures"), root.get("errors")) == ("4", "0", "0")


def test_a_failing_project_exits_1_with_failed_runs(
    live_server: tuple[str, int],  # noqa: F811
    running_worker: Worker,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    url = "http://{}:{}".format(*live_server)
    project = calculator_project(tmp_path / "p", failing=True)
    junit = tmp_path / "junit.xml"
    code, out, err = submit(capsys, url, project, junit)
    assert code == 1, err
    result = json.loads(out)
    assert result["status"] == "failed"
    wrong = next(c for c in result["cases"] if c["test_name"] == "expects_the_wrong_sum")
    assert wrong["passed"] is False and wrong["failure_reason"]
    shown = wrong["failed_runs"]["shown"]
    # Early stop: at 100% its first failed run decided the case, its second never started.
    assert wrong["failed_runs"]["total_failed"] == 1 and len(shown) == 1
    assert all("fetch_error" not in run for run in shown)
    assert shown[0]["output"] == {"sum": 4}
    assert any(json.loads(span["metadata_json"]) for span in shown[0]["traces"])

    SCHEMA.validate(str(junit))
    root = ET.parse(junit).getroot()
    assert root.get("failures") == "2" and root.get("tests") == "6"
    failed_names = {c.get("name") for c in root.iter("testcase") if c.find("failure") is not None}
    assert failed_names == {"calc::expects_the_wrong_sum", "flaky::two_of_three_at_67_percent"}


def test_a_gate_that_cannot_judge_exits_2_with_nothing_on_stdout(
    live_server: tuple[str, int],  # noqa: F811
    running_worker: Worker,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    url = "http://{}:{}".format(*live_server)
    project = unknown_agent_project(tmp_path / "p")
    junit = tmp_path / "junit.xml"
    code, out, err = submit(capsys, url, project, junit)
    assert (code, out) == (2, "")
    assert "Gate errored:" in err
    SCHEMA.validate(str(junit))
    assert ET.parse(junit).getroot().get("errors") == "1"


def test_a_refused_token_exits_2(
    live_server: tuple[str, int],  # noqa: F811
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    url = "http://{}:{}".format(*live_server)
    project = calculator_project(tmp_path / "p", failing=False)
    code = main(["submit", str(project), "--json", "--url", url, "--token", "not-a-token"])
    out, err = capsys.readouterr()
    assert (code, out) == (2, "") and "the token not-a… is not known" in err
