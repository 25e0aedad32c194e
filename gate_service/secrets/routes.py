"""Admin routes for a project's secrets: put, list (names only) and delete."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Request, Response

from ..app_state import state_of
from ..auth import service as auth
from ..auth.deps import Admin
from ..deps import SessionDep
from ..errors import error_responses
from . import service
from .crypto import SecretBox
from .schemas import SecretList, SecretPut, SecretRead, SecretStored

router = APIRouter(prefix="/v1/projects/{project}/secrets", tags=["secrets"])
ERRORS = error_responses(
    {
        400: "Not an environment-variable name, or a GATE_ one",
        401: "No token, or an unknown, expired or revoked one",
        403: "The token lacks the admin scope",
        404: "Not found (or another project's)",
        409: "The project's secrets would be too many or too large together",
        422: 'The body is not {"value": text} (UTF-8, no NUL, at most 64 KiB), or a '
        "*_API_BASE secret's value is not an endpoint the gateway calls",
        429: "Too many failed authentications",
    }
)


def get_secret_box(request: Request) -> SecretBox:
    return state_of(request).part(SecretBox)


SecretBoxDep = Annotated[SecretBox, Depends(get_secret_box)]


@router.put(
    "/{name}",
    status_code=201,
    response_model=SecretStored,
    responses={200: {"model": SecretStored, "description": "Replaced"}, **ERRORS},
)
def put_secret(
    project: str,
    name: str,
    body: SecretPut,
    session: SessionDep,
    who: Admin,
    box: SecretBoxDep,
    response: Response,
) -> SecretStored:
    """Store a secret (201), or replace one (200). Its value reaches every case container of
    the project as the environment variable NAME, and is redacted from everything stored."""
    target = auth.visible_project(session, who, project)
    row, created = service.put_secret(session, box, target, name, body.value)
    if not created:
        response.status_code = 200
    auth.record(
        session,
        "secret.put",
        project_id=target.id,
        token_id=who.token_id,
        detail={"project": target.name, "name": name, "created": created},
    )
    return SecretStored(
        name=row.name, updated_at=row.updated_at, project=target.name, created=created
    )


@router.get("", response_model=SecretList, responses=ERRORS)
def list_secrets(project: str, session: SessionDep, who: Admin) -> SecretList:
    """The project's secret names and when each was last put; never a value."""
    target = auth.visible_project(session, who, project)
    return SecretList(
        project=target.name,
        items=[SecretRead.model_validate(s) for s in service.list_secrets(session, target)],
    )


@router.delete("/{name}", status_code=204, responses=ERRORS)
def delete_secret(project: str, name: str, session: SessionDep, who: Admin) -> Response:
    """Remove a secret; cases that start from now on no longer receive it."""
    target = auth.visible_project(session, who, project)
    service.delete_secret(session, target, name)
    auth.record(
        session,
        "secret.deleted",
        project_id=target.id,
        token_id=who.token_id,
        detail={"project": target.name, "name": name},
    )
    return Response(status_code=204)
