"""The static, offline coverage report of a project's suites (spec §11, `gate coverage DIR`).

The model is the one `connic test --coverage --json` prints, rebuilt on the format library's
public pieces so that the JSON is equal for the same project:

* agents come from ``connic.loader.ProjectLoader(validation_only=True)``: tool modules are read
  as syntax trees, nothing of the project is imported, nothing touches the network;
* a suite is every ``tests/**/*.yaml`` (the suffix compared case-insensitively; ``.yml`` is not
  a suite, as in the format's own discovery) outside hidden files and folders, parsed with
  ``connic.test_schema.TestFile``; an empty document is no suite; a ``tests/`` that is itself
  a symbolic link is a top-level error;
* a suite belongs to its ``agent:`` when that is a string, else to its file's stem;
* an agent's tools are the refs of ``tools`` and ``discoverable_tools`` (``ref or name``)
  without the injected discovery markers ``search_tools`` and ``use_tool``; A/B variants are
  left out;
* a tool is covered when a case names it in ``expected_tool_calls`` (string or mapping key) or
  ``expected_tool_call_order``, by its exact ref or else by its last dotted segment; a tool
  agent's body tool is covered by any parseable suite with a case;
* ``overall`` is the unweighted mean over the agents whose suites all parse.

Messages name paths as the format's CLI names them when run inside the project (relative to
it), so the report does not depend on the working directory.

The short-name fallback cannot be ambiguous: the loader refuses an agent whose tools share a
function name (``a.add`` and ``b.add``). The tools are still tried in sorted order, so the
result never depends on a set's iteration order.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from connic.core import AgentType
from connic.loader import ProjectLoader
from connic.terminal import escape_terminal_text
from connic.test_schema import TestFile
from rich.console import Console
from rich.table import Table
from rich.text import Text

# Tools the platform injects for tool discovery: nobody authored them, nobody tests them.
DISCOVERY_MARKERS = frozenset({"search_tools", "use_tool"})

# (path relative to the project, agent name, parsed suite or None, error or None)
Suite = tuple[str, str, TestFile | None, str | None]


def discover_suites(root: Path) -> list[Suite]:
    """Every suite under ``root/tests`` with the agent it targets, parsed or with its error.

    Raises ``ValueError`` when ``tests/`` itself is a symbolic link.
    """
    tests_dir = root / "tests"
    if tests_dir.is_symlink():
        raise ValueError(f"Symbolic links are not allowed: {tests_dir.relative_to(root)}")
    suites: list[Suite] = []
    if not tests_dir.is_dir():
        return suites
    tests_real = tests_dir.resolve()
    for path in sorted(tests_dir.rglob("*")):
        rel = path.relative_to(root)
        # Hidden files are never uploaded, so they are never suites.
        if any(part.startswith(".") for part in rel.parts):
            continue
        if not path.is_file() or path.suffix.lower() != ".yaml":
            continue
        agent_name = path.stem
        try:
            real = path.resolve()
            if not real.is_relative_to(tests_real):
                raise ValueError(f"Source path '{rel}' is outside '{tests_dir.relative_to(root)}'")
            # The locale's encoding, as the format's own discovery reads suites.
            with open(real) as fh:
                doc = yaml.safe_load(fh)
            if doc is None:
                continue  # an empty suite is skipped, not reported
            if isinstance(doc, dict) and isinstance(doc.get("agent"), str):
                agent_name = doc["agent"]
            parsed: TestFile | None = TestFile(**doc)
            error = None
        except Exception as exc:
            parsed = None
            error = f"{rel}: {exc}"
        suites.append((rel.as_posix(), agent_name, parsed, error))
    return suites


def _load_errors(loader: ProjectLoader) -> list[str]:
    # The loader keeps the problems of agents it could not load (duplicates, unresolved tools,
    # A/B variants without a base, sequential cycles) in this list and offers no other way to
    # read them; the format's report joins them into its top-level ``error``.
    errors = getattr(loader, "_load_errors", [])
    return [str(e) for e in errors]


def _covered_tools(agent_tools: set[str], parsed: TestFile, is_tool_agent: bool) -> set[str]:
    covered: set[str] = set()
    # A tool agent IS its body tool: any case of the suite runs it.
    if is_tool_agent and parsed.tests:
        covered |= agent_tools
    ordered_tools = sorted(agent_tools)
    for case in parsed.tests:
        refs = [
            entry if isinstance(entry, str) else next(iter(entry.keys()))
            for entry in case.expected_tool_calls
        ]
        refs.extend(case.expected_tool_call_order)
        for ref in refs:
            if ref in agent_tools:
                covered.add(ref)
                continue
            short = ref.split(".")[-1]
            for tool in ordered_tools:
                if tool.split(".")[-1] == short:
                    covered.add(tool)
                    break
    return covered


def compute_coverage(root: Path) -> dict[str, Any]:
    """The coverage report of the project at ``root``, shaped as spec §11's JSON."""
    root = Path(root)
    loader = ProjectLoader(str(root), validation_only=True)
    try:
        agents = loader.load_agents()
    except FileNotFoundError as exc:
        return {"agents": [], "overall": 0.0, "error": str(exc)}
    load_error = "; ".join(_load_errors(loader)) or None

    try:
        discovered = discover_suites(root)
    except ValueError as exc:
        return {"agents": [], "overall": 0.0, "error": str(exc)}

    by_agent: dict[str, list[tuple[TestFile | None, str | None]]] = {}
    for _, agent_name, parsed, error in discovered:
        by_agent.setdefault(agent_name, []).append((parsed, error))

    rows: list[dict[str, Any]] = []
    for agent in agents:
        if getattr(agent.config, "is_test_variant", False):
            continue  # A/B variants are scored through their base agent's suites
        name: str = agent.config.name
        agent_tools: set[str] = set()
        for tool in [*agent.tools, *agent.discoverable_tools]:
            if tool.is_predefined and tool.name in DISCOVERY_MARKERS:
                continue
            agent_tools.add(tool.ref or tool.name)

        suites = by_agent.get(name, [])
        errors = [error for _, error in suites if error is not None]
        parse_error = "; ".join(errors) if errors else None
        covered: set[str] = set()
        is_tool_agent = agent.config.type == AgentType.TOOL
        for parsed, error in suites:
            if error is None and parsed is not None:
                covered |= _covered_tools(agent_tools, parsed, is_tool_agent)

        percent: float | None
        if parse_error is not None:
            percent = None
        elif agent_tools:
            percent = 100.0 * len(covered) / len(agent_tools)
        else:
            percent = 100.0 if suites else 0.0

        kind = agent.config.type
        rows.append(
            {
                "name": name,
                "type": kind.value if isinstance(kind, AgentType) else str(kind),
                "has_tests": bool(suites),
                "tools_total": len(agent_tools),
                "tools_covered": len(covered),
                "uncovered_tools": sorted(agent_tools - covered),
                "percent": percent,
                "parse_error": parse_error,
            }
        )

    scored = [row["percent"] for row in rows if row["parse_error"] is None]
    overall = sum(scored) / len(scored) if scored else 0.0
    report: dict[str, Any] = {"agents": rows, "overall": overall}

    # A suite that fails to parse and targets no reported agent has no row to carry its error.
    reported = {row["name"] for row in rows}
    orphaned = any(
        error is not None
        for agent_name, suites in by_agent.items()
        if agent_name not in reported
        for _, error in suites
    )
    problems = [load_error] if load_error else []
    if orphaned:
        every = [error for suites in by_agent.values() for _, error in suites if error is not None]
        problems.append(f"Test files failed to parse: {'; '.join(every)}")
    if problems:
        report["error"] = "; ".join(problems)
    return report


def _colour(percent: float) -> str:
    if percent >= 80.0:
        return "green"
    if percent >= 40.0:
        return "yellow"
    return "red"


def _plain(text: object) -> str:
    # Names come from the project: no control sequence reaches the terminal, no markup is read.
    return str(escape_terminal_text(str(text)))


def render_coverage(report: dict[str, Any], console: Console) -> int:
    """Print ``report`` for a person; the exit code: 1 for an error or a suite that fails to
    parse, else 0."""
    if report.get("error"):
        console.print(Text(f"error: {_plain(report['error'])}", style="bold red"))
        return 1
    rows: list[dict[str, Any]] = report["agents"]
    if not rows:
        console.print(Text("No agents found.", style="yellow"))
        return 0
    broken = [row for row in rows if row.get("parse_error")]
    if broken:
        details = "; ".join(f"{row['name']}: {row['parse_error']}" for row in broken)
        message = f"error: Test files failed to parse: {_plain(details)}"
        console.print(Text(message, style="bold red"))
        return 1

    table = Table("Agent", "Type", "Tools covered", "Coverage")
    table.columns[3].justify = "right"
    for row in rows:
        if not row["has_tests"]:
            tools = Text("no tests", style="red")
        elif row["tools_total"] == 0:
            tools = Text("—")
        else:
            tools = Text(f"{row['tools_covered']}/{row['tools_total']}")
        percent = float(row["percent"])
        table.add_row(
            Text(_plain(row["name"])),
            Text(_plain(row["type"])),
            tools,
            Text(f"{percent:.1f}%", style=f"bold {_colour(percent)}"),
        )
    console.print(table)

    gaps = [row for row in rows if row["has_tests"] and row["uncovered_tools"]]
    if gaps:
        console.print()
        console.print(Text("Uncovered tools:"))
        for row in gaps:
            tools_text = ", ".join(_plain(tool) for tool in row["uncovered_tools"])
            console.print(Text(f"  {_plain(row['name'])}: {tools_text}"))

    console.print()
    overall = float(report["overall"])
    count = len(rows)
    console.print(
        Text(
            f"Overall coverage: {overall:.1f}% ({count} agent{'s' if count != 1 else ''})",
            style=f"bold {_colour(overall)}",
        )
    )
    return 0
