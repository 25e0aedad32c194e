"""`gate coverage` reports what `connic test --coverage --json` reports, to the last float.

Every project the tests build (the fixture builders, and any project kept on disk under
tests/) and a set of edge-case projects made here are given to both: the format's CLI runs in
a process of its own (a fork of this one) with the project as its working directory, ours
runs in this process from another directory, and the two JSON documents must be equal.
"""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from gate_service.coverage import compute_coverage, render_coverage
from tests.fixtures import escape, leaky, outputs, projects, seed_bundle
from tests.fixtures.forked import run_forked
from tests.fixtures.projects import write

REPO = Path(__file__).resolve().parents[2]
TESTS = REPO / "tests"


def format_cli(
    project: Path, *, extra_env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """`connic test --coverage --json` run inside ``project`` by the installed format CLI.

    In a fork of this process (tests/fixtures/forked.py): a process of its own, with the
    project as its working directory, without paying a new interpreter's start each time.
    """
    from connic.cli import main

    argv = ["connic", "test", "--coverage", "--json"]
    return run_forked(
        lambda: main(argv[1:], prog_name="connic"),
        cwd=project,
        env={**os.environ, "CONNIC_NO_UPDATE_CHECK": "1", **(extra_env or {})},
        argv=argv,
    )


def format_report(project: Path, **kwargs: Any) -> dict[str, Any]:
    done = format_cli(project, **kwargs)
    assert done.stdout.strip(), done.stderr
    report: dict[str, Any] = json.loads(done.stdout)
    return report


def assert_parity(project: Path) -> dict[str, Any]:
    theirs = format_report(project)
    ours = compute_coverage(project)
    assert ours == theirs
    # Equal as JSON too: the same keys, the same floats once printed.
    assert json.dumps(ours, indent=2) == json.dumps(theirs, indent=2)
    return ours


# ---------------------------------------------------------------- every project of the tests

# Each project builder of tests/fixtures with the arguments it needs besides the root.
BUILDERS: dict[str, Callable[[Path], object]] = {
    "calculator-passing": lambda root: projects.calculator_project(root, failing=False),
    "calculator-failing": lambda root: projects.calculator_project(root, failing=True),
    "unknown-agent": projects.unknown_agent_project,
    "requirements": lambda root: projects.requirements_project(root, "gate_e2e_demo==1.0\n"),
    "llm": projects.llm_project,
    "live": projects.live_project,
    "guarded": projects.guarded_project,
    "builder": projects.builder_project,
    "mock": projects.mock_project,
    "approval": projects.approval_project,
    "results-page": lambda root: projects.results_page_project(root, wait_seconds=2),
    "many-causes": lambda root: projects.many_causes_project(root, live=True),
    "seed-bundle": seed_bundle.seed_bundle,
    "leaky": leaky.leaky_project,
    "tool-cases": projects.tool_cases_project,
    "sleepy-passing": lambda root: projects.sleepy_project(root, 3, failing=False),
    "sleepy-failing": lambda root: projects.sleepy_project(root, 3, failing=True),
    "big-output": outputs.big_output_project,
    "unstorable-output": outputs.unstorable_output_project,
    "escape": lambda root: escape.escape_project(root, "sk-parity-0001", [("127.0.0.1", 9)]),
}
BUILDER_FUNCTIONS: list[Callable[..., object]] = [
    projects.calculator_project,
    projects.unknown_agent_project,
    projects.requirements_project,
    projects.llm_project,
    projects.live_project,
    projects.guarded_project,
    projects.builder_project,
    projects.mock_project,
    projects.approval_project,
    projects.results_page_project,
    projects.many_causes_project,
    seed_bundle.seed_bundle,
    leaky.leaky_project,
    outputs.big_output_project,
    outputs.unstorable_output_project,
    projects.tool_cases_project,
    projects.sleepy_project,
    escape.escape_project,
]


def on_disk_projects() -> list[Path]:
    """Projects kept as folders under tests/ (a bundle fixture): agents/ beside tests/*.yaml."""
    found = []
    for agents in sorted(TESTS.rglob("agents")):
        root = agents.parent
        if agents.is_dir() and any((root / "tests").glob("**/*.yaml")):
            found.append(root)
    return found


def test_every_fixture_project_builder_is_compared() -> None:
    """A new project builder anywhere in tests/fixtures joins the parity test, or this fails."""
    compared = {(f.__module__, f.__name__) for f in BUILDER_FUNCTIONS}
    for source in sorted((TESTS / "fixtures").glob("*.py")):
        module = f"tests.fixtures.{source.stem}"
        for node in ast.parse(source.read_text()).body:
            if isinstance(node, ast.FunctionDef) and (
                node.name.endswith("_project") or node.name == "seed_bundle"
            ):
                assert (module, node.name) in compared, f"{module}.{node.name} is not in BUILDERS"


# Built by a fixture builder (a name) or kept on disk (a path); none is on disk today.
ALL_PROJECTS: list[str | Path] = [*sorted(BUILDERS), *on_disk_projects()]


@pytest.mark.slow
@pytest.mark.parametrize(
    "project",
    ALL_PROJECTS,
    ids=lambda p: p if isinstance(p, str) else p.relative_to(TESTS).as_posix(),
)
def test_project_of_the_tests_matches_the_format(project: str | Path, tmp_path: Path) -> None:
    if isinstance(project, str):
        root = tmp_path / project
        root.mkdir()
        BUILDERS[project](root)
    else:
        root = project
    report = assert_parity(root)
    assert report["agents"], "a project of the tests has agents"


# ---------------------------------------------------------------- edge cases made here

TOOLS = {
    "tools/calculator.py": """
        def add(a: int, b: int) -> int:
            \"\"\"Add.\"\"\"
            return a + b


        def subtract(a: int, b: int) -> int:
            \"\"\"Subtract.\"\"\"
            return a - b


        def multiply(a: int, b: int) -> int:
            \"\"\"Multiply.\"\"\"
            return a * b


        def body(payload: dict) -> dict:
            return payload
    """,
    "tools/text/fmt.py": """
        def upper(text: str) -> str:
            \"\"\"Upper-case.\"\"\"
            return text.upper()
    """,
}


def llm_agent(name: str, tools: list[str], discoverable: list[str] | None = None) -> str:
    body = (
        f'version: "1.0"\nname: {name}\ndescription: d\nmodel: openai/gpt-4o\n'
        f"system_prompt: s\ntools: {json.dumps(tools)}\n"
    )
    if discoverable:
        body += f"discoverable_tools: {json.dumps(discoverable)}\n"
    return body


MIXED = {
    **TOOLS,
    "agents/math-agent.yaml": llm_agent(
        "math-agent",
        ["calculator.add", "calculator.subtract", "calculator.multiply", "web_search"],
        discoverable=["text.fmt.upper"],
    ),
    # An A/B variant of math-agent: left out of the report.
    "agents/math-agent-test-b.yaml": llm_agent("math-agent-test-b", ["calculator.add"]),
    "agents/adder.yaml": """
        version: "1.0"
        name: adder
        description: A tool agent.
        type: tool
        tool_name: calculator.body
    """,
    "agents/flow.yaml": """
        version: "1.0"
        name: flow
        description: A sequential agent.
        type: sequential
        agents: [adder, math-agent]
    """,
    "agents/untested.yaml": llm_agent("untested", ["calculator.subtract"]),
    "agents/nested/deep.yaml": llm_agent("deep", ["text.fmt.upper"]),
    "tests/math-agent.yaml": """
        tests:
          - name: adds
            payload: add 1 and 2
            expected_tool_calls:
              - add
              - calculator.subtract: invocations >= 1
            expected_no_tool_calls: [calculator.multiply]
            expected_child_agents:
              adder:
                expected_tool_calls: [calculator.multiply]
    """,
    # A second suite for the same agent, in a subfolder, picked by `agent:`.
    "tests/more/other-name.yaml": """
        agent: math-agent
        tests:
          - name: ordered
            payload: shout
            expected_tool_call_order: [upper]
    """,
    # The suffix is compared case-insensitively.
    "tests/web.YAML": """
        agent: math-agent
        tests:
          - name: searches
            payload: look it up
            expected_tool_calls: [web_search]
    """,
    "tests/adder.yaml": """
        tests:
          - name: runs_the_body
            payload: '{"a": 1}'
    """,
    "tests/flow.yaml": """
        tests:
          - name: flows
            payload: go
    """,
    # Not suites: hidden files and folders, .yml, an empty document.
    "tests/.hidden.yaml": """
        agent: untested
        tests:
          - name: hidden
            payload: x
            expected_tool_calls: [calculator.subtract]
    """,
    "tests/.secret/untested.yaml": """
        tests:
          - name: hidden
            payload: x
            expected_tool_calls: [calculator.subtract]
    """,
    "tests/untested.yml": """
        tests:
          - name: not_a_suite
            payload: x
            expected_tool_calls: [calculator.subtract]
    """,
    "tests/deep.yaml": "",
    # A suite of an agent that does not exist, which parses: no row, no error.
    "tests/ghost.yaml": """
        tests:
          - name: nobody
            payload: x
    """,
    "tests/models/math-agent.py": "def respond(messages, tools):\n    return 'x'\n",
}

PARSE_ERRORS = {
    **TOOLS,
    "agents/adder.yaml": MIXED["agents/adder.yaml"],
    "agents/math-agent.yaml": llm_agent("math-agent", ["calculator.add"]),
    "agents/sums.yaml": llm_agent("sums", ["calculator.add", "calculator.subtract"]),
    "tests/adder.yaml": "tests: [unclosed\n",  # not YAML
    "tests/math-agent.yaml": "tests: []\n",  # YAML, not a suite: no case
    "tests/math-extra.yaml": """
        agent: math-agent
        tests:
          - name: fine
            payload: x
            expected_tool_calls: [calculator.add]
    """,
    # `agent:` that is not a string: the stem names the agent, and the schema refuses it.
    "tests/sums.yaml": """
        agent: [sums]
        tests:
          - name: one
            payload: x
            expected_tool_calls: [subtract]
    """,
    "tests/ghost.yaml": MIXED["tests/ghost.yaml"],
}

UNKNOWN_AGENT_BROKEN = {
    **PARSE_ERRORS,
    "tests/ghost.yaml": "tests:\n  - name: nobody\n    unknown_key: 1\n",
    "tests/list.yaml": "- just\n- a list\n",
}

LOAD_ERRORS = {
    **TOOLS,
    "agents/a.yaml": llm_agent("dup", ["calculator.add"]),
    "agents/b.yaml": llm_agent("dup", ["calculator.subtract"]),
    "agents/orphan-test-x.yaml": llm_agent("orphan-test-x", ["calculator.add"]),
    "agents/broken.yaml": llm_agent("broken", ["calculator.nothing_here"]),
    "tests/dup.yaml": """
        tests:
          - name: one
            payload: x
            expected_tool_calls: [calculator.add]
    """,
}

EDGE_PROJECTS: dict[str, dict[str, str]] = {
    "mixed": MIXED,
    "parse-errors": PARSE_ERRORS,
    "unknown-agent-broken-suite": UNKNOWN_AGENT_BROKEN,
    "load-errors": LOAD_ERRORS,
    "missing-agents": {"tests/a.yaml": MIXED["tests/adder.yaml"]},
    "no-agents": {"agents/_defaults.yaml": "model: openai/gpt-4o\n"},
    "no-tests": {**TOOLS, "agents/adder.yaml": MIXED["agents/adder.yaml"]},
    # The loader refuses an agent whose tools share a function name, so `add` never matches
    # two tools by the last-segment fallback.
    "same-short-name": {
        "tools/a.py": "def add(x: int) -> int:\n    return x\n",
        "tools/b.py": "def add(x: int) -> int:\n    return x\n",
        "agents/two.yaml": llm_agent("two", ["a.add", "b.add"]),
        "agents/split.yaml": llm_agent("split", ["a.add"], discoverable=["b.add"]),
        "tests/two.yaml": MIXED["tests/adder.yaml"],
    },
    # The fallback compares only the last segment: `elsewhere.add` covers calculator.add.
    "foreign-prefix": {
        **TOOLS,
        "agents/sums.yaml": llm_agent("sums", ["calculator.add"]),
        "tests/sums.yaml": """
            tests:
              - name: one
                payload: x
                expected_tool_call_order: [elsewhere.add]
        """,
    },
}


@pytest.mark.parametrize("name", sorted(EDGE_PROJECTS))
def test_edge_project_matches_the_format(name: str, tmp_path: Path) -> None:
    root = write(tmp_path / name, EDGE_PROJECTS[name])
    assert_parity(root)


def test_mixed_project_scores_as_the_spec_says(tmp_path: Path) -> None:
    report = assert_parity(write(tmp_path / "p", MIXED))
    rows = {row["name"]: row for row in report["agents"]}
    assert set(rows) == {"adder", "deep", "flow", "math-agent", "untested"}  # no A/B variant
    math = rows["math-agent"]
    # search_tools and use_tool are injected for discoverable_tools and not counted;
    # `add` covers calculator.add; `upper` in an order covers text.fmt.upper; multiply is named
    # only in expected_no_tool_calls and a child's expectations.
    assert math["tools_total"] == 5
    assert math["uncovered_tools"] == ["calculator.multiply"]
    assert math["percent"] == 80.0
    assert rows["adder"]["percent"] == 100.0  # a tool agent with a case
    assert rows["flow"]["tools_total"] == 0
    assert rows["flow"]["percent"] == 100.0  # a sequential agent with a suite
    assert rows["untested"]["has_tests"] is False  # hidden and .yml suites don't count
    assert rows["deep"]["has_tests"] is False  # an empty suite is none
    assert "error" not in report


def test_parse_errors_are_per_agent_unless_the_agent_is_unknown(tmp_path: Path) -> None:
    report = assert_parity(write(tmp_path / "p", PARSE_ERRORS))
    rows = {row["name"]: row for row in report["agents"]}
    assert rows["adder"]["percent"] is None
    assert rows["adder"]["parse_error"].startswith("tests/adder.yaml: ")
    assert rows["sums"]["parse_error"].startswith("tests/sums.yaml: ")
    assert rows["math-agent"]["percent"] is None
    assert report["overall"] == 0.0
    assert "error" not in report

    report = assert_parity(write(tmp_path / "q", UNKNOWN_AGENT_BROKEN))
    assert report["error"].startswith("Test files failed to parse: ")
    assert "tests/ghost.yaml" in report["error"]
    assert "tests/adder.yaml" in report["error"]  # every parse error is named


def test_missing_agents_folder_is_an_error(tmp_path: Path) -> None:
    root = write(tmp_path / "p", EDGE_PROJECTS["missing-agents"])
    report = assert_parity(root)
    assert report == {
        "agents": [],
        "overall": 0.0,
        "error": f"Agents directory not found at {root.resolve() / 'agents'}",
    }


def test_symlinked_tests_folder_is_an_error(tmp_path: Path) -> None:
    elsewhere = write(tmp_path / "elsewhere", {"adder.yaml": MIXED["tests/adder.yaml"]})
    root = write(tmp_path / "p", {**TOOLS, "agents/adder.yaml": MIXED["agents/adder.yaml"]})
    (root / "tests").symlink_to(elsewhere, target_is_directory=True)
    report = assert_parity(root)
    assert report["error"] == "Symbolic links are not allowed: tests"


def test_suite_linked_from_outside_tests_fails_to_parse(tmp_path: Path) -> None:
    outside = write(tmp_path / "outside", {"adder.yaml": MIXED["tests/adder.yaml"]})
    root = write(
        tmp_path / "p",
        {**TOOLS, "agents/adder.yaml": MIXED["agents/adder.yaml"], "tests/flow.yaml": ""},
    )
    (root / "tests" / "adder.yaml").symlink_to(outside / "adder.yaml")
    (root / "tests" / "inside.yaml").symlink_to(root / "tests" / "flow.yaml")
    report = assert_parity(root)
    assert report["agents"][0]["parse_error"] == (
        "tests/adder.yaml: Source path 'tests/adder.yaml' is outside 'tests'"
    )


def test_ours_does_not_depend_on_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = write(tmp_path / "p", PARSE_ERRORS)
    monkeypatch.chdir(tmp_path)
    from_parent = compute_coverage(Path("p"))
    monkeypatch.chdir(root / "tests")
    from_inside = compute_coverage(root)
    assert from_parent == from_inside == format_report(root)


# ---------------------------------------------------------------- the human report


def rendered(report: dict[str, Any], width: int = 100) -> tuple[int, str, Console]:
    console = Console(record=True, width=width, force_terminal=True, color_system="standard")
    code = render_coverage(report, console)
    return code, console.export_text(styles=False, clear=False), console


def row(name: str, **fields: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "name": name,
        "type": "llm",
        "has_tests": True,
        "tools_total": 2,
        "tools_covered": 1,
        "uncovered_tools": ["calculator.subtract"],
        "percent": 50.0,
        "parse_error": None,
    }
    return {**base, **fields}


def test_render_table_uncovered_and_overall() -> None:
    report = {
        "agents": [
            row("math-agent"),
            row(
                "adder",
                type="tool",
                tools_total=1,
                tools_covered=1,
                uncovered_tools=[],
                percent=100.0,
            ),
            row(
                "flow",
                type="sequential",
                tools_total=0,
                tools_covered=0,
                uncovered_tools=[],
                percent=100.0,
            ),
            row(
                "lonely",
                has_tests=False,
                tools_covered=0,
                uncovered_tools=["a.b", "c.d"],
                percent=0.0,
            ),
        ],
        "overall": 62.5,
    }
    code, text, _ = rendered(report)
    assert code == 0
    lines = text.splitlines()
    header = next(line for line in lines if "Agent" in line)
    assert [cell.strip() for cell in header.strip("┃│ ").split("┃")] == [
        "Agent",
        "Type",
        "Tools covered",
        "Coverage",
    ]

    def cells(name: str) -> list[str]:
        line = next(line for line in lines if f" {name} " in line)
        return [cell.strip() for cell in line.strip("│ ").split("│")]

    assert cells("math-agent") == ["math-agent", "llm", "1/2", "50.0%"]
    assert cells("adder") == ["adder", "tool", "1/1", "100.0%"]
    assert cells("flow") == ["flow", "sequential", "—", "100.0%"]
    assert cells("lonely") == ["lonely", "llm", "no tests", "0.0%"]
    # Only agents with tests list their gaps.
    gaps = lines[lines.index("Uncovered tools:") + 1 :]
    assert gaps[0] == "  math-agent: calculator.subtract"
    assert not any("lonely" in line for line in gaps)
    assert lines[-1] == "Overall coverage: 62.5% (4 agents)"


@pytest.mark.parametrize(
    ("percent", "colour"),
    [
        (100.0, "green"),
        (80.0, "green"),
        (79.9, "yellow"),
        (40.0, "yellow"),
        (39.9, "red"),
        (0.0, "red"),
    ],
)
def test_render_colours(percent: float, colour: str) -> None:
    report = {"agents": [row("solo", percent=percent)], "overall": percent}
    code, _, console = rendered(report)
    assert code == 0
    ansi = {"green": "32", "yellow": "33", "red": "31"}[colour]
    styled = console.export_text(styles=True)
    assert re.search(rf"\x1b\[1;{ansi}m *{percent:.1f}%\x1b\[0m", styled)
    assert f"\x1b[1;{ansi}mOverall coverage: {percent:.1f}% (1 agent)" in styled


def test_render_no_agents() -> None:
    code, text, _ = rendered({"agents": [], "overall": 0.0})
    assert code == 0
    assert text.strip() == "No agents found."


def test_render_top_level_error_exits_1() -> None:
    code, text, _ = rendered({"agents": [row("a")], "overall": 50.0, "error": "Agents gone"})
    assert code == 1
    assert "Agents gone" in text
    assert "Overall" not in text


def test_render_parse_error_exits_1() -> None:
    report = {
        "agents": [row("a", percent=None, parse_error="tests/a.yaml: bad"), row("b")],
        "overall": 50.0,
    }
    code, text, _ = rendered(report)
    assert code == 1
    assert "Test files failed to parse: a: tests/a.yaml: bad" in text
    assert "Overall" not in text


def test_render_escapes_names() -> None:
    report = {"agents": [row("evil\x1b[2J[bold]x[/bold]")], "overall": 50.0}
    code, text, _ = rendered(report, width=120)
    assert code == 0
    assert "\x1b[2J" not in text
    assert "evil\\x1b[2J[bold]x[/bold]" in text


def test_render_a_real_report(tmp_path: Path) -> None:
    report = compute_coverage(write(tmp_path / "p", MIXED))
    code, text, _ = rendered(report)
    assert code == 0
    assert "Overall coverage: 56.0% (5 agents)" in text
    assert "  math-agent: calculator.multiply" in text


# ---------------------------------------------------------------- `gate coverage`


def gate_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gate_service.cli", "coverage", *args],
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": str(REPO), "NO_COLOR": "1", "COLUMNS": "120"},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.mark.slow
@pytest.mark.parametrize("name", ["mixed", "parse-errors", "unknown-agent-broken-suite"])
def test_gate_coverage_json_prints_what_the_format_prints(name: str, tmp_path: Path) -> None:
    root = write(tmp_path / name, EDGE_PROJECTS[name])
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    done = gate_cli(str(root), "--json", cwd=elsewhere)
    theirs = format_cli(root)
    assert json.loads(done.stdout) == format_report(root)
    assert done.stdout == theirs.stdout
    # Exit 1 for a report with an error or a parse error, as the installed format CLI does.
    assert done.returncode == theirs.returncode, done.stderr


@pytest.mark.slow
def test_gate_coverage_table_and_exit_codes(tmp_path: Path) -> None:
    good = write(tmp_path / "good", MIXED)
    done = gate_cli(str(good), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "Overall coverage: 56.0% (5 agents)" in done.stdout

    broken = write(tmp_path / "broken", PARSE_ERRORS)
    done = gate_cli(str(broken), cwd=tmp_path)
    assert done.returncode == 1
    assert "Test files failed to parse" in done.stdout + done.stderr

    missing = write(tmp_path / "missing", EDGE_PROJECTS["missing-agents"])
    done = gate_cli(str(missing), cwd=tmp_path)
    assert done.returncode == 1
    assert "Agents directory not found" in done.stdout + done.stderr
