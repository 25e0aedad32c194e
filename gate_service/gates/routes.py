"""HTTP routes for gates and runs: thin, everything decided below them.

Reads go through ``views``, writes through ``submission`` (never the ``lifecycle`` itself),
and a long-poll's waiting is ``notify.wait_for_change``.
"""

from __future__ import annotations

import logging
import time
import uuid
from dataclasses import dataclass
from functools import partial
from typing import Annotated, Any

import anyio
import anyio.to_thread
import psycopg
from fastapi import APIRouter, Depends, Header, Query, Request, Response
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse, PlainTextResponse
from sqlalchemy.orm import Session, sessionmaker

from ..app_state import state_of
from ..auth.brakes import FailureLimiter
from ..auth.deps import (
    Reader,
    Submitter,
    bearer_token,
    client_address,
    require,
)
from ..auth.service import Principal, last_use_due, record_by, token_refusal
from ..auth.tokens import Scope, digests_match, token_digest
from ..baselines.summary import gate_summary
from ..db import session_scope
from ..deps import SessionDep, SessionFactoryDep, SettingsDep
from ..errors import BadRequest, NotFound, error_responses
from ..models import GateStatus, utcnow
from ..text import unstorable
from . import views
from .labels import parse_label_filter
from .notify import GateBodies, GateChanges, wait_for_change
from .schemas import CasePage, GateList, GateRead, RecordingsRead, RunRead
from .status_reads import StatusReads
from .submission import MODEL_MODES, request_cancel, submit_bundle
from .upload import MinimumRate, receive_upload

log = logging.getLogger(__name__)
router = APIRouter(prefix="/v1")

ERRORS = error_responses(
    {
        400: "Bad request (or a Host not in GATE_TRUSTED_HOSTS)",
        401: "No token, or an unknown, expired or revoked one",
        403: "The token lacks the scope this route needs",
        404: "Not found (or another project's)",
        409: "Conflict",
        413: "Bundle over the size limits",
        415: "Not a .tar.gz or .zip",
        422: "Unsafe archive or invalid request",
        408: "The upload's body arrived slower than GATE_UPLOAD_MIN_BYTES_PER_SECOND",
        429: "Too many failed authentications, or over a project's cap or share "
        "(uploads, long-polls in progress); Retry-After where waiting helps",
        503: "Over a service-wide cap (queue, uploads, long-polls); Retry-After",
    }
)


CASES_PAGE, MAX_CASES_PAGE = views.CASES_PAGE, views.MAX_CASES_PAGE


def _etag(gate_id: uuid.UUID, revision: int, cases_limit: int = CASES_PAGE) -> str:
    # Bodies with other pages of cases are other representations of the same revision.
    page = "" if cases_limit == CASES_PAGE else f".c{cases_limit}"
    return f'W/"{gate_id}.{revision}{page}"'


MAX_IDEMPOTENCY_KEY_CHARS = 200


def check_idempotency_key(value: str | None) -> str | None:
    """The Idempotency-Key header, or 400 when it is blank, too long or unstorable."""
    if value is None:
        return None
    if not value.strip() or len(value) > MAX_IDEMPOTENCY_KEY_CHARS:
        raise BadRequest(
            f"the Idempotency-Key header must be 1 to {MAX_IDEMPOTENCY_KEY_CHARS} characters, "
            f"not blank; got {len(value)}"
        )
    why = unstorable(value)
    if why:
        raise BadRequest(f"the Idempotency-Key header holds {why}")
    return value


UPLOAD_SCHEMA: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "content": {
            "multipart/form-data": {
                "schema": {
                    "type": "object",
                    "required": ["bundle"],
                    "properties": {
                        "bundle": {
                            "type": "string",
                            "format": "binary",
                            "description": "The project as .tar.gz/.tgz or .zip",
                        },
                        "filter": {
                            "type": "string",
                            "description": "Run only cases whose name contains this",
                        },
                        "model_mode": {
                            "type": "string",
                            "enum": list(MODEL_MODES),
                            "description": "Force this model mode for every LLM agent",
                        },
                        "labels": {
                            "type": "string",
                            "description": 'JSON object, e.g. {"commit": "abc"}',
                        },
                        "baseline": {
                            "type": "string",
                            "description": "Compare each case with this gate's: a gate id, "
                            "or label:key=value (the project's last passing gate with that "
                            "label, e.g. label:branch=main)",
                        },
                        "changed_only": {
                            "type": "string",
                            "enum": ["true", "false"],
                            "description": "Reuse the baseline's passing cases whose closure "
                            "is unchanged (scripted or replay only) instead of running them",
                        },
                    },
                }
            }
        },
    }
}


@router.post(
    "/gates",
    status_code=202,
    response_model=GateRead,
    responses={
        200: {"model": GateRead, "description": "An Idempotency-Key seen before: its gate"},
        **ERRORS,
    },
    openapi_extra=UPLOAD_SCHEMA,
)
async def create_gate(
    request: Request,
    factory: SessionFactoryDep,
    settings: SettingsDep,
    who: Submitter,
    idempotency_key: Annotated[
        str | None,
        Header(description="1 to 200 characters; a repeat answers the first gate (200)"),
    ] = None,
) -> Response:
    """Queue a bundle for judging; poll the Location it answers with."""
    idempotency_key = check_idempotency_key(idempotency_key)
    # A slot for the whole upload, taken before a byte of the body is read (and after the
    # token named the project): when the project holds its share the answer is 429, when
    # every slot is in use 503, at once, so waiting uploads never pile up in memory. A body
    # arriving slower than GATE_UPLOAD_MIN_BYTES_PER_SECOND is cut (408), freeing the slot.
    with state_of(request).upload_slots.hold(who.project_id, who.project_name):
        upload = await receive_upload(
            request, limit_bytes=settings.upload_limit_bytes, rate=MinimumRate.of(settings)
        )
        try:
            # Archive scanning and the database are blocking work: keep them off the loop.
            view, created = await run_in_threadpool(
                submit_bundle, factory, who, upload, idempotency_key, settings
            )
        finally:
            upload.close()
    return JSONResponse(
        view.model_dump(mode="json"),
        status_code=202 if created else 200,
        headers={"Location": f"/v1/gates/{view.id}"},
    )


@router.get("/gates", response_model=GateList, responses=ERRORS)
def list_gates(
    session: SessionDep,
    settings: SettingsDep,
    who: Reader,
    status: Annotated[GateStatus | None, Query()] = None,
    label: Annotated[list[str] | None, Query(description="key=value, repeatable")] = None,
    limit: Annotated[int, Query(ge=1, le=200)] = 50,
    offset: Annotated[int, Query(ge=0, le=1_000_000)] = 0,
) -> GateList:
    """List gates, newest first."""
    wanted = parse_label_filter(label or [])
    return views.list_gates(
        session,
        project_id=who.project_id,
        status=status,
        label=wanted or None,
        limit=limit,
        offset=offset,
        public_url=settings.public_url,
    )


def _look(
    factory: sessionmaker[Session],
    bodies: GateBodies,
    who: Principal,
    gate_id: uuid.UUID,
    if_none_match: str | None,
    public_url: str,
    cases_limit: int = CASES_PAGE,
) -> tuple[str, bytes | None]:
    """One short transaction: the current ETag, and the body if it differs from the client's.

    An unchanged gate costs one revision query; a changed one is read and serialised once
    per revision (``GateBodies``), however many clients poll it.
    """
    with session_scope(factory) as session:
        revision = views.gate_revision(session, gate_id, who.project_id)
        etag = _etag(gate_id, revision, cases_limit)
        if etag == if_none_match:
            return etag, None
        body = bodies.get(gate_id, revision, who.project_id, cases_limit)
        if body is None:
            revision, body = views.read_gate_body(
                session, gate_id, who.project_id, public_url=public_url, cases_limit=cases_limit
            )
            bodies.put(gate_id, revision, who.project_id, body, cases_limit)
            etag = _etag(gate_id, revision, cases_limit)
        return etag, body


_READ = require(Scope.read)


@dataclass(frozen=True)
class GateReader:
    """The caller (with the read scope) and, when it came with the check, the gate's revision
    (None: not known yet; -1: no such gate of the caller's project)."""

    who: Principal
    revision: int | None = None


async def _quick_read(request: Request) -> GateReader | None:
    """The read-scope check of ``auth.deps.require`` and the gate's revision, in one query
    on the event loop (``StatusReads``).

    Only the path where authentication writes nothing: None when the client is being braked,
    the header is not a bearer token, or the token is unknown, revoked, expired, lacks the
    read scope or has a last_used_at due, or the query failed; ``require`` then decides
    (401/403/429, audit rows, last_used_at), exactly as for every other route.
    """
    limiter = state_of(request).part(FailureLimiter)
    if limiter.retry_after(client_address(request)) is not None:
        return None
    token = bearer_token(request)
    try:
        gate_id = uuid.UUID(request.path_params["gate_id"])
    except (KeyError, ValueError):
        return None
    if token is None:
        return None
    digest = token_digest(token)
    reads = state_of(request).part(StatusReads)
    try:
        row = await reads.token_and_revision(gate_id, digest)
    except psycopg.Error:
        log.debug("status read: falling back to the ordinary path", exc_info=True)
        return None
    if row is None or not digests_match(row.token_sha256, digest):
        return None
    now = utcnow()
    # The rules of auth.service.authenticate; anything it would refuse or write goes there.
    if token_refusal(row.revoked_at, row.expires_at, now) or last_use_due(row.last_used_at, now):
        return None
    who = Principal(row.id, row.project_id, row.name, frozenset(row.scopes))
    if not who.has(Scope.read):
        return None
    return GateReader(who, -1 if row.revision is None else row.revision)


# Status reads in threads at once, per process (AppState.status_read_threads): fewer than the
# engine's pool (10), so a burst of polls queues instead of opening overflow connections.
STATUS_READ_THREADS = 8


async def gate_reader(request: Request) -> GateReader:
    """Like ``Reader``, plus the gate's revision: one query on the event loop, no thread."""
    quick = await _quick_read(request)
    if quick is not None:
        return quick
    who = await anyio.to_thread.run_sync(
        _READ, request, limiter=state_of(request).status_read_threads
    )
    return GateReader(who)


@router.get(
    "/gates/{gate_id}",
    response_model=GateRead,
    responses={304: {"description": "Unchanged since If-None-Match (after ?wait)"}, **ERRORS},
)
async def get_gate(
    gate_id: uuid.UUID,
    request: Request,
    reader: Annotated[GateReader, Depends(gate_reader)],
    wait: Annotated[int, Query(ge=0, description="Long-poll up to N seconds for a change")] = 0,
    cases_limit: Annotated[
        int,
        Query(
            ge=0,
            le=MAX_CASES_PAGE,
            description="Answer at most this many cases; `next_cases` is the path of the rest "
            "(0: none, for a poll that needs only the status and the counts)",
        ),
    ] = CASES_PAGE,
    if_none_match: Annotated[str | None, Header()] = None,
) -> Response:
    """Read a gate; with ?wait=N and If-None-Match, wait for it to change."""
    # The app's state read here, not through sync dependencies: each is a threadpool hop.
    state = state_of(request)
    factory, settings = state.sessions, state.settings
    bodies, limiter = state.part(GateBodies), state.status_read_threads
    public = settings.public_url
    who = reader.who
    if wait <= 0:
        if reader.revision == -1:
            raise NotFound(f"no gate with id {gate_id}")
        if reader.revision is not None:
            # The common poll: 304, or a cached body, with no further database work.
            etag = _etag(gate_id, reader.revision, cases_limit)
            if etag == if_none_match:
                return _answer(etag, None)
            body = bodies.get(gate_id, reader.revision, who.project_id, cases_limit)
            if body is not None:
                return _answer(etag, body)
        etag, body = await anyio.to_thread.run_sync(
            _look,
            factory,
            bodies,
            who,
            gate_id,
            if_none_match,
            public,
            cases_limit,
            limiter=limiter,
        )
        return _answer(etag, body)
    look = partial(_look, factory, bodies, who, gate_id, if_none_match, public, cases_limit)

    # A read of the gate is a session's blocking work: in a thread, within the status reads'
    # share of them, so the long-poll itself holds no thread while it waits.
    async def look_off_the_loop() -> tuple[str, bytes | None]:
        return await anyio.to_thread.run_sync(look, limiter=limiter)

    # Only a waiting request holds a slot, of its project's share: past the share 429, when
    # all are taken 503, at once.
    with state.long_poll_slots.hold(who.project_id, who.project_name):
        etag, body = await wait_for_change(
            state.part(GateChanges),
            state.part(StatusReads),
            gate_id=gate_id,
            project_id=who.project_id,
            known=reader.revision,
            if_none_match=if_none_match,
            etag_of=partial(_etag, gate_id, cases_limit=cases_limit),
            look=look_off_the_loop,
            deadline=time.monotonic() + min(wait, settings.long_poll_max_seconds),
            settle=settings.long_poll_settle_seconds,
        )
        return _answer(etag, body)


def _answer(etag: str, body: bytes | None) -> Response:
    if body is None:
        return Response(status_code=304, headers={"ETag": etag})
    return Response(body, media_type="application/json", headers={"ETag": etag})


@router.post("/gates/{gate_id}/cancel", response_model=GateRead, responses=ERRORS)
def cancel_gate(
    gate_id: uuid.UUID, request: Request, session: SessionDep, settings: SettingsDep, who: Submitter
) -> GateRead:
    """Cancel a gate; a running gate stops before its next case."""
    gate = request_cancel(session, gate_id, who.project_id)
    state_of(request).metrics.gate_ended_unstarted(session, gate)
    record_by(session, who, "gate.cancelled", gate=str(gate_id))
    return views.read_gate(
        session, gate_id, who.project_id, public_url=settings.public_url, cases_limit=CASES_PAGE
    )


@router.get("/gates/{gate_id}/cases", response_model=CasePage, responses=ERRORS)
def get_cases(
    gate_id: uuid.UUID,
    session: SessionDep,
    who: Reader,
    after: Annotated[
        int, Query(ge=-1, description="Cases after this position (-1: from the first)")
    ] = -1,
    limit: Annotated[int, Query(ge=1, le=MAX_CASES_PAGE)] = CASES_PAGE,
) -> CasePage:
    """A page of the gate's cases, in order: what follows a gate's `next_cases`."""
    views.gate_revision(session, gate_id, who.project_id)  # NotFound for another's gate
    items, following = views.read_case_views(session, gate_id, after=after, limit=limit)
    return CasePage(items=items, next=following)


@router.get("/gates/{gate_id}/recordings", response_model=RecordingsRead, responses=ERRORS)
def get_recordings(gate_id: uuid.UUID, session: SessionDep, who: Reader) -> RecordingsRead:
    """The gate's answered model calls as replay recordings (tests/recordings/<agent>/)."""
    return views.gate_recordings(session, gate_id, who.project_id)


class MarkdownResponse(PlainTextResponse):
    media_type = "text/markdown"


@router.get(
    "/gates/{gate_id}/summary.md",
    # Answered as Markdown, its errors in the one JSON error shape (so not response_class,
    # which would document them as Markdown too).
    response_model=None,
    responses={
        200: {
            "description": "The verdict, then a table of the cases that need a look (failed, "
            "regressed, likely regressed, flaky, quarantined, narrow) with their rates, "
            "intervals, baseline rates, p-values and pages; only the verdict's lines when "
            "every case passed plainly",
            "content": {"text/markdown": {"schema": {"type": "string"}}},
        },
        **ERRORS,
    },
)
def get_summary(
    gate_id: uuid.UUID, session: SessionDep, settings: SettingsDep, who: Reader
) -> MarkdownResponse:
    """The gate's Markdown summary, for a pull-request comment."""
    gate = views.read_gate(session, gate_id, who.project_id, public_url=settings.public_url)
    return MarkdownResponse(
        gate_summary(gate, public_url=settings.public_url),
        headers={"X-Content-Type-Options": "nosniff"},
    )


@router.get("/runs/{run_id}", response_model=RunRead, responses=ERRORS)
def get_run(run_id: uuid.UUID, session: SessionDep, who: Reader) -> RunRead:
    """One invocation of a case, with its trace."""
    return views.read_run(session, run_id, who.project_id)
