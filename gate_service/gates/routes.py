"""HTTP routes for gates and runs: thin, everything decided in the service layer."""

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
from fastapi.responses import JSONResponse
from sqlalchemy.orm import Session, sessionmaker

from ..app_state import state_of
from ..auth.deps import (
    Reader,
    Submitter,
    bearer_token,
    client_address,
    require,
)
from ..auth.service import Principal, last_use_due, record_by, token_refusal
from ..auth.tokens import Scope, digests_match, token_digest
from ..db import session_scope
from ..deps import SessionDep, SessionFactoryDep, SettingsDep
from ..errors import BadRequest, NotFound, error_responses
from ..models import GateStatus, utcnow
from ..text import unstorable
from . import service
from .labels import parse_label_filter
from .notify import GateBodies
from .schemas import CasePage, GateList, GateRead, RecordingsRead, RunRead
from .submission import MODEL_MODES, submit_bundle
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


CASES_PAGE, MAX_CASES_PAGE = service.CASES_PAGE, service.MAX_CASES_PAGE


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
    return service.list_gates(
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
        revision = service.gate_revision(session, gate_id, who.project_id)
        etag = _etag(gate_id, revision, cases_limit)
        if etag == if_none_match:
            return etag, None
        body = bodies.get(gate_id, revision, who.project_id, cases_limit)
        if body is None:
            revision, body = service.read_gate_body(
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
    limiter = state_of(request).auth_failures
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
    reads = state_of(request).status_reads
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
    bodies, limiter = state.gate_bodies, state.status_read_threads
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
    changes = state_of(request).gate_changes
    # Only a waiting request holds a slot, of its project's share: past the share 429, when
    # all are taken 503, at once.
    with state_of(request).long_poll_slots.hold(who.project_id, who.project_name):
        deadline = time.monotonic() + min(wait, settings.long_poll_max_seconds)
        # Subscribed before the first read, and cleared before each re-check: a change
        # committed while reading wakes the waiter again instead of being missed.
        with changes.subscribe(gate_id) as waiter:
            # Waiting happens on the event loop, so a long-poll holds no thread or lock.
            look = partial(_look, factory, bodies, who, gate_id, if_none_match, public, cases_limit)
            known = reader.revision
            if known not in (None, -1) and _etag(gate_id, known, cases_limit) == if_none_match:
                # Unchanged when the token was checked; subscribed now, one look on the loop
                # closes the gap between the two (no thread, no session).
                etag, body = if_none_match, None
                if await _peek(request, who, gate_id, etag, cases_limit) is not _SAME:
                    etag, body = await anyio.to_thread.run_sync(look, limiter=limiter)
            else:
                etag, body = await anyio.to_thread.run_sync(look, limiter=limiter)
            settle = settings.long_poll_settle_seconds
            answer_at: float | None = None  # set once a change of a running gate is seen
            while body is None:
                now = time.monotonic()
                if now >= deadline:
                    break
                if answer_at is not None and now >= answer_at:
                    etag, body = await anyio.to_thread.run_sync(look, limiter=limiter)
                    answer_at = None
                    continue
                # Woken by a notification for this gate (or a reconnect of the listener);
                # re-checks on its own now and then, in case a notification was lost.
                until = deadline if answer_at is None else answer_at
                woken = await waiter.wait(min(until - now, changes.recheck_seconds))
                heard = waiter.heard
                waiter.clear()
                if answer_at is not None and not woken:
                    continue  # gathering, and nothing new: the answer is read when it is due
                if woken and heard is not None:
                    # The notification said the new revision and status: no query needed.
                    seen = _seen(gate_id, *heard, etag, cases_limit)
                else:
                    # The revision and status first, on the loop: an unchanged gate (a lost
                    # notification's re-check, a reconnect's wake-up) costs no thread.
                    seen = await _peek(request, who, gate_id, etag, cases_limit)
                if seen is _SAME:
                    continue
                if seen is _RUNNING and settle > 0:
                    # A running gate changes once or twice per case: answering each change
                    # would cost a read, an answer and a new request per case for every
                    # poller. Its changes are gathered for up to `settle` seconds into one
                    # answer; an end (or a gone gate) is answered at once.
                    if answer_at is None:
                        answer_at = min(time.monotonic() + settle, deadline)
                    continue
                etag, body = await anyio.to_thread.run_sync(look, limiter=limiter)
                answer_at = None
            return _answer(etag, body)


# What a long-poll's look on the loop found (``_peek``).
_SAME, _RUNNING, _OTHER = "same", "running", "other"


async def _peek(
    request: Request, who: Principal, gate_id: uuid.UUID, etag: str, cases_limit: int
) -> str:
    """_SAME when the gate still has this ETag; _RUNNING when it changed and has not ended;
    _OTHER when it ended, is gone, or the quick query failed (the caller then reads it the
    ordinary way)."""
    reads = state_of(request).status_reads
    try:
        found = await reads.revision(gate_id, who.project_id)
    except psycopg.Error:
        log.debug("status re-check: falling back to the ordinary path", exc_info=True)
        return _OTHER
    if found is None:
        return _OTHER
    return _seen(gate_id, *found, etag, cases_limit)


def _seen(gate_id: uuid.UUID, revision: int, status: str, etag: str, cases_limit: int) -> str:
    """What a gate at ``revision`` with ``status`` is to a long-poll that holds ``etag``."""
    if _etag(gate_id, revision, cases_limit) == etag:
        return _SAME
    return _OTHER if status in TERMINAL_STATUSES else _RUNNING


TERMINAL_STATUSES = frozenset(s.value for s in GateStatus if s.terminal)


def _answer(etag: str, body: bytes | None) -> Response:
    if body is None:
        return Response(status_code=304, headers={"ETag": etag})
    return Response(body, media_type="application/json", headers={"ETag": etag})


@router.post("/gates/{gate_id}/cancel", response_model=GateRead, responses=ERRORS)
def cancel_gate(
    gate_id: uuid.UUID, request: Request, session: SessionDep, settings: SettingsDep, who: Submitter
) -> GateRead:
    """Cancel a gate; a running gate stops before its next case."""
    gate = service.request_cancel(session, gate_id, who.project_id)
    state_of(request).metrics.gate_ended_unstarted(session, gate)
    record_by(session, who, "gate.cancelled", gate=str(gate_id))
    return service.read_gate(
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
    service.gate_revision(session, gate_id, who.project_id)  # NotFound for another's gate
    items, following = service.read_case_views(session, gate_id, after=after, limit=limit)
    return CasePage(items=items, next=following)


@router.get("/gates/{gate_id}/recordings", response_model=RecordingsRead, responses=ERRORS)
def get_recordings(gate_id: uuid.UUID, session: SessionDep, who: Reader) -> RecordingsRead:
    """The gate's answered model calls as replay recordings (tests/recordings/<agent>/)."""
    return service.gate_recordings(session, gate_id, who.project_id)


@router.get("/runs/{run_id}", response_model=RunRead, responses=ERRORS)
def get_run(run_id: uuid.UUID, session: SessionDep, who: Reader) -> RunRead:
    """One invocation of a case, with its trace."""
    return service.read_run(session, run_id, who.project_id)
