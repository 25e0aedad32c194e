"""The two statistics of baselines (gate_service/baselines/stats.py) against known values:
p-values as ``scipy.stats.fisher_exact(table, alternative="greater")`` gives them (printed by
scipy 1.17 once, written down here: the service does not depend on scipy), and Wilson
intervals as published: Newcombe (1998), "Two-sided confidence intervals for the single
proportion", Statistics in Medicine 17, Table I, method 3 (score, no continuity correction)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gate_service.baselines.stats import fisher_drop, wilson

# (baseline successes, baseline runs, successes, runs) -> scipy's one-sided p-value.
FISHER_KNOWN = {
    (10, 10, 3, 10): 0.001547987616099071,  # the end-to-end table
    (3, 4, 1, 4): 0.24285714285714283,  # the lady tasting tea, one-sided
    (9, 10, 7, 10): 0.29102167182662536,
    (10, 10, 7, 10): 0.10526315789473684,
    (3, 3, 0, 3): 0.05000000000000001,  # n8n's "about 3 iterations": p = 0.05 at best
    (9, 10, 5, 10): 0.07043343653250772,
    (9, 10, 6, 10): 0.15170278637770898,
    (5, 10, 5, 10): 0.6718591006516703,  # no drop
    (0, 10, 10, 10): 1.0,  # a rise
}


@pytest.mark.parametrize(("table", "p"), FISHER_KNOWN.items())
def test_fisher_drop_matches_scipy_on_known_tables(
    table: tuple[int, int, int, int], p: float
) -> None:
    assert fisher_drop(*table) == pytest.approx(p, rel=1e-12)


def test_fisher_drop_is_exact_at_the_threshold() -> None:
    """3/3 -> 0/3 is exactly 1/20, not a float a hair either side of 0.05."""
    assert fisher_drop(3, 3, 0, 3) == 0.05


@given(
    st.integers(1, 30).flatmap(lambda n: st.tuples(st.integers(0, n), st.just(n))),
    st.integers(1, 30).flatmap(lambda n: st.tuples(st.integers(0, n), st.just(n))),
)
def test_fisher_drop_is_a_probability_and_falls_as_the_drop_grows(
    base: tuple[int, int], now: tuple[int, int]
) -> None:
    p = fisher_drop(base[0], base[1], now[0], now[1])
    assert 0 < p <= 1
    if now[0] > 0:  # one pass fewer now: a larger drop, never a larger p-value
        assert fisher_drop(base[0], base[1], now[0] - 1, now[1]) <= p


# (successes, runs) -> the Wilson 95% interval in percent, to Newcombe's four places.
WILSON_KNOWN = {
    (81, 263): (25.53, 36.62),
    (15, 148): (6.24, 16.05),
    (0, 20): (0.0, 16.11),
    (1, 29): (0.61, 17.18),
    (5, 5): (56.55, 100.0),  # the example: 56.6-100%
}


@pytest.mark.parametrize(("counts", "interval"), WILSON_KNOWN.items())
def test_wilson_matches_published_intervals(
    counts: tuple[int, int], interval: tuple[float, float]
) -> None:
    got = wilson(*counts)
    assert (got.low, got.high) == pytest.approx(interval, abs=0.006)


def test_wilson_is_symmetric_in_passes_and_failures() -> None:
    for successes, runs in ((3, 10), (0, 7), (12, 30)):
        here, mirror = wilson(successes, runs), wilson(runs - successes, runs)
        assert here.low == pytest.approx(100 - mirror.high, abs=1e-3)


def test_narrow_is_a_threshold_strictly_inside_the_interval() -> None:
    assert wilson(7, 10).holds(80)  # 70% observed, 80% needed: cannot tell
    assert not wilson(10, 10).holds(50)  # 69.2-100: clears 50
    assert not wilson(0, 10).holds(50)  # 0-27.8: below 50


@pytest.mark.parametrize("bad", [(1, 0), (-1, 3), (4, 3)])
def test_impossible_counts_are_refused(bad: tuple[int, int]) -> None:
    with pytest.raises(ValueError, match="must be"):
        wilson(*bad)
    with pytest.raises(ValueError, match="must be"):
        fisher_drop(*bad, 1, 1)


@given(st.integers(1, 200).flatmap(lambda n: st.tuples(st.integers(0, n), st.just(n))))
def test_wilson_contains_the_observed_rate(counts: tuple[int, int]) -> None:
    successes, runs = counts
    got = wilson(successes, runs)
    rate = 100 * successes / runs
    assert 0 <= got.low <= rate + 1e-9 and rate - 1e-9 <= got.high <= 100
    assert not math.isnan(got.low)
