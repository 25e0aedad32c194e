"""Connic-compatible routes, so that the unmodified `connic test` CLI runs a suite here.

Set CONNIC_API_URL=<gate>/v1, CONNIC_API_KEY=<a token with submit and read scopes> and
CONNIC_PROJECT_ID=<the token's project name>. Thin like every route module: the mapping is
in service.py, gates are created and read by the gates domain.
"""

from __future__ import annotations

import re
import uuid
from typing import Annotated, Any

from fastapi import APIRouter, Header, Path, Request, Response
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse

from ..app_state import state_of
from ..auth.deps import Reader, Submitter
from ..deps import SessionDep, SessionFactoryDep, SettingsDep
from ..errors import PayloadTooLarge, UnsupportedMediaType, error_responses
from ..gates import views as gates
from ..gates.routes import check_idempotency_key
from ..gates.submission import submit_bundle
from ..gates.upload import MinimumRate, paced_body
from . import service
from .schemas import ConnicEnvironment, ConnicRun, ConnicTestRun, ConnicTestRunSubmit

router = APIRouter(prefix="/v1/projects/{pid}", tags=["connic"])

ERRORS = error_responses(
    {
        400: "Not a JSON object with base64 files_data, an unknown environment (or a Host "
        "not in GATE_TRUSTED_HOSTS)",
        401: "No token, or an unknown, expired or revoked one",
        403: "The token lacks the scope this route needs",
        404: "Not found: {pid} is not the token's project, or the id is another project's",
        409: "Conflict",
        413: "Body or bundle over the size limits",
        415: "Not application/json, or files_data is not a .tar.gz or .zip",
        422: "Unsafe archive or invalid request",
        408: "The body arrived slower than GATE_UPLOAD_MIN_BYTES_PER_SECOND",
        429: "Too many failed authentications, or over a project's cap or share of uploads "
        "in progress; Retry-After where waiting helps",
        503: "Over a service-wide cap (queue, uploads); Retry-After",
    }
)

Pid = Annotated[str, Path(description="The token's project name (CONNIC_PROJECT_ID)")]

# The declared-size middleware in main.py holds every other body to the multipart limit;
# this route's base64 body is a third larger, so it bounds its own body (below) instead.
# Matched at the end of the path: behind a proxy's root_path the scope's path has a prefix.
_TEST_RUNS_PATH = re.compile(r"/v1/projects/[^/]+/test-runs/?\Z")


def bounds_its_own_body(method: str, path: str) -> bool:
    """True for the one route that enforces its own, larger, body limit while streaming."""
    return method == "POST" and _TEST_RUNS_PATH.search(path) is not None


SUBMIT_SCHEMA: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "content": {"application/json": {"schema": ConnicTestRunSubmit.model_json_schema()}},
    }
}


async def _read_body(
    request: Request, limit_bytes: int, rate: MinimumRate, upload_limit_bytes: int
) -> service.TestRunBody:
    """The body, scanned as it streams (files_data decoded on the way, see body.py); refused
    with 413 as soon as it is declared or read past the limit, and cut with 408 once it
    arrives slower than ``rate``.

    Parsed by hand rather than by a pydantic body parameter: FastAPI would read any size
    before validating, and answer a malformed body 422 where the CLI expects 400.
    """
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit_bytes:
        raise PayloadTooLarge(
            f"the request declares {int(declared)} bytes; this route accepts at most "
            f"{limit_bytes} bytes (base64 of the upload limit, plus the JSON around it)",
            problems=[{"limit_bytes": limit_bytes, "declared_bytes": int(declared)}],
        )
    body = service.TestRunBody(upload_limit_bytes, service.JSON_ENVELOPE_BYTES)
    received = 0
    try:
        async for chunk in paced_body(request, rate):
            received += len(chunk)
            if received > limit_bytes:
                raise PayloadTooLarge(
                    f"the request body is larger than {limit_bytes} bytes (base64 of the "
                    f"upload limit, plus the JSON around it); refused after {received} bytes, "
                    "without reading the rest",
                    problems=[{"limit_bytes": limit_bytes, "received_bytes": received}],
                )
            body.feed(chunk)
    except BaseException:
        body.close()
        raise
    return body


@router.get("/environments", response_model=list[ConnicEnvironment], responses=ERRORS)
def list_environments(pid: Pid, who: Reader) -> list[ConnicEnvironment]:
    """The one default environment, which `connic test` resolves when no --env is given."""
    service.check_project(who, pid)
    return service.environments()


@router.post(
    "/test-runs",
    status_code=202,
    response_model=ConnicTestRun,
    responses={
        200: {"model": ConnicTestRun, "description": "An Idempotency-Key seen before"},
        **ERRORS,
    },
    openapi_extra=SUBMIT_SCHEMA,
)
async def create_test_run(
    pid: Pid,
    request: Request,
    factory: SessionFactoryDep,
    settings: SettingsDep,
    who: Submitter,
    idempotency_key: Annotated[
        str | None,
        Header(description="1 to 200 characters; a repeat answers the first test run (200)"),
    ] = None,
) -> Response:
    """Start a test run: a gate over the base64 archive, judged like POST /v1/gates."""
    service.check_project(who, pid)
    key = check_idempotency_key(idempotency_key)
    media_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if media_type != "application/json":
        raise UnsupportedMediaType(
            f'expected Content-Type application/json with {{"files_data": <base64 .tar.gz>}}; '
            f"got {media_type!r}"
        )
    # Held before a byte is read, as for multipart uploads: at most N bodies in flight, of
    # which at most the project's share are this project's.
    with state_of(request).upload_slots.hold(who.project_id, who.project_name):
        body = await _read_body(
            request,
            service.body_limit_bytes(settings.upload_limit_bytes),
            MinimumRate.of(settings),
            settings.upload_limit_bytes,
        )
        upload = service.parse_submission(body, upload_limit_bytes=settings.upload_limit_bytes)
        try:
            view, created = await run_in_threadpool(
                submit_bundle, factory, who, upload, key, settings
            )
        finally:
            upload.close()
    return JSONResponse(
        service.as_test_run(view).model_dump(mode="json"),
        status_code=202 if created else 200,
        headers={"Location": f"/v1/projects/{who.project_name}/test-runs/{view.id}"},
    )


@router.get("/test-runs/{test_run_id}", response_model=ConnicTestRun, responses=ERRORS)
def get_test_run(
    pid: Pid, test_run_id: uuid.UUID, session: SessionDep, who: Reader
) -> ConnicTestRun:
    """The test run (the gate of that id), which the CLI polls every 5 s until it ends."""
    service.check_project(who, pid)
    return service.as_test_run(gates.read_gate(session, test_run_id, who.project_id))


@router.get("/runs/{run_id}", response_model=ConnicRun, responses=ERRORS)
def get_run(pid: Pid, run_id: uuid.UUID, session: SessionDep, who: Reader) -> ConnicRun:
    """One invocation with its trace, for the CLI's failed-run drill-down."""
    service.check_project(who, pid)
    return service.as_run(gates.read_run(session, run_id, who.project_id))
