"""A worker's fair shares between projects: its gate places and its case slots.

A worker judges up to GATE_WORKER_GATES gates at once (its *places*) and runs up to
GATE_CASE_CONCURRENCY case containers at once (its *slots*), shared by the gates it holds.
Both are shared by projects under one rule:

- A project's **fair share** of a capacity is an equal part of it among the projects that
  hold or want some of it, at least one: ``share_of(capacity, projects)``.
- **Work-conserving**: a project alone may use the whole capacity.
- **A project below its share never waits for one above it.** Nothing is taken back (a
  running case is never stopped, a held gate never handed back), so when every place or slot
  is in use and a project below its share comes, it is served at once beyond the capacity,
  up to twice it (``OVERDRAFT``); meanwhile a project at or over its share gets nothing
  new, so the overdraft is paid back as that project's work ends.

So one project's slow gates can no longer keep another's one-case gate `queued`: its gate
is claimed and its case started at once, while the slow project runs on within its share.
Within a project, free slots go to its waiting gates in turn (round-robin), so a gate of two
cases held next to a gate of two hundred gets every other free slot and finishes early.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Hashable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Generic, TypeVar

# Capacity times this: what a worker may use at most while it serves a project below its
# share (it never takes work back, so the newcomer is served on top).
OVERDRAFT = 2


def share_of(capacity: int, projects: int) -> int:
    """A project's fair share of ``capacity`` among ``projects``: an equal part, at least 1."""
    return max(1, capacity // max(1, projects))


P = TypeVar("P", bound=Hashable)


@dataclass(frozen=True)
class PlaceClaim(Generic[P]):
    """The claim a worker may make for one more gate: of a project not in ``exclude`` (those
    at or over their share of its places), then, when ``fallback``, of any project."""

    exclude: frozenset[P]
    fallback: bool


def next_place_claim(held: Mapping[P, int], limit: int) -> PlaceClaim[P] | None:
    """What a worker holding ``held`` gates (per project) may claim next; None: nothing.

    Below ``limit`` places, projects under their share first and then any (work-conserving);
    at ``limit`` or over, only a project under its share, up to OVERDRAFT times ``limit``.
    """
    total = sum(held.values())
    if total >= OVERDRAFT * limit:
        return None
    share = share_of(limit, sum(1 for n in held.values() if n))
    over = frozenset(p for p, n in held.items() if n >= share)
    return PlaceClaim(exclude=over, fallback=total < limit)


class CaseSlots:
    """The case slots of one worker, handed to the waiting cases by the rule above."""

    def __init__(self, size: int) -> None:
        if size < 1:
            raise ValueError("a worker needs at least one case slot")
        self.size = size
        self.ceiling = OVERDRAFT * size
        self._in_use = 0
        self._held: Counter[Hashable] = Counter()  # slots in use, per project
        self._cond = threading.Condition()
        # Projects with a case waiting, in turn order, each with its gates in turn order (a
        # dict keeps insertion order) and their waiting cases: the first takes the next
        # slot, then goes to the back of its line if it has more waiting.
        self._waiting: dict[Hashable, dict[Hashable, int]] = {}

    @property
    def in_use(self) -> int:
        return self._in_use

    @contextmanager
    def slot(self, gate: Hashable, project: Hashable = None) -> Iterator[None]:
        """Hold one slot for a case of ``gate`` of ``project`` (waiting for its turn) while
        in the block."""
        self._acquire(gate, project)
        try:
            yield
        finally:
            self._release(project)

    def _next(self) -> tuple[Hashable, Hashable] | None:
        """The (project, gate) whose case takes a slot now, if any may."""
        if not self._waiting:
            return None
        active = set(self._waiting) | {p for p, n in self._held.items() if n}
        share = share_of(self.size, len(active))
        below = [p for p in self._waiting if self._held[p] < share]
        # Below its share: served even past the size (see OVERDRAFT); otherwise in turn,
        # within the size, and only while no project below its share waits.
        candidates, room = (below, self.ceiling) if below else (list(self._waiting), self.size)
        if self._in_use >= room:
            return None
        project = candidates[0]
        return project, next(iter(self._waiting[project]))

    def _acquire(self, gate: Hashable, project: Hashable) -> None:
        with self._cond:
            gates = self._waiting.setdefault(project, {})
            gates[gate] = gates.get(gate, 0) + 1
            while self._next() != (project, gate):
                self._cond.wait()
            self._in_use += 1
            self._held[project] += 1
            gates = self._waiting.pop(project)
            left = gates.pop(gate) - 1
            if left:
                gates[gate] = left  # the back of its project's line
            if gates:
                self._waiting[project] = gates  # the back of the line of projects
            self._cond.notify_all()  # the next in turn may take another slot

    def _release(self, project: Hashable) -> None:
        with self._cond:
            self._in_use -= 1
            self._held[project] -= 1
            if not self._held[project]:
                del self._held[project]
            self._cond.notify_all()


class CaseLease:
    """One case's CPU slot, which it lends back while it only waits on its model.

    A live case spends most of its time waiting for the provider's answer, using no CPU; its
    slot goes to the next case meanwhile (``waiting_on_model``, around each call the
    worker's gateway forwards for it), and the answer is handed back only once the case holds
    a slot again. So at most ``slots.size`` cases compute at once (within the fair-share rule
    above), while more wait on models: their number is bounded by the worker's container
    slots (GATE_MAX_CASE_CONTAINERS, for memory) and the gateway's concurrent-call budgets.

    Enter to take the slot (waiting for it in turn); leave to give it back. With several
    calls in flight at once, the slot is lent at the first and taken back after the last.
    """

    def __init__(self, slots: CaseSlots, gate: Hashable, project: Hashable = None) -> None:
        self._slots = slots
        self._gate = gate
        self._project = project
        self._turns = threading.Lock()  # one lend or take-back at a time
        self._state = threading.Lock()  # guards _held and _closed, never held while waiting
        self._waiting = 0
        self._held = False
        self._closed = False

    def __enter__(self) -> CaseLease:
        self._slots._acquire(self._gate, self._project)
        self._held = True
        return self

    def __exit__(self, *exc: object) -> None:
        with self._state:
            self._closed = True
            give_back, self._held = self._held, False
        if give_back:
            self._slots._release(self._project)

    @contextmanager
    def waiting_on_model(self) -> Iterator[None]:
        """The slot is lent to other cases while in the block; leaving waits for one again
        (unless the case has ended meanwhile, when nothing is taken)."""
        with self._turns:
            self._waiting += 1
            with self._state:
                lend = self._held and not self._closed
                self._held = self._held and not lend
            if lend:
                self._slots._release(self._project)
        try:
            yield
        finally:
            with self._turns:
                self._waiting -= 1
                with self._state:
                    take = not self._waiting and not self._held and not self._closed
                if take:
                    self._slots._acquire(self._gate, self._project)
                    with self._state:
                        # The case ended while this waited: give the slot straight back.
                        keep = not self._closed
                        self._held = keep
                    if not keep:
                        self._slots._release(self._project)
