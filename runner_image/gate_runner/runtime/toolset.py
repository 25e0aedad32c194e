"""The tools an LLM agent offers its model: which are visible for this run (spec 2.3) and
the function schemas they are described by.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .port import RuntimePort


def is_api_tool(tool: Any) -> bool:
    """An `api:<prefix>.<tool>` tool: an operation of one of the project's API specs."""
    return str(getattr(tool, "ref", "") or "").startswith("api:")


def tool_schema(tool: Any) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": tool.name,
            "description": tool.description or "",
            "parameters": tool.parameters or {"type": "object", "properties": {}},
        },
    }


@functools.cache
def predefined_stubs() -> dict[str, Callable[..., Any]]:
    """The SDK's predefined-tool stubs, captured before install_predefined replaces them
    (it calls this first), and on first use: a case that never reaches them never imports
    the SDK."""
    import connic.tools as connic_tools

    names = ("trigger_agent", "trigger_agent_at", "db_find", "db_insert", "db_update",
             "db_upsert", "db_delete", "db_count", "db_list_collections", "retrieval_query",
             "retrieval_store", "retrieval_delete", "retrieval_list_namespaces", "web_search",
             "web_read_page", "query_knowledge", "store_knowledge", "delete_knowledge",
             "kb_list_namespaces")  # fmt: skip
    return {n: getattr(connic_tools, n) for n in names if hasattr(connic_tools, n)}


PREDEFINED_SCHEMAS: dict[str, dict[str, Any]] = {
    # The discovery tools have no SDK stub: these are the gate's (see use_discoverable).
    "search_tools": {
        "type": "object",
        "properties": {"query": {"type": "string"}},
        "required": ["query"],
    },
    "use_tool": {
        "type": "object",
        "properties": {
            "tool_name": {"type": "string", "description": "the tool's name or canonical ref"},
            "arguments": {"type": "object"},
        },
        "required": ["tool_name"],
    },
    "trigger_agent": {
        "type": "object",
        "properties": {
            "agent_name": {"type": "string"},
            "payload": {},
            "wait_for_response": {"type": "boolean"},
            "timeout_seconds": {"type": "integer"},
        },
        "required": ["agent_name", "payload"],
    },
}


def predefined_schema(rt: RuntimePort, name: str) -> dict[str, Any]:
    """The JSON schema the SDK's own stub declares (its signature and docstring)."""
    stub = predefined_stubs().get(name)
    if stub is not None and rt.loader is not None:
        try:
            return dict(rt.loader._generate_schema(stub))
        except Exception:  # the SDK's private helper changed: fall back below
            pass
    return PREDEFINED_SCHEMAS.get(name, {"type": "object", "properties": {}})


# The discovery pair has no SDK stub to describe it.
DISCOVERY_DESCRIPTIONS = {
    "search_tools": "Find this agent's discoverable tools by a natural-language query; "
    "answers each match's name, description and parameters.",
    "use_tool": "Call one of this agent's discoverable tools (found with search_tools) by "
    "its name, with its arguments.",
}


def predefined_description(name: str) -> str:
    """What the model is told a predefined tool does: the first paragraph of the SDK stub's
    docstring (the SDK's loader leaves a predefined tool's description empty)."""
    stub = predefined_stubs().get(name)
    doc = inspect.getdoc(stub) if stub is not None else None
    if not doc:
        return DISCOVERY_DESCRIPTIONS.get(name, "")
    return " ".join(doc.split("\n\n", 1)[0].split())


def approval_inputs(agent: Any) -> dict[str, Any]:
    """The agent's `approval.inputs`: generated tools by name (SDK ApprovalInput)."""
    config = getattr(agent.config, "approval", None)
    entries = getattr(config, "inputs", None) or []
    return {name: spec for entry in entries for name, spec in entry.items()}


def input_schema(name: str, spec: Any) -> dict[str, Any]:
    """An approval input as the model is offered it: its prompt and its parameters."""
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": spec.prompt,
            "parameters": spec.parameters_schema(),
        },
    }


def visible_tools(agent: Any, context: dict[str, Any], *, discoverable: bool = False) -> list[Any]:
    """The agent's tools (or, with ``discoverable``, its discoverable tools) whose condition
    holds for this run; a condition that cannot be evaluated hides its tool (spec 2.3)."""
    from ..expr import EvaluationError, ExpressionError, compile_expression

    visible = []
    for tool in agent.discoverable_tools if discoverable else agent.tools:
        condition = getattr(tool, "condition", None)
        if condition:
            try:
                expr = compile_expression(condition, ("context", "input"))
                if not expr.holds({"context": context, "input": context.get("payload", {})}):
                    continue
            except (ExpressionError, EvaluationError):
                continue  # spec §2.3: an error hides the tool
        visible.append(tool)
    return visible


def discoverable(rt: RuntimePort, agent: Any, context: dict[str, Any]) -> list[Any]:
    """What search_tools and use_tool reach in this run: the agent's discoverable tools whose
    condition holds, then the tools of its MCP servers marked ``discoverable``."""
    servers = rt.mcp_tools.get((id(context), agent.config.name))
    found = visible_tools(agent, context, discoverable=True)
    return [*found, *(servers.discoverable if servers is not None else [])]


def tool_schemas(rt: RuntimePort, tools: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The function schemas the model is offered, one per visible tool."""
    schemas = []
    for tool in tools.values():
        if tool.is_predefined and not is_api_tool(tool):
            schema = predefined_schema(rt, tool.name)
            schemas.append(
                {
                    "type": "function",
                    "function": {
                        "name": tool.name,
                        "description": tool.description or predefined_description(tool.name),
                        "parameters": schema,
                    },
                }
            )
        else:
            schemas.append(tool_schema(tool))
    return schemas
