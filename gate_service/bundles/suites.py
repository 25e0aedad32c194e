"""Suite discovery and fail-fast validation on the host, before any image is built.

Nothing here executes user code: suites are YAML read with safe_load and checked with the
connic-composer-sdk schema, and agents are read by the SDK's loader in validation-only mode
(which parses Python with `ast` instead of importing it).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from connic import ProjectLoader
from connic.test_schema import TestCase, TestFile
from pydantic import ValidationError

# NON_SUITE_DIRS: the folders under tests/ that hold support files, not suites (spec §13.1),
# the same the runner's plan skips.
from gate_runner import NON_SUITE_DIRS
from gate_runner.assertions import compile_assertions
from gate_runner.expr import ExpressionError, compile_expression

from ..endpoints import header_name_problem, shown, url_problem
from .support import MAX_WARNINGS, agent_warnings, mcp_mock_names, mcp_mock_warning

MAX_SUITE_BYTES = 1024 * 1024
_SURROGATE = re.compile("[\ud800-\udfff]")
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")
# YAML aliases let a few hundred bytes stand for billions of nodes once expanded; validation
# walks the expanded tree, so the expanded size is what is capped.
MAX_EXPANDED_NODES = 100_000


class SuiteTooComplex(Exception):
    """The YAML expands to more nodes than a suite may have."""


def _expanded_size(node: yaml.Node, memo: dict[int, int]) -> int:
    key = id(node)
    if key in memo:
        return memo[key]
    memo[key] = 0  # a node that refers to itself counts once
    if isinstance(node, yaml.SequenceNode):
        size = 1 + sum(_expanded_size(child, memo) for child in node.value)
    elif isinstance(node, yaml.MappingNode):
        size = 1 + sum(_expanded_size(k, memo) + _expanded_size(v, memo) for k, v in node.value)
    else:
        size = 1
    memo[key] = size
    return size


def load_yaml_bounded(text: str) -> Any:
    """yaml.safe_load, refusing documents whose aliases expand past MAX_EXPANDED_NODES."""
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        size = _expanded_size(node, {})
        if size > MAX_EXPANDED_NODES:
            raise SuiteTooComplex(
                f"the document expands to {size} nodes through its aliases; the limit is "
                f"{MAX_EXPANDED_NODES}"
            )
        return loader.construct_document(node)
    finally:
        loader.dispose()


@dataclass(frozen=True)
class CaseRef:
    suite: str
    agent_name: str
    test_name: str
    runs: int
    success_threshold: int
    timeout_s: int
    # The sha256 of the case as resolved with its suite's defaults (canonical JSON), and the
    # bundle files it names (fixtures, builder, mocks module): its part of the closure hash
    # (gate_service/baselines/closure.py).
    definition: str = ""
    references: tuple[str, ...] = ()


def case_definition(resolved: Mapping[str, Any]) -> str:
    """The sha256 of a resolved case as canonical JSON (sorted keys; a value JSON has no
    form for, a YAML date say, by its repr): equal for the same case however it is spelled."""
    text = json.dumps(resolved, sort_keys=True, default=repr, ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def case_references(resolved: Mapping[str, Any]) -> tuple[str, ...]:
    """The bundle files a resolved case names: its fixtures, builder and mocks module."""
    found = [f"tests/files/{f}" for f in resolved.get("files") or [] if isinstance(f, str)]
    for key, folder in (("builder", "builders"), ("mocks", "mocks")):
        name = resolved.get(key)
        if isinstance(name, str) and name:
            found.append(f"tests/{folder}/{name.removesuffix('.py')}.py")
    return tuple(sorted(set(found)))


@dataclass
class ProjectReport:
    cases: list[CaseRef] = field(default_factory=list)
    problems: list[dict[str, Any]] = field(default_factory=list)
    agents: set[str] = field(default_factory=set)
    # Each agent's config as the SDK's loader read it (connic AgentConfig), by name.
    configs: dict[str, Any] = field(default_factory=dict)
    # What the gate cannot honour as the platform does (support.py): file, agent, key.
    warnings: list[dict[str, Any]] = field(default_factory=list)

    def add(self, file: str, message: str, case: str | None = None) -> None:
        self.problems.append({"file": file, "case": case, "message": message})


def discover_suites(root: Path) -> list[Path]:
    tests = root / "tests"
    if not tests.is_dir():
        return []
    found = []
    for path in sorted(tests.rglob("*")):
        rel = path.relative_to(tests)
        if rel.parts and rel.parts[0] in NON_SUITE_DIRS:
            continue
        if path.is_file() and path.suffix.lower() in (".yaml", ".yml"):
            found.append(path)
    return found


def _load_agents(
    root: Path, report: ProjectReport, api_tools: Mapping[str, Any] | None = None
) -> None:
    # api: refs resolve against the project's API specs: an unknown tool is a problem then.
    loader = ProjectLoader(str(root), validation_only=True, api_spec_tools=dict(api_tools or {}))
    try:
        agents = loader.load_agents()
    except FileNotFoundError:
        report.add("agents/", "the bundle has no agents/ folder")
        return
    report.agents = {a.config.name for a in agents}
    report.configs = {a.config.name: a.config for a in agents}
    for message in getattr(loader, "_load_errors", []):
        report.add("agents/", str(message))
    for agent in agents:
        source = agent.config.source_path
        for message in _mcp_problems(agent.config):
            report.add(source or "agents/", message)
        if not source:
            continue
        try:
            raw = load_yaml_bounded((root / source).read_text(encoding="utf-8"))
        except (OSError, yaml.YAMLError, UnicodeDecodeError, SuiteTooComplex, RecursionError):
            continue  # the loader read it; a second read that fails only loses its warnings
        if isinstance(raw, dict):
            predefined = {
                field: [t.name for t in getattr(agent, field, []) if t.is_predefined]
                for field in ("tools", "discoverable_tools")
            }
            report.warnings.extend(agent_warnings(source, raw, predefined, set(api_tools or {})))
    del report.warnings[MAX_WARNINGS:]


def _mcp_problems(config: Any) -> list[str]:
    """What the gateway would refuse in an agent's MCP servers, said when the bundle is
    validated rather than at the run's first call: a URL it would not call (not http(s), no
    URL both its parsers read alike, credentials, a link-local or metadata address in any
    spelling; a name is resolved at each call), and a header no tenant may set (Host,
    hop-by-hop, another authority). A bridged or OAuth server is never called in a gate."""
    found = []
    for server in getattr(config, "mcp_servers", None) or []:
        if getattr(server, "bridge", None) or getattr(server, "oauth", None):
            continue
        where = f"agent {config.name}, mcp_servers.{server.name}"
        problem = url_problem(str(server.url))
        if problem is not None:
            found.append(f"{where}: url: {problem}")
        for name in server.headers or {}:
            why = header_name_problem(str(name))
            if why is not None:
                found.append(f"{where}: header {shown(str(name))} is refused: {why}")
    return found


def _errors(exc: ValidationError, prefix: str = "") -> list[str]:
    out = []
    for err in exc.errors():
        where = ".".join(str(p) for p in (prefix, *err.get("loc", ())) if p != "")
        msg = str(err.get("msg", "")).removeprefix("Value error, ")
        out.append(f"{where}: {msg}" if where else msg)
    return out


def suite_problems(raw: Any) -> list[tuple[str | None, str]]:
    """Every schema problem of one suite, each with its case, not only pydantic's first.

    The SDK's TestFile stops at the first duplicate name and checks cases only once the file
    is otherwise valid; validating each part on its own finds all of them in one go.
    """
    if not isinstance(raw, dict):
        return [(None, "a suite must be a YAML mapping with a `tests:` list of cases")]
    out: list[tuple[str | None, str]] = []
    try:  # file-level keys (version, agent, defaults), with a stand-in case list
        TestFile.model_validate({**raw, "tests": [{"name": "stand-in", "payload": "x"}]})
    except ValidationError as exc:
        out += [(None, message) for message in _errors(exc)]
    tests = raw.get("tests")
    if not isinstance(tests, list) or not tests:
        out.append((None, "`tests` must be a non-empty list of cases"))
        return out
    names: Counter[str] = Counter()
    for index, item in enumerate(tests):
        name = item.get("name") if isinstance(item, dict) else None
        label = name if isinstance(name, str) and name else f"#{index + 1}"
        if isinstance(name, str):
            names[name] += 1
        try:
            TestCase.model_validate(item)
        except ValidationError as exc:
            out += [(label, message) for message in _errors(exc)]
    for name, count in names.items():
        if count > 1:
            out.append((name, f"duplicate case name {name!r}: {count} cases in this suite use it"))
    return out


def _unstorable(text: str) -> str | None:
    """What in ``text`` neither Postgres nor a command line can carry, or None."""
    if "\x00" in text:
        return "a NUL character (\\x00)"
    surrogate = _SURROGATE.search(text)
    if surrogate is not None:
        return f"a lone surrogate (\\u{ord(surrogate.group()):04x})"
    return None


def _visible(text: str) -> str:
    """``text`` with NUL and lone surrogates written as escapes, to quote it in a problem."""
    return "".join(
        c if c != "\x00" and not "\ud800" <= c <= "\udfff" else f"\\u{ord(c):04x}" for c in text
    )


def _unstorable_strings(node: Any, where: str) -> list[tuple[str, str]]:
    """(path, what) for every key or string under ``node`` that holds NUL or a lone surrogate."""
    found = []
    if isinstance(node, str):
        what = _unstorable(node)
        if what:
            found.append((where, what))
    elif isinstance(node, list):
        for index, item in enumerate(node):
            found += _unstorable_strings(item, f"{where}[{index}]")
    elif isinstance(node, dict):
        for key, value in node.items():
            name = _visible(key) if isinstance(key, str) else repr(key)
            path = f"{where}.{name}" if where else name
            what = _unstorable(key) if isinstance(key, str) else None
            if what:
                found.append((f"the key {path}", what))
            found += _unstorable_strings(value, path)
    return found


def string_problems(raw: Any) -> list[tuple[str | None, str]]:
    """Every string of a suite that holds NUL or a lone surrogate, with its case.

    Such a string cannot be stored (Postgres text holds neither) nor passed to the runner on
    its command line, so the suite is refused here instead of failing the gate's writes.
    """
    out: list[tuple[str | None, str]] = []
    tests = raw.get("tests") if isinstance(raw, dict) else None
    cases = tests if isinstance(tests, list) else []
    for index, item in enumerate(cases):
        name = item.get("name") if isinstance(item, dict) else None
        label = _visible(name) if isinstance(name, str) and name else f"#{index + 1}"
        for path, what in _unstorable_strings(item, f"tests[{index}]"):
            out.append((label, f"{path} holds {what}, which cannot be stored; remove it"))
    rest = {k: v for k, v in raw.items() if k != "tests"} if isinstance(raw, dict) else raw
    for path, what in _unstorable_strings(rest, ""):
        out.append((None, f"{path or 'the suite'} holds {what}, which cannot be stored; remove it"))
    return out


def _parsed_cases(raw: Any) -> list[dict[str, Any]]:
    """Each case that validates on its own, resolved with the file's defaults."""
    if not isinstance(raw, dict) or not isinstance(raw.get("tests"), list):
        return []
    out = []
    for item in raw["tests"]:
        try:
            single = TestFile.model_validate({**raw, "tests": [item]})
        except ValidationError:
            continue
        out.append(single.resolved(single.tests[0]))
    return out


def _check_expressions(rel: str, case: dict[str, Any], report: ProjectReport) -> None:
    """Refuse assertions outside the expression language now, with their position."""
    try:
        compile_assertions(case)
        for decision in case.get("approval_decisions") or []:
            if decision.get("params"):
                compile_expression(decision["params"], ("params", "context"))
    except ExpressionError as exc:
        report.add(rel, f"expression: {exc}", case["name"])


def _check_references(root: Path, rel: str, case: dict[str, Any], report: ProjectReport) -> None:
    name = case["name"]
    for fixture in case.get("files") or []:
        if not (root / "tests" / "files" / fixture).is_file():
            report.add(rel, f"fixture tests/files/{fixture} does not exist", name)
    builder = case.get("builder")
    if (
        builder
        and not (root / "tests" / "builders" / f"{builder.removesuffix('.py')}.py").is_file()
    ):
        report.add(
            rel, f"builder tests/builders/{builder.removesuffix('.py')}.py does not exist", name
        )
    mocks = case.get("mocks")
    if mocks and not (root / "tests" / "mocks" / f"{mocks.removesuffix('.py')}.py").is_file():
        report.add(
            rel, f"mocks module tests/mocks/{mocks.removesuffix('.py')}.py does not exist", name
        )


def _warn_mcp_mocks(
    root: Path, agent: str, resolved: Mapping[str, Any], report: ProjectReport
) -> None:
    """A case whose mocks module uses the gate's own MCP mock ladder (support.MCP_MOCKS):
    one warning per agent and module."""
    mocks = resolved.get("mocks")
    if not isinstance(mocks, str) or not mocks:
        return
    file = f"tests/mocks/{mocks.removesuffix('.py')}.py"
    if any(w["file"] == file and w["agent"] == agent for w in report.warnings):
        return
    path = root / file
    try:
        if not path.is_file() or path.stat().st_size > MAX_SUITE_BYTES:
            return
        names = mcp_mock_names(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError):
        return
    if names and len(report.warnings) < MAX_WARNINGS:
        report.warnings.append(mcp_mock_warning(file, agent, names))


def validate_project(
    root: Path, name_filter: str | None = None, api_tools: Mapping[str, Any] | None = None
) -> ProjectReport:
    """Every problem with the bundle's suites, not only the first, and the cases to run;
    ``api_tools``: the project's API specs as the SDK loader's registry (api_specs/)."""
    report = ProjectReport()
    _load_agents(root, report, api_tools)
    suites = discover_suites(root)
    if not suites:
        report.add("tests/", "no test suites found under tests/ (a gate needs at least one case)")
        return report
    for path in suites:
        rel = path.relative_to(root).as_posix()
        if path.stat().st_size > MAX_SUITE_BYTES:
            report.add(rel, f"a suite may hold at most {MAX_SUITE_BYTES} bytes")
            continue
        try:
            raw = load_yaml_bounded(path.read_text(encoding="utf-8"))
            problems = string_problems(raw) + suite_problems(raw)
            cases = _parsed_cases(raw)
        except (yaml.YAMLError, UnicodeDecodeError, SuiteTooComplex, ValueError, TypeError) as exc:
            report.add(rel, f"not valid YAML: {exc}")
            continue
        except RecursionError:
            report.add(rel, "the suite is nested too deeply (or refers to itself) to be read")
            continue
        for case, message in problems:
            report.add(rel, message, case)
        agent = raw.get("agent") if isinstance(raw, dict) else None
        agent = agent if isinstance(agent, str) and agent else path.stem
        # References and the agent are checked for every case that parses, so one bad case
        # does not hide the others' problems.
        for resolved in cases:
            name = resolved["name"]
            _warn_mcp_mocks(root, agent, resolved, report)
            _check_references(root, rel, resolved, report)
            _check_expressions(rel, resolved, report)
            if agent not in report.agents:
                known = ", ".join(sorted(report.agents)) or "none"
                report.add(
                    rel,
                    f"suite {rel} targets agent {agent!r}, which does not exist (agents: {known})",
                    name,
                )
                continue
            if problems or (name_filter and name_filter not in name):
                continue
            report.cases.append(
                CaseRef(
                    suite=rel,
                    agent_name=agent,
                    test_name=name,
                    runs=resolved["runs"],
                    success_threshold=resolved["success_threshold"],
                    timeout_s=resolved["timeout_s"],
                    definition=case_definition(resolved),
                    references=case_references(resolved),
                )
            )
    if not report.problems and not report.cases:
        report.add(
            "tests/",
            f"no case name contains the filter {name_filter!r}"
            if name_filter
            else "the bundle holds no test case: no suite under tests/ lists one under `tests:`",
        )
    return report
