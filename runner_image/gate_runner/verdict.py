"""Case verdict arithmetic (spec §6.6), the case-level failure sentence, and when the
invocations judged so far decide the verdict (early stop)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Final


def case_passes(successes: int, runs: int, success_threshold: int) -> bool:
    """Exact integer arithmetic: successes / runs * 100 >= threshold, with no rounding.

    Floating point would make 67% of 3 runs (2/3 = 66.66...%) depend on rounding; the integer
    form decides it exactly (200 >= 201 is false).
    """
    if runs < 1:
        raise ValueError("runs must be at least 1")
    return successes * 100 >= success_threshold * runs


def required_successes(runs: int, success_threshold: int) -> int:
    """The smallest number of passing invocations that makes the case pass."""
    return -(-success_threshold * runs // 100)


def case_failure_reason(
    *,
    runs: int,
    success_threshold: int,
    invocation_reasons: Sequence[str | None],
) -> str | None:
    """One sentence for the case: how many invocations failed and the first reason.

    ``invocation_reasons`` holds, per invocation in order, None for a pass or its reason:
    one for each of the ``runs``, or fewer after an early stop (the rest never started).
    """
    failed = [(i, r) for i, r in enumerate(invocation_reasons) if r is not None]
    successes = len(invocation_reasons) - len(failed)
    if case_passes(successes, runs, success_threshold):
        return None
    first_index, first_reason = failed[0]
    need = required_successes(runs, success_threshold)
    first = f"first failure (invocation {first_index + 1}): {first_reason}"
    if len(invocation_reasons) < runs:
        return (
            f"{len(failed)} of {runs} invocation(s) failed and {runs - len(invocation_reasons)} "
            "did not start, since the case could no longer pass (early stop; "
            f"{successes} passed, {need} needed for {success_threshold}%); {first}"
        )
    return (
        f"{len(failed)} of {runs} invocation(s) failed ({successes} passed, {need} needed for "
        f"{success_threshold}%); {first}"
    )


# Early stop (docs/semantics.md, "Early stop"): the modes of the runner's --stop-early.
# "failing": stop once the case can no longer reach its threshold; "decided": that, or once
# it has reached it. Without a mode every invocation runs.
STOP_FAILING: Final = "failing"
STOP_DECIDED: Final = "decided"
STOP_MODES: Final = (STOP_FAILING, STOP_DECIDED)


def verdict_decided(
    mode: str, *, runs: int, success_threshold: int, successes: int, agent_failures: int
) -> bool:
    """Whether invocations judged so far decide the case's verdict by ``mode``, so that the
    remaining ones need not start.

    ``successes`` counts the passing invocations, ``agent_failures`` the failing ones whose
    failure is the agent's (not a provider's, which may leave the case unjudged; see
    ``unjudged_reason``). Decided as failed: more agent failures than ``runs`` minus the
    successes required, so even if every other run passed the case would fail, and no
    provider failure could have changed that. Decided as passed (``decided`` only): the
    required successes are there (at least one: a threshold of 0 still runs an invocation).
    Both only grow as more invocations are judged, so a decision never needs taking back.
    """
    if mode not in STOP_MODES:
        raise ValueError(f"the stop mode must be one of {', '.join(STOP_MODES)}, got {mode!r}")
    need = required_successes(runs, success_threshold)
    if agent_failures > runs - need:
        return True
    return mode == STOP_DECIDED and successes >= max(need, 1)


def unjudged_reason(
    *,
    runs: int,
    success_threshold: int,
    successes: int,
    provider_failures: Sequence[tuple[int, str]],
    passes: Callable[[int, int, int], bool] = case_passes,
) -> str | None:
    """Why the case cannot be judged, or None (docs/semantics.md, "Provider failures
    are not agent failures"). ``passes(successes, runs, success_threshold)`` is the verdict
    rule: the platform's by default, the Wilson rule's final verdict under it (case.py).

    ``provider_failures`` holds (index, reason) of each failed invocation whose run failed
    because a model call failed outside the agent (models: ModelCallError
    .outside_the_agent). Such a run says nothing of the agent, so the case is judged only
    when those runs cannot change its verdict: it passes without them, or fails even if
    every one of them had passed. Otherwise it is not judged and the gate ends ``error``.
    """
    if not provider_failures or passes(successes, runs, success_threshold):
        return None
    if not passes(successes + len(provider_failures), runs, success_threshold):
        return None  # fails whatever those runs would have done: the agent's own failures
    index, reason = provider_failures[0]
    return (
        f"{len(provider_failures)} of {runs} invocation(s) could not be judged, because a model "
        f"call failed for a reason that is not the agent's (invocation {index + 1}: {reason}); "
        "fix the project's keys, routes or budgets (or the provider) and submit again"
    )
