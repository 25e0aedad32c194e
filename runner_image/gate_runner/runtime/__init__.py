"""The agent runtime: tool, sequential and LLM agents, with middleware, tool hooks and
trigger_agent (spec sections 2 to 4).

An invocation runs in its own forked process, so the runtime may keep per-run state in
plain attributes and patch ``connic.tools`` for the user code it imports.

One module per concern, so that a change to one of them has one place to go:

- ``orchestrator``: the Runtime of one invocation, a run from start to outcome, dispatch
- ``tool_agent``, ``sequential``, ``llm``: one agent kind each (``operation`` is what tool
  and sequential agents share: middleware around retried attempts)
- ``toolset``: which tools an LLM agent offers its model, and their schemas
- ``tool_calls``: one tool call: approval, hooks, the tool itself or its mock
- ``middleware``, ``guardrails``, ``triggers``, ``output_schema``: one call phase each
- ``mocking``: mock-or-real for a phase, and strict-flag violations
- ``model_choice``: an agent's model for the invocation; ``sessions``: session history and
  context compression of LLM agents
- ``trace``, ``payloads``, ``usercode``: spans, payload shapes, calling user code
"""

from ..runtime_errors import AgentNotFound, AgentRunError
from .llm import render_prompt
from .orchestrator import RunOutcome, Runtime
from .output_schema import schema_problem
from .payloads import as_payload, content_to_message, jsonable, stage_input, user_content
from .tool_calls import ApprovalRejected
from .toolset import PREDEFINED_SCHEMAS, PREDEFINED_STUBS, tool_schema
from .trace import Span, Trace, error_text, timed
from .triggers import install_predefined
from .usercode import call_user_function

__all__ = [
    "PREDEFINED_SCHEMAS",
    "PREDEFINED_STUBS",
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
    "render_prompt",
    "schema_problem",
    "stage_input",
    "timed",
    "tool_schema",
    "user_content",
]
