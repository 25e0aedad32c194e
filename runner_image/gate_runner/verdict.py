"""Case verdict arithmetic (spec §6.6) and the case-level failure sentence."""

from __future__ import annotations

from collections.abc import Sequence


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

    ``invocation_reasons`` holds, per invocation in order, None for a pass or its reason.
    """
    failed = [(i, r) for i, r in enumerate(invocation_reasons) if r is not None]
    successes = runs - len(failed)
    if case_passes(successes, runs, success_threshold):
        return None
    first_index, first_reason = failed[0]
    need = required_successes(runs, success_threshold)
    return (
        f"{len(failed)} of {runs} invocation(s) failed ({successes} passed, {need} needed for "
        f"{success_threshold}%); first failure (invocation {first_index + 1}): {first_reason}"
    )


def unjudged_reason(
    *,
    runs: int,
    success_threshold: int,
    successes: int,
    provider_failures: Sequence[tuple[int, str]],
) -> str | None:
    """Why the case cannot be judged, or None (docs/semantics.md, "Provider failures
    are not agent failures").

    ``provider_failures`` holds (index, reason) of each failed invocation whose run failed
    because a model call failed outside the agent (models: ModelCallError
    .outside_the_agent). Such a run says nothing of the agent, so the case is judged only
    when those runs cannot change its verdict: it passes without them, or fails even if
    every one of them had passed. Otherwise it is not judged and the gate ends ``error``.
    """
    if not provider_failures or case_passes(successes, runs, success_threshold):
        return None
    if not case_passes(successes + len(provider_failures), runs, success_threshold):
        return None  # fails whatever those runs would have done: the agent's own failures
    index, reason = provider_failures[0]
    return (
        f"{len(provider_failures)} of {runs} invocation(s) could not be judged, because a model "
        f"call failed for a reason that is not the agent's (invocation {index + 1}: {reason}); "
        "fix the project's keys, routes or budgets (or the provider) and submit again"
    )
