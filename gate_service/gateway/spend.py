"""A project's model spending kept in Postgres, so that its budget holds across every worker
process (budget.SpendStore; table project_model_spend, migration 0009).

Windows are aligned to the epoch (``window_s`` seconds each; 0: one window for ever), so
every process agrees on which window a call falls in without talking to the others. A call
is charged by one statement that adds it only while no limit is reached, so two workers
cannot both take the last call of a budget.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable

from sqlalchemy import text
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from ..db import session_scope
from .budget import Limits, spent_refusal
from .failure import Failure

log = logging.getLogger(__name__)

_CHARGE = text(
    """
    INSERT INTO project_model_spend AS s (project_id, window_start, calls, tokens, cost_usd)
    VALUES (:owner, :window, 1, 0, 0)
    ON CONFLICT (project_id, window_start) DO UPDATE SET calls = s.calls + 1
    WHERE (:max_calls = 0 OR s.calls < :max_calls)
      AND (:max_tokens = 0 OR s.tokens < :max_tokens)
      AND (:max_cost = 0 OR s.cost_usd < :max_cost)
    RETURNING s.calls
    """
)
_SPENT = text(
    "SELECT calls, tokens, cost_usd FROM project_model_spend "
    "WHERE project_id = :owner AND window_start = :window"
)
# Into the window the call ended in: a call charged just before a window's end settles in
# the next one, whose row may not exist yet (an UPDATE would lose its spending).
_ADD = text(
    """
    INSERT INTO project_model_spend AS s (project_id, window_start, calls, tokens, cost_usd)
    VALUES (:owner, :window, 0, :tokens, :cost)
    ON CONFLICT (project_id, window_start)
    DO UPDATE SET tokens = s.tokens + :tokens, cost_usd = s.cost_usd + :cost
    """
)


class ProjectSpend:
    """budget.SpendStore over the worker's sessions; ``owner`` is a project's id."""

    def __init__(
        self, sessions: sessionmaker[Session], *, clock: Callable[[], float] = time.time
    ) -> None:
        self._sessions = sessions
        self._clock = clock

    def window(self, window_s: float) -> int:
        if window_s <= 0:
            return 0
        return int(self._clock() // window_s * window_s)

    def charge(self, owner: str, scope: str, limits: Limits, window_s: float) -> Failure | None:
        params = {
            "owner": uuid.UUID(owner),
            "window": self.window(window_s),
            "max_calls": limits.calls,
            "max_tokens": limits.tokens,
            "max_cost": float(limits.cost_usd),
        }
        try:
            with session_scope(self._sessions) as session:
                if session.execute(_CHARGE, params).first() is not None:
                    return None
                row = session.execute(_SPENT, params).one()
        except SQLAlchemyError as exc:
            # Fail closed, and as a budget refusal: a provider's fault would send the agent
            # to its fallback model, which this store would refuse just the same.
            log.warning("model gateway: %s budget of %s not checked: %s", scope, owner, exc)
            return Failure(
                "budget",
                f"{scope} budget could not be checked (the gate's database did not answer); "
                "the call was not made",
            )
        refused = spent_refusal(scope, limits, calls=row[0], tokens=row[1], cost_usd=row[2])
        # Refused by the statement, so a limit was reached when it ran.
        return refused or Failure("budget", f"{scope} budget reached")

    def add(self, owner: str, window_s: float, *, tokens: int, cost_usd: float) -> None:
        params = {
            "owner": uuid.UUID(owner),
            "window": self.window(window_s),
            "tokens": tokens,
            "cost": float(cost_usd),
        }
        with session_scope(self._sessions) as session:
            session.execute(_ADD, params)
