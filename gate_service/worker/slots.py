"""Case slots: the case containers one worker runs at once, shared by the gates it holds.

A gate asks for a slot per case; free slots go to the waiting gates in turn (round-robin),
not first come first served, so a gate of two cases held next to a gate of two hundred gets
every other free slot and finishes early instead of waiting behind the large one.
"""

from __future__ import annotations

import threading
from collections.abc import Hashable, Iterator
from contextlib import contextmanager


class CaseSlots:
    def __init__(self, size: int) -> None:
        if size < 1:
            raise ValueError("a worker needs at least one case slot")
        self.size = size
        self._free = size
        self._cond = threading.Condition()
        # Gates with a case waiting, in turn order (a dict keeps insertion order): the first
        # takes the next free slot, then goes to the back if it has more cases waiting.
        self._waiting: dict[Hashable, int] = {}

    @contextmanager
    def slot(self, gate: Hashable) -> Iterator[None]:
        """Hold one slot for a case of ``gate`` (waiting for its turn) while in the block."""
        self._acquire(gate)
        try:
            yield
        finally:
            self._release()

    def _acquire(self, gate: Hashable) -> None:
        with self._cond:
            self._waiting[gate] = self._waiting.get(gate, 0) + 1
            while not (self._free > 0 and next(iter(self._waiting)) == gate):
                self._cond.wait()
            self._free -= 1
            left = self._waiting.pop(gate) - 1
            if left:
                self._waiting[gate] = left  # back of the line
            self._cond.notify_all()  # the next gate in turn may take another free slot

    def _release(self) -> None:
        with self._cond:
            self._free += 1
            self._cond.notify_all()
