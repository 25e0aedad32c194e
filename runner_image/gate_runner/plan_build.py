"""Building the project's plan (plan.py): ``gate_runner plan``, once per test image, at build.

It prepares every case as ``case.prepare`` does, so it imports the case module; the plan's
reader (plan.py) is imported by the case module and imports none of this, so the reading
side stays light and the dependency goes one way: this module, then case.py, then plan.py.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from .case import (
    CaseError,
    agent_limits,
    check_case,
    load_suite,
    project_agents,
    suite_agent,
    suite_paths,
)
from .light import light_agents, names_the_sdk, shares_typing_forms
from .plan import PLAN_VERSION


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
    try:
        entries, why = light_agents(project)
    except Exception as exc:  # never a reason to lose the rest of the plan
        entries, why = None, f"{type(exc).__name__}: {exc}"
    if entries is None:
        return {"light": None, "light_refused": why}
    try:
        imports_sdk = names_the_sdk(project) or shares_typing_forms(project)
        return {"light": _exact_json(entries), "imports_sdk": imports_sdk}
    except (TypeError, ValueError):
        return {"light": None, "light_refused": "an agent's config is not plain JSON"}


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
