"""Admin routes: projects and their settings (model routes, egress hosts, the guardrail model,
the verdict rule, API specs)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from ..auth.deps import ADMIN_ERRORS as ERRORS
from ..auth.deps import Admin
from ..auth.service import visible_project
from ..deps import SessionDep
from ..errors import error_responses
from . import deletion, service
from .schemas import (
    ApiSpecList,
    ApiSpecPut,
    ApiSpecRead,
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
    VerdictRule,
    VerdictRuleName,
    VerdictRulePut,
)

router = APIRouter(prefix="/v1", tags=["admin"])


@router.post("/projects", status_code=201, response_model=ProjectRead, responses=ERRORS)
def create_project(body: ProjectCreate, session: SessionDep, who: Admin) -> ProjectRead:
    """Create a project (admin tokens of the `default` project only)."""
    project = service.create_project(session, who, body.name, body.retention_days)
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
    deleted = deletion.delete_project(session, who, name)
    return ProjectDeleted.model_validate(deleted)


@router.patch("/projects/{name}", response_model=ProjectRead, responses=ERRORS)
def update_project(name: str, body: ProjectUpdate, session: SessionDep, who: Admin) -> ProjectRead:
    """Change a project's retention (admins of the project, or of `default`)."""
    project = service.set_retention(session, who, name, body.retention_days)
    return ProjectRead.model_validate(project)


@router.get("/projects/{name}/model-routes", response_model=ModelRoutes, responses=ERRORS)
def get_model_routes(name: str, session: SessionDep, who: Admin) -> ModelRoutes:
    """The project's model routes, in the order the gateway tries them."""
    project = visible_project(session, who, name)
    return _routes_of(project.name, project.model_routes)


@router.put("/projects/{name}/model-routes", response_model=ModelRoutes, responses=ERRORS)
def put_model_routes(
    name: str, body: ModelRoutesPut, session: SessionDep, who: Admin
) -> ModelRoutes:
    """Replace the project's model routes. Cases that start from now on use them: a model
    name matching a route's pattern goes to its OpenAI-compatible endpoint, with the key in
    its key secret."""
    project = service.set_model_routes(session, who, name, body.routes)
    return _routes_of(project.name, project.model_routes)


@router.get("/projects/{name}/egress", response_model=Egress, responses=ERRORS)
def get_egress(name: str, session: SessionDep, who: Admin) -> Egress:
    """The hosts the project's cases may fetch pages from through the model gateway."""
    project = visible_project(session, who, name)
    return Egress(project=project.name, hosts=list(project.egress_hosts))


@router.put("/projects/{name}/egress", response_model=Egress, responses=ERRORS)
def put_egress(name: str, body: EgressPut, session: SessionDep, who: Admin) -> Egress:
    """Replace the project's egress allowlist. Cases that start from now on may fetch pages
    (web_read_page) from these hosts through the gateway, and from no other."""
    project = service.set_egress(session, who, name, body.hosts)
    return Egress(project=project.name, hosts=list(project.egress_hosts))


@router.get("/projects/{name}/guardrail-model", response_model=GuardrailModel, responses=ERRORS)
def get_guardrail_model(name: str, session: SessionDep, who: Admin) -> GuardrailModel:
    """The model that judges the project's judged guardrails; null: none."""
    project = visible_project(session, who, name)
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
    project = service.set_guardrail_model(session, who, name, body.model)
    return GuardrailModel(project=project.name, model=project.guardrail_model)


@router.delete("/projects/{name}/guardrail-model", response_model=GuardrailModel, responses=ERRORS)
def delete_guardrail_model(name: str, session: SessionDep, who: Admin) -> GuardrailModel:
    """Remove the project's judge model: its judged guardrails are skipped again (never
    block), and each gate whose cases they could change warns so."""
    project = service.clear_guardrail_model(session, who, name)
    return GuardrailModel(project=project.name, model=None)


@router.get("/projects/{name}/verdict-rule", response_model=VerdictRule, responses=ERRORS)
def get_verdict_rule(name: str, session: SessionDep, who: Admin) -> VerdictRule:
    """How the project's cases with runs > 1 are judged: threshold or wilson."""
    project = visible_project(session, who, name)
    return VerdictRule(project=project.name, verdict_rule=_rule(project.verdict_rule))


@router.put("/projects/{name}/verdict-rule", response_model=VerdictRule, responses=ERRORS)
def put_verdict_rule(
    name: str, body: VerdictRulePut, session: SessionDep, who: Admin
) -> VerdictRule:
    """Set how the project's cases with runs > 1 are judged. Gates that start from now on
    use it. Audited as `project.verdict_rule_set`."""
    project = service.set_verdict_rule(session, who, name, body.verdict_rule)
    return VerdictRule(project=project.name, verdict_rule=_rule(project.verdict_rule))


def _rule(stored: str) -> VerdictRuleName:
    return "wilson" if stored == "wilson" else "threshold"


@router.get("/projects/{name}/api-specs", response_model=ApiSpecList, responses=ERRORS)
def get_api_specs(name: str, session: SessionDep, who: Admin) -> ApiSpecList:
    """The project's OpenAPI specs, by prefix: the api: tools its agents may list."""
    project = visible_project(session, who, name)
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
    project, spec = service.put_api_spec(
        session, who, name, prefix, body.spec, base_url=body.base_url, headers=body.headers
    )
    return _spec_read(project.name, prefix, spec.stored())


@router.delete("/projects/{name}/api-specs/{prefix}", status_code=204, responses=ERRORS)
def delete_api_spec(name: str, prefix: str, session: SessionDep, who: Admin) -> None:
    """Remove the spec under ``prefix``: its tools are no longer the project's."""
    service.delete_api_spec(session, who, name, prefix)


def _routes_of(project: str, stored: list[dict[str, Any]]) -> ModelRoutes:
    return ModelRoutes(project=project, routes=[ModelRouteSpec.model_validate(r) for r in stored])


def _spec_read(project: str, prefix: str, stored: dict[str, Any]) -> ApiSpecRead:
    return ApiSpecRead(
        project=project,
        prefix=prefix,
        base_url=stored["base_url"],
        headers=sorted(stored.get("headers", {})),
        tools=sorted(stored.get("tools", {})),
    )
