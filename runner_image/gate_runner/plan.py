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

This module is the plan's shape and its reader, which case.py imports; the build's side
(``build_plan``, ``write_plan``) is plan_build.py, which imports case.py.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

PLAN_PATH = "/opt/gate-plan.json"
PLANNED_PROJECT = "/bundle"  # the project a test image's plan is of
PLAN_VERSION = 1


@dataclass(frozen=True)
class ConcurrencyRule:
    """The agent's `concurrency: {key, on_conflict}` (SDK ConcurrencyConfig)."""

    key: str  # a dot-path into the trigger payload
    on_conflict: str  # queue | drop | coalesce


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


def planned_case(plan: Mapping[str, Any], suite: str, case_name: str) -> PlannedCase | None:
    """The plan's entry for a case, or None when the plan does not hold it."""
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
