"""Budgets: how many model calls, tokens, dollars and concurrent calls a gate and a project
may spend through this worker process's gateway.

A gate's budget is shared by all its cases' channels; a project's by all channels of the
project in this process, over a window that starts again every ``window_s`` seconds. Calls
are checked before a call is forwarded; tokens and cost are known only after it, so they are
checked before forwarding against what is already spent: the call that crosses a limit is
answered and counted, and the next one is refused. Concurrency is not spending: a call over
a concurrent-call limit waits for one in flight to end (until the gate's deadline), because
failing it would make a case's verdict depend on how many others happened to run beside it.
Across worker processes a project's budget would need its accounting in Postgres; this one
is per process.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from .failure import Failure


@dataclass(frozen=True, slots=True)
class Limits:
    """One scope's limits; 0 means no limit."""

    calls: int = 0
    tokens: int = 0  # prompt and completion tokens together
    cost_usd: float = 0.0
    concurrent_calls: int = 0


@dataclass(frozen=True, slots=True)
class Budgets:
    """The limits a channel is opened under: its gate's and its project's."""

    gate: Limits = field(default_factory=Limits)
    project: Limits = field(default_factory=Limits)
    project_window_s: float = 86400.0  # 0: the project's count never starts again


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:.6g}"


class Budget:
    """One scope's counters ("gate" or "project"); changed only under the ledger's lock."""

    def __init__(
        self,
        scope: str,
        limits: Limits,
        *,
        window_s: float = 0.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.scope = scope
        self.limits = limits
        self.window_s = window_s
        self._clock = clock
        self._window_start = clock()
        self.calls = 0
        self.tokens = 0
        self.cost_usd = 0.0
        self.in_flight = 0

    def _roll(self) -> None:
        if self.window_s > 0 and self._clock() - self._window_start >= self.window_s:
            self._window_start = self._clock()
            self.calls, self.tokens, self.cost_usd = 0, 0, 0.0

    def refusal(self) -> Failure | None:
        """Why one more call may never start (calls, tokens or cost spent), or None."""
        self._roll()
        checks: list[tuple[str, float, float]] = [
            ("calls", self.limits.calls, self.calls),
            ("tokens", self.limits.tokens, self.tokens),
            ("cost_usd", self.limits.cost_usd, self.cost_usd),
        ]
        for name, allowed, used in checks:
            if allowed > 0 and used >= allowed:
                limit = f"{self.scope}.{name}"
                return Failure(
                    "budget",
                    f"{limit} budget of {_number(allowed)} reached ({_number(used)} used)",
                    limit=limit,
                    allowed=float(allowed),
                    used=float(used),
                )
        return None

    def full(self) -> bool:
        """Whether one more call must wait: its concurrent calls are all in flight."""
        return 0 < self.limits.concurrent_calls <= self.in_flight


class BudgetLedger:
    """Admits calls against several budgets at once: all of them admit, or none is charged.

    One lock for the whole gateway: an admission is a few comparisons, and one lock makes a
    call's gate and project charges a single step."""

    def __init__(self, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._changed = threading.Condition()
        self._clock = clock
        self.waiting = 0  # calls waiting for a concurrent-call place now

    def admit(
        self,
        budgets: Sequence[Budget],
        *,
        deadline: float = float("inf"),
        stopped: Callable[[], bool] = lambda: False,
    ) -> None:
        """Count one call starting, once no concurrent-call limit is full; raise
        ``Failure("budget")`` for the first spending limit reached, or ``Failure("deadline")``
        when ``deadline`` (a ``clock`` instant) comes, or ``stopped()``, while it waits."""
        with self._changed:
            while True:
                for budget in budgets:
                    refused = budget.refusal()
                    if refused is not None:
                        raise refused
                full = [b for b in budgets if b.full()]
                if not full:
                    break
                left = deadline - self._clock()
                if left <= 0 or stopped():
                    limit = f"{full[0].scope}.concurrent_calls"
                    allowed = full[0].limits.concurrent_calls
                    raise Failure(
                        "deadline",
                        f"the call waited for one of its {limit} ({allowed}) until the gate's "
                        "deadline",
                        limit=limit,
                        allowed=float(allowed),
                        used=float(full[0].in_flight),
                    )
                # Woken when a call ends; a short timeout notices the deadline and a close.
                self.waiting += 1
                try:
                    self._changed.wait(min(left, 0.5))
                finally:
                    self.waiting -= 1
            for budget in budgets:
                budget.calls += 1
                budget.in_flight += 1

    def settle(self, budgets: Sequence[Budget], *, tokens: int, cost_usd: float) -> None:
        """Count one admitted call ending, with what it spent."""
        with self._changed:
            for budget in budgets:
                budget.in_flight -= 1
                budget.tokens += tokens
                budget.cost_usd += cost_usd
            self._changed.notify_all()
