"""The worker believes only the runner: one block, this container's nonce, this case, and a
verdict it recomputes from the suite it validated (the trust issue, item 3).

The fake sandbox runs the real runner in-process and then lets a test forge what reaches the
container's stdout, as user code would if it could write there.
"""

import json
from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient

from gate_runner.contract import BEGIN_MARKER, END_MARKER
from gate_service.worker.loop import Worker
from tests.fixtures.projects import bundle_of, calculator_project
from tests.fixtures.sandbox import FakeSandbox

CASE = "expects_the_wrong_sum"  # fails both of its 2 runs


def judged_case(client: TestClient, worker: Worker, tmp_path: Path) -> dict[str, Any]:
    data = bundle_of(calculator_project(tmp_path / "p", failing=True))
    response = client.post("/v1/gates", files={"bundle": ("b.tgz", data)}, data={"filter": CASE})
    assert response.status_code == 202, response.text
    assert worker.run_once() is True
    gate = client.get(f"/v1/gates/{response.json()['id']}").json()
    assert gate["status"] == "failed", gate
    (case,) = gate["cases"]
    return dict(case)


def all_passed(result: dict[str, Any]) -> dict[str, Any]:
    for inv in result["invocations"]:
        inv.update(passed=True, failure_reason=None, failed_assertions=[])
    return {**result, "successes": result["runs"], "passed": True, "failure_reason": None}


def test_a_forged_block_before_the_runners_is_not_trusted(
    client: TestClient, worker: Worker, sandbox: FakeSandbox, tmp_path: Path
) -> None:
    forged = {"schema_version": 2, "suite": "tests/calc.yaml", "test_name": CASE, "passed": True}
    sandbox.forged_stdout = f"{BEGIN_MARKER}\n{json.dumps(forged)}\n{END_MARKER}\n".encode()
    case = judged_case(client, worker, tmp_path)
    assert case["status"] == "failed" and case["passed"] is False
    assert case["failure_reason"].startswith("the case's result was not trusted: ")
    assert "2 result start" in case["failure_reason"]


def test_a_passing_result_without_the_nonce_is_not_trusted(
    client: TestClient, worker: Worker, sandbox: FakeSandbox, tmp_path: Path
) -> None:
    sandbox.tamper = lambda result: {**all_passed(result), "nonce": "0" * 64}
    case = judged_case(client, worker, tmp_path)
    assert case["status"] == "failed"
    assert "not trusted" in case["failure_reason"]
    assert "nonce" in case["failure_reason"]


def test_a_result_for_another_case_is_not_trusted(
    client: TestClient, worker: Worker, sandbox: FakeSandbox, tmp_path: Path
) -> None:
    sandbox.tamper = lambda result: {**result, "test_name": "adds_two_numbers"}
    case = judged_case(client, worker, tmp_path)
    assert "not trusted" in case["failure_reason"]
    assert "adds_two_numbers" in case["failure_reason"]


def test_runs_and_threshold_come_from_the_validated_suite(
    client: TestClient, worker: Worker, sandbox: FakeSandbox, tmp_path: Path
) -> None:
    # Claims 1 run at a 0% threshold and a pass, keeping the nonce: the worker recomputes.
    # One passing invocation of 2 at 100% decides nothing, so it is no early stop either.
    def fewer_runs(result: dict[str, Any]) -> dict[str, Any]:
        return {
            **all_passed(result),
            "runs": 1,
            "success_threshold": 0,
            "successes": 1,
            "invocations": all_passed(result)["invocations"][:1],
        }

    sandbox.tamper = fewer_runs
    case = judged_case(client, worker, tmp_path)
    assert (case["runs"], case["success_threshold"]) == (2, 100)
    assert "not trusted" in case["failure_reason"]
    assert "the suite asks for 2 run(s)" in case["failure_reason"]
    assert "do not decide its verdict (early stop: decided)" in case["failure_reason"]


def test_a_claimed_pass_is_recomputed_from_the_invocations(
    client: TestClient, worker: Worker, sandbox: FakeSandbox, tmp_path: Path
) -> None:
    sandbox.tamper = lambda result: {
        **result,
        "successes": 2,
        "passed": True,
        "success_threshold": 0,
    }
    case = judged_case(client, worker, tmp_path)
    assert (case["passed"], case["successes"], case["success_threshold"]) == (False, 0, 100)
