"""A bundle as it arrived, the one use case that makes it a gate, and the API's cancel.

Every way a bundle arrives (the multipart form of POST /v1/gates, the base64 JSON of the
connic `test-runs` route) becomes an ``Upload`` and goes through ``submit_bundle``, so all of
them pass the same archive checks, model mode and labels rules, admission caps, idempotency
and audit record. No HTTP here: the routes receive, this decides.

This is the API's way into the gate's writes (``lifecycle``): the HTTP modules never import
the lifecycle themselves (an import-linter contract), so a route cannot make a worker's state
change by mistake.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import IO

from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from ..auth.service import Principal, record_by
from ..baselines.spec import parse_baseline
from ..bundles.archive import read_archive
from ..config import Settings
from ..db import session_scope
from ..errors import BadRequest
from ..models import Gate
from . import lifecycle, views
from .labels import parse_labels
from .schemas import GateRead

MODEL_MODES = ("scripted", "replay", "live")
# The text fields a submission may carry beside the bundle, each at most this long.
TEXT_FIELDS = ("filter", "labels", "model_mode", "baseline", "changed_only")
MAX_TEXT_FIELD_BYTES = 16 * 1024
# An upload is kept in memory up to this size, then in a file on disk.
SPOOL_MEMORY_BYTES = 1024 * 1024


@dataclass
class Upload:
    file: IO[bytes]
    size: int
    sha256: str
    filename: str | None
    fields: dict[str, str] = field(default_factory=dict)

    def close(self) -> None:
        self.file.close()


def submit_bundle(
    sessions: sessionmaker[Session],
    who: Principal,
    upload: Upload,
    idempotency_key: str | None,
    settings: Settings,
) -> tuple[GateRead, bool]:
    """Check the archive, then create (or find, by key) the gate and audit it; (gate, created).

    The transaction is this function's own (one per attempt): a concurrent request with the
    same idempotency key that wins the insert makes the second attempt find its gate.
    """
    # Bounded depth and size, storable text (see labels.py).
    labels = parse_labels(upload.fields.get("labels"))
    model_mode = upload.fields.get("model_mode") or None
    if model_mode not in (None, *MODEL_MODES):
        raise BadRequest(f"model_mode must be one of {', '.join(MODEL_MODES)}, got {model_mode!r}")
    baseline = upload.fields.get("baseline") or None
    if baseline is not None:
        parse_baseline(baseline)  # its form now; which gate it names, in validating
    changed_only = _flag(upload.fields.get("changed_only"), "changed_only")
    if changed_only and baseline is None:
        raise BadRequest(
            "changed_only needs a baseline: the cases it skips are those that passed there "
            "(e.g. baseline=label:branch=main)"
        )
    if changed_only and model_mode == "live":
        raise BadRequest(
            "changed_only never reuses a live case (a live model's answer is not "
            "deterministic): submit it without model_mode=live"
        )
    # Read from the spooled file, never loaded whole (the upload may be 25 MiB).
    manifest = read_archive(upload.file)

    def create() -> tuple[GateRead, bool]:
        with session_scope(sessions) as session:
            gate, created = lifecycle.create_gate(
                session,
                settings,
                project_id=who.project_id,
                project_name=who.project_name,
                sha256=upload.sha256,
                bundle=upload.file,
                size_bytes=upload.size,
                manifest=manifest,
                name_filter=upload.fields.get("filter"),
                model_mode=model_mode,
                labels=labels,
                idempotency_key=idempotency_key,
                baseline=baseline,
                changed_only=changed_only,
            )
            if created:
                record_by(session, who, "gate.submitted", gate=str(gate.id), sha256=upload.sha256)
            public = settings.public_url
            view = views.read_gate(
                session, gate.id, who.project_id, public_url=public, cases_limit=views.CASES_PAGE
            )
            return view, created

    try:
        return create()
    except IntegrityError:
        if not idempotency_key:
            raise
        return create()


def _flag(raw: str | None, name: str) -> bool:
    if raw in (None, "", "false", "0"):
        return False
    if raw in ("true", "1"):
        return True
    raise BadRequest(f"{name} must be true or false, got {raw[:20]!r}")


def request_cancel(session: Session, gate_id: uuid.UUID, project_id: uuid.UUID) -> Gate:
    """Cancel the project's gate: a queued one at once, a running one before its next case
    (``lifecycle.request_cancel``; Conflict once it has ended, NotFound for another's)."""
    return lifecycle.request_cancel(session, gate_id, project_id)
