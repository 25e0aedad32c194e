"""A case's closure hash (gate_service/baselines/closure.py): it changes with everything that
can change the case's outcome, and stays equal across what cannot, so history compares like
with like and an incremental gate reuses only what it may."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gate_service.baselines.closure import (
    Closure,
    case_key,
    closure_hashes,
    environment_digest,
    why_not_reusable,
)
from gate_service.bundles.live_models import agent_modes, triggers_agents
from gate_service.bundles.suites import validate_project
from tests.fixtures.projects import write

BASE = {
    "agents/calc.yaml": """
        version: "1.0"
        name: calc
        description: Adds.
        type: tool
        tool_name: math_ops.add
    """,
    "agents/other.yaml": """
        version: "1.0"
        name: other
        description: Adds too.
        type: tool
        tool_name: math_ops.add
    """,
    "agents/writer.yaml": """
        version: "1.0"
        name: writer
        description: Writes.
        model: openai/gpt-4o
        system_prompt: Write.
    """,
    "tools/math_ops.py": """
        def add(payload: dict) -> dict:
            return {"sum": payload["a"] + payload["b"]}
    """,
    "tests/calc.yaml": """
        tests:
          - name: adds
            payload: '{"a": 1, "b": 2}'
            expected_result: output.sum == 3
          - name: adds_more
            payload: '{"a": 2, "b": 2}'
            expected_result: output.sum == 4
    """,
    "tests/other.yaml": """
        tests:
          - name: adds
            payload: '{"a": 1, "b": 2}'
    """,
    "tests/writer.yaml": """
        tests:
          - name: writes
            payload: hello
    """,
    "tests/models/writer.py": """
        def respond(messages, tools, context):
            return {"content": "hi"}
    """,
}


def closures(
    root: Path,
    files: dict[str, str],
    *,
    mode: str | None = None,
    guardrail_model: str | None = None,
    verdict_rule: str = "threshold",
    environment: str = "env",
) -> dict[str, Closure]:
    project = write(root, files)
    report = validate_project(project)
    assert not report.problems, report.problems
    triggers = triggers_agents(project)
    agents = {c.agent_name for c in report.cases}
    modes = agent_modes(project, report.configs, agents, mode, triggers)
    got = closure_hashes(
        project,
        report.cases,
        modes,
        guardrail_model=guardrail_model,
        verdict_rule=verdict_rule,
        environment=environment,
    )
    return {f"{c.agent_name}::{c.test_name}": h for c, h in zip(report.cases, got, strict=True)}


def hashes(root: Path, files: dict[str, str], **kw: Any) -> dict[str, str]:
    return {name: c.closure for name, c in closures(root, files, **kw).items()}


@pytest.fixture
def base(tmp_path: Path) -> dict[str, str]:
    return hashes(tmp_path / "base", BASE)


def changed(tmp_path: Path, **files: str) -> dict[str, str]:
    return hashes(tmp_path / "changed", {**BASE, **files})


def test_the_same_bundle_hashes_the_same_anywhere(tmp_path: Path, base: dict[str, str]) -> None:
    assert hashes(tmp_path / "again", BASE) == base
    assert len(set(base.values())) == len(base)  # every case its own


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("tools/math_ops.py", BASE["tools/math_ops.py"] + "\n# edited\n"),
        # Outside every named folder, and still importable: the root is on sys.path.
        ("lib/pricing.py", "RATE = 2\n"),
        ("middleware/calc.py", "def before(content, context):\n    return content\n"),
        ("tests/models/writer.py", "def respond(m, t, c):\n    return {'content': 'x'}\n"),
        ("tests/files/data.txt", "read by path, named by no case\n"),
        ("requirements.txt", "six==1.16.0\n"),
    ],
)
def test_any_file_but_the_suites_changes_every_case(
    tmp_path: Path, base: dict[str, str], path: str, body: str
) -> None:
    after = changed(tmp_path, **{path: body})
    assert all(after[k] != base[k] for k in base)


def test_a_case_changes_alone_when_its_own_yaml_does(tmp_path: Path, base: dict[str, str]) -> None:
    suite = BASE["tests/calc.yaml"].replace("output.sum == 4", "output.sum >= 4")
    after = changed(tmp_path, **{"tests/calc.yaml": suite})
    assert after["calc::adds_more"] != base["calc::adds_more"]
    assert after["calc::adds"] == base["calc::adds"]
    assert after["writer::writes"] == base["writer::writes"]


def test_a_named_fixture_is_part_of_its_cases_definition_only(tmp_path: Path) -> None:
    files = {
        **BASE,
        "tests/other.yaml": """
            tests:
              - name: adds
                payload: '{"a": 1, "b": 2}'
                files: [data.txt]
        """,
        "tests/files/data.txt": "one\n",
    }
    before = closures(tmp_path / "a", files)
    after = closures(tmp_path / "b", {**files, "tests/files/data.txt": "two\n"})
    assert after["other::adds"].definition != before["other::adds"].definition
    assert after["calc::adds"].definition == before["calc::adds"].definition


def test_what_reaches_the_cases_from_outside_the_bundle_is_counted(
    tmp_path: Path, base: dict[str, str]
) -> None:
    for kw in (
        {"guardrail_model": "openai/gpt-4o-mini"},
        {"verdict_rule": "wilson"},
        {"environment": "another secret"},
        {"mode": "replay"},
    ):
        other = hashes(tmp_path / str(len(kw)) / next(iter(kw)), BASE, **kw)
        assert all(other[k] != base[k] for k in base), kw


def test_the_environment_digest_reads_no_value_and_sees_every_change() -> None:
    one = environment_digest([("OPENAI_API_KEY", "c1")], {"REGION": "eu"})
    assert environment_digest([("OPENAI_API_KEY", "c1")], {"REGION": "eu"}) == one
    assert environment_digest([("OPENAI_API_KEY", "c2")], {"REGION": "eu"}) != one
    assert environment_digest([("OPENAI_API_KEY", "c1")], {"REGION": "us"}) != one
    assert environment_digest([], {"REGION": "eu"}) != one


def test_case_keys_separate_their_parts() -> None:
    assert case_key("tests/a.yaml", "b", "c") != case_key("tests/a.yaml", "bc", "")
    assert len(case_key("s", "a", "t")) == 64


def test_only_deterministic_agents_may_be_reused(tmp_path: Path) -> None:
    project = write(
        tmp_path / "p",
        {
            **BASE,
            "agents/live.yaml": """
                version: "1.0"
                name: live
                description: Calls its model.
                model: openai/gpt-4o
                system_prompt: Go.
            """,
            "agents/reader.yaml": """
                version: "1.0"
                name: reader
                description: Reads pages.
                model: openai/gpt-4o
                system_prompt: Read.
                tools: [web_read_page]
            """,
            "tests/models/reader.py": BASE["tests/models/writer.py"],
        },
    )
    report = validate_project(project)
    configs = report.configs

    def why(agent: str, mode: str | None = None) -> str | None:
        return why_not_reusable(project, configs, agent, mode, None, False)

    assert why("calc") is None
    assert why("writer") is None  # scripted
    assert why("live") == "agent 'live' calls openai/gpt-4o live"
    assert why("writer", "live") == "agent 'writer' calls openai/gpt-4o live"
    assert why("reader") == "agent 'reader' reads web pages"
