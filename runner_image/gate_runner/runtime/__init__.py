"""The agent runtime: tool, sequential and LLM agents, with middleware, tool hooks and
trigger_agent (spec sections 2 to 4).

An invocation runs in its own forked process, so the runtime may keep per-run state in
plain attributes and patch ``connic.tools`` for the user code it imports.

One module per concern, so that a change to one of them has one place to go:

- ``orchestrator``: the Runtime of one invocation, a run from start to outcome, dispatch
- ``port``: what the other modules see of that Runtime (``RuntimePort``, a Protocol) and a
  run's outcome: they import it, never the orchestrator, which imports them
- ``tool_agent``, ``sequential``, ``llm``: one agent kind each (``operation`` is what tool
  and sequential agents share: middleware around retried attempts)
- ``toolset``: which tools an LLM agent offers its model, and their schemas
- ``tool_calls``: one tool call: approval, hooks, the tool itself or its mock
- ``mcp``: an LLM agent's MCP servers; ``mcp_tools``: the tools found on them
- ``middleware``, ``guardrails``, ``triggers``, ``output_schema``: one call phase each
- ``mocking``: mock-or-real for a phase, and strict-flag violations
- ``model_choice``: an agent's model for the invocation; ``sessions``: session history and
  context compression of LLM agents; ``retries``: how many attempts a model request and an
  operation get (the rule without ``retry_options``)
- ``trace``, ``payloads``, ``usercode``: spans, payload shapes, calling user code;
  ``model_request``: what a model span records of its request, and its caps
"""

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..runtime_errors import AgentNotFound, AgentRunError
    from .llm import render_prompt
    from .orchestrator import Runtime
    from .output_schema import schema_problem
    from .payloads import as_payload, content_to_message, jsonable, stage_input, user_content
    from .port import RunOutcome
    from .tool_calls import ApprovalRejected
    from .toolset import PREDEFINED_SCHEMAS, predefined_stubs, tool_schema
    from .trace import Span, Trace, error_text, timed
    from .triggers import install_predefined
    from .usercode import call_user_function

# Each name from its module on first use: what a case needs of the runtime is imported, and
# only that (a tool agent's case never loads the LLM loop, the model clients or MCP).
_HOMES = {
    "AgentNotFound": "..runtime_errors",
    "AgentRunError": "..runtime_errors",
    "render_prompt": ".llm",
    "RunOutcome": ".port",
    "Runtime": ".orchestrator",
    "schema_problem": ".output_schema",
    "as_payload": ".payloads",
    "content_to_message": ".payloads",
    "jsonable": ".payloads",
    "stage_input": ".payloads",
    "user_content": ".payloads",
    "ApprovalRejected": ".tool_calls",
    "PREDEFINED_SCHEMAS": ".toolset",
    "predefined_stubs": ".toolset",
    "tool_schema": ".toolset",
    "Span": ".trace",
    "Trace": ".trace",
    "error_text": ".trace",
    "timed": ".trace",
    "install_predefined": ".triggers",
    "call_user_function": ".usercode",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(home, __name__), name)


__all__ = [
    "PREDEFINED_SCHEMAS",
    "AgentNotFound",
    "AgentRunError",
    "ApprovalRejected",
    "RunOutcome",
    "Runtime",
    "Span",
    "Trace",
    "as_payload",
    "call_user_function",
    "content_to_message",
    "error_text",
    "install_predefined",
    "jsonable",
    "predefined_stubs",
    "render_prompt",
    "schema_problem",
    "stage_input",
    "timed",
    "tool_schema",
    "user_content",
]
