"""The project's plan: every case prepared once per test image, at build time.

Preparing a case (parse and validate its suite, resolve its defaults, find its agent among
the project's, check its builder, compile its expressions) depends on the bundle alone, and
the bundle never changes inside its image. The test-image build runs ``gate_runner plan``
once, and each case container reads the result: plain JSON, read without YAML, pydantic or
the SDK. A case the plan does not hold exactly (a value JSON would change, an image built
without a plan, a runner outside an image) is prepared as before, from the suite itself, so
the plan only ever saves time and never changes a verdict.

The plan is written by the build as root into a root-owned file of the read-only image; the
loader reads the project in validation mode, which runs none of its code (the same reading
every case container's root process did before), and the step runs under the invocation uid
all the same. A failure writes no plan and never fails the build.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .case import ConcurrencyRule

PLAN_PATH = "/opt/gate-plan.json"
PLANNED_PROJECT = "/bundle"  # the project a test image's plan is of
PLAN_VERSION = 1


@dataclass(frozen=True)
class AgentLimits:
    """What the runner's parent reads of an agent's config (case.py: effective_timeout,
    parallelism, concurrency_rule), as the SDK's config gave them at build time."""

    timeout: int | None
    max_concurrent_runs: int
    concurrency: ConcurrencyRule | None = None


@dataclass(frozen=True)
class PlannedCase:
    """One case as the build prepared it: its error, or what `prepare` derives the rest from."""

    error: str | None = None
    agent_name: str = ""
    resolved: dict[str, Any] | None = None
    agent: AgentLimits | None = None


def _exact_json(value: Any) -> Any:
    """``value`` as JSON gives it back, or a ValueError when JSON would change it (a date, a
    tuple, a non-string key): such a case is prepared from its suite at run time instead."""
    text = json.dumps(value, allow_nan=False)
    back = json.loads(text)
    if back != value or _shape(back) != _shape(value):
        raise ValueError("not exactly representable in JSON")
    return back


def _shape(value: Any) -> Any:
    """The types of a value, all the way down (1 == 1.0 == True, but a plan must not change
    one into another)."""
    if isinstance(value, dict):
        return ("dict", tuple((k, _shape(v)) for k, v in value.items()))
    if isinstance(value, list):
        return ("list", tuple(_shape(v) for v in value))
    return type(value).__name__


def build_plan(project: Path) -> dict[str, Any]:
    """Every case of every suite under ``project``, prepared as case.prepare does."""
    from .case import (
        CaseError,
        agent_limits,
        check_case,
        load_suite,
        project_agents,
        suite_agent,
        suite_paths,
    )

    names, _errors = project_agents(project)
    agents = {name: agent_limits(config) for name, config in names.items()}
    suites: dict[str, Any] = {}
    for rel in suite_paths(project):
        try:
            test_file = load_suite(project, rel)
        except CaseError as exc:
            suites[rel] = {"error": str(exc), "cases": {}}
            continue
        agent = suite_agent(Path(rel), test_file)
        cases: dict[str, Any] = {}
        for case in test_file.tests:
            if case.name in cases:
                continue  # the first case of a name is the one run (case.prepare)
            resolved = test_file.resolved(case)
            try:
                check_case(project, rel, case.name, agent, resolved, names)
            except CaseError as exc:
                cases[case.name] = {"error": str(exc)}
                continue
            try:
                cases[case.name] = {"resolved": _exact_json(resolved)}
            except (TypeError, ValueError):
                pass  # left out: prepared from the suite at run time
        suites[rel] = {"agent": agent, "cases": cases}
    return {
        "version": PLAN_VERSION,
        "agents": {
            name: {
                "timeout": limits.timeout,
                "max_concurrent_runs": limits.max_concurrent_runs,
                "concurrency": None
                if limits.concurrency is None
                else [limits.concurrency.key, limits.concurrency.on_conflict],
            }
            for name, limits in agents.items()
        },
        "suites": suites,
        **_light_section(project),
    }


def _light_section(project: Path) -> dict[str, Any]:
    """The agents as the light path loads them (light.py), or why the project does not
    qualify (kept in the plan, for whoever reads it to see why its cases pay for the SDK)."""
    from .light import light_agents, names_the_sdk

    try:
        entries, why = light_agents(project)
    except Exception as exc:  # never a reason to lose the rest of the plan
        entries, why = None, f"{type(exc).__name__}: {exc}"
    if entries is None:
        return {"light": None, "light_refused": why}
    try:
        return {"light": _exact_json(entries), "imports_sdk": names_the_sdk(project)}
    except (TypeError, ValueError):
        return {"light": None, "light_refused": "an agent's config is not plain JSON"}


def planned_case(plan: Mapping[str, Any], suite: str, case_name: str) -> PlannedCase | None:
    """The plan's entry for a case, or None when the plan does not hold it."""
    from .case import ConcurrencyRule

    entry = plan.get("suites", {}).get(suite)
    if entry is None:
        return None
    if entry.get("error"):
        return PlannedCase(error=entry["error"])
    case = entry["cases"].get(case_name)
    if case is None:
        return None
    if case.get("error"):
        return PlannedCase(error=case["error"])
    agent = plan["agents"][entry["agent"]]
    rule = agent["concurrency"]
    return PlannedCase(
        agent_name=entry["agent"],
        resolved=case["resolved"],
        agent=AgentLimits(
            timeout=agent["timeout"],
            max_concurrent_runs=agent["max_concurrent_runs"],
            concurrency=None if rule is None else ConcurrencyRule(key=rule[0], on_conflict=rule[1]),
        ),
    )


def read_plan(path: str = PLAN_PATH) -> dict[str, Any] | None:
    """The image's plan, or None when it has none (or one of another version)."""
    try:
        with open(path, encoding="utf-8") as file:
            plan = json.load(file)
    except (OSError, ValueError):
        return None
    if not isinstance(plan, dict) or plan.get("version") != PLAN_VERSION:
        return None
    return plan


def write_plan(project: Path, out: str, as_uid: int | None) -> int:
    """``gate_runner plan``: write the plan to ``out``, opened before privileges are dropped;
    exit 0 whatever happens (a build never fails for want of a plan)."""
    try:
        fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    except OSError as exc:
        sys.stderr.write(f"gate_runner plan: cannot write {out}: {exc}\n")
        return 0
    try:
        if as_uid is not None:
            os.setgroups([])
            os.setgid(as_uid)
            os.setuid(as_uid)
        text = json.dumps(build_plan(project), allow_nan=False)
    except Exception as exc:  # no plan: every case is prepared from its suite
        sys.stderr.write(f"gate_runner plan: no plan ({type(exc).__name__}: {exc})\n")
        os.close(fd)
        try:
            os.unlink(out)
        except OSError:
            pass
        return 0
    with os.fdopen(fd, "w", encoding="utf-8") as file:
        file.write(text)
    return 0
