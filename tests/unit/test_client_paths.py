"""Every admin call of the client quotes each path segment whole, dots too: a name of ".."
is never a dot-segment httpx folds into a shorter path (`DELETE /v1/projects/..` would be
`DELETE /v1/`), and "#", "?" or "/" reach the API inside the name they are part of."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import pytest

from gate_service.client.api import GateClient

CALLS: list[tuple[str, Callable[[GateClient], Any], str]] = [
    ("DELETE", lambda c: c.delete_project(".."), "/v1/projects/%2E%2E"),
    ("GET", lambda c: c.tokens("a/b"), "/v1/projects/a%2Fb/tokens"),
    ("PUT", lambda c: c.set_egress("p#x", []), "/v1/projects/p%23x/egress"),
    ("PUT", lambda c: c.set_api_spec("p", "../x", {}), "/v1/projects/p/api-specs/%2E%2E%2Fx"),
    ("DELETE", lambda c: c.revoke_token("../audit"), "/v1/tokens/%2E%2E%2Faudit"),
    ("DELETE", lambda c: c.clear_guardrail_model("p?q"), "/v1/projects/p%3Fq/guardrail-model"),
]


@pytest.mark.parametrize(("method", "call", "path"), CALLS)
def test_each_segment_reaches_the_api_whole(
    method: str, call: Callable[[GateClient], Any], path: str
) -> None:
    seen: list[httpx.Request] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json={})

    client = GateClient("http://gate.test", token="t")
    client._http = httpx.Client(base_url="http://gate.test", transport=httpx.MockTransport(answer))
    call(client)
    (request,) = seen
    assert (request.method, request.url.raw_path.decode()) == (method, path)
