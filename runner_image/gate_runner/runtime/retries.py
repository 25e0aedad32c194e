"""How many attempts an agent's work gets: its ``retry_options``, and one rule for an agent
without them (decided, issue 39; docs/semantics.md, Retries).

The rule. Without ``retry_options``, a model request (an LLM agent's turn, its compression
summary, a moderation check) gets 3 attempts, the SDK's ``RetryOptions().attempts``, and
everything else gets 1: a tool or sequential agent's operation, and any tool call (an LLM
agent's tool error goes back to its model; an MCP call is made once). With
``retry_options``, its ``attempts`` (3 when it leaves the field out) count for both. Only a
live request or an operation waits between attempts (the gateway's backoff, and
``initial_delay`` doubling up to ``max_delay``); a scripted model is asked again at once.

Why a tool and a chain keep one attempt by default: applied to them, the SDK's default
(``initial_delay`` 10, ``max_delay`` 30) would hold every failing tool agent's verdict 10 +
20 s longer and run its side effects three times, when a test that wants the retries says so
with ``retry_options``; a model request is retried by default because a provider's 429 or
5xx is the provider's weather, not the agent's behaviour.
"""

from __future__ import annotations

from typing import Any

from ..runtime_errors import AgentRunError
from .sdk import stop_processing

# The SDK's RetryOptions default (connic/core.py: attempts=3): an LLM agent's request budget.
MODEL_REQUEST_ATTEMPTS = 3
# What the gate gives a tool or sequential agent's operation without retry_options.
OPERATION_ATTEMPTS = 1


def model_request_attempts(config: Any) -> int:
    """The tries of each model request of the agent (``config`` its AgentConfig): the
    agent's ``retry_options.attempts``, else 3."""
    return _attempts(config, MODEL_REQUEST_ATTEMPTS)


def operation_attempts(config: Any) -> int:
    """The attempts of a tool or sequential agent's operation, the first included: the
    agent's ``retry_options.attempts``, else 1."""
    return _attempts(config, OPERATION_ATTEMPTS)


def _attempts(config: Any, default: int) -> int:
    retry = getattr(config, "retry_options", None)
    if retry is None:
        return default
    # Given retry_options without `attempts` is the SDK's default, as its model fills it in.
    return max(1, int(getattr(retry, "attempts", None) or MODEL_REQUEST_ATTEMPTS))


def retries_request(exc: BaseException) -> bool:
    """Whether a scripted model's failed request is asked again (while attempts remain).

    Not a context-window refusal (context compression repairs the prompt and asks once more,
    outside the retry budget: SDK RetryOptions.attempts, "One context-compression repair
    request is separate"), nor the runtime's own errors or a StopProcessing, which end the
    run as they would from a tool. Only exceptions: the invocation's timeout is a
    BaseException and ends the run at once."""
    from .sessions import is_context_window_error  # here: a tool agent's case never loads it

    if not isinstance(exc, Exception) or isinstance(exc, (AgentRunError, stop_processing())):
        return False
    return not is_context_window_error(exc)
