"""Invalid suites end the gate `error` in `validating`, before any image is built, with a
`problems` list that names every problem with its file and case."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session, sessionmaker

from gate_service.config import Settings
from gate_service.worker.handler import WorkerContext
from gate_service.worker.loop import Worker
from tests.fixtures.projects import AGENTS, bundle_of, calculator_project, write
from tests.fixtures.sandbox import FakeSandbox


@pytest.fixture
def judge(
    client: TestClient, settings: Settings, sessions: sessionmaker[Session], tmp_path: Path
) -> Any:
    sandbox = FakeSandbox()
    worker = Worker(
        WorkerContext(settings=settings, sessions=sessions, sandbox=sandbox, stop=threading.Event())
    )

    def run(files: dict[str, str]) -> dict[str, Any]:
        root = write(tmp_path / f"p{len(list(tmp_path.iterdir()))}", {**AGENTS, **files})
        response = client.post("/v1/gates", files={"bundle": ("b.tgz", bundle_of(root))})
        assert response.status_code == 202, response.text
        worker.run_once()
        gate: dict[str, Any] = client.get(f"/v1/gates/{response.json()['id']}").json()
        return gate

    run.sandbox = sandbox  # type: ignore[attr-defined]
    return run


def problems(gate: dict[str, Any]) -> list[tuple[str, str | None, str]]:
    assert (gate["status"], gate["phase"]) == ("error", "validating"), gate
    return [(p["file"], p["case"], p["message"]) for p in gate["problems"]]


SUITE_ERRORS = {
    "yaml_syntax_error": ("tests/calc.yaml", "tests: [\n  - name: x\n", None, "not valid YAML"),
    "suite_not_a_mapping": (
        "tests/calc.yaml",
        "- just\n- a list\n",
        None,
        "must be a YAML mapping",
    ),
    "empty_tests_list": ("tests/calc.yaml", "tests: []\n", None, "non-empty list"),
    "case_without_name": (
        "tests/calc.yaml",
        "tests:\n  - payload: x\n",
        "#1",
        "name: Field required",
    ),
    "neither_payload_nor_builder": (
        "tests/calc.yaml",
        "tests:\n  - name: a\n",
        "a",
        "either `payload` or `builder`",
    ),
    "file_with_a_path": (
        "tests/calc.yaml",
        "tests:\n  - name: a\n    payload: x\n    files: [../secret.txt]\n",
        "a",
        "bare filename",
    ),
    "repeated_file": (
        "tests/calc.yaml",
        "tests:\n  - name: a\n    payload: x\n    files: [f.txt, f.txt]\n",
        "a",
        "files",
    ),
    "runs_out_of_range": (
        "tests/calc.yaml",
        "tests:\n  - name: a\n    payload: x\n    runs: 101\n",
        "a",
        "runs: Input should be less than or equal to 100",
    ),
    "threshold_out_of_range": (
        "tests/calc.yaml",
        "defaults: {success_threshold: 0}\ntests:\n  - name: a\n    payload: x\n",
        None,
        "defaults.success_threshold",
    ),
    "timeout_out_of_range": (
        "tests/calc.yaml",
        "tests:\n  - name: a\n    payload: x\n    timeout_s: 0\n",
        "a",
        "timeout_s",
    ),
    "two_key_tool_call_mapping": (
        "tests/calc.yaml",
        "tests:\n  - name: a\n    payload: x\n    expected_tool_calls: [{add: 'invocations == 1', sub: 'invocations == 1'}]\n",
        "a",
        "exactly one key",
    ),
    "approval_decision_extra_key": (
        "tests/calc.yaml",
        "tests:\n  - name: a\n    payload: x\n    approval_decisions: [{tool: t.f, decision: approve, color: red}]\n",
        "a",
        "Extra inputs are not permitted",
    ),
    "missing_fixture": (
        "tests/calc.yaml",
        "tests:\n  - name: a\n    payload: x\n    files: [invoice.pdf]\n",
        "a",
        "tests/files/invoice.pdf does not exist",
    ),
    "missing_builder": (
        "tests/calc.yaml",
        "tests:\n  - name: a\n    builder: make_charge\n",
        "a",
        "tests/builders/make_charge.py does not exist",
    ),
    "missing_mocks_module": (
        "tests/calc.yaml",
        "defaults: {mocks: billing}\ntests:\n  - name: a\n    payload: x\n",
        "a",
        "tests/mocks/billing.py does not exist",
    ),
    "yaml_alias_bomb": (
        "tests/calc.yaml",
        "a: &a [x, x, x, x, x, x, x, x, x, x]\n"
        + "".join(
            f"{c}: &{c} [*{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}]\n"
            for p, c in zip("abcdefgh", "bcdefghi", strict=True)
        )
        + "tests:\n  - name: a\n    payload: x\n    builder_args: {big: *i}\n",
        None,
        "expands to 2345679030 nodes",
    ),
    "nesting_too_deep": (
        "tests/calc.yaml",
        "tests: " + "[" * 5000 + "]" * 5000 + "\n",
        None,
        "nested too deeply",
    ),
    "impossible_date": (
        "tests/calc.yaml",
        "version: 2023-02-30\ntests:\n  - name: a\n    payload: x\n",
        None,
        "not valid YAML",
    ),
    "expression_with_a_call": (
        "tests/calc.yaml",
        "tests:\n  - name: a\n    payload: x\n    expected_result: len(output) > 1\n",
        "a",
        "function and method calls not allowed at column 1",
    ),
    "expression_with_arithmetic": (
        "tests/calc.yaml",
        "tests:\n  - name: a\n    payload: x\n    expected_tool_calls: [{add: 'invocations + 1 == 2'}]\n",
        "a",
        "arithmetic not allowed",
    ),
    "expression_with_an_unknown_root": (
        "tests/calc.yaml",
        "tests:\n  - name: a\n    payload: x\n    expected_result: params.x == 1\n",
        "a",
        "unknown name 'params'",
    ),
    "expression_mixing_params_and_invocations": (
        "tests/calc.yaml",
        "tests:\n  - name: a\n    payload: x\n    expected_tool_calls: [{add: 'params.a == invocations'}]\n",
        "a",
        "not both",
    ),
    "child_payload_expression_dunder": (
        "tests/calc.yaml",
        "tests:\n  - name: a\n    payload: x\n    expected_child_agents:\n      calc: {expected_payload: payload.__class__}\n",
        "a",
        "names starting with _",
    ),
    "unknown_agent": (
        "tests/ghost.yaml",
        "tests:\n  - name: a\n    payload: x\n",
        "a",
        "agent 'ghost', which does not exist",
    ),
    "unknown_agent_by_agent_key": (
        "tests/x.yaml",
        "agent: nobody\ntests:\n  - name: a\n    payload: x\n",
        "a",
        "agent 'nobody'",
    ),
}


@pytest.mark.parametrize("name", sorted(SUITE_ERRORS))
def test_suite_error_is_reported_with_file_and_case(name: str, judge: Any) -> None:
    path, body, case, fragment = SUITE_ERRORS[name]
    found = problems(judge({path: body}))
    assert any(f == path and c == case and fragment in m for f, c, m in found), found
    assert judge.sandbox.images == {}, "no image may be built for an invalid bundle"


def test_every_problem_is_listed_not_only_the_first(judge: Any) -> None:
    gate = judge(
        {
            "tests/calc.yaml": """
                tests:
                  - name: dup
                    payload: x
                  - name: dup
                    payload: y
                  - name: no_input
                  - name: bad_runs
                    payload: x
                    runs: 0
            """,
            "tests/ghost.yaml": "tests:\n  - name: boo\n    payload: x\n",
            "tests/other.yaml": "agent: calc\ntests:\n  - name: fine\n    payload: x\n    files: [missing.bin]\n",
        }
    )
    found = problems(gate)
    assert {(f, c) for f, c, _ in found} == {
        ("tests/calc.yaml", "dup"),
        ("tests/calc.yaml", "no_input"),
        ("tests/calc.yaml", "bad_runs"),
        ("tests/ghost.yaml", "boo"),
        ("tests/other.yaml", "fine"),
    }
    assert any("duplicate case name 'dup'" in m for _, _, m in found)
    assert gate["failure_reason"].startswith(f"{len(found)} problem(s) in the bundle's suites")


def test_support_folders_are_not_suites(judge: Any) -> None:
    gate = judge(
        {
            "tests/calc.yaml": 'tests:\n  - name: a\n    payload: \'{"a": 1, "b": 2}\'\n',
            "tests/files/data.yaml": "not: a suite\n",
            "tests/mocks/m.py": "",
            "tests/builders/b.py": "",
        }
    )
    assert gate["status"] == "passed", gate


def test_no_suites_at_all_is_an_error(judge: Any) -> None:
    found = problems(judge({}))
    assert found == [
        ("tests/", None, "no test suites found under tests/ (a gate needs at least one case)")
    ]


def test_one_bad_case_does_not_hide_the_other_cases_problems(judge: Any) -> None:
    found = problems(
        judge(
            {
                "tests/calc.yaml": """
                    tests:
                      - name: a
                      - name: b
                        files: [nope.pdf]
                        builder: nob
                """,
                "tests/ghost.yaml": "tests:\n  - name: c\n  - name: d\n    payload: x\n",
            }
        )
    )
    messages = {(c, m.split(" does not exist")[0]) for _, c, m in found}
    assert ("b", "fixture tests/files/nope.pdf") in messages
    assert ("b", "builder tests/builders/nob.py") in messages
    assert any(c == "d" and "agent 'ghost'" in m for _, c, m in found)
    assert any(c == "c" and "`payload` or `builder`" in m for _, c, m in found)


def test_a_filter_that_selects_no_case_names_the_filter(
    client: TestClient, settings: Settings, sessions: sessionmaker[Session], tmp_path: Path
) -> None:
    worker = Worker(
        WorkerContext(
            settings=settings, sessions=sessions, sandbox=FakeSandbox(), stop=threading.Event()
        )
    )
    data = bundle_of(calculator_project(tmp_path / "p", failing=False))
    response = client.post("/v1/gates", files={"bundle": ("b.tgz", data)}, data={"filter": "zzz"})
    assert response.status_code == 202, response.text
    worker.run_once()
    gate = client.get(f"/v1/gates/{response.json()['id']}").json()
    assert problems(gate) == [("tests/", None, "no case name contains the filter 'zzz'")]


def test_a_gate_carries_warnings_for_what_its_agents_use_and_it_cannot_honour(
    judge: Any,
) -> None:
    gate = judge(
        {
            "agents/calc.yaml": """
                version: "1.0"
                name: calc
                description: Adds two numbers, in a session the gate does not keep.
                type: tool
                tool_name: math_ops.add
                session: true
                timeout: 30
            """,
            "tests/calc.yaml": 'tests:\n  - name: a\n    payload: \'{"a": 1, "b": 2}\'\n',
        }
    )
    assert gate["status"] == "passed", gate
    assert gate["problems"] == []
    assert [(w["file"], w["agent"], w["key"], w["support"]) for w in gate["warnings"]] == [
        ("agents/calc.yaml", "calc", "session", "partial"),
        ("agents/calc.yaml", "calc", "timeout", "partial"),
    ]
    assert gate["warnings"][0]["message"].startswith("session is partial: ")
