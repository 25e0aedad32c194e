"""A case's closure hash (gate_service/baselines/closure.py): it changes with everything that
can change the case's outcome, and stays equal across what cannot, so history compares like
with like and an incremental gate reuses only what it may."""

from __future__ import annotations

from pathlib import Path

import pytest

from gate_service.baselines.closure import case_key, closure_hashes, why_not_reusable
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


def hashes(root: Path, files: dict[str, str], **kw: str | None) -> dict[str, str]:
    project = write(root, files)
    report = validate_project(project)
    assert not report.problems, report.problems
    triggers = triggers_agents(project)
    agents = {c.agent_name for c in report.cases}
    modes = agent_modes(project, report.configs, agents, kw.get("mode"), triggers)
    got = closure_hashes(
        project,
        report.configs,
        report.cases,
        modes,
        guardrail_model=kw.get("guardrail_model"),
        triggers=triggers,
    )
    return {f"{c.agent_name}::{c.test_name}": h for c, h in zip(report.cases, got, strict=True)}


@pytest.fixture
def base(tmp_path: Path) -> dict[str, str]:
    return hashes(tmp_path / "base", BASE)


def changed(tmp_path: Path, **files: str) -> dict[str, str]:
    return hashes(tmp_path / "changed", {**BASE, **files})


def test_the_same_bundle_hashes_the_same_anywhere(tmp_path: Path, base: dict[str, str]) -> None:
    assert hashes(tmp_path / "again", BASE) == base
    assert len(set(base.values())) == len(base)  # every case its own


def test_a_shared_tool_changes_every_case(tmp_path: Path, base: dict[str, str]) -> None:
    after = changed(tmp_path, **{"tools/math_ops.py": BASE["tools/math_ops.py"] + "\n# edited\n"})
    assert all(after[k] != base[k] for k in base)


def test_an_agents_own_files_change_only_its_cases(tmp_path: Path, base: dict[str, str]) -> None:
    after = changed(
        tmp_path,
        **{"middleware/calc.py": "def before(content, context):\n    return content\n"},
    )
    assert after["calc::adds"] != base["calc::adds"]
    assert after["other::adds"] == base["other::adds"]
    assert after["writer::writes"] == base["writer::writes"]


def test_a_case_changes_alone_when_its_own_yaml_does(tmp_path: Path, base: dict[str, str]) -> None:
    suite = BASE["tests/calc.yaml"].replace("output.sum == 4", "output.sum >= 4")
    after = changed(tmp_path, **{"tests/calc.yaml": suite})
    assert after["calc::adds_more"] != base["calc::adds_more"]
    assert after["calc::adds"] == base["calc::adds"]


def test_a_scripted_model_and_a_mode_change_the_llm_agents_cases(
    tmp_path: Path, base: dict[str, str]
) -> None:
    after = changed(
        tmp_path,
        **{"tests/models/writer.py": BASE["tests/models/writer.py"].replace("hi", "hello")},
    )
    assert after["writer::writes"] != base["writer::writes"]
    assert after["calc::adds"] == base["calc::adds"]
    replayed = hashes(tmp_path / "replay", BASE, mode="replay")
    assert replayed["writer::writes"] != base["writer::writes"]


def test_the_judge_model_and_requirements_are_counted(tmp_path: Path, base: dict[str, str]) -> None:
    judged = hashes(tmp_path / "judge", BASE, guardrail_model="openai/gpt-4o-mini")
    assert judged["calc::adds"] != base["calc::adds"]
    required = changed(tmp_path, **{"requirements.txt": "six==1.16.0\n"})
    assert required["calc::adds"] != base["calc::adds"]


def test_a_trigger_anywhere_makes_every_agent_part_of_every_closure(
    tmp_path: Path, base: dict[str, str]
) -> None:
    trig = {
        **BASE,
        "tools/relay.py": "def relay(payload: dict) -> dict:\n    return {'via': 'trigger_agent'}\n",
    }
    before = hashes(tmp_path / "t1", trig)
    after = hashes(
        tmp_path / "t2",
        {**trig, "middleware/writer.py": "def before(content, context):\n    return content\n"},
    )
    assert after["calc::adds"] != before["calc::adds"]  # writer may be triggered from calc


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
