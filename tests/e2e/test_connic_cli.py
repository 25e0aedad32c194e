"""The unmodified `connic test` CLI against the live service (real Docker, real Postgres).

Set up as a user would: CONNIC_API_URL=<gate>/v1, CONNIC_API_KEY=<a submit+read token>,
CONNIC_PROJECT_ID=<its project's name>, cwd = the project. The CLI polls every 5 s, so
there are three gates only: one passes (exit 0), one fails (exit 1, with the failed runs'
traces fetched), one cannot be judged (exit 2).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.fixtures.auth import ADMIN_TOKEN, bearer
from tests.fixtures.projects import calculator_project

pytestmark = pytest.mark.docker

PROJECT = "connic-cli"
CLI_SECONDS = 600


@pytest.fixture(scope="module")
def token(gate_url: str) -> str:
    """A submit+read token of PROJECT, made through the admin API."""
    admin = bearer(ADMIN_TOKEN)
    made = httpx.post(f"{gate_url}/v1/projects", json={"name": PROJECT}, headers=admin)
    assert made.status_code in (201, 409), made.text
    answer = httpx.post(
        f"{gate_url}/v1/projects/{PROJECT}/tokens",
        json={"scopes": ["submit", "read"]},
        headers=admin,
    )
    assert answer.status_code == 201, answer.text
    return str(answer.json()["token"])


def connic_test(
    gate_url: str, token: str, project: Path, *args: str, base_url: str | None = None
) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CONNIC_", "GATE_"))}
    env.update(
        {
            "CONNIC_API_URL": f"{gate_url}/v1",
            "CONNIC_API_KEY": token,
            "CONNIC_PROJECT_ID": PROJECT,
            # Its documented switch for the start-up update check (PyPI, GitHub): no network
            # here, and a test must not depend on one.
            "CONNIC_NO_UPDATE_CHECK": "1",
            # Its cache and any ~/.connic of the machine stay out of the test.
            "HOME": str(project.parent),
        }
    )
    if base_url:
        env["CONNIC_BASE_URL"] = base_url
    return subprocess.run(
        [sys.executable, "-c", "from connic.cli import main; main()", "test", *args],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=CLI_SECONDS,
        check=False,
    )


def json_result(done: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    try:
        return dict(json.loads(done.stdout))
    except json.JSONDecodeError:
        pytest.fail(f"not JSON (exit {done.returncode}):\n{done.stdout}\n{done.stderr}")


DASHBOARD_LINK = re.compile(r"^\s*(http://\S+/projects/\S+/deployments/(\S+)\?env=default)$", re.M)


def test_a_passing_project_exits_0_and_links_the_gates_page(
    gate_url: str, token: str, tmp_path: Path
) -> None:
    project = calculator_project(tmp_path / "passing", failing=False)
    # Its dashboard link, pointed at the gate: CONNIC_BASE_URL is the gate's address.
    done = connic_test(gate_url, token, project, base_url=gate_url)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "4/4 cases passed." in done.stdout, done.stdout
    for name in ("adds_then_doubles", "adds_two_numbers", "slow_call_times_out"):
        assert name in done.stdout
    link = DASHBOARD_LINK.search(done.stdout)
    assert link is not None, done.stdout
    url, gate_id = link.groups()
    assert url.startswith(f"{gate_url}/projects/{PROJECT}/deployments/")
    # The test run is the project's gate of the same id.
    gate = httpx.get(f"{gate_url}/v1/gates/{gate_id}", headers=bearer(token)).json()
    assert (gate["status"], gate["total_cases"]) == ("passed", 4)
    # Following the printed link: the gate's page, once signed in with the same token.
    with httpx.Client(follow_redirects=True) as browser:
        form = browser.get(url)
        assert form.url.path == "/ui/sign-in", form.url
        page = browser.post(
            f"{gate_url}/ui/sign-in",
            data={"token": token, "next": form.url.params["next"]},
            headers={"Origin": gate_url},  # as a browser sends it with the form
        )
    assert (page.status_code, page.url.path) == (200, f"/ui/gates/{gate_id}")
    assert "adds_two_numbers" in page.text and "PASSED" in page.text


def test_a_failing_project_exits_1_with_its_failed_runs(
    gate_url: str, token: str, tmp_path: Path
) -> None:
    project = calculator_project(tmp_path / "failing", failing=True)
    done = connic_test(gate_url, token, project, "--json")
    assert done.returncode == 1, done.stdout + done.stderr
    result = json_result(done)
    assert result["status"] == "failed"
    cases = {c["test_name"]: c for c in result["cases"]}
    assert {n for n, c in cases.items() if not c["passed"]} == {
        "expects_the_wrong_sum",
        "two_of_three_at_67_percent",
    }
    wrong = cases["expects_the_wrong_sum"]
    assert (wrong["agent_name"], wrong["successes"], wrong["runs"]) == ("calc", 0, 2)
    assert "output.sum = 4" in wrong["failure_reason"]
    failed_runs = wrong["failed_runs"]
    # Early stop: at 100% its first failed run decided the case, its second never started.
    assert failed_runs["total_failed"] == 1 and len(failed_runs["shown"]) == 1
    shown = failed_runs["shown"][0]
    assert "fetch_error" not in shown, shown
    assert json.loads(shown["output"]) == {"sum": 4}
    names = [t["name"] for t in shown["traces"]]
    assert names and all(t["status"] for t in shown["traces"]), shown["traces"]
    tool_meta = [json.loads(t["metadata_json"]) for t in shown["traces"]]
    assert any("math_ops" in json.dumps(m) for m in tool_meta), tool_meta
    # The one flaky run that failed is the one fetched, with its error.
    flaky = cases["two_of_three_at_67_percent"]["failed_runs"]
    assert flaky["total_failed"] == 1
    assert "call 3 fails on purpose" in json.dumps(flaky["shown"][0])
    assert "failed_runs" not in cases["adds_two_numbers"]  # fetched for failed cases only


def test_a_project_the_gate_cannot_judge_exits_2(gate_url: str, token: str, tmp_path: Path) -> None:
    # Valid to the CLI's own checks; the service refuses pip options in requirements.txt.
    project = calculator_project(tmp_path / "unjudgeable", failing=False)
    (project / "requirements.txt").write_text("--index-url http://127.0.0.1:9/simple\n")
    done = connic_test(gate_url, token, project)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "Test run errored:" in done.stderr
    assert "requirements.txt line 1" in done.stderr
