"""The two statistics a case's history is read with: a Wilson score interval for a pass rate
(``gate_runner.sequential``, re-exported) and a one-sided Fisher exact test for a drop
against a baseline.

Exact integer arithmetic (``math.comb``, ``fractions.Fraction``) where it decides something:
the counts are a case's runs (the suite schema bounds them), so the sums are short and a
p-value at a threshold is never a rounding accident. No scipy: a service dependency of tens
of megabytes for two formulas. tests/unit/test_baseline_stats.py holds both against values
``scipy.stats`` gives for known tables.
"""

from __future__ import annotations

import math
from fractions import Fraction

from gate_runner.sequential import Interval, operating, wilson

# The interval is the runner's (its Wilson verdict rule decides with it): one declaration.
__all__ = ["Interval", "fisher_drop", "operating_table", "wilson"]


def fisher_drop(base_successes: int, base_runs: int, successes: int, runs: int) -> float:
    """One-sided Fisher exact p-value that the pass rate dropped from the baseline's.

    The table [[base_successes, base_failures], [successes, failures]] with its margins
    fixed; the p-value is the probability, under "both rates are the same", of a baseline
    with at least as many successes as observed (scipy's ``fisher_exact(table,
    alternative="greater")``).
    """
    for name, value, total in (
        ("base_successes", base_successes, base_runs),
        ("successes", successes, runs),
    ):
        if total < 1 or not 0 <= value <= total:
            raise ValueError(f"{name} must be between 0 and its runs (at least 1)")
    total = base_runs + runs
    passes = base_successes + successes
    denominator = math.comb(total, base_runs)
    top = min(base_runs, passes)
    tail = sum(
        math.comb(passes, k) * math.comb(total - passes, base_runs - k)
        for k in range(base_successes, top + 1)
    )
    return float(Fraction(tail, denominator))


def threshold_pass_probability(rate: float, runs: int, success_threshold: int) -> float:
    """The probability that the platform's rule passes a case whose invocations pass
    independently at ``rate`` percent: at least the required passes of ``runs`` (binomial)."""
    p = rate / 100
    need = -(-success_threshold * runs // 100)
    return sum(math.comb(runs, k) * p**k * (1 - p) ** (runs - k) for k in range(need, runs + 1))


def operating_table(runs: int = 10, max_runs: int = 30) -> str:
    """docs/baselines.md's table of the Wilson rule's error rates beside the platform's
    (tests/unit/test_wilson_rule.py checks the page holds exactly this)."""
    lines = [
        "| threshold | true pass rate | P(pass), threshold rule | P(pass), Wilson rule "
        "| invocations, Wilson rule (mean) |",
        "|---|---|---|---|---|",
    ]
    for threshold in (50, 70, 80, 90):
        for step in (-20, -10, 0, 10):
            rate = threshold + step
            if rate > 100:
                continue
            wil = operating(rate, runs, threshold, max_runs)
            plain = threshold_pass_probability(rate, runs, threshold)
            lines.append(
                f"| {threshold}% | {rate}% | {plain:.3f} | {wil.pass_probability:.3f} "
                f"| {wil.expected_runs:.1f} |"
            )
    return "\n".join(lines)
