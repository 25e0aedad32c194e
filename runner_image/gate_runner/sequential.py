"""The Wilson score interval, and the sequential verdict a project's ``verdict_rule: wilson``
asks for (docs/baselines.md, "The Wilson verdict rule").

The runner decides with it whether to start another invocation and the worker checks the
runner's stopping point with it, so both read this one module. Standard library only (the
runner loads it on every case).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from .verdict import case_passes

# The normal quantile for a two-sided 95% interval (scipy.stats.norm.ppf(0.975)).
Z95 = 1.959963984540054

Decision = Literal["pass", "fail", "more"]


@dataclass(frozen=True)
class Interval:
    """A pass rate's 95% interval, in percent (0-100)."""

    low: float
    high: float

    def holds(self, threshold: float) -> bool:
        """Whether ``threshold`` (percent) lies strictly inside: the runs cannot tell on
        which side of it the agent really is ("narrow")."""
        return self.low < threshold < self.high


def wilson(successes: int, runs: int, z: float = Z95) -> Interval:
    """The Wilson score interval of ``successes`` of ``runs`` (Inspect's ``ci_wilson``).

    Unlike the normal approximation it stays inside 0-100 and is not zero-width at 0/n or
    n/n: 5 of 5 passes is 56.6-100%, the honest answer to "how good is it?".
    """
    if runs < 1:
        raise ValueError("runs must be at least 1")
    if not 0 <= successes <= runs:
        raise ValueError(f"successes must be between 0 and runs ({runs}), got {successes}")
    p = successes / runs
    z2 = z * z
    denominator = 1 + z2 / runs
    centre = (p + z2 / (2 * runs)) / denominator
    spread = z * math.sqrt(p * (1 - p) / runs + z2 / (4 * runs * runs)) / denominator
    # Exactly 0 and 100 at the ends (the formula gives them up to a rounding error).
    low = 0.0 if successes == 0 else max(0.0, centre - spread)
    high = 1.0 if successes == runs else min(1.0, centre + spread)
    return Interval(round(low * 100, 4), round(high * 100, 4))


def wilson_applies(runs: int, success_threshold: int) -> bool:
    """Whether the Wilson rule judges a case: more than one run and a threshold an interval
    can clear or miss (0% always passes; no interval's low end ever reaches 100%, so 100%
    stays "every run passes", the platform's rule)."""
    return runs > 1 and 0 < success_threshold < 100


def wilson_decision(
    successes: int, ran: int, runs: int, success_threshold: int, max_runs: int
) -> Decision:
    """The Wilson rule after ``ran`` invocations with ``successes`` passes: ``pass`` once the
    interval's low end clears the threshold, ``fail`` once its high end is below it, else
    ``more`` until ``max_runs`` invocations ran, when the platform's rule decides (over all
    the invocations run). Never decides before the case's own ``runs``."""
    if ran < runs:
        return "more"
    interval = wilson(successes, ran)
    if interval.low >= success_threshold:
        return "pass"
    if interval.high < success_threshold:
        return "fail"
    if ran >= max(max_runs, runs):
        return "pass" if case_passes(successes, ran, success_threshold) else "fail"
    return "more"


@dataclass(frozen=True)
class Operating:
    """How the Wilson rule behaves when the agent's true pass rate is ``rate`` (percent)."""

    rate: float
    pass_probability: float
    expected_runs: float


def operating(rate: float, runs: int, success_threshold: int, max_runs: int) -> Operating:
    """The exact probability that the Wilson rule passes a case whose invocations pass
    independently at ``rate`` percent, and the invocations it runs on average: a walk over
    (invocations run, passes), each state's probability carried forward (no simulation)."""
    p = rate / 100
    states = {0: 1.0}  # passes -> probability, among walks still undecided
    passed = expected = 0.0
    for ran in range(1, max(max_runs, runs) + 1):
        after: dict[int, float] = {}
        for successes, weight in states.items():
            for hit, chance in ((1, p), (0, 1 - p)):
                if chance:
                    after[successes + hit] = after.get(successes + hit, 0.0) + weight * chance
        states = {}
        for successes, weight in after.items():
            decision = wilson_decision(successes, ran, runs, success_threshold, max_runs)
            if decision == "more":
                states[successes] = weight
                continue
            expected += weight * ran
            if decision == "pass":
                passed += weight
        if not states:
            break
    return Operating(rate, passed, expected)


def wilson_final(successes: int, ran: int, success_threshold: int) -> bool:
    """The verdict the Wilson rule gives where it stopped: by the interval when that decides,
    else (at the cap) by the platform's rule over every invocation run."""
    interval = wilson(successes, ran)
    if interval.low >= success_threshold:
        return True
    if interval.high < success_threshold:
        return False
    return case_passes(successes, ran, success_threshold)


def wilson_stop_ok(passes: list[bool], runs: int, success_threshold: int, max_runs: int) -> bool:
    """Whether a result of these invocations (their passes in index order) stopped where the
    Wilson rule stops: no decision before its last invocation, and one at it (the worker's
    check of the runner's stopping point)."""
    ran = len(passes)
    if ran < runs or ran > max(max_runs, runs):
        return False
    successes = 0
    for count, passed in enumerate(passes, start=1):
        successes += passed
        decision = wilson_decision(successes, count, runs, success_threshold, max_runs)
        if count < ran and count >= runs and decision != "more":
            return False
        if count == ran:
            return decision != "more"
    return False


def wilson_reason(
    successes: int, ran: int, runs: int, success_threshold: int, max_runs: int
) -> str | None:
    """The case's sentence under the Wilson rule: None when it passed; else how many passed,
    its interval, and why that fails it."""
    if wilson_final(successes, ran, success_threshold):
        return None
    interval = wilson(successes, ran)
    if interval.high < success_threshold:
        why = f"its Wilson 95% interval {interval.low:.1f}-{interval.high:.1f}% lies below"
    else:
        why = (
            f"its Wilson 95% interval {interval.low:.1f}-{interval.high:.1f}% still held the "
            f"threshold after {ran} invocations (the cap, GATE_WILSON_MAX_RUNS = "
            f"{max(max_runs, runs)}), and {successes}/{ran} is below"
        )
    return (
        f"{ran - successes} of {ran} invocation(s) failed ({successes} passed; verdict rule "
        f"wilson: {why} {success_threshold}%)"
    )
