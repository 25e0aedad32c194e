"""Admin routes: projects, their tokens, and the audit trail."""

from __future__ import annotations

import re
import uuid
from datetime import UTC, datetime
from typing import Annotated, Any

from fastapi import APIRouter, Query
from sqlalchemy import select

from ..api_specs import PREFIX, convert
from ..deps import SessionDep
from ..endpoints import endpoint_problem
from ..errors import Forbidden, RequestInvalid, error_responses
from ..models import AuditEvent
from . import deletion, service
from .deps import Admin
from .schemas import (
    ApiSpecList,
    ApiSpecPut,
    ApiSpecRead,
    AuditList,
    AuditRead,
    Egress,
    EgressPut,
    GuardrailModel,
    GuardrailModelPut,
    ModelRoutes,
    ModelRouteSpec,
    ModelRoutesPut,
    ProjectCreate,
    ProjectDeleted,
    ProjectRead,
    ProjectUpdate,
    TokenCreate,
    TokenCreated,
    TokenList,
    TokenRead,
)

router = APIRouter(prefix="/v1", tags=["admin"])
AUDIT_ACTION = re.compile(r"[a-z][a-z0-9_]*(\.[a-z0-9_]+)*", re.ASCII)
ERRORS = error_responses(
    {
        400: "Bad request (or a Host not in GATE_TRUSTED_HOSTS)",
        401: "No token, or an unknown, expired or revoked one",
        403: "The token lacks the admin scope",
        404: "Not found (or another project's)",
        409: "Conflict",
        422: "Invalid request",
        429: "Too many failed authentications",
    }
)


@router.post("/projects", status_code=201, response_model=ProjectRead, responses=ERRORS)
def create_project(body: ProjectCreate, session: SessionDep, who: Admin) -> ProjectRead:
    """Create a project (admin tokens of the `default` project only)."""
    if not who.service_admin:
        raise Forbidden("only admin tokens of the 'default' project create projects")
    project = service.create_project(session, body.name, body.retention_days)
    service.record_by(session, who, "project.created", project=project.name)
    return ProjectRead.model_validate(project)


@router.delete(
    "/projects/{name}",
    response_model=ProjectDeleted,
    responses={
        **ERRORS,
        **error_responses({503: "Its rows were in use (deadlocks); nothing was deleted"}),
    },
)
def delete_project(name: str, session: SessionDep, who: Admin) -> ProjectDeleted:
    """Delete a project and everything of it, in one transaction: its gates (a queued or
    running one is stopped: its worker writes nothing more and removes its containers),
    cases, runs, model calls, jobs, tokens (401 from now on), results-page sessions,
    secrets, settings, model spending, audit events, and the bundles no other project's
    gate references. Audited as `project.deleted` under `default`, with what went. Admin
    tokens of `default` only; `default` itself cannot be deleted (409)."""
    if not who.service_admin:
        raise Forbidden("only admin tokens of the 'default' project delete projects")
    deleted = deletion.delete_project(session, who, name)
    return ProjectDeleted.model_validate(deleted)


@router.patch("/projects/{name}", response_model=ProjectRead, responses=ERRORS)
def update_project(name: str, body: ProjectUpdate, session: SessionDep, who: Admin) -> ProjectRead:
    """Change a project's retention (admins of the project, or of `default`)."""
    project = service.visible_project(session, who, name)
    before = project.retention_days
    project.retention_days = body.retention_days
    session.flush()
    service.record(
        session,
        "project.updated",
        project_id=project.id,
        token_id=who.token_id,
        detail={"project": project.name, "retention_days": [before, body.retention_days]},
    )
    return ProjectRead.model_validate(project)


@router.get("/projects/{name}/model-routes", response_model=ModelRoutes, responses=ERRORS)
def get_model_routes(name: str, session: SessionDep, who: Admin) -> ModelRoutes:
    """The project's model routes, in the order the gateway tries them."""
    project = service.visible_project(session, who, name)
    return _routes_of(project.name, project.model_routes)


@router.put("/projects/{name}/model-routes", response_model=ModelRoutes, responses=ERRORS)
def put_model_routes(
    name: str, body: ModelRoutesPut, session: SessionDep, who: Admin
) -> ModelRoutes:
    """Replace the project's model routes. Cases that start from now on use them: a model
    name matching a route's pattern goes to its OpenAI-compatible endpoint, with the key in
    its key secret."""
    project = service.visible_project(session, who, name)
    routes = [route.model_dump() for route in body.routes]
    project.model_routes = routes
    session.flush()
    service.record(
        session,
        "project.model_routes_set",
        project_id=project.id,
        token_id=who.token_id,
        detail={"project": project.name, "routes": routes},
    )
    return _routes_of(project.name, routes)


@router.get("/projects/{name}/egress", response_model=Egress, responses=ERRORS)
def get_egress(name: str, session: SessionDep, who: Admin) -> Egress:
    """The hosts the project's cases may fetch pages from through the model gateway."""
    project = service.visible_project(session, who, name)
    return Egress(project=project.name, hosts=list(project.egress_hosts))


@router.put("/projects/{name}/egress", response_model=Egress, responses=ERRORS)
def put_egress(name: str, body: EgressPut, session: SessionDep, who: Admin) -> Egress:
    """Replace the project's egress allowlist. Cases that start from now on may fetch pages
    (web_read_page) from these hosts through the gateway, and from no other."""
    project = service.visible_project(session, who, name)
    project.egress_hosts = list(body.hosts)
    session.flush()
    service.record(
        session,
        "project.egress_set",
        project_id=project.id,
        token_id=who.token_id,
        detail={"project": project.name, "hosts": list(body.hosts)},
    )
    return Egress(project=project.name, hosts=list(body.hosts))


@router.get("/projects/{name}/guardrail-model", response_model=GuardrailModel, responses=ERRORS)
def get_guardrail_model(name: str, session: SessionDep, who: Admin) -> GuardrailModel:
    """The model that judges the project's judged guardrails; null: none."""
    project = service.visible_project(session, who, name)
    return GuardrailModel(project=project.name, model=project.guardrail_model)


@router.put("/projects/{name}/guardrail-model", response_model=GuardrailModel, responses=ERRORS)
def put_guardrail_model(
    name: str, body: GuardrailModelPut, session: SessionDep, who: Admin
) -> GuardrailModel:
    """Name the project's judge model. Gates that start from now on judge their agents'
    prompt_injection, topic_restriction, system_prompt_leakage, data_exfiltration and
    relevance guardrails with it, through the model gateway (live and record mode; replay
    reads the recorded verdicts). In live and record mode it must resolve to a provider key
    among the project's secrets or to a model route, checked before any case runs."""
    project = service.visible_project(session, who, name)
    before = project.guardrail_model
    project.guardrail_model = body.model
    session.flush()
    service.record(
        session,
        "project.guardrail_model_set",
        project_id=project.id,
        token_id=who.token_id,
        detail={"project": project.name, "guardrail_model": [before, body.model]},
    )
    return GuardrailModel(project=project.name, model=body.model)


@router.delete("/projects/{name}/guardrail-model", response_model=GuardrailModel, responses=ERRORS)
def delete_guardrail_model(name: str, session: SessionDep, who: Admin) -> GuardrailModel:
    """Remove the project's judge model: its judged guardrails are skipped again (never
    block), and each gate whose cases they could change warns so."""
    project = service.visible_project(session, who, name)
    before = project.guardrail_model
    if before is not None:
        project.guardrail_model = None
        session.flush()
        service.record(
            session,
            "project.guardrail_model_deleted",
            project_id=project.id,
            token_id=who.token_id,
            detail={"project": project.name, "guardrail_model": [before, None]},
        )
    return GuardrailModel(project=project.name, model=None)


def _spec_read(project: str, prefix: str, stored: dict[str, Any]) -> ApiSpecRead:
    return ApiSpecRead(
        project=project,
        prefix=prefix,
        base_url=stored["base_url"],
        headers=sorted(stored.get("headers", {})),
        tools=sorted(stored.get("tools", {})),
    )


@router.get("/projects/{name}/api-specs", response_model=ApiSpecList, responses=ERRORS)
def get_api_specs(name: str, session: SessionDep, who: Admin) -> ApiSpecList:
    """The project's OpenAPI specs, by prefix: the api: tools its agents may list."""
    project = service.visible_project(session, who, name)
    specs = dict(project.api_specs or {})
    return ApiSpecList(
        project=project.name,
        specs=[_spec_read(project.name, prefix, specs[prefix]) for prefix in sorted(specs)],
    )


@router.put("/projects/{name}/api-specs/{prefix}", response_model=ApiSpecRead, responses=ERRORS)
def put_api_spec(
    name: str, prefix: str, body: ApiSpecPut, session: SessionDep, who: Admin
) -> ApiSpecRead:
    """Store an OpenAPI 3.x spec under ``prefix``: its operations are the tools
    ``api:<prefix>.<tool>``, called by the model gateway at hosts on the project's egress
    allowlist. Replaces what the prefix held."""
    project = service.visible_project(session, who, name)
    if not PREFIX.fullmatch(prefix):
        raise RequestInvalid(
            f"the prefix {prefix!r} must be 1 to 64 characters of a-z, 0-9 and '_', "
            "starting with a letter"
        )
    spec = convert(body.spec, base_url=body.base_url, headers=body.headers)
    problem = endpoint_problem(spec.base_url)
    if problem is not None:
        raise RequestInvalid(f"base_url: {problem}")
    project.api_specs = {**(project.api_specs or {}), prefix: spec.stored()}
    session.flush()
    service.record(
        session,
        "project.api_spec_set",
        project_id=project.id,
        token_id=who.token_id,
        detail={"project": project.name, "prefix": prefix, "tools": sorted(spec.tools)},
    )
    return _spec_read(project.name, prefix, spec.stored())


@router.delete("/projects/{name}/api-specs/{prefix}", status_code=204, responses=ERRORS)
def delete_api_spec(name: str, prefix: str, session: SessionDep, who: Admin) -> None:
    """Remove the spec under ``prefix``: its tools are no longer the project's."""
    project = service.visible_project(session, who, name)
    specs = dict(project.api_specs or {})
    if specs.pop(prefix, None) is not None:
        project.api_specs = specs
        session.flush()
        service.record(
            session,
            "project.api_spec_deleted",
            project_id=project.id,
            token_id=who.token_id,
            detail={"project": project.name, "prefix": prefix},
        )


def _routes_of(project: str, stored: list[dict[str, Any]]) -> ModelRoutes:
    return ModelRoutes(project=project, routes=[ModelRouteSpec.model_validate(r) for r in stored])


@router.post(
    "/projects/{name}/tokens", status_code=201, response_model=TokenCreated, responses=ERRORS
)
def create_token(name: str, body: TokenCreate, session: SessionDep, who: Admin) -> TokenCreated:
    """Issue a token of the project; its value is in this answer and nowhere else."""
    project = service.visible_project(session, who, name)
    row, token = service.issue_token(
        session, project, body.scopes, expires_in_days=body.expires_in_days, name=body.name
    )
    service.record(
        session,
        "token.created",
        project_id=project.id,
        token_id=who.token_id,
        detail={"token": str(row.id), "scopes": row.scopes},
    )
    return TokenCreated(
        **TokenRead.model_validate(row).model_dump(), project=project.name, token=token
    )


@router.get("/projects/{name}/tokens", response_model=TokenList, responses=ERRORS)
def list_tokens(name: str, session: SessionDep, who: Admin) -> TokenList:
    """The project's tokens, without their values."""
    project = service.visible_project(session, who, name)
    return TokenList(
        items=[TokenRead.model_validate(t) for t in service.project_tokens(session, project)]
    )


@router.delete("/tokens/{token_id}", response_model=TokenRead, responses=ERRORS)
def revoke_token(token_id: uuid.UUID, session: SessionDep, who: Admin) -> TokenRead:
    """Revoke a token at once; it answers 401 from now on."""
    token = service.revoke_token(session, who, token_id)
    service.record(
        session,
        "token.revoked",
        project_id=token.project_id,
        token_id=who.token_id,
        detail={"token": str(token.id)},
    )
    return TokenRead.model_validate(token)


@router.get("/audit", response_model=AuditList, responses=ERRORS)
def audit(
    session: SessionDep,
    who: Admin,
    action: Annotated[
        list[str] | None,
        Query(max_length=20, description="Only these actions, e.g. token.rejected (repeatable)"),
    ] = None,
    since: Annotated[
        datetime | None,
        Query(description="Only events at or after this ISO 8601 time (UTC if no offset)"),
    ] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 100,
    offset: Annotated[int, Query(ge=0, le=1_000_000)] = 0,
) -> AuditList:
    """Recorded events, newest first: the project's own, or every project's for `default`."""
    stmt = select(AuditEvent)
    if not who.service_admin:
        stmt = stmt.where(AuditEvent.project_id == who.project_id)
    if action:
        bad = [a for a in action if len(a) > 64 or not AUDIT_ACTION.fullmatch(a)]
        if bad:
            raise RequestInvalid(
                f"action must be an audit action such as token.rejected, got {bad[0]!r}",
                problems=[{"location": "query.action", "message": "not an audit action"}],
            )
        stmt = stmt.where(AuditEvent.action.in_(action))
    if since is not None:
        stmt = stmt.where(AuditEvent.at >= (since if since.tzinfo else since.replace(tzinfo=UTC)))
    rows = session.scalars(stmt.order_by(AuditEvent.id.desc()).limit(limit).offset(offset)).all()
    return AuditList(items=[AuditRead.model_validate(r) for r in rows], limit=limit, offset=offset)
