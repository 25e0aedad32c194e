"""`api:` tools (issue 21, item 6; spec 3.3): a project's OpenAPI spec, stored under a prefix,
gives its agents one tool an operation; the case's runner asks the gateway to call one by
name, and the gateway builds the HTTP request from the stored spec and sends it only to a
host on the project's egress allowlist. Hooks fire, mocks never apply, calls replay.

Real parts: the conversion, a gateway channel's Unix socket, the runner in-process, a JSON
API on loopback. No Docker, no Postgres.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gate_runner.gateway_wire import API_PATH, SOCKET_NAME
from gate_runner.invocations import Isolation
from gate_runner.models import GatewayChannel
from gate_service.api_specs import convert, loader_tools, tool_name
from gate_service.errors import RequestInvalid
from tests.fixtures.api_server import ApiServer
from tests.fixtures.fake_llm import FakeProvider
from tests.fixtures.gateway import Gateways, post
from tests.fixtures.projects import write
from tests.fixtures.runner import judged


@pytest.mark.parametrize(
    ("method", "path", "operation_id", "name"),
    [
        ("post", "/charges", "createCharge", "charge_create"),
        ("get", "/users/{id}", None, "users_by_id_get"),
        ("get", "/api/v1/users/{userId}/orders", None, "users_by_user_id_orders_get"),
        ("delete", "/v2/items/{id}", "deleteItemById", "item_by_id_delete"),
        ("get", "/health", "health", "health"),
    ],
)
def test_tools_are_named_as_the_platform_names_them(
    method: str, path: str, operation_id: str | None, name: str
) -> None:
    assert tool_name(method, path, operation_id) == name


def test_a_spec_becomes_tools_with_their_parameters_and_where_each_goes() -> None:
    api = ApiServer()
    try:
        spec = convert(api.spec(), headers={"Authorization": "Bearer ${ORDERS_KEY}"})
    finally:
        api.close()
    assert spec.base_url == api.url
    assert sorted(spec.tools) == ["order_get", "orders_post"]
    get = spec.tools["order_get"]
    assert (get["method"], get["path"], get["description"]) == (
        "GET", "/api/v1/orders/{id}", "Find an order by its id.",
    )  # fmt: skip
    assert get["parameters"]["required"] == ["id"]
    assert get["in"] == {"id": "path", "verbose": "query"}
    posted = spec.tools["orders_post"]
    # The body's $ref is resolved: its properties are the tool's.
    assert posted["parameters"]["properties"]["quantity"] == {"type": "integer"}
    assert posted["parameters"]["required"] == ["item"]
    assert posted["in"] == {"item": "body", "quantity": "body"}
    # What the case's loader gets: no base URL and no headers.
    registry = loader_tools({"orders": spec.stored()})
    assert set(registry["orders"]["order_get"]) == {"description", "method", "path", "parameters"}


def test_a_spec_whose_refs_inline_to_megabytes_is_refused_quickly() -> None:
    """A few KB of self-references would inline to tens of MB, stored on the project and
    handed to every case."""
    schema = {"type": "object", "properties": {f"p{i}": {"$ref": "#/components/schemas/A"}
                                               for i in range(100)}}  # fmt: skip
    operations = {
        f"/r{i}": {"post": {"requestBody": {"content": {"application/json": {"schema": {
            "$ref": "#/components/schemas/A"}}}}}}
        for i in range(3)
    }  # fmt: skip
    document = {"openapi": "3.0.0", "servers": [{"url": "http://x"}], "paths": operations,
                "components": {"schemas": {"A": schema}}}  # fmt: skip
    with pytest.raises(RequestInvalid) as refused:
        convert(document)
    assert "expand to over" in str(refused.value.detail)


@pytest.mark.parametrize(
    ("document", "says"),
    [
        ({"swagger": "2.0", "paths": {"/a": {}}}, "OpenAPI 3.x"),
        ({"openapi": "3.0.0", "paths": {}}, "no `paths`"),
        ({"openapi": "3.0.0", "paths": {"/a": {"get": {}}}}, "servers[0].url"),
        (
            {"openapi": "3.1.0", "servers": [{"url": "http://x"}],
             "paths": {"/a": {"get": {"operationId": "getA"}}, "/b": {"get": {"operationId": "getA"}}}},
            "both named 'a_get'",
        ),
    ],
)  # fmt: skip
def test_a_spec_that_cannot_be_tools_is_refused_saying_why(document: Any, says: str) -> None:
    with pytest.raises(RequestInvalid) as refused:
        convert(document)
    assert says in str(refused.value.detail)


@pytest.fixture
def api() -> Any:
    server = ApiServer()
    try:
        yield server
    finally:
        server.close()


def stored(api: ApiServer) -> dict[str, Any]:
    return {
        "orders": convert(api.spec(), headers={"Authorization": "Bearer ${ORDERS_KEY}"}).stored()
    }


def call(channel: Any, tool: str, **arguments: Any) -> tuple[int, dict[str, Any]]:
    body = {"api": "orders", "tool": tool, "arguments": arguments, "agent": "desk"}
    return post(channel.folder, body, token=channel.token, path=API_PATH)


def test_the_gateway_builds_the_call_from_the_stored_spec(
    gateways: Gateways, api: ApiServer
) -> None:
    channel = gateways.open({"ORDERS_KEY": "k-123"}, egress=["127.0.0.1"], api_specs=stored(api))
    status, answer = call(channel, "order_get", id="A/42", verbose=True)
    assert status == 200, answer
    assert (answer["status"], answer["body"]) == (200, {"id": "A%2F42", "status": "shipped"})
    # The path argument is one segment, quoted; the header's secret filled by the gateway.
    assert api.seen[-1][:3] == ("GET", "/api/v1/orders/A%2F42?verbose=true", "Bearer k-123")
    status, answer = call(channel, "orders_post", item="tea", quantity=2)
    assert (status, answer["status"], answer["body"]["id"]) == (200, 201, "o-9")
    assert api.seen[-1][3] == {"item": "tea", "quantity": 2}
    # An error status is the tool's answer, not a gateway failure.
    status, answer = call(channel, "order_get", id="missing")
    assert (status, answer["status"]) == (200, 404)
    (first, *_) = channel.records
    assert first.request == {
        "api": {"api": "orders", "tool": "order_get", "arguments": {"id": "A/42", "verbose": True}}
    }
    assert "k-123" not in json.dumps([r.request for r in channel.records])


@pytest.mark.slow
@pytest.mark.parametrize(
    ("egress", "secrets", "tool", "arguments", "kind", "says"),
    [
        ([], {"ORDERS_KEY": "k"}, "order_get", {"id": "1"}, "no_route",
         "not on the project's egress allowlist"),
        (["127.0.0.1"], {}, "order_get", {"id": "1"}, "no_route",
         "not one of the project's secrets"),
        (["127.0.0.1"], {"ORDERS_KEY": "k"}, "order_delete", {}, "no_route",
         "no such API tool"),
        (["127.0.0.1"], {"ORDERS_KEY": "k"}, "order_get", {"id": "1", "url": "http://x"},
         "bad_request", "unknown argument(s): url"),
        (["127.0.0.1"], {"ORDERS_KEY": "k"}, "order_get", {}, "bad_request",
         "missing path argument(s): id"),
        # A step up would reach another path of the host with the spec's secret header.
        (["127.0.0.1"], {"ORDERS_KEY": "k"}, "order_get", {"id": ".."}, "bad_request",
         "may not be '..'"),
    ],
)  # fmt: skip
def test_a_call_the_gateway_may_not_make_is_refused_and_nothing_is_sent(
    gateways: Gateways,
    api: ApiServer,
    egress: list[str],
    secrets: dict[str, str],
    tool: str,
    arguments: dict[str, Any],
    kind: str,
    says: str,
) -> None:
    channel = gateways.open(secrets, egress=egress, api_specs=stored(api))
    status, answer = call(channel, tool, **arguments)
    assert status == (424 if kind == "no_route" else 400), answer
    assert answer["error"]["kind"] == kind, answer
    assert says in answer["error"]["message"]
    assert api.seen == []


def test_a_spec_header_may_not_carry_a_provider_key(gateways: Gateways, api: ApiServer) -> None:
    specs = {"orders": convert(api.spec(), headers={"X-Key": "${OPENAI_API_KEY}"}).stored()}
    channel = gateways.open({"OPENAI_API_KEY": "sk-no"}, egress=["127.0.0.1"], api_specs=specs)
    status, answer = call(channel, "order_get", id="1")
    assert (status, answer["error"]["kind"]) == (424, "no_route")
    assert "a model provider's key" in answer["error"]["message"]
    assert api.seen == []


def isolation(channel: Any, specs: dict[str, Any]) -> Isolation:
    return Isolation(
        gateway=GatewayChannel(channel.token, socket_path=str(channel.folder / SOCKET_NAME)),
        api_tools=loader_tools(specs),
    )


def desk(root: Path) -> Path:
    return write(
        root,
        {
            "agents/desk.yaml": """
                version: "1.0"
                name: desk
                description: Answers about orders through the orders API.
                model: openai/gpt-4o
                system_prompt: Help.
                tools: [api:orders.order_get]
            """,
            "hooks/desk.py": """
                def before(tool_name, params):
                    return {**params, "verbose": True}
            """,
            "tests/models/desk.py": """
                import json


                def respond(messages, tools, context):
                    done = [json.loads(m["content"]) for m in messages if m["role"] == "tool"]
                    if not done:
                        offered = {t["function"]["name"]: t["function"] for t in tools}
                        assert offered["order_get"]["parameters"]["required"] == ["id"]
                        return {"tool_calls": [{"name": "order_get", "arguments": {"id": "A-42"}}]}
                    return {"content": done[0]["body"]["status"]}
            """,
            "tests/mocks/never.py": """
                def mock(tool_name, params, context):
                    raise AssertionError("an api: tool is never mocked")
            """,
            "tests/desk.yaml": """
                tests:
                  - name: looks_it_up
                    payload: where is A-42?
                    mocks: never
                    strict_mocks: true
                    expected_tool_calls:
                      - api:orders.order_get: params.id == "A-42" and result.status == 200
                    expected_result: output == "shipped"
            """,
        },
    )


def test_an_agent_calls_an_api_tool_through_its_gateway_with_its_hook(
    gateways: Gateways, api: ApiServer, tmp_path: Path
) -> None:
    specs = stored(api)
    channel = gateways.open({"ORDERS_KEY": "k-123"}, egress=["127.0.0.1"], api_specs=specs)
    root = desk(tmp_path / "p")
    result = judged(root, "tests/desk.yaml", "looks_it_up", isolation=isolation(channel, specs))
    assert result.passed, result.failure_reason
    # The before hook added verbose=true; the gateway sent it as the spec's query parameter.
    assert api.seen == [("GET", "/api/v1/orders/A-42?verbose=true", "Bearer k-123", None)]


@pytest.mark.slow
def test_a_live_gates_api_calls_replay_with_no_api_and_no_gateway(
    gateways: Gateways, api: ApiServer, fake_provider: FakeProvider, tmp_path: Path
) -> None:
    specs = stored(api)
    secrets = {
        "ORDERS_KEY": "k-123",
        "OPENAI_API_KEY": "sk-a",
        "OPENAI_API_BASE": fake_provider.url,
    }
    channel = gateways.open(secrets, egress=["127.0.0.1"], api_specs=specs)
    root = desk(tmp_path / "p")
    (root / "tests/models/desk.py").unlink()  # live: the fake provider calls the tool
    write(
        root,
        {
            "tests/desk.yaml": """
                tests:
                  - name: live
                    payload: where is x?
                    expected_tool_calls:
                      - api:orders.order_get: result.body.status == "shipped"
            """
        },
    )
    fake_provider.tool_call = ("order_get", {"id": "x"})
    fake_provider.script = ["tool", "ok"]
    live = judged(root, "tests/desk.yaml", "live", isolation=isolation(channel, specs))
    assert live.passed, live.failure_reason
    assert len(api.seen) == 1
    channel.export_recordings(root / "tests" / "recordings")
    api.close()
    replayed = judged(
        root, "tests/desk.yaml", "live", isolation=Isolation(api_tools=loader_tools(specs))
    )
    assert replayed.passed, replayed.failure_reason


def test_without_the_projects_spec_the_tool_is_not_offered(tmp_path: Path) -> None:
    root = desk(tmp_path / "p")
    result = judged(root, "tests/desk.yaml", "looks_it_up")
    assert not result.passed
    assert "expected a call to api:orders.order_get" in (result.failure_reason or "")


KEYS = ["paths", "get", "post", "parameters", "name", "in", "schema", "$ref", "requestBody",
        "content", "application/json", "properties", "required", "operationId", "/a/{x}"]  # fmt: skip
JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=4),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(st.sampled_from(KEYS) | st.text(max_size=3), inner, max_size=4)
    ),
    max_leaves=25,
)


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(
    st.fixed_dictionaries(
        {"openapi": st.just("3.0.0"), "servers": st.just([{"url": "http://x"}]), "paths": JSON}
    )
    | JSON
)
def test_any_document_is_tools_or_a_422_never_a_crash(document: Any) -> None:
    """An admin's upload is untrusted input too: whatever its shape, the answer is the tools
    or a 422 naming what is wrong."""
    try:
        spec = convert(document)
    except RequestInvalid:
        return
    for tool in spec.tools.values():
        assert tool["parameters"]["type"] == "object"
