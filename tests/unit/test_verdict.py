"""Case verdict arithmetic: exact integers, never floating-point rounding."""

import pytest

from gate_runner.verdict import case_failure_reason, case_passes, required_successes


@pytest.mark.parametrize(
    ("successes", "runs", "threshold", "passes"),
    [
        (4, 5, 80, True),
        (9, 10, 90, True),
        (19, 20, 95, True),
        (3, 5, 80, False),
        (2, 3, 67, False),  # 66.67% < 67%: rounding would wrongly pass this
        (2, 3, 66, True),
        (1, 1, 100, True),
        (0, 1, 1, False),
        (1, 100, 1, True),
        (99, 100, 100, False),
    ],
)
def test_exact_threshold_arithmetic(
    successes: int, runs: int, threshold: int, passes: bool
) -> None:
    assert case_passes(successes, runs, threshold) is passes


@pytest.mark.parametrize(
    ("runs", "threshold", "needed"), [(3, 67, 3), (3, 66, 2), (5, 80, 4), (10, 1, 1)]
)
def test_required_successes_is_the_boundary(runs: int, threshold: int, needed: int) -> None:
    assert required_successes(runs, threshold) == needed
    assert case_passes(needed, runs, threshold)
    assert not case_passes(needed - 1, runs, threshold)


def test_zero_runs_is_refused() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        case_passes(0, 0, 100)


def test_failure_reason_counts_and_names_the_first_failure() -> None:
    reason = case_failure_reason(
        runs=5,
        success_threshold=80,
        invocation_reasons=[None, "first bad", None, "second bad", None],
    )
    assert reason is not None
    assert reason.startswith("2 of 5 invocation(s) failed (3 passed, 4 needed for 80%)")
    assert "invocation 2): first bad" in reason
    assert "second bad" not in reason


def test_failure_reason_is_none_when_the_threshold_is_met() -> None:
    assert (
        case_failure_reason(runs=5, success_threshold=80, invocation_reasons=[None] * 4 + ["x"])
        is None
    )
