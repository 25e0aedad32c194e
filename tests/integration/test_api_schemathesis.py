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

import pytest
import schemathesis
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, settings
from schemathesis import BaseSchema, Case
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

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
