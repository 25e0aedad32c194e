"""Errors the runtime raises on purpose; their message becomes the run's `error`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


class AgentRunError(Exception):
    """The run fails with this message (a contract broken by user code, a missing model...)."""


class AgentNotFound(AgentRunError):
    """A test, a chain or a trigger names an agent the project does not define."""


class InvocationTimedOut(BaseException):
    """The invocation's timeout passed and the runner asked it to end its run (case.py): the
    run fails with this message and its middleware cleanup still runs. A BaseException, so
    that user code's `except Exception` does not swallow it."""


class ModelCallError(AgentRunError):
    """A model call that failed, with what its model span should show about why."""

    def __init__(self, message: str, span_metadata: Mapping[str, Any]) -> None:
        super().__init__(message)
        self.span_metadata = dict(span_metadata)

    @property
    def outside_the_agent(self) -> bool:
        """Whether the call failed for a reason outside the bundle (docs/semantics.md,
        "Provider failures are not agent failures"): the provider refused the credentials or
        does not know the model, could not be reached, failed or rate-limited after the
        retries, or the gate's budget, deadline or gateway stopped it. A run that fails so
        says nothing of the agent. A request the provider rejected as such (a 400 or 422: a
        prompt over the context window, an option or schema the model does not take) is the
        agent's configuration, and stays a failure."""
        kind = self.span_metadata.get("error_kind")
        if kind in OUTSIDE_KINDS:
            return True
        if kind != "provider":
            return False  # bad_request (over the wire's cap), or a script's own error
        status = self.span_metadata.get("provider_status")
        return not isinstance(status, int) or status not in REQUEST_REJECTED


# Model-call failures no agent causes: the gateway's kinds (gateway_wire.ErrorKind) and the
# runner's own (the gateway unreachable, its reply broken or over the cap).
OUTSIDE_KINDS = frozenset(
    {"no_route", "budget", "rate_limited", "deadline", "refused", "unreachable", "bad_reply",
     "reply_too_large"}
)  # fmt: skip
# A provider's answers that reject the request itself, not the caller or the provider's state.
REQUEST_REJECTED = frozenset({400, 413, 422})
