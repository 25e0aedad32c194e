"""Budgets: how many model calls, tokens, dollars and concurrent calls a gate and a project
may spend through this worker process's gateway.

A gate's budget is shared by all its cases' channels; a project's by all channels of the
project in this process, over a window that starts again every ``window_s`` seconds. Calls
are checked before a call is forwarded; tokens and cost are known only after it, so they are
checked before forwarding against what is already spent: the call that crosses a limit is
answered and counted, and the next one is refused. Concurrency is not spending: a call over
a concurrent-call limit waits for one in flight to end (until the gate's deadline), because
failing it would make a case's verdict depend on how many others happened to run beside it.
A project's spending (calls, tokens, cost) may be kept in a ``SpendStore`` instead
(gate_service/gateway/spend.py: Postgres), so that every worker process counts against the
same figures; its concurrent calls are counted per process either way.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from .failure import Failure

log = logging.getLogger(__name__)


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


def spent_refusal(
    scope: str, limits: Limits, *, calls: float, tokens: float, cost_usd: float
) -> Failure | None:
    """The first spending limit of ``scope`` that what was spent has reached, or None."""
    checks: list[tuple[str, float, float]] = [
        ("calls", limits.calls, calls),
        ("tokens", limits.tokens, tokens),
        ("cost_usd", limits.cost_usd, cost_usd),
    ]
    for name, allowed, used in checks:
        if allowed > 0 and used >= allowed:
            limit = f"{scope}.{name}"
            return Failure(
                "budget",
                f"{limit} budget of {_number(allowed)} reached ({_number(used)} used)",
                limit=limit,
                allowed=float(allowed),
                used=float(used),
            )
    return None


class SpendStore(Protocol):
    """Where a scope's spending is kept when it must be shared beyond this process."""

    def charge(self, owner: str, scope: str, limits: Limits, window_s: float) -> Failure | None:
        """Count one call of ``owner`` in its current window unless a spending limit is
        reached already; the refusal naming that limit, else None (charged)."""
        ...

    def add(self, owner: str, window_s: float, *, tokens: int, cost_usd: float) -> None:
        """Add a finished call's tokens and cost to ``owner``'s current window."""
        ...


class Budget:
    """One scope's counters ("gate" or "project"); changed only under the ledger's lock."""

    def __init__(
        self,
        scope: str,
        limits: Limits,
        *,
        window_s: float = 0.0,
        clock: Callable[[], float] = time.monotonic,
        store: SpendStore | None = None,
        owner: str = "",
    ) -> None:
        self.scope = scope
        # With a store, spending is checked and counted there (charge), for ``owner``.
        self.store = store
        self.owner = owner
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
        """Why one more call may never start (calls, tokens or cost spent in this process),
        or None; with a store, the store decides when the call is charged."""
        self._roll()
        if self.store is not None:
            return None
        return spent_refusal(
            self.scope, self.limits, calls=self.calls, tokens=self.tokens, cost_usd=self.cost_usd
        )

    def shared(self) -> SpendStore | None:
        """The store that keeps this budget's spending, when it has one and a limit to
        keep; else None."""
        limits = self.limits
        if limits.calls > 0 or limits.tokens > 0 or limits.cost_usd > 0:
            return self.store
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
        # A store is asked outside the lock: its round trip must not hold up other channels'
        # admissions. A refusal there takes this call's place back.
        try:
            for budget in budgets:
                store = budget.shared()
                if store is not None:
                    refused = store.charge(
                        budget.owner, budget.scope, budget.limits, budget.window_s
                    )
                    if refused is not None:
                        raise refused
        except BaseException:
            with self._changed:
                for budget in budgets:
                    budget.calls -= 1
                    budget.in_flight -= 1
                self._changed.notify_all()
            raise

    def settle(self, budgets: Sequence[Budget], *, tokens: int, cost_usd: float) -> None:
        """Count one admitted call ending, with what it spent."""
        with self._changed:
            for budget in budgets:
                budget.in_flight -= 1
                budget.tokens += tokens
                budget.cost_usd += cost_usd
            self._changed.notify_all()
        if not (tokens or cost_usd):
            return
        for budget in budgets:
            store = budget.shared()
            if store is None:
                continue
            try:
                store.add(budget.owner, budget.window_s, tokens=tokens, cost_usd=cost_usd)
            except Exception:
                # The provider answered: the call stands, its spending goes uncounted.
                log.exception(
                    "model gateway: %s spending of %s not stored", budget.scope, budget.owner
                )
