"""A worker's gate places: which claim it may make next, by its projects' fair shares."""

from __future__ import annotations

import pytest

from gate_service.worker.slots import PlaceClaim, next_place_claim, share_of


@pytest.mark.parametrize(
    ("capacity", "projects", "share"), [(2, 0, 2), (2, 1, 2), (2, 2, 1), (2, 3, 1), (8, 3, 2)]
)
def test_a_share_is_an_equal_part_and_at_least_one(
    capacity: int, projects: int, share: int
) -> None:
    assert share_of(capacity, projects) == share


def test_with_a_place_free_projects_under_their_share_come_first_then_any() -> None:
    assert next_place_claim({}, 2) == PlaceClaim(exclude=frozenset(), fallback=True)
    # Alone, A may have both places (work-conserving): nobody is excluded.
    assert next_place_claim({"A": 1}, 2) == PlaceClaim(exclude=frozenset(), fallback=True)
    # A at its share of 4 among two: another project first, A's only if nothing else.
    assert next_place_claim({"A": 2, "B": 1}, 4) == PlaceClaim(frozenset({"A"}), fallback=True)


def test_with_every_place_taken_only_a_project_under_its_share_is_taken() -> None:
    # A holds both places: B (or any project A is not) is taken beside them, A's are not.
    assert next_place_claim({"A": 2}, 2) == PlaceClaim(frozenset({"A"}), fallback=False)
    # A one place and B one: both at their share; a third project may still come.
    assert next_place_claim({"A": 2, "B": 1}, 2) == PlaceClaim(frozenset({"A", "B"}), False)


def test_never_more_than_twice_the_places() -> None:
    assert next_place_claim({"A": 2, "B": 1, "C": 1}, 2) is None
    assert next_place_claim({"A": 1}, 1) == PlaceClaim(frozenset({"A"}), fallback=False)
    assert next_place_claim({"A": 1, "B": 1}, 1) is None
