"""Project secrets in the database. Functions take the session and never commit."""

from __future__ import annotations

import re
import uuid

from sqlalchemy import func, select
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.orm import Session

from ..errors import BadRequest, Conflict, NotFound
from ..models import Project, ProjectSecret, utcnow
from .crypto import SecretBox

# What a case container receives is an environment variable of the same name.
SECRET_NAME = re.compile(r"[A-Z_][A-Z0-9_]{0,127}")
RESERVED_PREFIX = "GATE_"
# Every secret of a project enters every case container's environment, which Linux caps
# (about 2 MiB with argv); this keeps a project's secrets well inside it.
MAX_PROJECT_CIPHERTEXT_BYTES = 1024 * 1024


def check_name(name: str) -> None:
    if not SECRET_NAME.fullmatch(name):
        raise BadRequest(
            f"secret name {name!r} must be an environment-variable name: 1 to 128 characters "
            "of A-Z, 0-9 and '_', not starting with a digit"
        )
    if name.startswith(RESERVED_PREFIX):
        raise BadRequest(
            f"secret name {name!r} starts with {RESERVED_PREFIX}, which is the gate's own "
            "prefix; such variables never reach a case container"
        )


def put_secret(
    session: Session, box: SecretBox, project: Project, name: str, value: str
) -> tuple[ProjectSecret, bool]:
    """Store or replace ``name``; (the row, whether it was new)."""
    check_name(name)
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
    check_name(name)
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
