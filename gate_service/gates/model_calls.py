"""A case's model calls: stored with its outcome, summed for the gate JSON, exported for replay.

The worker hands over what the case's gateway channel recorded (``gateway.CallRecord``) in
the transaction that stores the case's outcome. Like a run, a call is redacted first (every
value that reached the case), then made storable, then bounded, and its stored bytes count
into the gate's ``result_bytes``, which the per-project quota adds up.

Functions take the session first and never commit, like the rest of the service layer.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict
from typing import Any

from sqlalchemy import delete, func, select
from sqlalchemy.orm import Session

from ..gateway.records import (
    ANSWERED,
    RECORDINGS_DIR,
    Answered,
    CallRecord,
    recording_files,
    safe_agent,
)
from ..models import Case, Gate, ModelCall
from ..stored_runs import RunCap, cut_text, json_bytes, storable, storable_text
from .schemas import ModelCallTotals, RecordingContent, RecordingFile, RecordingsRead

# A request is the whole conversation so far (up to the wire's 8 MiB), and every call of a
# case repeats the ones before it. Replaying a call needs only its key (request_hash) and its
# answer, so a request is kept, to be read, only up to this; a larger one is stored as null.
MAX_STORED_REQUEST_BYTES = 256 * 1024
# An answer over this is not stored (nor exported): as large as a run may store by default
# (GATE_MAX_STORED_RUN_BYTES), far more than a model's reply of a few thousand tokens.
MAX_STORED_RESPONSE_BYTES = 1024 * 1024
# A provider's error message is quoted for a person; its head says what went wrong.
MAX_ERROR_MESSAGE_BYTES = 4 * 1024
NAME_CHARS = 200  # ModelCall.agent and .model are String(200)
STATUS_CHARS = 32  # ModelCall.status is String(32); the gateway's kinds are shorter
HASH_CHARS = 64  # a sha256 in hex

Redact = Callable[[Any], Any]


def _body(value: Any, redact: Redact, limit: int) -> Any:
    """``value`` redacted and storable, or None when it is over ``limit`` bytes of JSON or
    nests too deeply to redact (then nothing of it is stored: a cut could keep a secret's
    part, and the key alone still replays the call)."""
    if value is None:
        return None
    try:
        stored = storable(redact(value))
    except RecursionError:
        return None
    return stored if json_bytes(stored) <= limit else None


def _text(value: Any, redact: Redact, chars: int) -> str:
    return storable_text(str(redact(str(value))))[:chars]


def _error(record: CallRecord, redact: Redact) -> dict[str, Any] | None:
    if record.error is None:
        return None
    error = storable(redact(asdict(record.error)))
    if isinstance(error.get("message"), str) and (
        json_bytes(error["message"]) > MAX_ERROR_MESSAGE_BYTES
    ):
        error["message"] = cut_text(error["message"], MAX_ERROR_MESSAGE_BYTES - 64)
    return dict(error)


def _count(value: int) -> int:
    return max(0, int(value))


def _cost(value: float) -> float:
    # LiteLLM's cost map can answer nothing sensible for an unknown model; a NaN would make
    # every sum over the gate NaN.
    cost = float(value)
    return cost if math.isfinite(cost) and cost >= 0 else 0.0


def _row(
    gate_id: uuid.UUID,
    case_id: uuid.UUID,
    position: int,
    record: CallRecord,
    redact: Redact,
    request_limit: int,
    response_limit: int,
) -> ModelCall:
    reply = record.reply.raw() if record.reply is not None else None
    values: dict[str, Any] = {
        "agent": _text(record.agent, redact, NAME_CHARS),
        "model": _text(record.request.get("model", ""), redact, NAME_CHARS),
        "request_hash": storable_text(record.request_hash)[:HASH_CHARS],
        "request": _body(record.request, redact, request_limit),
        "response": _body(reply, redact, response_limit),
        "error": _error(record, redact),
        "status": storable_text(record.status)[:STATUS_CHARS],
        "tokens_in": _count(record.tokens_in),
        "tokens_out": _count(record.tokens_out),
        "cost_usd": _cost(record.cost_usd),
        "latency_ms": _count(record.latency_ms),
        "attempts": _count(record.attempts),
    }
    return ModelCall(
        gate_id=gate_id,
        case_id=case_id,
        position=position,
        stored_bytes=json_bytes(values),
        **values,
    )


def save_model_calls(
    session: Session,
    gate_id: uuid.UUID,
    case_id: uuid.UUID,
    records: Sequence[CallRecord],
    redact: Redact,
    *,
    cap: RunCap | None = None,
) -> int:
    """Store the calls a case's gateway channel answered, replacing any an earlier attempt
    of the case stored: the change in the bytes they store, for the gate's ``result_bytes``
    (``lifecycle.count_case_write``).

    ``redact`` replaces every secret value in a JSON-like value (``secrets.redact.Redactor``
    of the case's environment); request, response, error, agent and model pass through it
    before anything is stored. ``cap``: the run cap the case's runs are stored under
    (``run_cap``); once the project's stored results reached its quota it is the floor, and
    a request or answer is then kept only up to that floor, as a run is.
    """
    request_limit, response_limit = MAX_STORED_REQUEST_BYTES, MAX_STORED_RESPONSE_BYTES
    if cap is not None:
        request_limit = min(request_limit, cap.limit)
        response_limit = min(response_limit, cap.limit)
    replaced = session.scalar(
        select(func.coalesce(func.sum(ModelCall.stored_bytes), 0)).where(
            ModelCall.case_id == case_id
        )
    )
    session.execute(delete(ModelCall).where(ModelCall.case_id == case_id))
    rows = [
        _row(gate_id, case_id, position, record, redact, request_limit, response_limit)
        for position, record in enumerate(records)
    ]
    session.add_all(rows)
    return sum(r.stored_bytes for r in rows) - int(replaced or 0)


def model_call_totals(
    session: Session, gate_id: uuid.UUID, case_ids: Sequence[uuid.UUID] | None = None
) -> tuple[ModelCallTotals, dict[uuid.UUID, ModelCallTotals]]:
    """The gate's totals and each case's (a case without calls is absent), from one grouped
    query over the gate's calls; with ``case_ids``, over those cases' calls only (a page of
    cases), the first total then being theirs. Tokens and cost are the answered calls' only
    (status ``ok``): a call that failed, before the provider or at it, counts as failed."""
    answered = ModelCall.status == ANSWERED
    query = select(
        ModelCall.case_id,
        func.count(),
        func.count().filter(answered),
        func.coalesce(func.sum(ModelCall.tokens_in).filter(answered), 0),
        func.coalesce(func.sum(ModelCall.tokens_out).filter(answered), 0),
        func.coalesce(func.sum(ModelCall.cost_usd).filter(answered), 0.0),
    ).where(ModelCall.gate_id == gate_id)
    if case_ids is not None:
        query = query.where(ModelCall.case_id.in_(case_ids))
    rows = session.execute(query.group_by(ModelCall.case_id)).all()
    by_case = {
        case_id: ModelCallTotals(
            calls=int(calls),
            answered=int(ok),
            failed=int(calls) - int(ok),
            tokens_in=int(tokens_in),
            tokens_out=int(tokens_out),
            cost_usd=float(cost),
        )
        for case_id, calls, ok, tokens_in, tokens_out, cost in rows
    }
    gate = ModelCallTotals(
        calls=sum(t.calls for t in by_case.values()),
        answered=sum(t.answered for t in by_case.values()),
        failed=sum(t.failed for t in by_case.values()),
        tokens_in=sum(t.tokens_in for t in by_case.values()),
        tokens_out=sum(t.tokens_out for t in by_case.values()),
        cost_usd=sum(t.cost_usd for t in by_case.values()),
    )
    return gate, by_case


def read_recordings(session: Session, gate: Gate) -> RecordingsRead:
    """The gate's answered calls as replay recordings (gateway.records.recording_files), in
    the order of its cases and their calls. ``gate``: one the caller may read."""
    rows = session.execute(
        select(ModelCall.agent, ModelCall.request_hash, ModelCall.request, ModelCall.response)
        .join(Case, Case.id == ModelCall.case_id)
        .where(ModelCall.gate_id == gate.id)
        .where(ModelCall.status == ANSWERED)
        .order_by(Case.position, ModelCall.position)
    ).all()
    left_out = 0

    def kept() -> Iterator[Answered]:
        nonlocal left_out
        for agent, key, request, response in rows:
            if not isinstance(response, dict) or not safe_agent(agent):
                left_out += 1
                continue
            yield Answered(agent, key, request, response)

    files = recording_files(kept())
    return RecordingsRead(
        recordings=[
            RecordingFile(
                path=f"{RECORDINGS_DIR}/{relative}",
                content=RecordingContent.model_validate(document),
            )
            for relative, document in files
        ],
        left_out=left_out,
    )
