"""Which model an agent's calls go to in one invocation: chosen on its first use (an LLM
agent's first turn, or a moderation guardrail's first check) and kept for the invocation.
A module of its own because both the LLM loop (llm.py) and the guardrails ask it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..runtime_errors import AgentRunError
from .retries import model_request_attempts, retries_request

if TYPE_CHECKING:
    from ..models import Model
    from .port import RuntimePort


def model_for(rt: RuntimePort, name: str) -> Model:
    """The agent's model, chosen once per invocation (scripted, replay or live)."""
    if name not in rt.models:
        from ..models import choose_model  # here: agents without a model never load it

        if rt.project is None:
            raise AgentRunError("LLM agents need the project directory to find their model")
        rt.models[name] = choose_model(
            rt.project,
            name,
            rt.model_mode,
            # retry_options.attempts, else 3 (decided, issue 39: the rule is in retries.py).
            attempts=model_request_attempts(rt.agents[name].config),
            gateway=rt.gateway,
            retries=retries_request,  # a scripted model's rule, which models.py cannot import
        )
    return rt.models[name]
