"""Brakes on failed authentication, per API process: no HTTP, no database.

``FailureLimiter`` makes a client that keeps failing wait (429); ``AuditBudget`` bounds how
many audit rows refusals write, however many clients they come from.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Callable


class FailureLimiter:
    """Counts failed authentications per client; past the limit the client waits (429).

    In memory, per API process: enough to make guessing a 256-bit token pointless and to keep
    a flood of bad tokens from writing an audit row each.
    """

    def __init__(self, limit: int, window_s: float) -> None:
        self.limit, self.window_s = limit, window_s
        self._failures: dict[str, deque[float]] = {}
        self._lock = threading.Lock()

    def _recent(self, client: str, now: float) -> deque[float]:
        failures = self._failures.setdefault(client, deque())
        while failures and failures[0] <= now - self.window_s:
            failures.popleft()
        return failures

    def retry_after(self, client: str) -> int | None:
        """Seconds the client must wait, or None when it may try."""
        now = time.monotonic()
        with self._lock:
            failures = self._recent(client, now)
            if len(failures) < self.limit:
                if not failures:
                    self._failures.pop(client, None)
                return None
            return max(1, math.ceil(failures[0] + self.window_s - now))

    def failed(self, client: str) -> None:
        with self._lock:
            self._recent(client, time.monotonic()).append(time.monotonic())


class AuditBudget:
    """Audit rows for refused tokens, at most ``limit`` per window in this process.

    The failure brake bounds each client address, not how many addresses there are (a
    botnet, or a proxy's forwarded addresses): past the budget a refusal is counted, not
    written, and the next row written says how many were left out (``suppressed``).
    """

    def __init__(
        self, limit: int, window_s: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.limit, self.window_s, self.clock = limit, window_s, clock
        self._written: deque[float] = deque()
        self._suppressed = 0
        self._lock = threading.Lock()

    def take(self) -> int | None:
        """None: write no row; else write one, saying this many before it were left out."""
        now = self.clock()
        with self._lock:
            while self._written and self._written[0] <= now - self.window_s:
                self._written.popleft()
            if len(self._written) >= self.limit:
                self._suppressed += 1
                return None
            self._written.append(now)
            suppressed, self._suppressed = self._suppressed, 0
            return suppressed
