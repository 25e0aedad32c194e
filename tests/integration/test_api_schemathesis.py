"""Schemathesis over the service's own OpenAPI document (issue 9, item 5).

Every documented operation gets generated requests, valid and invalid, sent to the ASGI app
in-process (no network) with the bootstrap admin token, against a real Postgres. Each answer
must not be a 5xx and must be what the document says: a documented status code, the
documented content type, and a body matching the documented schema (errors: ErrorBody).

Nothing is excluded. POST /v1/gates is generated too: its multipart body rarely holds a
readable archive, so it mostly exercises the refusals (415, 400, 422), which is the point.

Bounded and deterministic: at most MAX_EXAMPLES examples per operation, derandomized (a
fixed seed derived from each test), no deadline.
"""

from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from schemathesis import BaseSchema, Case
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)
from schemathesis.hooks import GLOBAL_HOOK_DISPATCHER, HookContext

from gate_service.config import Settings
from gate_service.main import create_app
from tests.fixtures.auth import ADMIN_TOKEN, bearer

MAX_EXAMPLES = 25
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
]


@pytest.fixture
def api_schema(settings: Settings) -> Iterator[BaseSchema]:
    # A long-poll that matches would wait; one second keeps the run bounded.
    app = create_app(settings.model_copy(update={"long_poll_max_seconds": 1}))
    with TestClient(app):  # the lifespan: database engine and the bootstrap admin token
        yield schemathesis.openapi.from_asgi("/openapi.json", app)


schema = schemathesis.pytest.from_fixture("api_schema")


@schema.parametrize()
@settings(
    max_examples=MAX_EXAMPLES,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=list(HealthCheck),
)
def test_the_api_answers_as_documented_and_never_5xx(case: Case) -> None:
    response = case.call(headers=bearer(ADMIN_TOKEN))
    case.validate_response(response, checks=CHECKS, headers=bearer(ADMIN_TOKEN))


# The routes where a project's admin stores what the model gateway calls: each URL, host and
# header in them is parsed when stored, and any failure must be a 422, never a 5xx. They
# are fuzzed again against a project that exists (the run above mostly names projects that
# do not, so it ends at 404 before any URL is read), with strings that are often URLs,
# hosts and headers in odd spellings, bugs included (an unclosed "[" once answered 500).
STORED_FOR_THE_GATEWAY = r"^/v1/projects/\{name\}/(model-routes|egress|api-specs/\{prefix\})$"
STORED_EXAMPLES = 60
HOSTS = st.sampled_from(
    ["example.com", "127.0.0.1", "2852039166", "0xa9fea9fe", "0251.0376.0251.0376",
     "169.254.43518", "169.254.169.254.", "[::1]", "[::1", "[", "]", "[fe80::1%25eth0]",
     "[::ffff:a9fe:a9fe]", "a b", "\uff11.2.3.4", "h:99999", "h:0", "h:", "u:p@h", "",
     "xn--", "-a", "a..b", "*.example.com", "%00", "\\evil", "a\tb"]
) | st.text(max_size=12)  # fmt: skip
URLS = st.builds(
    "".join,
    st.tuples(
        st.sampled_from(["http://", "https://", "ftp://", "http:", "//", ""]),
        HOSTS,
        st.sampled_from(["", "/", "/v1", "?q=1", "#f", "/{id}", "@x", "/a b"])
        | st.text(max_size=6),
    ),
)
HEADER_NAMES = st.sampled_from(
    ["Authorization", "X-Key", "Host", "Connection", "Content-Length", "X-Forwarded-For",
     "Proxy-Authorization", ":authority", "X A", ""]
) | st.text(max_size=8)  # fmt: skip
HEADER_VALUES = st.sampled_from(["Bearer ${KEY}", "a\r\nX-Injected: 1", "a\x00", " x"]) | st.text(
    max_size=8
)
SPECS = st.fixed_dictionaries(
    {
        "openapi": st.just("3.0.3"),
        "servers": st.lists(st.fixed_dictionaries({"url": URLS}), min_size=1, max_size=1),
        "paths": st.dictionaries(
            st.sampled_from(["/a", "/a/{id}", "@evil/x", "/a?x=1", "//h/x"]) | st.text(max_size=6),
            st.just({"get": {"parameters": [{"name": "X-Trace", "in": "header"}]}})
            | st.fixed_dictionaries(
                {"get": st.fixed_dictionaries({"parameters": st.lists(
                    st.fixed_dictionaries({"name": HEADER_NAMES, "in": st.just("header")}),
                    max_size=2)})}
            ),
            min_size=1,
            max_size=2,
        ),
    }
)  # fmt: skip


def _stored_body(context: HookContext, body: Any) -> Any:
    """Mostly a body with URL-, host- and header-shaped strings where the route reads them;
    else the one generated (negative cases included)."""
    path = context.operation.path if context.operation is not None else ""
    if path.endswith("/model-routes"):
        shaped = st.fixed_dictionaries(
            {"routes": st.lists(
                st.fixed_dictionaries({"pattern": st.just("x/*"), "api_base": URLS}),
                max_size=3)}
        )  # fmt: skip
    elif path.endswith("/egress"):
        shaped = st.fixed_dictionaries({"hosts": st.lists(HOSTS | URLS, max_size=4)})
    else:
        shaped = st.fixed_dictionaries(
            {"spec": SPECS},
            optional={"base_url": URLS, "headers": st.dictionaries(HEADER_NAMES, HEADER_VALUES,
                                                                    max_size=2)},
        )  # fmt: skip
    return shaped | st.just(body)


@schema.include(method="PUT", path_regex=STORED_FOR_THE_GATEWAY).parametrize()
@GLOBAL_HOOK_DISPATCHER.apply(_stored_body, name="flatmap_body")
@settings(
    max_examples=STORED_EXAMPLES,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=list(HealthCheck),
)
def test_what_the_gateway_will_call_is_stored_or_refused_never_5xx(case: Case) -> None:
    # The bootstrap project exists: its routes, allowlist and specs are what is changed.
    case.path_parameters = {**(case.path_parameters or {}), "name": "default"}
    if "{prefix}" in case.path:
        case.path_parameters["prefix"] = "fuzzed"
    response = case.call(headers=bearer(ADMIN_TOKEN))
    case.validate_response(response, checks=CHECKS, headers=bearer(ADMIN_TOKEN))


def test_every_route_documents_its_errors_in_the_error_shape() -> None:
    """What the run above checks against: every error status of every route is an ErrorBody,
    and each /v1 route lists the answers any of them can give."""
    app = create_app(Settings(database_url="postgresql://unused@127.0.0.1:9/unused"))
    document = app.openapi()
    missing = []
    for path, operations in document["paths"].items():
        for method, operation in operations.items():
            responses = operation["responses"]
            for code, response in responses.items():
                if code[0] in "45":
                    ref = response["content"]["application/json"]["schema"].get("$ref", "")
                    if not ref.endswith("/ErrorBody"):
                        missing.append(f"{method.upper()} {path} {code}: not ErrorBody")
            wanted = {"400", "500"}
            if path.startswith("/v1/"):
                wanted |= {"401", "403", "422", "429"}
            if "{" in path:
                wanted.add("404")
            missing += [
                f"{method.upper()} {path}: {c} undocumented" for c in wanted - set(responses)
            ]
    assert missing == []
    assert "HTTPValidationError" not in str(document)  # FastAPI's 422 shape is never answered
