"""The worker's case slots: fair shares between projects, then the waiting gates in turn."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from gate_service.worker.slots import CaseLease, CaseSlots


def wait_until_waiting(slots: CaseSlots, expected: dict[Any, dict[str, int]]) -> None:
    """Until the cases waiting, per project and gate, are ``expected``."""
    for _ in range(2000):  # the threads reach their wait in well under a second
        with slots._cond:
            if slots._waiting == expected:
                return
        time.sleep(0.005)
    raise AssertionError(f"waiting: {slots._waiting}, expected {expected}")


def test_free_slots_go_round_robin_across_gates() -> None:
    slots = CaseSlots(1)
    order: list[str] = []

    def case(gate: str) -> None:
        with slots.slot(gate):
            order.append(gate)

    threads = []
    with slots.slot("busy"):  # the only slot is taken: everyone below waits
        for gate, waiting in (
            ("large", {None: {"large": 1}}),
            ("large", {None: {"large": 2}}),
            ("large", {None: {"large": 3}}),
            ("small", {None: {"large": 3, "small": 1}}),
        ):
            threads.append(threading.Thread(target=case, args=(gate,)))
            threads[-1].start()
            wait_until_waiting(slots, waiting)
    for t in threads:
        t.join()
    # The small gate, queued behind three cases of the large one, gets the second slot.
    assert order == ["large", "small", "large", "large"]


def test_at_most_size_slots_are_held_at_once() -> None:
    slots = CaseSlots(2)
    held, most = 0, 0
    lock = threading.Lock()

    def case(gate: str) -> None:
        nonlocal held, most
        with slots.slot(gate):
            with lock:
                held += 1
                most = max(most, held)
            time.sleep(0.001)
            with lock:
                held -= 1

    threads = [threading.Thread(target=case, args=(f"g{i % 3}",)) for i in range(30)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert most <= 2


def test_a_worker_needs_a_slot() -> None:
    with pytest.raises(ValueError, match="at least one"):
        CaseSlots(0)


class Cases:
    """Cases run in threads; each holds its slot until released by the test."""

    def __init__(self, slots: CaseSlots) -> None:
        self.slots = slots
        self.running: list[tuple[str, str]] = []  # (project, gate), in the order they started
        self._release: dict[int, threading.Event] = {}
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()

    def start(self, project: str, gate: str) -> int:
        n = len(self._threads)
        self._release[n] = threading.Event()

        def case() -> None:
            with self.slots.slot(gate, project):
                with self._lock:
                    self.running.append((project, gate))
                self._release[n].wait()

        self._threads.append(threading.Thread(target=case, daemon=True))
        self._threads[-1].start()
        return n

    def end(self, n: int) -> None:
        self._release[n].set()
        self._threads[n].join()

    def wait_running(self, count: int) -> None:
        for _ in range(2000):
            with self._lock:
                if len(self.running) >= count:
                    return
            time.sleep(0.005)
        raise AssertionError(f"running: {self.running}, expected {count}")

    def end_all(self) -> None:
        for n in self._release:
            self._release[n].set()
        for t in self._threads:
            t.join()


def held_by_a(*gates: str) -> tuple[CaseSlots, Cases, list[int]]:
    """Two slots, both running a case of project A (one per gate named)."""
    slots = CaseSlots(2)
    cases = Cases(slots)
    a = [cases.start("A", gate) for gate in gates]
    cases.wait_running(2)
    return slots, cases, a


def test_a_project_under_its_share_starts_at_once_even_with_every_slot_taken() -> None:
    slots, cases, a = held_by_a("a1", "a2")
    more_a = cases.start("A", "a1")  # A holds the whole worker; its next case waits
    wait_until_waiting(slots, {"A": {"a1": 1}})
    cases.start("B", "b1")  # B holds nothing, under its share of 1: past the size, at once
    cases.wait_running(3)
    assert cases.running[-1] == ("B", "b1") and slots.in_use == 3
    # One of A's ends: A (2 -> 1) is at its share and B holds its own, so the freed slot
    # does not go over the size: A's waiting case starts only once in_use is back under 2.
    cases.end(a[0])
    cases.wait_running(3)
    wait_until_waiting(slots, {"A": {"a1": 1}})
    cases.end(a[1])
    cases.wait_running(4)
    assert cases.running[-1] == ("A", "a1")
    cases.end(more_a)
    cases.end_all()


def test_a_slot_goes_to_the_project_under_its_share_before_one_at_it() -> None:
    slots, cases, a = held_by_a("a1", "a1")
    cases.start("A", "a2")  # waits first
    wait_until_waiting(slots, {"A": {"a2": 1}})
    cases.start("B", "b1")  # over the size, at once (B holds nothing)
    cases.start("B", "b1")  # B at its share now: waits, behind A in turn order
    cases.wait_running(3)
    wait_until_waiting(slots, {"A": {"a2": 1}, "B": {"b1": 1}})
    cases.end(a[0])  # in_use 3 -> 2: still no room within the size
    wait_until_waiting(slots, {"A": {"a2": 1}, "B": {"b1": 1}})
    cases.end(a[1])  # A holds none now, under its share: its case goes before B's
    cases.wait_running(4)
    assert cases.running[-1] == ("A", "a2")
    cases.end_all()


def test_never_more_than_twice_the_size_whatever_the_projects() -> None:
    slots = CaseSlots(2)
    cases = Cases(slots)
    for p in range(8):  # eight projects, each under its share when it comes
        cases.start(f"P{p}", "g")
    cases.wait_running(4)
    with slots._cond:
        assert slots.in_use == 4 and sum(len(g) for g in slots._waiting.values()) == 4
    cases.end_all()
    assert slots.in_use == 0


# -- a case lends its slot while it waits on its model (CaseLease) -------------------------


def test_a_case_waiting_on_its_model_lends_its_slot_and_takes_one_back_after() -> None:
    slots = CaseSlots(1)
    lease = CaseLease(slots, "live")
    ran_meanwhile = threading.Event()
    with lease:
        assert slots.in_use == 1
        with lease.waiting_on_model():
            assert slots.in_use == 0
            # Another case gets the only slot while this one waits on its model.
            other = threading.Thread(target=lambda: _hold(slots, "other", ran_meanwhile))
            other.start()
            assert ran_meanwhile.wait(10)
            other.join()
        assert slots.in_use == 1  # taken back before the answer is handed back
    assert slots.in_use == 0


def _hold(slots: CaseSlots, gate: str, done: threading.Event) -> None:
    with slots.slot(gate):
        done.set()


def test_the_answer_waits_until_the_case_holds_a_slot_again() -> None:
    slots = CaseSlots(1)
    lease = CaseLease(slots, "live")
    release_other = threading.Event()
    other_holds = threading.Event()
    answered = threading.Event()

    def other() -> None:
        with slots.slot("other"):
            other_holds.set()
            release_other.wait(10)

    def call() -> None:
        with lease.waiting_on_model():
            thread = threading.Thread(target=other)
            thread.start()
            assert other_holds.wait(10)
        answered.set()  # only once the slot is this case's again
        thread.join()

    with lease:
        caller = threading.Thread(target=call)
        caller.start()
        assert other_holds.wait(10)
        wait_until_waiting(slots, {None: {"live": 1}})
        assert not answered.is_set()
        release_other.set()
        caller.join(10)
        assert answered.is_set() and slots.in_use == 1
    assert slots.in_use == 0


def test_concurrent_calls_lend_one_slot_and_a_case_that_ended_takes_none() -> None:
    slots = CaseSlots(2)
    lease = CaseLease(slots, "live")
    with lease:
        with lease.waiting_on_model(), lease.waiting_on_model():
            assert slots.in_use == 0  # lent once, not twice
        assert slots.in_use == 1
    # A call still in flight when its case ends (the container gone): nothing is taken back.
    lease = CaseLease(slots, "live")
    with lease:
        waiting = lease.waiting_on_model()
        waiting.__enter__()
    waiting.__exit__(None, None, None)
    assert slots.in_use == 0
