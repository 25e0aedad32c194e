"""Project secrets in the database. Functions take the session and never commit."""

from __future__ import annotations

import hashlib
import uuid

from sqlalchemy import func, select
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.orm import Session

from gate_runner.case_env import ENV_NAME, RESERVED_PREFIX, refusal

from ..admission import lock_project
from ..endpoints import endpoint_problem
from ..errors import BadRequest, Conflict, NotFound, RequestInvalid
from ..models import Project, ProjectSecret, utcnow
from .crypto import SecretBox

# Every secret of a project is handed to every case (gate_runner/case_env.py reads at most
# 4 MiB) and becomes part of each invocation's environment, which Linux caps for the
# programs it starts (about 2 MiB with argv); this keeps a project's secrets well inside it.
MAX_PROJECT_CIPHERTEXT_BYTES = 1024 * 1024
# Names per project: every one is matched in everything stored for each of its cases.
MAX_SECRETS_PER_PROJECT = 100


def check_name(name: str, *, storing: bool = True) -> None:
    """400 for a name no case environment may hold (gate_runner.case_env.refusal).

    Deleting (``storing`` False) checks only the shape and the gate's own prefix: a row
    stored under a name refused since (LD_PRELOAD, say) must still be removable.
    """
    why = refusal(name)
    if why is None:
        return
    if not storing and ENV_NAME.fullmatch(name) and not name.startswith(RESERVED_PREFIX):
        return
    raise BadRequest(f"secret name {name!r} is refused: {why}")


def check_endpoint(name: str, value: str) -> None:
    """A ``*_API_BASE`` secret names the endpoint the gateway sends a provider's calls to:
    refused when set (422) unless it is an http(s) URL the gateway would call (no link-local,
    unspecified, multicast or metadata address in any spelling), as a route's is. It is
    checked again at each call, from what its host resolves to. The message never holds the
    value: it is a secret."""
    if not name.endswith("_API_BASE"):
        return
    if endpoint_problem(value) is not None:
        raise RequestInvalid(
            f"the secret {name} names a model provider's endpoint, and its value is not one "
            "the gateway calls: an http:// or https:// URL with a host and no credentials, "
            "query or fragment, not at a link-local, unspecified, multicast or cloud-metadata "
            "address in any spelling (169.254.169.254, 2852039166, 0xa9fea9fe, ...)"
        )


def put_secret(
    session: Session, box: SecretBox, project: Project, name: str, value: str
) -> tuple[ProjectSecret, bool]:
    """Store or replace ``name``; (the row, whether it was new)."""
    check_name(name)
    check_endpoint(name, value)
    # The caps below count the project's other rows: two PUTs at once count in turn.
    lock_project(session, project.id)
    ciphertext = box.encrypt(project.id, name, value)
    others = session.scalar(
        select(func.coalesce(func.sum(func.length(ProjectSecret.ciphertext)), 0))
        .where(ProjectSecret.project_id == project.id)
        .where(ProjectSecret.name != name)
    )
    if int(others or 0) + len(ciphertext) > MAX_PROJECT_CIPHERTEXT_BYTES:
        raise Conflict(
            f"project {project.name}'s secrets would take {int(others or 0) + len(ciphertext)} "
            f"bytes encrypted; together they may take {MAX_PROJECT_CIPHERTEXT_BYTES} (each "
            "enters every case container's environment)"
        )
    existed = session.scalar(
        select(ProjectSecret.id)
        .where(ProjectSecret.project_id == project.id)
        .where(ProjectSecret.name == name)
    )
    if existed is None:
        count = session.scalar(select(func.count()).where(ProjectSecret.project_id == project.id))
        if int(count or 0) >= MAX_SECRETS_PER_PROJECT:
            raise Conflict(
                f"project {project.name} already has {count} secrets; the limit is "
                f"{MAX_SECRETS_PER_PROJECT} per project (each is redacted from everything "
                "stored for its cases): delete one first"
            )
    now = utcnow()
    # An upsert: two PUTs of a new name at once both succeed (the later one wins).
    session.execute(
        insert(ProjectSecret)
        .values(
            id=uuid.uuid4(), project_id=project.id, name=name, ciphertext=ciphertext, updated_at=now
        )
        .on_conflict_do_update(
            index_elements=[ProjectSecret.project_id, ProjectSecret.name],
            set_={"ciphertext": ciphertext, "updated_at": now},
        )
    )
    row = session.scalars(
        select(ProjectSecret)
        .where(ProjectSecret.project_id == project.id)
        .where(ProjectSecret.name == name)
        .execution_options(populate_existing=True)
    ).one()
    return row, existed is None


def list_secrets(session: Session, project: Project) -> list[ProjectSecret]:
    return list(
        session.scalars(
            select(ProjectSecret)
            .where(ProjectSecret.project_id == project.id)
            .order_by(ProjectSecret.name)
        )
    )


def delete_secret(session: Session, project: Project, name: str) -> None:
    check_name(name, storing=False)
    row = session.scalar(
        select(ProjectSecret)
        .where(ProjectSecret.project_id == project.id)
        .where(ProjectSecret.name == name)
    )
    if row is None:
        raise NotFound(f"project {project.name} has no secret named {name}")
    session.delete(row)


def project_secrets(session: Session, box: SecretBox, project_id: uuid.UUID) -> dict[str, str]:
    """Every secret of the project, decrypted (name -> value): what its case containers get.

    SecretUnreadable when one does not decrypt with this process's key.
    """
    rows = session.execute(
        select(ProjectSecret.name, ProjectSecret.ciphertext, Project.name)
        .join(Project, Project.id == ProjectSecret.project_id)
        .where(ProjectSecret.project_id == project_id)
        .order_by(ProjectSecret.name)
    ).all()
    return {
        name: box.decrypt(project_id, project_name, name, ciphertext)
        for name, ciphertext, project_name in rows
    }


def secret_fingerprints(session: Session, project_id: uuid.UUID) -> list[tuple[str, str]]:
    """Each of the project's secrets as (name, sha256 of its stored ciphertext), nothing
    decrypted: what a case's closure hash counts of them (baselines/closure.py). A secret set
    again changes its fingerprint even when its value did not (a fresh nonce each time)."""
    return [
        (name, hashlib.sha256(ciphertext).hexdigest())
        for name, ciphertext in session.execute(
            select(ProjectSecret.name, ProjectSecret.ciphertext)
            .where(ProjectSecret.project_id == project_id)
            .order_by(ProjectSecret.name)
        )
    ]
