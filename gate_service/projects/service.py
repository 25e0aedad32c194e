"""Projects and their settings: the one owner of every write to the projects table (creation,
retention, model routes, egress hosts, the guardrail model, the verdict rule, API specs) with
its audit event, and of what the worker reads of them. Functions take the session and never commit.

Who may touch which project is auth's rule (``visible_project``); each write here asks it
first, so a project the caller does not administer answers 404 before anything is checked.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from ..api_specs import PREFIX, ApiSpec, convert
from ..auth.service import (
    PROJECT_NAME,
    Principal,
    issue_token,
    record_by,
    record_in,
    visible_project,
)
from ..auth.tokens import Scope, token_digest
from ..endpoints import endpoint_problem
from ..errors import BadRequest, Conflict, Forbidden, RequestInvalid
from ..gateway import ModelRoute, route_of
from ..models import DEFAULT_PROJECT, ApiToken, Project, utcnow
from .schemas import ModelRouteSpec


def create_project(session: Session, who: Principal, name: str, retention_days: int) -> Project:
    """A new project, audited as ``project.created`` (admin tokens of `default` only)."""
    if not who.service_admin:
        raise Forbidden("only admin tokens of the 'default' project create projects")
    project = _new_project(session, name, retention_days)
    record_by(session, who, "project.created", project=project.name)
    return project


def _new_project(session: Session, name: str, retention_days: int = 30) -> Project:
    if not PROJECT_NAME.fullmatch(name):
        raise BadRequest(
            f"project name {name!r} must be 1 to 64 characters of a-z, 0-9, '.', '_' and '-', "
            "starting with a letter or digit"
        )
    if session.scalar(select(Project.id).where(Project.name == name)) is not None:
        raise Conflict(f"a project named {name!r} exists already")
    project = Project(name=name, retention_days=retention_days, created_at=utcnow())
    session.add(project)
    session.flush()
    return project


def ensure_bootstrap(session: Session, token: str | None) -> str | None:
    """The `default` project, with an admin token.

    With ``token`` (GATE_BOOTSTRAP_TOKEN) that token is made sure of (a revoked one stays
    revoked). Without it, a new admin token is made only while no token exists at all, and
    returned so that the caller can hand it over once; otherwise None.
    """
    project = session.scalar(select(Project).where(Project.name == DEFAULT_PROJECT))
    if project is None:
        project = _new_project(session, DEFAULT_PROJECT)
    if token is not None:
        known = session.scalar(
            select(ApiToken.id).where(ApiToken.token_sha256 == token_digest(token))
        )
        if known is None:
            issue_token(session, project, [Scope.admin], name="bootstrap", token=token)
        return None
    if session.scalar(select(func.count()).select_from(ApiToken)):
        return None
    _row, created = issue_token(session, project, [Scope.admin], name="first start")
    return created


def set_retention(session: Session, who: Principal, name: str, retention_days: int) -> Project:
    """Change how long the project's finished gates, runs and audit events are kept."""
    project = visible_project(session, who, name)
    before = project.retention_days
    project.retention_days = retention_days
    record_in(session, who, project, "project.updated", retention_days=[before, retention_days])
    return project


def set_model_routes(
    session: Session, who: Principal, name: str, routes: Sequence[ModelRouteSpec]
) -> Project:
    """Replace the project's model routes (stored in order, as ``route_of`` reads them)."""
    project = visible_project(session, who, name)
    stored = [route.model_dump() for route in routes]
    project.model_routes = stored
    record_in(session, who, project, "project.model_routes_set", routes=stored)
    return project


def set_egress(session: Session, who: Principal, name: str, hosts: Sequence[str]) -> Project:
    """Replace the project's egress allowlist."""
    project = visible_project(session, who, name)
    project.egress_hosts = list(hosts)
    record_in(session, who, project, "project.egress_set", hosts=list(hosts))
    return project


def set_guardrail_model(session: Session, who: Principal, name: str, model: str) -> Project:
    """Name the project's judge model; audited even when it was that model already."""
    project = visible_project(session, who, name)
    before = project.guardrail_model
    project.guardrail_model = model
    record_in(session, who, project, "project.guardrail_model_set", guardrail_model=[before, model])
    return project


def clear_guardrail_model(session: Session, who: Principal, name: str) -> Project:
    """Remove the project's judge model; audited only when there was one."""
    project = visible_project(session, who, name)
    before = project.guardrail_model
    if before is not None:
        project.guardrail_model = None
        record_in(
            session,
            who,
            project,
            "project.guardrail_model_deleted",
            guardrail_model=[before, None],
        )
    return project


def set_verdict_rule(session: Session, who: Principal, name: str, rule: str) -> Project:
    """Set how the project's cases with runs > 1 are judged (threshold or wilson); audited
    even when it was that rule already."""
    project = visible_project(session, who, name)
    before = project.verdict_rule
    project.verdict_rule = rule
    record_in(session, who, project, "project.verdict_rule_set", verdict_rule=[before, rule])
    return project


def put_api_spec(
    session: Session,
    who: Principal,
    name: str,
    prefix: str,
    spec: Mapping[str, Any],
    *,
    base_url: str | None,
    headers: Mapping[str, str],
) -> tuple[Project, ApiSpec]:
    """Store an OpenAPI document's tools under ``prefix``, replacing what it held.

    RequestInvalid for a prefix that is no prefix, a document that does not convert, or a
    base URL the gateway would not call (checked here, not only when a case calls it).
    """
    project = visible_project(session, who, name)
    if not PREFIX.fullmatch(prefix):
        raise RequestInvalid(
            f"the prefix {prefix!r} must be 1 to 64 characters of a-z, 0-9 and '_', "
            "starting with a letter"
        )
    converted = convert(spec, base_url=base_url, headers=headers)
    problem = endpoint_problem(converted.base_url)
    if problem is not None:
        raise RequestInvalid(f"base_url: {problem}")
    project.api_specs = {**(project.api_specs or {}), prefix: converted.stored()}
    record_in(
        session,
        who,
        project,
        "project.api_spec_set",
        prefix=prefix,
        tools=sorted(converted.tools),
    )
    return project, converted


def delete_api_spec(session: Session, who: Principal, name: str, prefix: str) -> None:
    """Remove the spec under ``prefix``; audited only when there was one."""
    project = visible_project(session, who, name)
    specs = dict(project.api_specs or {})
    if specs.pop(prefix, None) is not None:
        project.api_specs = specs
        record_in(session, who, project, "project.api_spec_deleted", prefix=prefix)


@dataclass(frozen=True, slots=True)
class ProjectSettings:
    """What a gate's worker reads of its project's settings, at one moment."""

    name: str
    routes: tuple[ModelRoute, ...]  # in the order the gateway tries them
    egress: tuple[str, ...]  # the hosts a case's web_read_page may reach
    api_specs: dict[str, Any]  # prefix -> {base_url, headers, tools} (api_specs.ApiSpec)
    guardrail_model: str | None  # None: judged guardrails are skipped
    # How a case with runs > 1 is judged: "threshold" (the platform's) or "wilson".
    verdict_rule: str = "threshold"


def settings_of(session: Session, project_id: uuid.UUID) -> ProjectSettings:
    """The project's settings as stored now, read in the caller's transaction."""
    project = session.get_one(Project, project_id)
    return ProjectSettings(
        name=project.name,
        routes=tuple(route_of(stored) for stored in project.model_routes),
        egress=tuple(str(host) for host in project.egress_hosts),
        api_specs=dict(project.api_specs or {}),
        guardrail_model=project.guardrail_model,
        verdict_rule=project.verdict_rule or "threshold",
    )
