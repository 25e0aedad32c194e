"""`gate admin`: a thin client of the admin API; prints its JSON answers."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer
import yaml

from .options import DEFAULT_URL, Token, Url

admin = typer.Typer(
    help="Projects, tokens and the audit trail (admin token).", no_args_is_help=True
)


class Scope(StrEnum):
    submit = "submit"
    read = "read"
    admin = "admin"


@admin.callback()
def connection(ctx: typer.Context, url: Url = DEFAULT_URL, token: Token = None) -> None:
    """Projects, tokens and the audit trail (admin token)."""
    ctx.obj = {"url": url, "token": token}


def _call(ctx: typer.Context, request: Callable[[Any], dict[str, Any]]) -> None:
    import httpx

    from ..client.api import GateAPIError, GateClient

    client = GateClient(ctx.obj["url"], token=ctx.obj["token"])
    try:
        answer = request(client)
    except GateAPIError as exc:
        typer.echo(f"gate admin: {exc}", err=True)
        raise typer.Exit(2) from exc
    except httpx.HTTPError as exc:  # network down, timeouts: infrastructure, exit 2
        typer.echo(f"gate admin: cannot reach {ctx.obj['url']}: {exc}", err=True)
        raise typer.Exit(2) from exc
    finally:
        client.close()
    typer.echo(json.dumps(answer, indent=2))


@admin.command("project-create")
def project_create(
    ctx: typer.Context,
    name: str,
    retention_days: Annotated[int | None, typer.Option()] = None,
) -> None:
    """Create a project."""
    _call(ctx, lambda c: c.create_project(name, retention_days=retention_days))


@admin.command("project-delete")
def project_delete(
    ctx: typer.Context,
    name: str,
    yes: Annotated[
        bool, typer.Option("--yes", help="do not ask; required without a terminal")
    ] = False,
) -> None:
    """Delete a project and everything of it: gates, runs, tokens, secrets, settings."""
    if not yes:
        typer.confirm(
            f"Delete project {name!r} with all its gates, runs, tokens and secrets?", abort=True
        )
    _call(ctx, lambda c: c.delete_project(name))


@admin.command("token-create")
def token_create(
    ctx: typer.Context,
    project: str,
    scope: Annotated[list[Scope], typer.Option(help="repeatable")],
    expires_in_days: Annotated[int | None, typer.Option()] = None,
    name: Annotated[str | None, typer.Option()] = None,
) -> None:
    """Issue a token (shown once)."""
    scopes = [s.value for s in scope]
    _call(
        ctx, lambda c: c.create_token(project, scopes, expires_in_days=expires_in_days, name=name)
    )


@admin.command("token-list")
def token_list(ctx: typer.Context, project: str) -> None:
    """A project's tokens, without values."""
    _call(ctx, lambda c: c.tokens(project))


@admin.command("token-revoke")
def token_revoke(ctx: typer.Context, token_id: str) -> None:
    """Revoke a token by id."""
    _call(ctx, lambda c: c.revoke_token(token_id))


def parse_route(text: str) -> dict[str, Any]:
    """``PATTERN=URL`` or ``PATTERN=URL#KEY_SECRET`` (a route's URL has no fragment)."""
    pattern, equals, rest = text.partition("=")
    if not equals or not pattern or not rest:
        raise typer.BadParameter(f"{text!r} is not PATTERN=URL or PATTERN=URL#KEY_SECRET")
    url, _, secret = rest.partition("#")
    return {"pattern": pattern, "api_base": url, "key_secret": secret or None}


@admin.command("routes")
def routes(ctx: typer.Context, project: str) -> None:
    """A project's model routes."""
    _call(ctx, lambda c: c.model_routes(project))


@admin.command("routes-set")
def routes_set(
    ctx: typer.Context,
    project: str,
    route: Annotated[
        list[str] | None,
        typer.Option(
            help="PATTERN=URL or PATTERN=URL#KEY_SECRET, repeatable, tried in order: "
            "'corp/*=http://llm-proxy:4000/v1#CORP_KEY'. None: remove all."
        ),
    ] = None,
    responses_api: Annotated[
        list[str] | None,
        typer.Option(
            "--responses-api",
            help="PATTERN of a route (given with --route) whose endpoint is called at its "
            "Responses API (/responses) instead of chat completions; repeatable.",
        ),
    ] = None,
) -> None:
    """Replace a project's model routes."""
    parsed = [parse_route(r) for r in route or []]
    chosen = set(responses_api or [])
    unknown = sorted(chosen - {p["pattern"] for p in parsed})
    if unknown:
        raise typer.BadParameter(f"--responses-api names no --route pattern: {', '.join(unknown)}")
    for entry in parsed:
        entry["responses_api"] = entry["pattern"] in chosen
    _call(ctx, lambda c: c.set_model_routes(project, parsed))


@admin.command("egress")
def egress(ctx: typer.Context, project: str) -> None:
    """The hosts a project's cases may fetch pages from."""
    _call(ctx, lambda c: c.egress(project))


@admin.command("egress-set")
def egress_set(
    ctx: typer.Context,
    project: str,
    host: Annotated[
        list[str] | None,
        typer.Option(help="a host name, *.domain or address, repeatable; none: allow none"),
    ] = None,
) -> None:
    """Replace a project's egress allowlist (web_read_page and MCP servers, through the
    gateway)."""
    _call(ctx, lambda c: c.set_egress(project, list(host or [])))


@admin.command("guardrail-model")
def guardrail_model(ctx: typer.Context, project: str) -> None:
    """The model that judges a project's judged guardrails (null: none, so they are skipped)."""
    _call(ctx, lambda c: c.guardrail_model(project))


@admin.command("guardrail-model-set")
def guardrail_model_set(
    ctx: typer.Context,
    project: str,
    model: Annotated[
        str,
        typer.Argument(
            help="the judge model, named as an agent's model: 'openai/gpt-4o-mini' (its "
            "provider key a project secret, or a model route)"
        ),
    ],
) -> None:
    """Name the model that judges a project's prompt_injection, topic_restriction,
    system_prompt_leakage, data_exfiltration and relevance guardrails."""
    _call(ctx, lambda c: c.set_guardrail_model(project, model))


@admin.command("guardrail-model-clear")
def guardrail_model_clear(ctx: typer.Context, project: str) -> None:
    """Remove a project's judge model: its judged guardrails are skipped (and warned of)."""
    _call(ctx, lambda c: c.clear_guardrail_model(project))


class VerdictRule(StrEnum):
    threshold = "threshold"
    wilson = "wilson"


@admin.command("verdict-rule")
def verdict_rule(ctx: typer.Context, project: str) -> None:
    """How a project's cases with runs > 1 are judged: threshold or wilson."""
    _call(ctx, lambda c: _send(c, "GET", f"/v1/projects/{project}/verdict-rule"))


@admin.command("verdict-rule-set")
def verdict_rule_set(
    ctx: typer.Context,
    project: str,
    rule: Annotated[
        VerdictRule,
        typer.Argument(
            help="threshold: successes/runs against success_threshold (the platform's rule); "
            "wilson: more invocations while the Wilson interval holds the threshold"
        ),
    ],
) -> None:
    """Set how a project's cases with runs > 1 are judged (gates that start from now on)."""
    body = {"verdict_rule": rule.value}
    _call(ctx, lambda c: _send(c, "PUT", f"/v1/projects/{project}/verdict-rule", json=body))


def expiry(expires_at: str | None, days: float | None) -> str:
    """The ISO 8601 end of a quarantine: ``expires_at`` as given, or ``days`` from now."""
    if (expires_at is None) == (days is None):
        raise typer.BadParameter("give either --expires-at or --days")
    if expires_at is not None:
        return expires_at
    assert days is not None
    return (datetime.now(UTC) + timedelta(days=days)).isoformat()


@admin.command("quarantine-set")
def quarantine_set(
    ctx: typer.Context,
    project: str,
    suite: Annotated[str, typer.Option(help="the case's suite path: tests/bot.yaml")],
    agent: Annotated[str, typer.Option(help="the case's agent")],
    test: Annotated[str, typer.Option(help="the case's test name")],
    owner: Annotated[str, typer.Option(help="who answers for the quarantine")],
    reason: Annotated[str, typer.Option(help="why the case is quarantined")],
    expires_at: Annotated[
        str | None, typer.Option(help="when it ends, ISO 8601 (UTC without an offset)")
    ] = None,
    days: Annotated[float | None, typer.Option(help="or: it ends this many days from now")] = None,
) -> None:
    """Quarantine a case: it still runs and is reported, but until it expires its failure
    does not fail a gate (at most GATE_MAX_QUARANTINE_DAYS; replaces its quarantine)."""
    body = {
        "case": {"suite": suite, "agent_name": agent, "test_name": test},
        "owner": owner,
        "reason": reason,
        "expires_at": expiry(expires_at, days),
    }
    _call(ctx, lambda c: _send(c, "POST", f"/v1/projects/{project}/quarantine", json=body))


@admin.command("quarantine-list")
def quarantine_list(ctx: typer.Context, project: str) -> None:
    """A project's quarantines that hold, then those that ended in the last 30 days."""
    _call(ctx, lambda c: _send(c, "GET", f"/v1/projects/{project}/quarantine"))


@admin.command("quarantine-clear")
def quarantine_clear(ctx: typer.Context, project: str, quarantine_id: str) -> None:
    """End a quarantine now, by its id (quarantine-list shows them)."""
    _call(ctx, lambda c: _send(c, "DELETE", f"/v1/projects/{project}/quarantine/{quarantine_id}"))


def _send(client: Any, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
    """A request of the admin API through the client's connection and error handling, for
    the routes GateClient has no method of its own for."""
    answer: dict[str, Any] = client._check(client._http.request(method, path, **kwargs))
    return answer


@admin.command("api-specs")
def api_specs(ctx: typer.Context, project: str) -> None:
    """A project's OpenAPI specs, by prefix, with the api: tools each gives."""
    _call(ctx, lambda c: c.api_specs(project))


@admin.command("api-spec-set")
def api_spec_set(
    ctx: typer.Context,
    project: str,
    prefix: str,
    spec: Annotated[Path, typer.Argument(help="an OpenAPI 3.x document, JSON or YAML")],
    base_url: Annotated[
        str | None, typer.Option(help="where its operations are called (default: servers[0])")
    ] = None,
    header: Annotated[
        list[str] | None,
        typer.Option(help="NAME=VALUE sent with every call, ${SECRET} filled; repeatable"),
    ] = None,
) -> None:
    """Store an OpenAPI spec under a prefix: its operations become api:<prefix>.<tool>."""
    try:
        document = yaml.safe_load(spec.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise typer.BadParameter(f"{spec}: {exc}") from None
    headers = {}
    for item in header or []:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise typer.BadParameter(f"--header {item!r} must be NAME=VALUE")
        headers[name] = value
    _call(ctx, lambda c: c.set_api_spec(project, prefix, document, base_url, headers))


@admin.command("audit")
def audit(ctx: typer.Context, limit: Annotated[int, typer.Option()] = 100) -> None:
    """Recorded events, newest first."""
    _call(ctx, lambda c: c.audit(limit=limit))
