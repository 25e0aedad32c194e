"""What a project's admin stores for the gateway to call is read once, when it is stored,
and anything wrong is a 422 in the one error shape saying what, where and why, never a 500:
model routes, the egress allowlist and API specs (their base URL, paths and headers). Every
spelling of a link-local or metadata address is refused there, not only at the call. An
allowlist entry that once held the API for 25 s is answered at once. Through the real app,
on a real Postgres."""

from __future__ import annotations

import time
from typing import Any

from fastapi.testclient import TestClient
from httpx import Response

SPEC: dict[str, Any] = {
    "openapi": "3.0.3",
    "info": {"title": "orders", "version": "1"},
    "servers": [{"url": "http://orders.example.com/api"}],
    "paths": {"/orders/{id}": {"get": {"operationId": "getOrder"}}},
}
# URLs that are not URLs, or not ones the gateway would call.
BAD_URLS = [
    "http://[::1",
    "http://[::1]x/",
    "http://[",
    "http://h:99999/",
    "http://a b/",
    "http://u:p@h/",
    "http://\uff11\uff16\uff19.254.169.254/",
    "http://2852039166/",
    "http://0251.0376.0251.0376/",
    "http://0xa9fea9fe/",
    "http://0xa9.0xfe.0xa9.0xfe/",
    "http://169.254.43518/",
    "http://169.16689662/",
    "http://169.254.169.254./",
    "http://[::ffff:169.254.169.254]/",
    "http://[::ffff:a9fe:a9fe]/",
    "http://[fe80::1%25eth0]/",
    "http://0/",
]


def refused(response: Response, *says: str) -> dict[str, Any]:
    assert response.status_code == 422, response.text
    body: dict[str, Any] = response.json()
    assert set(body) == {"error", "detail", "problems"}, body
    assert body["error"] == "RequestInvalid"
    for said in says:
        assert said in body["detail"], body["detail"]
    return body


def test_a_model_route_the_gateway_would_not_call_is_a_422_saying_why(
    client: TestClient,
) -> None:
    for url in BAD_URLS:
        r = client.put("/v1/projects/default/model-routes", json={"routes": [
            {"pattern": "x/*", "api_base": url}]})  # fmt: skip
        body = refused(r, "api_base")
        assert body["problems"][0]["location"] == "body.routes.0.api_base", body
    assert client.get("/v1/projects/default/model-routes").json()["routes"] == []


EGRESS_REFUSED = [
    "2852039166", "0xa9fea9fe", "169.254.43518", "169.254.169.254.", "::ffff:a9fe:a9fe",
    "[::ffff:169.254.169.254]", "0251.0376.0251.0376", "0", "*.0x7f.1", "a" * 29 + "!",
    "a" * 64 + ".com", "-a.example.com", "http://example.com", "example.com:443",
]  # fmt: skip


def test_an_egress_entry_that_is_no_host_or_a_refused_address_is_a_422(
    client: TestClient,
) -> None:
    for entry in EGRESS_REFUSED:
        started = time.perf_counter()
        r = client.put("/v1/projects/default/egress", json={"hosts": ["example.com", entry]})
        refused(r, "hosts")
        assert time.perf_counter() - started < 5  # the old pattern: 25 s on 30 characters
    assert client.get("/v1/projects/default/egress").json()["hosts"] == []


def test_every_spelling_of_an_allowed_address_is_stored_as_written(client: TestClient) -> None:
    hosts = ["127.0.0.1", "2130706433", "api.example.com", "*.example.com", "::1"]
    r = client.put("/v1/projects/default/egress", json={"hosts": hosts})
    assert r.status_code == 200, r.text
    assert r.json()["hosts"] == hosts


def test_an_api_spec_whose_base_url_cannot_be_called_is_a_422_never_a_500(
    client: TestClient,
) -> None:
    for url in BAD_URLS:
        # servers[0].url: once a 500 (urlsplit's ValueError escaped) for http://[::1.
        spec = {**SPEC, "servers": [{"url": url}]}
        body = refused(client.put("/v1/projects/default/api-specs/orders", json={"spec": spec}))
        assert body["problems"][0]["location"] == "body.spec.servers[0].url", body
        assert "servers[0].url" in body["detail"]
        r = client.put(
            "/v1/projects/default/api-specs/orders", json={"spec": SPEC, "base_url": url}
        )
        assert refused(r)["problems"][0]["location"] == "body.base_url", r.text
    assert client.get("/v1/projects/default/api-specs").json()["specs"] == []


SPEC_REFUSED: list[tuple[dict[str, Any], str]] = [
    ({"headers": {"Host": "internal-admin.corp.example"}}, "header 'Host' is refused"),
    ({"headers": {"X-Forwarded-For": "10.0.0.1"}}, "header 'X-Forwarded-For' is refused"),
    ({"headers": {"Proxy-Authorization": "Basic x"}}, "is refused"),
    ({"headers": {"X-Key": "a\r\nX-Injected: 1"}}, "the value of header X-Key holds"),
    ({"headers": {"X Key": "v"}}, "a header name is a token"),
    ({"spec": {**SPEC, "paths": {"@evil.example.com/x": {"get": {}}}}}, "starts with '/'"),
    ({"spec": {**SPEC, "paths": {"/a?admin=1": {"get": {}}}}}, "holds no '?' or '#'"),
    ({"spec": {**SPEC, "paths": {"/a\x01": {"get": {}}}}}, "HTTP client reads"),
    (
        {"spec": {**SPEC, "paths": {"/o": {"get": {"parameters": [
            {"name": "Host", "in": "header"}]}}}}},
        "the header parameter 'Host' is refused",
    ),
]  # fmt: skip


def test_an_api_spec_whose_headers_or_paths_would_reach_elsewhere_is_a_422(
    client: TestClient,
) -> None:
    for change, says in SPEC_REFUSED:
        body = {"spec": SPEC, **change}
        refused(client.put("/v1/projects/default/api-specs/orders", json=body), says)
    assert client.get("/v1/projects/default/api-specs").json()["specs"] == []


def test_a_spec_a_tenant_may_store_is_stored(client: TestClient) -> None:
    body = {"spec": SPEC, "headers": {"Authorization": "Bearer ${ORDERS_KEY}"}}
    r = client.put("/v1/projects/default/api-specs/orders", json=body)
    assert r.status_code == 200, r.text
    assert r.json()["base_url"] == "http://orders.example.com/api"
    assert r.json()["headers"] == ["Authorization"]


def test_a_base_secret_the_gateway_would_not_call_is_a_422_without_its_value(
    client: TestClient,
) -> None:
    # A *_API_BASE secret chooses a provider's endpoint as a route does: refused when set in
    # any spelling of a refused address, and the answer never holds the value.
    for url in BAD_URLS:
        r = client.put("/v1/projects/default/secrets/OPENAI_API_BASE", json={"value": url})
        body = refused(r, "OPENAI_API_BASE")
        assert url not in r.text and url.split("//", 1)[-1] not in body["detail"], r.text
    assert client.get("/v1/projects/default/secrets").json()["items"] == []
    r = client.put(
        "/v1/projects/default/secrets/GEMINI_API_BASE", json={"value": "http://127.0.0.1:9/v1"}
    )
    assert r.status_code == 201, r.text
    # Any other secret's value is the project's business.
    r = client.put("/v1/projects/default/secrets/NOTES", json={"value": "http://[::1"})
    assert r.status_code == 201, r.text
