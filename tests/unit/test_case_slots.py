"""The worker's case slots: free slots go to the waiting gates in turn."""

from __future__ import annotations

import threading
import time

import pytest

from gate_service.worker.slots import CaseSlots


def wait_until_waiting(slots: CaseSlots, expected: dict[str, int]) -> None:
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
            ("large", {"large": 1}),
            ("large", {"large": 2}),
            ("large", {"large": 3}),
            ("small", {"large": 3, "small": 1}),
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
