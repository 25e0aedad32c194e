"""MCP servers (issue 21, item 5; spec 3.3): a case reaches its agent's MCP servers through
its model gateway alone, only those on the project's egress allowlist, with the mcp SDK's
client; against the SDK's own server (tests/fixtures/mcp_server.py), on and off the
allowlist, and a mocked case with no server at all.

Real parts: the runner in-process (forked invocations), a gateway channel's Unix socket, the
mcp SDK on both sides, the fake provider for the live round trip. No Docker, no Postgres.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from gate_runner.gateway_wire import MCP_PATH, SOCKET_NAME
from gate_runner.invocations import Isolation
from gate_runner.models import GatewayChannel
from gate_service.bundles.support import agent_warnings
from tests.fixtures.fake_llm import FakeProvider
from tests.fixtures.gateway import Gateways, post
from tests.fixtures.mcp_server import McpServer
from tests.fixtures.projects import write
from tests.fixtures.runner import judged

TOKEN = "mcp-token-7"


def isolation(channel: Any) -> Isolation:
    return Isolation(
        gateway=GatewayChannel(channel.token, socket_path=str(channel.folder / SOCKET_NAME))
    )


def project(root: Path, url: str, **server: Any) -> Path:
    """An agent with one MCP server, ``orders`` (``server``: more of its fields), whose
    scripted model calls each of its tools once (lookup, whoami, broken) and then answers
    with what it was offered and the run's ``mcp_errors``."""
    config = {
        "name": "orders",
        "url": url,
        "headers": {"Authorization": "Bearer ${ORDERS_TOKEN}", "X-User-Id": "${context.user_id}"},
        **server,
    }
    agent = {
        "version": "1.0",
        "name": "desk",
        "description": "Answers about orders through an MCP server.",
        "model": "openai/gpt-4o",
        "system_prompt": "Help.",
        "mcp_servers": [{k: v for k, v in config.items() if v is not None}],
    }
    return write(
        root,
        {
            "agents/desk.yaml": yaml.safe_dump(agent, sort_keys=False),
            "middleware/desk.py": """
                def before(content, context):
                    context["user_id"] = "u-7"
                    return content
            """,
            "tests/models/desk.py": """
                import json

                ORDER = ["lookup", "whoami", "broken"]


                def respond(messages, tools, context):
                    offered = sorted(t["function"]["name"] for t in tools)
                    done = [m for m in messages if m["role"] == "tool"]
                    if len(done) < len(ORDER) and ORDER[len(done)] in offered:
                        name = ORDER[len(done)]
                        args = {"q": "A-42"} if name == "lookup" else {}
                        return {"tool_calls": [{"name": name, "arguments": args}]}
                    return {"content": json.dumps({"offered": offered,
                                                   "errors": context.get("mcp_errors")})}
            """,
            "tests/desk.yaml": """
                tests:
                  - name: uses_the_servers_tools
                    payload: orders?
                    expected_tool_calls:
                      - lookup: >-
                          result.is_error == false
                          and result.parts[0].text == "order for A-42: shipped"
                          and params.q == "A-42"
                      - whoami: result.parts[0].text == "auth=Bearer mcp-token-7 user=u-7"
                      - broken: result.is_error == true
                  - name: runs_without_the_server
                    payload: orders?
                    expected_no_tool_calls: [lookup]
                    expected_result: output.offered == []
            """,
        },
    )


@pytest.mark.slow
def test_an_agent_lists_and_calls_an_mcp_server_through_its_gateway(
    gateways: Gateways, mcp_server: McpServer, tmp_path: Path
) -> None:
    channel = gateways.open({"ORDERS_TOKEN": TOKEN}, egress=["127.0.0.1"])
    root = project(tmp_path / "p", mcp_server.url)
    result = judged(root, "tests/desk.yaml", "uses_the_servers_tools", isolation=isolation(channel))
    assert result.passed, result.failure_reason
    assert mcp_server.calls == ["lookup", "whoami", "broken"]
    spans = result.invocations[0].traces
    (server,) = [s for s in spans if s.type == "mcp_server"]
    assert server.metadata["connected"] is True
    assert server.metadata["tools"] == ["lookup", "whoami", "flood", "broken"]
    calls = [s for s in spans if s.type == "tool_call"]
    assert [(s.name, s.metadata["mcp_server"], s.metadata["tool_ref"]) for s in calls] == [
        ("lookup", "orders", "mcp:orders.lookup"),
        ("whoami", "orders", "mcp:orders.whoami"),
        ("broken", "orders", "mcp:orders.broken"),
    ]
    # The secret reached the server (whoami echoed it) and never the case: the server's span
    # and the requests the gateway recorded carry the header as written, if at all.
    assert TOKEN not in json.dumps(server.metadata)
    assert [r.request["mcp"]["op"] for r in channel.records] == ["list", "call", "call", "call"]
    assert TOKEN not in json.dumps([r.request for r in channel.records])


def test_a_server_off_the_allowlist_fails_the_run_naming_it(
    gateways: Gateways, mcp_server: McpServer, tmp_path: Path
) -> None:
    channel = gateways.open({"ORDERS_TOKEN": TOKEN}, egress=["example.com"])
    root = project(tmp_path / "p", mcp_server.url)
    result = judged(
        root, "tests/desk.yaml", "runs_without_the_server", isolation=isolation(channel)
    )
    assert not result.passed
    error = result.invocations[0].error or ""
    assert "MCP server 'orders' could not be used" in error, error
    assert "127.0.0.1 is not on the project's egress allowlist" in error, error
    assert mcp_server.calls == []


def test_an_optional_server_off_the_allowlist_is_skipped_and_its_error_kept_in_context(
    gateways: Gateways, mcp_server: McpServer, tmp_path: Path
) -> None:
    channel = gateways.open({"ORDERS_TOKEN": TOKEN}, egress=[])
    root = project(tmp_path / "p", mcp_server.url, optional=True)
    result = judged(
        root, "tests/desk.yaml", "runs_without_the_server", isolation=isolation(channel)
    )
    assert result.passed, result.failure_reason
    output = json.loads(result.invocations[0].output)
    assert "not on the project's egress allowlist" in output["errors"]["orders"]
    (server,) = [s for s in result.invocations[0].traces if s.type == "mcp_server"]
    assert (server.status, server.metadata["connected"]) == ("error", False)


def test_an_unreachable_optional_server_is_skipped(gateways: Gateways, tmp_path: Path) -> None:
    channel = gateways.open({"ORDERS_TOKEN": TOKEN}, egress=["127.0.0.1"])
    root = project(tmp_path / "p", "http://127.0.0.1:9/mcp", optional=True)
    result = judged(
        root, "tests/desk.yaml", "runs_without_the_server", isolation=isolation(channel)
    )
    assert result.passed, result.failure_reason
    reason = json.loads(result.invocations[0].output)["errors"]["orders"]
    assert "connection attempts failed" in reason and "ConnectError" not in reason, reason


def test_a_header_may_not_carry_a_provider_key_or_a_missing_secret(
    gateways: Gateways, mcp_server: McpServer
) -> None:
    channel = gateways.open(
        {"OPENAI_API_KEY": "sk-never-to-mcp", "ORDERS_TOKEN": TOKEN}, egress=["127.0.0.1"]
    )
    for header, says in [
        ("Bearer ${OPENAI_API_KEY}", "a model provider's key"),
        ("Bearer ${NOT_A_SECRET}", "not one of the project's secrets"),
    ]:
        body = {"server": "orders", "url": mcp_server.url, "op": "list",
                "headers": {"Authorization": header}}  # fmt: skip
        status, answer = post(channel.folder, body, token=channel.token, path=MCP_PATH)
        assert (status, answer["error"]["kind"]) == (424, "no_route"), answer
        assert says in answer["error"]["message"]
    # A context value is filled in once: the text ${ORDERS_TOKEN} in it stays that text.
    body = {"server": "orders", "url": mcp_server.url, "op": "call", "tool": "whoami",
            "headers": {"X-User-Id": "${context.user}"},
            "context_values": {"context.user": "${ORDERS_TOKEN}"}}  # fmt: skip
    status, answer = post(channel.folder, body, token=channel.token, path=MCP_PATH)
    assert status == 200, answer
    assert answer["result"]["parts"][0]["text"] == "auth=None user=${ORDERS_TOKEN}"


def test_a_mocked_server_needs_no_server_and_no_gateway(tmp_path: Path) -> None:
    root = project(tmp_path / "p", "https://mcp.invalid/mcp", tools=["lookup"])
    write(
        root,
        {
            "tests/mocks/orders_mocks.py": """
                def mock_mcp_orders_lookup(tool_name, params, context):
                    return {"is_error": False,
                            "parts": [{"type": "text", "text": "mocked " + params["q"]}]}
            """,
            "tests/desk.yaml": """
                tests:
                  - name: mocked
                    payload: orders?
                    mocks: orders_mocks
                    expected_tool_calls:
                      - lookup: result.parts[0].text == "mocked A-42" and invocations == 1
                    expected_result: output.offered == ["lookup"]
            """,
        },
    )
    result = judged(root, "tests/desk.yaml", "mocked")
    assert result.passed, result.failure_reason
    spans = result.invocations[0].traces
    (server,) = [s for s in spans if s.type == "mcp_server"]
    assert (server.metadata["connected"], server.metadata["mocked"]) == (False, True)
    (call,) = [s for s in spans if s.type == "tool_call"]
    assert call.metadata["mocked"] is True


def test_no_hook_fires_for_an_mcp_tool(
    gateways: Gateways, mcp_server: McpServer, tmp_path: Path
) -> None:
    channel = gateways.open({"ORDERS_TOKEN": TOKEN}, egress=["127.0.0.1"])
    root = project(tmp_path / "p", mcp_server.url)
    write(
        root,
        {
            "hooks/desk.py": """
                def before(tool_name, params):
                    raise RuntimeError("a hook fired for " + tool_name)
            """
        },
    )
    result = judged(root, "tests/desk.yaml", "uses_the_servers_tools", isolation=isolation(channel))
    assert result.passed, result.failure_reason


@pytest.mark.parametrize(
    ("server", "why"),
    [
        ({"bridge": "br-1"}, "a self-hosted gate cannot use one"),
        # oauth may not come with an Authorization header (SDK McpServerConfig).
        ({"oauth": {"app": "orders", "user": "context.user_id"}, "headers": None},
         "a gate stores none"),
    ],
)  # fmt: skip
def test_a_bridged_or_oauth_server_is_skipped_with_a_span_and_a_gate_warning(
    tmp_path: Path, server: dict[str, Any], why: str
) -> None:
    root = project(tmp_path / "p", "https://mcp.invalid/mcp", **server)
    result = judged(root, "tests/desk.yaml", "runs_without_the_server")
    assert result.passed, result.failure_reason
    (span,) = [s for s in result.invocations[0].traces if s.type == "mcp_server"]
    assert why in span.metadata["skipped"]
    raw = yaml.safe_load((root / "agents/desk.yaml").read_text())
    (warning,) = [
        w for w in agent_warnings("agents/desk.yaml", raw, {}) if w["key"] == "mcp_servers.orders"
    ]
    assert why in warning["message"]


def test_an_oauth_servers_connect_tool_is_offered_and_says_a_gate_has_no_sign_in(
    tmp_path: Path,
) -> None:
    # Issue 39, item 4 (SDK McpOAuthConfig: "With `connect_tool` the agent gets a
    # `connect_<server>` tool that returns a sign-in link"): the server is still skipped (no
    # stored token), its connect tool is offered, and its link says a gate has no OAuth flow.
    oauth = {"app": "orders", "user": "context.user_id", "connect_tool": True}
    root = project(tmp_path / "p", "https://mcp.invalid/mcp", oauth=oauth, headers=None)
    write(
        root,
        {
            "tests/models/desk.py": """
                import json


                def respond(messages, tools, context):
                    offered = sorted(t["function"]["name"] for t in tools)
                    done = [json.loads(m["content"]) for m in messages if m["role"] == "tool"]
                    if not done and "connect_orders" in offered:
                        return {"tool_calls": [{"name": "connect_orders", "arguments": {}}]}
                    return {"content": json.dumps({"offered": offered, "answers": done})}
            """,
            "tests/desk.yaml": """
                tests:
                  - name: offers_its_connect_tool
                    payload: orders?
                    expected_tool_calls:
                      - connect_orders: result.connected == false
                    expected_result: output.offered == ["connect_orders"]
            """,
        },
    )
    result = judged(root, "tests/desk.yaml", "offers_its_connect_tool")
    assert result.passed, result.failure_reason
    (answer,) = json.loads(result.invocations[0].output)["answers"]
    assert answer["url"] == "https://gate.invalid/oauth/orders/no-sign-in-in-a-gate"
    assert "no OAuth flow" in answer["message"]
    (span,) = [s for s in result.invocations[0].traces if s.type == "mcp_server"]
    assert span.metadata["connected"] is False and span.metadata["connect_tool"] == (
        "connect_orders"
    )
    raw = yaml.safe_load((root / "agents/desk.yaml").read_text())
    (warning,) = [
        w for w in agent_warnings("agents/desk.yaml", raw, {}) if w["key"] == "mcp_servers.orders"
    ]
    assert "connect_tool" in warning["message"]


@pytest.mark.slow
def test_a_live_gates_mcp_calls_replay_with_no_server(
    gateways: Gateways, fake_provider: FakeProvider, tmp_path: Path
) -> None:
    """Live: the fake provider calls `lookup`, the gateway lists and calls the server; its
    records export as recordings, and replay needs neither the server nor a gateway."""
    server = McpServer()
    root = project(tmp_path / "p", server.url)
    (root / "tests/models/desk.py").unlink()  # live: no scripted model
    write(
        root,
        {
            "tests/desk.yaml": """
                tests:
                  - name: live
                    payload: orders?
                    expected_tool_calls:
                      - lookup: >-
                          result.parts[0].text == "order for x: shipped"
            """
        },
    )
    secrets = {"OPENAI_API_KEY": "sk-a", "OPENAI_API_BASE": fake_provider.url,
               "ORDERS_TOKEN": TOKEN}  # fmt: skip
    try:
        fake_provider.script = ["tool", "ok"]
        channel = gateways.open(secrets, egress=["127.0.0.1"])
        live = judged(root, "tests/desk.yaml", "live", isolation=isolation(channel))
        assert live.passed, live.failure_reason
        assert server.calls == ["lookup"]
        channel.export_recordings(root / "tests" / "recordings")
    finally:
        server.close()
    replayed = judged(root, "tests/desk.yaml", "live")
    assert replayed.passed, replayed.failure_reason
    spans = replayed.invocations[0].traces
    (call,) = [s for s in spans if s.type == "tool_call"]
    assert call.metadata["result"]["parts"][0]["text"] == "order for x: shipped"


def test_a_discoverable_servers_tools_are_found_and_used_through_use_tool(
    gateways: Gateways, mcp_server: McpServer, tmp_path: Path
) -> None:
    channel = gateways.open({"ORDERS_TOKEN": TOKEN}, egress=["127.0.0.1"])
    root = project(tmp_path / "p", mcp_server.url, discoverable=True)
    write(
        root,
        {
            "tests/models/desk.py": """
                import json


                def respond(messages, tools, context):
                    results = [json.loads(m["content"]) for m in messages if m["role"] == "tool"]
                    offered = sorted(t["function"]["name"] for t in tools)
                    if not results:
                        assert offered == ["search_tools", "use_tool"], offered
                        return {"tool_calls": [{"name": "search_tools",
                                                "arguments": {"query": "look up an order"}}]}
                    if len(results) == 1:
                        found = [t["name"] for t in results[0]["tools"]]
                        assert found[0] == "lookup", found
                        return {"tool_calls": [{"name": "use_tool", "arguments": {
                            "tool_name": "lookup", "arguments": {"q": "A-42"}}}]}
                    return {"content": results[1]["parts"][0]["text"]}
            """,
            "tests/desk.yaml": """
                tests:
                  - name: discovers
                    payload: orders?
                    expected_tool_calls:
                      - lookup: params.q == "A-42" and result.is_error == false
                    expected_result: >-
                      output == "order for A-42: shipped"
            """,
        },
    )
    result = judged(root, "tests/desk.yaml", "discovers", isolation=isolation(channel))
    assert result.passed, result.failure_reason
    assert mcp_server.calls == ["lookup"]


def test_a_server_that_answers_too_much_is_cut_off_and_the_call_fails(
    gateways: Gateways, mcp_server: McpServer
) -> None:
    """The SDK reads a reply whole: the gateway counts what a session reads before any of it
    is parsed, so a server cannot fill the worker's memory."""
    channel = gateways.open({}, egress=["127.0.0.1"])
    body = {"server": "orders", "url": mcp_server.url, "op": "call", "tool": "flood"}
    status, answer = post(channel.folder, body, token=channel.token, path=MCP_PATH)
    assert (status, answer["error"]["kind"]) == (502, "provider"), answer
    assert f"sent over {8 * 1024 * 1024} bytes" in answer["error"]["message"]
    assert mcp_server.calls == ["flood"]


def test_an_optional_server_whose_header_context_is_missing_is_skipped(
    gateways: Gateways, mcp_server: McpServer, tmp_path: Path
) -> None:
    channel = gateways.open({"ORDERS_TOKEN": TOKEN}, egress=["127.0.0.1"])
    root = project(
        tmp_path / "p", mcp_server.url, optional=True, headers={"X-Team": "${context.team}"}
    )
    result = judged(
        root, "tests/desk.yaml", "runs_without_the_server", isolation=isolation(channel)
    )
    assert result.passed, result.failure_reason
    errors = json.loads(result.invocations[0].output)["errors"]
    assert "${context.team}" in errors["orders"], errors
    assert mcp_server.calls == []


def test_an_mcp_tool_is_named_by_server_and_tool_with_or_without_mcp_prefix() -> None:
    # Decided (issue 39): an MCP tool's canonical ref is `mcp:<server>.<tool>`; assertions
    # also take `<server>.<tool>` (as `calculator.add` names a file tool) and the bare name.
    from gate_runner.assertions import calls_in_scope, check_tool_calls, compile_assertions

    root = {"span_id": "s1", "parent_span_id": None, "type": "agent", "name": "d", "metadata": {}}
    call = {
        "span_id": "s2",
        "parent_span_id": "s1",
        "type": "tool_call",
        "name": "lookup",
        "metadata": {
            "tool_name": "lookup",
            "tool_ref": "mcp:orders.lookup",
            "params": {"q": "A-42"},
            "mcp_server": "orders",
            "result": {"is_error": False, "parts": []},
        },
    }
    calls = calls_in_scope([root, call], None)
    for name in ("mcp:orders.lookup", "orders.lookup", "lookup"):
        held = compile_assertions(
            {
                "expected_tool_calls": [{name: 'params.q == "A-42"'}],
                "expected_tool_call_order": [name],
            }
        )
        assert check_tool_calls(held, calls, {}) == [], name
    other = compile_assertions({"expected_no_tool_calls": ["billing.lookup", "rders.lookup"]})
    assert check_tool_calls(other, calls, {}) == []
