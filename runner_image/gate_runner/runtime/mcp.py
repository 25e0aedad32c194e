"""An LLM agent's MCP servers (spec 3.3; the SDK's McpServerConfig), and the door its `api:`
tools share with them. The servers are connected once per run, through the case's model
gateway, their tools offered like listed ones (or, with ``discoverable: true``, through
search_tools and use_tool).

Per server, at the run's start, one ``mcp_server`` span says what happened:
- ``condition`` false (or not evaluable): not connected.
- ``bridge`` or ``oauth``: skipped, with the reason; a self-hosted gate has neither a connic
  bridge nor stored OAuth tokens (the SDK skips a server whose user has no token). With
  ``oauth.connect_tool`` the agent still gets ``connect_<server>`` (SDK McpOAuthConfig: a
  tool "that returns a sign-in link"); decided (issue 39): a gate has no OAuth flow, so its
  answer is ``connect_answer``, whose link says so and never resolves (``.invalid``).
- mocked (a server-wide mock, or one for each name of its ``tools:`` filter): not connected
  at all, so a case can run with no server; its tools are the ``tools:`` names, any
  arguments accepted. Without a ``tools:`` filter the server is still listed.
- otherwise listed through the gateway (replayed from recordings in replay mode), the
  ``tools:`` filter applied. A failure fails the run naming the server, or with
  ``optional: true`` skips it and records the reason in ``context["mcp_errors"]`` (decided: a
  mapping of server name to message).

``${context.path}`` in headers is resolved here, strictly (spec 4.4: a missing key or a None
value fails the run; a key starting with ``_`` is refused); ``${VAR}`` is the gateway's to
fill from the project's secrets. Hooks never fire for MCP tools (spec 4.2); their results are
``{"is_error", "parts"}``.
"""

from __future__ import annotations

import dataclasses
import re
from typing import TYPE_CHECKING, Any

from .. import gateway_wire as wire
from ..models import GatewayModel, ReplayModel
from ..runtime_errors import AgentRunError
from .mcp_tools import McpTool, McpTools
from .model_choice import model_for
from .payloads import jsonable
from .trace import Span, Trace, error_text
from .usercode import call_user_function

if TYPE_CHECKING:
    from .port import RuntimePort

CONTEXT_REF = re.compile(r"\$\{(context\.[^}]*)\}")
OPEN_SCHEMA: dict[str, Any] = {"type": "object", "additionalProperties": True}
NO_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {}}


def connect_answer(tool: McpTool) -> dict[str, Any]:
    """What `connect_<server>` answers in a gate (decided, issue 39): no sign-in link can
    work, since a gate has no OAuth flow and stores no token, so the link says so."""
    return {
        "connected": False,
        "server": tool.server,
        "app": tool.connect_app,
        "url": f"https://gate.invalid/oauth/{tool.connect_app}/no-sign-in-in-a-gate",
        "message": f"a gate has no OAuth flow: the {tool.connect_app} sign-in is not "
        f"available, and MCP server {tool.server!r} stays skipped for this run",
    }


class McpUnavailable(AgentRunError):
    """A server that is not optional could not be reached or listed: the run fails."""


def _door(rt: RuntimePort, agent: str) -> ReplayModel | GatewayModel | None:
    """Where an MCP or api: request goes: the recordings in replay mode, else the case's
    gateway. A gate in replay mode never goes live: no recordings is an error."""
    if rt.project is not None:
        try:
            chosen = model_for(rt, agent)
        except AgentRunError:
            if rt.model_mode == "replay":
                raise
            chosen = None
        if isinstance(chosen, ReplayModel | GatewayModel):
            return chosen
    if rt.model_mode == "replay":
        raise AgentRunError(f"replay mode: agent {agent!r} has no recordings to answer from")
    if rt.gateway is not None:
        return GatewayModel(rt.gateway, agent=agent, attempts=1)
    return None


def ask(rt: RuntimePort, agent: str, request: wire.McpRequest) -> dict[str, Any]:
    door = _door(rt, agent)
    if door is None:
        raise AgentRunError(
            f"MCP server {request.server}: this case has no model gateway, which is a case's "
            "only way to an MCP server"
        )
    return door.mcp(request)


def call_api_tool(rt: RuntimePort, agent: str, ref: str, params: dict[str, Any]) -> dict[str, Any]:
    """An `api:<prefix>.<tool>` call through the same door as MCP: the gateway builds it from
    the project's spec; the answer is ``{"status", "body"}``."""
    prefix, _, name = ref.removeprefix("api:").rpartition(".")
    door = _door(rt, agent)
    if door is None:
        raise AgentRunError(
            f"{ref}: this case has no model gateway, which is a case's only way to an API"
        )
    return door.api(wire.ApiRequest(api=prefix, tool=name, arguments=params))


def context_values(server: Any, context: dict[str, Any]) -> dict[str, str]:
    """Each ``${context.path}`` of the server's headers, resolved strictly."""
    values = {}
    for template in (server.headers or {}).values():
        for ref in CONTEXT_REF.findall(template):
            path = ref.removeprefix("context.").split(".")
            if any(not part or part.startswith("_") for part in path):
                raise AgentRunError(
                    f"MCP server {server.name!r}: ${{{ref}}} in its headers names a key "
                    "starting with '_' (or an empty one), which is not allowed"
                )
            value: Any = context
            for part in path:
                if not isinstance(value, dict) or value.get(part) is None:
                    raise AgentRunError(
                        f"MCP server {server.name!r}: its headers use ${{{ref}}}, and the run "
                        "context has no value there"
                    )
                value = value[part]
            values[ref] = value if isinstance(value, str) else str(jsonable(value))
    return values


def _condition_holds(condition: str | None, context: dict[str, Any]) -> bool:
    if not condition:
        return True
    from ..expr import EvaluationError, ExpressionError, compile_expression

    try:
        expr = compile_expression(condition, ("context", "input"))
        return bool(expr.holds({"context": context, "input": context.get("payload", {})}))
    except (ExpressionError, EvaluationError):
        return False  # as for a conditional tool (spec 2.3): an error leaves it out


def connect(
    rt: RuntimePort, agent: Any, context: dict[str, Any], trace: Trace, parent: Span
) -> McpTools:
    """The tools of the agent's MCP servers for this run (see the module's docstring)."""
    found = McpTools()
    name = agent.config.name
    for server in getattr(agent.config, "mcp_servers", None) or []:
        span = trace.open("mcp_server", server.name, parent, url=server.url, mcp_server=True)
        if not _condition_holds(server.condition, context):
            span.metadata.update(connected=False, skipped="its condition does not hold")
            continue
        if server.bridge:
            span.metadata.update(
                connected=False,
                skipped="a bridge tunnels to the platform's agent containers; a self-hosted "
                "gate cannot use one",
            )
            continue
        if server.oauth is not None:
            span.metadata.update(
                connected=False,
                skipped="per-user OAuth needs a stored token, and a gate stores none "
                "(the SDK skips a server without one)",
            )
            if getattr(server.oauth, "connect_tool", False):
                connect = McpTool(
                    name=f"connect_{server.name}", server=server.name, url=server.url,
                    description=f"Sign in to {server.oauth.app} to use {server.name}: "
                    "returns a sign-in link.",
                    parameters=NO_PARAMETERS, connect_app=str(server.oauth.app),
                )  # fmt: skip
                span.metadata["connect_tool"] = connect.name
                found.listed.setdefault(connect.name, connect)
            continue
        template = McpTool(
            name="", server=server.name, url=server.url, description="",
            parameters=OPEN_SCHEMA, headers=dict(server.headers or {}),
        )  # fmt: skip
        wanted = list(server.tools) if server.tools else None
        if rt.mocks.mcp_server_mocked(server.name, wanted) and wanted:
            # Never connected, so its headers are never resolved either.
            tools = [_named(template, tool, "", OPEN_SCHEMA) for tool in wanted]
            span.metadata.update(connected=False, mocked=True, tools=wanted)
        else:
            try:
                # A header's context value that is missing is this server's failure: with
                # optional, the run goes on without it.
                values = context_values(server, context)
                template = dataclasses.replace(template, context_values=values)
                request = wire.McpRequest(
                    server=server.name, url=server.url, op="list", headers=template.headers,
                    context_values=values,
                )  # fmt: skip
                listed = ask(rt, name, request)["tools"]
            except Exception as exc:
                message = error_text(exc)
                span.status = "error"
                span.metadata.update(connected=False, error=message)
                if not server.optional:
                    raise McpUnavailable(
                        f"MCP server {server.name!r} could not be used: {message}"
                    ) from None
                errors = context.setdefault("mcp_errors", {})
                if isinstance(errors, dict):
                    errors[server.name] = message
                continue
            tools = [
                _named(template, t["name"], t["description"], t["input_schema"])
                for t in listed
                if wanted is None or t["name"] in wanted
            ]
            span.metadata.update(connected=True, tools=[t.name for t in tools])
        span.metadata["discoverable"] = bool(server.discoverable)
        for tool in tools:
            if server.discoverable:
                found.discoverable.append(tool)
            else:
                found.listed.setdefault(tool.name, tool)
    return found


def _named(template: McpTool, name: str, description: str, schema: dict[str, Any]) -> McpTool:
    return McpTool(
        name=name,
        server=template.server,
        url=template.url,
        description=description,
        parameters=schema or OPEN_SCHEMA,
        headers=template.headers,
        context_values=template.context_values,
    )


def call(
    rt: RuntimePort, agent: str, tool: McpTool, params: dict[str, Any], context: dict[str, Any],
    span: Span,
) -> Any:  # fmt: skip
    """One MCP tool call: its mock (the mcp ladder, mocks.py) or the server through the
    gateway. A failure raises, and goes back to the model as the call's error."""
    if tool.connect_app:
        # No server behind it (so no mock either), and not an MCP result: assertions see
        # the answer as it is.
        span.metadata["connect_tool_of"] = tool.server
        return connect_answer(tool)
    span.metadata["mcp_server"] = tool.server
    mock = rt.mocks.mcp_tool(tool.server, tool.name)
    if mock is not None:
        span.metadata["mocked"] = True
        return call_user_function(mock, tool.ref, params, context)
    request = wire.McpRequest(
        server=tool.server, url=tool.url, op="call", tool=tool.name, arguments=params,
        headers=tool.headers, context_values=tool.context_values,
    )  # fmt: skip
    return ask(rt, agent, request)["result"]
