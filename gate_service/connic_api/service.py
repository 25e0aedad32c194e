"""Connic's test-run vocabulary mapped onto gates and runs; no state of its own.

A test run *is* a gate: its id is the gate's id, it is created by the same
`gates.submission.submit_bundle` as POST /v1/gates and read by the same
`gates.views.read_gate`/`read_run`, so caps, idempotency, the audit trail and project
scoping are the gates' own. This module only translates.
"""

from __future__ import annotations

import json
import math
from typing import Any

from pydantic import ValidationError

from ..auth.service import Principal
from ..errors import BadRequest, NotFound, PayloadTooLarge
from ..gates.schemas import GateRead, RunRead
from ..gates.submission import Upload
from ..models import GateStatus
from ..results import carried
from .body import TestRunBody as TestRunBody  # the routes make one per request
from .schemas import (
    DEFAULT_ENVIRONMENT_ID,
    ConnicCase,
    ConnicEnvironment,
    ConnicRun,
    ConnicSpan,
    ConnicStatus,
    ConnicTestRun,
    ConnicTestRunSubmit,
)

# Room for the JSON around files_data: the keys, environment_id and a test_filter of up to
# 16 KiB (each character of which JSON may escape as six).
JSON_ENVELOPE_BYTES = 128 * 1024
MAX_SHOWN_PROJECT_CHARS = 100


def body_limit_bytes(upload_limit_bytes: int) -> int:
    """The largest JSON body accepted: base64 of an upload at the limit, plus the envelope."""
    return 4 * math.ceil(upload_limit_bytes / 3) + JSON_ENVELOPE_BYTES


def check_project(who: Principal, pid: str) -> None:
    """`{pid}` must name the token's own project; anything else is 404.

    The same answer whether or not a project of that name exists, as for another project's
    gate, so a token learns nothing about other tenants.
    """
    if pid != who.project_name:
        raise NotFound(f"no project named {pid[:MAX_SHOWN_PROJECT_CHARS]!r}")


def environments() -> list[ConnicEnvironment]:
    """One standard default environment: the CLI takes its id when no --env is given."""
    return [
        ConnicEnvironment(
            id=DEFAULT_ENVIRONMENT_ID,
            name=DEFAULT_ENVIRONMENT_ID,
            env_type="standard",
            is_default=True,
            test_environment_id=None,
        )
    ]


def _problems(exc: ValidationError) -> list[dict[str, Any]]:
    # Location and message only: pydantic's `input` would echo up to 35 MB of base64 back.
    return [
        {"location": ".".join(["body", *(str(p) for p in e["loc"])]), "message": e["msg"]}
        for e in exc.errors(include_url=False)
    ]


def parse_submission(body: TestRunBody, *, upload_limit_bytes: int) -> Upload:
    """The streamed JSON body as an Upload, as if its archive had come in a multipart form.

    Everything wrong with the JSON itself is 400: the CLI prints a 400's detail as
    "Test request rejected: <detail>" and exits 1. An archive over the upload limit is 413,
    as on POST /v1/gates. The archive's own checks follow in `gates.submission.submit_bundle`.
    ``body`` is closed here unless its archive is handed on in the Upload.
    """
    try:
        return _parsed(body, upload_limit_bytes)
    except BaseException:
        body.close()
        raise


def _parsed(body: TestRunBody, upload_limit_bytes: int) -> Upload:
    if body.over_skeleton_limit:
        raise PayloadTooLarge(
            f"the JSON around files_data is larger than {body.skeleton_limit} bytes; send "
            "the project in files_data, with only environment_id and test_filter beside it",
            problems=[{"limit_bytes": body.skeleton_limit}],
        )
    try:
        # The skeleton holds files_data as a placeholder (see body.py): the JSON and every
        # field are judged by the model, as a whole body would be.
        parsed = ConnicTestRunSubmit.model_validate_json(body.skeleton)
    except ValidationError as exc:
        problems = _problems(exc)
        detail = "; ".join(f"{p['location']}: {p['message']}" for p in problems)
        raise BadRequest(
            'expected a JSON object {"files_data": <base64 .tar.gz>, "environment_id": ..., '
            f'"test_filter"?: ...}}; {detail}',
            problems=problems,
        ) from None
    if body.duplicate:
        raise BadRequest("files_data appears more than once in the JSON object; send it once")
    if parsed.environment_id not in (None, DEFAULT_ENVIRONMENT_ID):
        raise BadRequest(
            f"unknown environment {parsed.environment_id!r}; this service has one environment, "
            f"{DEFAULT_ENVIRONMENT_ID!r} (leave out --env)"
        )
    files = body.files
    assert files is not None  # the model requires files_data, and only a string passes
    # Judged by its length first, as before decoding: base64 is 4 characters per 3 bytes.
    if files.chars // 4 * 3 > upload_limit_bytes + 2:
        raise _too_large(upload_limit_bytes, files.chars // 4 * 3)
    # validate=True semantics: anything outside the alphabet (or bad padding) is an error,
    # not silently skipped, so a mangled upload is refused instead of judged.
    if files.error is not None:
        raise BadRequest(f"files_data is not valid base64 ({files.error})")
    if not files.size:
        raise BadRequest("files_data decodes to nothing; send the project as a .tar.gz")
    if files.size > upload_limit_bytes:
        raise _too_large(upload_limit_bytes, files.size)
    fields = {"filter": parsed.test_filter} if parsed.test_filter else {}
    return Upload(
        file=files.file,
        size=files.size,
        sha256=files.hash.hexdigest(),
        filename=None,
        fields=fields,
    )


def _too_large(limit: int, size: int) -> PayloadTooLarge:
    return PayloadTooLarge(
        f"the bundle in files_data is {size} bytes; the upload limit is {limit} bytes",
        problems=[{"limit_bytes": limit, "received_bytes": size}],
    )


def _status(gate_status: str) -> ConnicStatus:
    # The CLI keeps polling until a terminal status; queued is "not yet" just as running is.
    status = GateStatus(gate_status)
    if not status.terminal:
        return "running"
    terminal: dict[GateStatus, ConnicStatus] = {
        GateStatus.passed: "passed",
        GateStatus.failed: "failed",
        GateStatus.error: "error",
        GateStatus.cancelled: "cancelled",
    }
    return terminal[status]


def as_test_run(gate: GateRead) -> ConnicTestRun:
    status = _status(gate.status)
    return ConnicTestRun(
        id=gate.id,
        status=status,
        phase=gate.phase,
        total_cases=gate.total_cases,
        # The gate's id: the CLI links {CONNIC_BASE_URL}/projects/{pid}/deployments/<this>,
        # which the service answers with a redirect to the gate's results page.
        deployment_id=str(gate.id),
        # The CLI prints this as "Test run errored: <error>"; a gate ended `error` by the
        # worker always has one of the two.
        error=(gate.error or gate.failure_reason) if status == "error" else gate.error,
        cases=[
            # The CLI tests `passed` for truth; a case not judged (None) did not pass.
            ConnicCase(**carried(c, ConnicCase) | {"passed": c.passed is True})
            for c in gate.cases
        ],
    )


def _text(value: Any) -> str | None:
    # The CLI slices input/output as text (`_truncate`); ours are JSON values.
    if value is None or isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False)


def as_run(view: RunRead) -> ConnicRun:
    """The run under Connic's names: every field both shapes hold carried as it is (a field
    added to the contract travels without a line here), input, output and spans as text."""
    spans = [
        ConnicSpan(
            **carried(s, ConnicSpan)
            # Connic ships metadata as JSON text; the CLI json.loads it for the tool name and
            # the inline error of a failed span.
            | {"metadata_json": json.dumps(s.metadata, ensure_ascii=False)}
        )
        for s in view.traces
    ]
    return ConnicRun(
        **carried(view, ConnicRun)
        | {"input": _text(view.input), "output": _text(view.output), "traces": spans}
    )
