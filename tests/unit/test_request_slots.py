"""Upload and long-poll slots: a share per project, the process's capacity for all."""

from __future__ import annotations

import pytest

from gate_service.admission import Slots
from gate_service.errors import ServiceUnavailable, TooManyRequests


def slots(capacity: int, per_project: int | None = None) -> Slots:
    return Slots(
        capacity, "uploads", "GATE_CAP", per_project=per_project, per_project_setting="GATE_SHARE"
    )


@pytest.mark.parametrize(
    ("capacity", "setting", "share"),
    [(8, None, 4), (1, None, 1), (3, None, 1), (8, 2, 2), (4, 9, 4)],
)
def test_a_projects_share_is_the_setting_or_half_and_never_past_the_capacity(
    capacity: int, setting: int | None, share: int
) -> None:
    assert slots(capacity, setting).per_project == share


def test_a_project_at_its_share_gets_429_and_others_still_get_a_slot() -> None:
    s = slots(4)
    with s.hold("a", "alpha"), s.hold("a", "alpha"):
        with pytest.raises(TooManyRequests) as refused:
            s.hold("a", "alpha").__enter__()
        assert "project 'alpha' already has 2 uploads in progress" in refused.value.detail
        assert "its share of the 4 (GATE_SHARE)" in refused.value.detail
        assert int(refused.value.headers["Retry-After"]) > 0
        with s.hold("b", "beta"):
            assert (s.in_use, s.held_by("a"), s.held_by("b")) == (3, 2, 1)
    assert (s.in_use, s.held_by("a"), s.held_by("b")) == (0, 0, 0)


def test_a_full_process_gets_503_whoever_asks() -> None:
    s = slots(2, per_project=2)
    assert s.try_acquire("a") and s.try_acquire("a")
    with pytest.raises(ServiceUnavailable, match=r"already handling 2 uploads .*GATE_CAP"):
        s.hold("b", "beta").__enter__()
    s.release("a")
    assert s.try_acquire("b")


def test_a_release_without_a_slot_changes_nothing() -> None:
    s = slots(2)
    assert s.try_acquire("a")
    s.release("b")
    assert (s.in_use, s.held_by("a")) == (1, 1)
