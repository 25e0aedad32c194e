"""finish_gate fails closed (issue 18, item 2), on a real Postgres.

A gate passes only when it has at least one case and every case passed; a case in any other
state ends it `error`, naming that case. Each state is injected into the case rows directly,
as a bug elsewhere (or a future status) would leave them.
"""

from __future__ import annotations

import uuid

import pytest
from sqlalchemy.orm import Session, sessionmaker

from gate_service.db import session_scope
from gate_service.gates import lifecycle
from gate_service.models import Bundle, Case, Gate, GateStatus, Project


def gate_with(sessions: sessionmaker[Session], statuses: list[str]) -> uuid.UUID:
    sha = uuid.uuid4().hex * 2
    with session_scope(sessions) as s:
        project = Project(name=f"p{uuid.uuid4().hex[:8]}")
        s.add(project)
        s.add(
            Bundle(
                sha256=sha,
                archive_format="tar.gz",
                size_bytes=1,
                code_bytes=1,
                fixture_bytes=0,
            )
        )
        s.flush()
        gate = Gate(
            project_id=project.id,
            bundle_sha256=sha,
            status=GateStatus.running,
            phase="running_tests",
            labels={},
            problems=[],
        )
        s.add(gate)
        s.flush()
        for position, status in enumerate(statuses):
            s.add(
                Case(
                    gate_id=gate.id,
                    position=position,
                    suite="tests/s.yaml",
                    agent_name="a",
                    test_name=f"case_{position}",
                    status=status,
                    passed=status == "passed",
                    successes=1 if status == "passed" else 0,
                    runs=1,
                    success_threshold=100,
                    timeout_s=60,
                    failure_reason=None if status == "passed" else f"reason of case_{position}",
                )
            )
        return gate.id


def finish(sessions: sessionmaker[Session], gate_id: uuid.UUID) -> Gate:
    with session_scope(sessions) as s:
        gate = lifecycle.get_gate(s, gate_id, for_update=True)
        lifecycle.finish_gate(s, gate)
        return gate


def test_every_case_passed_passes(sessions: sessionmaker[Session]) -> None:
    gate = finish(sessions, gate_with(sessions, ["passed", "passed"]))
    assert (gate.status, gate.failure_reason) == (GateStatus.passed, None)


def test_a_gate_with_no_case_is_an_error_not_a_pass(sessions: sessionmaker[Session]) -> None:
    gate = finish(sessions, gate_with(sessions, []))
    assert gate.status == GateStatus.error
    assert gate.failure_reason == "the gate has no cases, so nothing was judged"


def test_a_failed_case_fails_the_gate_naming_it(sessions: sessionmaker[Session]) -> None:
    gate = finish(sessions, gate_with(sessions, ["passed", "failed"]))
    assert gate.status == GateStatus.failed
    assert gate.failure_reason == "1 of 2 case(s) failed; a::case_1: reason of case_1"


@pytest.mark.parametrize("status", ["queued", "running", "cancelled", "judged-somehow"])
def test_a_case_that_was_never_judged_ends_the_gate_error_naming_it(
    sessions: sessionmaker[Session], status: str
) -> None:
    gate = finish(sessions, gate_with(sessions, ["passed", "failed", status]))
    assert gate.status == GateStatus.error
    assert gate.failure_reason == (
        "1 of 3 case(s) could not be judged; tests/s.yaml::case_2: it was never judged "
        f"(its status is {status!r})"
    )


def test_an_errored_case_is_named_before_an_unjudged_one(sessions: sessionmaker[Session]) -> None:
    gate = finish(sessions, gate_with(sessions, ["queued", "error", "passed"]))
    assert gate.status == GateStatus.error
    assert gate.failure_reason == (
        "2 of 3 case(s) could not be judged; tests/s.yaml::case_1: reason of case_1"
    )
