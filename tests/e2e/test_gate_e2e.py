"""Whole gates through the real service: HTTP in, Docker containers, Postgres, verdict out."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from gate_service.client.api import GateClient
from tests.fixtures.auth import ADMIN_TOKEN, bearer
from tests.fixtures.projects import (
    AGENTS,
    bundle_of,
    calculator_project,
    llm_project,
    requirements_project,
    unknown_agent_project,
    write,
)

pytestmark = pytest.mark.docker


def judge(url: str, data: bytes) -> dict[str, Any]:
    client = GateClient(url, token=ADMIN_TOKEN)
    try:
        gate = client.submit(data)
        return client.wait(gate["id"], timeout_s=600)
    finally:
        client.close()


def cases_by_name(gate: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["test_name"]: c for c in gate["cases"]}


def test_bundle_with_failing_cases_ends_failed(gate_url: str, tmp_path: Path) -> None:
    gate = judge(gate_url, bundle_of(calculator_project(tmp_path / "p", failing=True)))
    assert (gate["status"], gate["phase"]) == ("failed", "done")
    cases = cases_by_name(gate)
    assert {n: (c["passed"], c["successes"], c["runs"]) for n, c in cases.items()} == {
        "adds_two_numbers": (True, 2, 2),
        "slow_call_times_out": (True, 1, 1),
        "adds_then_doubles": (True, 1, 1),
        "two_of_three_at_66_percent": (True, 2, 3),
        "expects_the_wrong_sum": (False, 0, 2),
        "two_of_three_at_67_percent": (False, 2, 3),
    }
    wrong = cases["expects_the_wrong_sum"]
    assert wrong["agent_name"] == "calc"
    # Early stop: at 100% its first failed run decided the case, its second never started.
    assert wrong["failure_reason"].startswith("1 of 2 invocation(s) failed and 1 did not start")
    assert (wrong["invocations_run"], wrong["stopped_early"]) == (1, True)
    assert "`output.sum == 5` was false (seen: output.sum = 4)" in wrong["failure_reason"]
    flaky = cases["two_of_three_at_67_percent"]
    assert "1 of 3 invocation(s) failed (2 passed, 3 needed for 67%)" in flaky["failure_reason"]
    assert "call 3 fails on purpose" in flaky["failure_reason"]
    assert gate["failed_cases"] == 2 and gate["total_cases"] == 6
    run = httpx.get(
        f"{gate_url}/v1/runs/{wrong['agent_run_ids'][0]}", headers=bearer(ADMIN_TOKEN)
    ).json()
    assert run["output"] == {"sum": 4}
    assert [s["type"] for s in run["traces"]] == ["agent", "tool_call", "outbound", "log"]
    assert run["traces"][2]["metadata"]["delivered"] is False
    assert run["traces"][3]["metadata"]["message"] == "adding 2 2"


def test_all_passing_bundle_ends_passed(gate_url: str, tmp_path: Path) -> None:
    gate = judge(gate_url, bundle_of(calculator_project(tmp_path / "p", failing=False)))
    assert (gate["status"], gate["phase"]) == ("passed", "done")
    assert gate["passed_cases"] == gate["total_cases"] == 4
    assert gate["failure_reason"] is None
    assert all(c["passed"] for c in gate["cases"])


def test_unknown_agent_ends_error_naming_suite_and_agent(gate_url: str, tmp_path: Path) -> None:
    gate = judge(gate_url, bundle_of(unknown_agent_project(tmp_path / "p")))
    assert (gate["status"], gate["phase"]) == ("error", "validating")
    assert "tests/ghost.yaml" in gate["failure_reason"]
    assert "agent 'ghost'" in gate["failure_reason"]


HOSTILE = {
    "agents/probe.yaml": """
        version: "1.0"
        name: probe
        description: Looks at its own sandbox.
        type: tool
        tool_name: hostile.probe
    """,
    "agents/hog.yaml": """
        version: "1.0"
        name: hog
        description: Allocates without end.
        type: tool
        tool_name: hostile.hog
    """,
    "agents/bomb.yaml": """
        version: "1.0"
        name: bomb
        description: Forks without end.
        type: tool
        tool_name: hostile.bomb
    """,
    "tools/hostile.py": """
        import os
        import socket


        def probe(payload: dict) -> dict:
            out = {"uid": os.getuid()}
            try:
                socket.create_connection(("127.0.0.1", 8080), timeout=2).close()
                out["network"] = "open"
            except OSError as exc:
                out["network"] = str(exc)
            try:
                open("/bundle/tools/planted.py", "w").write("x")
                out["bundle_writable"] = True
            except OSError:
                out["bundle_writable"] = False
            try:
                open("/etc/planted", "w").write("x")
                out["root_writable"] = True
            except OSError:
                out["root_writable"] = False
            with open("/proc/self/status") as fh:
                caps = [l for l in fh if l.startswith("CapEff")][0].split()[1]
            out["caps"] = caps
            return out


        def hog(payload: dict) -> dict:
            blocks = []
            while True:
                blocks.append(bytearray(50 * 1024 * 1024))


        def bomb(payload: dict) -> dict:
            while True:
                try:
                    os.fork()
                except OSError:
                    pass
    """,
    "tests/probe.yaml": """
        tests:
          - name: sandbox_is_locked_down
            payload: '{}'
            expected_result: >-
              output.uid != 0 and output.network != "open" and not output.bundle_writable
              and not output.root_writable and output.caps == "0000000000000000"
    """,
    "tests/hog.yaml": """
        tests:
          - name: memory_hog_is_contained
            payload: '{}'
            timeout_s: 30
    """,
    "tests/bomb.yaml": """
        tests:
          - name: fork_bomb_is_contained
            payload: '{}'
            timeout_s: 5
    """,
}


def test_hostile_code_is_contained_and_judged(gate_url: str, tmp_path: Path) -> None:
    gate = judge(gate_url, bundle_of(write(tmp_path / "p", HOSTILE)))
    cases = cases_by_name(gate)
    probe = cases["sandbox_is_locked_down"]
    assert probe["passed"], probe["failure_reason"]
    hog = cases["memory_hog_is_contained"]
    assert (hog["passed"], hog["status"]) == (False, "failed")
    # The kernel may kill just the invocation or the whole container; either is reported.
    assert "out of memory" in hog["failure_reason"] or "signal 9" in hog["failure_reason"]
    bomb = cases["fork_bomb_is_contained"]
    # Under gVisor the bomb meets GATE_CASE_GVISOR_TASKS in gVisor's kernel, and the host
    # pids limit is sized for what those cost, so gVisor's kernel outlives it and the runner
    # judges the case, as under runc.
    assert (bomb["passed"], bomb["status"]) == (False, "failed"), bomb["failure_reason"]
    assert "timed out after 5 s" in bomb["failure_reason"]
    assert gate["status"] == "failed"


def test_requirements_install_from_the_configured_wheelhouse(gate_url: str, tmp_path: Path) -> None:
    gate = judge(gate_url, bundle_of(requirements_project(tmp_path / "p", "gate-e2e-demo==1.0\n")))
    assert gate["status"] == "passed", gate["failure_reason"]


def test_requirement_options_are_refused(gate_url: str, tmp_path: Path) -> None:
    reqs = "--index-url http://127.0.0.1:9/simple\ngate-e2e-demo==1.0\n"
    gate = judge(gate_url, bundle_of(requirements_project(tmp_path / "p", reqs)))
    assert (gate["status"], gate["phase"]) == ("error", "validating")
    assert "requirements.txt line 1" in gate["failure_reason"]


def test_cancel_stops_a_running_gate_and_removes_its_containers(
    gate_url: str, tmp_path: Path
) -> None:
    import time

    import docker

    sleeper = {
        **AGENTS,
        "tests/calc.yaml": """
            tests:
              - name: sleeps_for_two_minutes
                payload: '{"a": 1, "b": 1, "sleep": 120}'
                timeout_s: 300
        """,
    }
    client = GateClient(gate_url, token=ADMIN_TOKEN)
    try:
        gate_id = client.submit(bundle_of(write(tmp_path / "p", sleeper)))["id"]
        deadline = time.monotonic() + 120
        while (
            client.gate(gate_id)["cases"][:1] == []
            or client.gate(gate_id)["cases"][0]["status"] != "running"
        ):
            assert time.monotonic() < deadline, client.gate(gate_id)
            time.sleep(0.2)
        time.sleep(1)  # let the container start
        engine = docker.from_env()
        label = {"label": f"gate.gate_id={gate_id}"}
        assert engine.containers.list(filters=label), "the case container should be running"
        assert (
            httpx.post(
                f"{gate_url}/v1/gates/{gate_id}/cancel", headers=bearer(ADMIN_TOKEN)
            ).status_code
            == 200
        )
        # The case sleeps 120 s; ending within the 60 s wait means the cancel stopped it.
        final = client.wait(gate_id, timeout_s=60)
        assert final["status"] == "cancelled"
        assert engine.containers.list(all=True, filters=label, ignore_removed=True) == []
        engine.close()
    finally:
        client.close()


def test_scripted_llm_agent_with_tools_hooks_and_a_child_agent(
    gate_url: str, tmp_path: Path
) -> None:
    gate = judge(gate_url, bundle_of(llm_project(tmp_path / "p")))
    assert gate["status"] == "passed", [
        (c["test_name"], c["failure_reason"]) for c in gate["cases"]
    ]
    assert gate["total_cases"] == 8


def test_the_seed_documents_examples_get_their_expected_verdicts(
    gate_url: str, tmp_path: Path
) -> None:
    from tests.fixtures.seed_bundle import EXPECTED, seed_bundle

    gate = judge(gate_url, bundle_of(seed_bundle(tmp_path / "p")))
    assert gate["status"] == "failed"  # two examples are meant to fail
    verdicts = {c["test_name"]: (c["passed"], c["failure_reason"]) for c in gate["cases"]}
    assert set(verdicts) == set(EXPECTED)
    for name, (passes, fragment) in EXPECTED.items():
        passed, reason = verdicts[name]
        assert passed is passes, (name, reason)
        if fragment:
            assert fragment in reason, (name, reason)
