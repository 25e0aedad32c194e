"""`gate admin`: a thin client of the admin API; prints its JSON answers."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, NoReturn

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


def _call(
    ctx: typer.Context, request: Callable[[Any], dict[str, Any]], *, conceal: str = ""
) -> None:
    """Print the API's answer as JSON; a refusal or an unreachable API is one line on stderr
    and exit 2. ``conceal``: a secret's value, never printed even if an answer held it."""
    import httpx

    from ..client.api import GateAPIError, GateClient

    def fail(message: str) -> NoReturn:
        if len(conceal) >= 4:  # as redaction does: a shorter value would garble the line
            message = message.replace(conceal, "[REDACTED]")
        typer.echo(f"gate admin: {message}", err=True)
        raise typer.Exit(2)

    client = GateClient(ctx.obj["url"], token=ctx.obj["token"])
    try:
        answer = request(client)
    except GateAPIError as exc:
        fail(str(exc))
    except httpx.HTTPError as exc:  # network down, timeouts: infrastructure, exit 2
        fail(f"cannot reach {ctx.obj['url']}: {exc}")
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


@admin.command("token-path")
def token_path() -> None:
    """The file a first start keeps the admin token it made in (GATE_DATA_DIR/admin-token):
    export GATE_TOKEN=$(cat "$(gate admin token-path)")."""
    from ..config import Settings

    path = Settings().admin_token_path()
    typer.echo(str(path))
    if not path.exists():
        typer.echo(
            f"gate admin: there is no {path} (yet): a first start without "
            "GATE_BOOTSTRAP_TOKEN makes it, with this GATE_DATA_DIR",
            err=True,
        )


# A secret's value on stdin is read up to this many characters; the API takes 64 KiB.
MAX_STDIN_CHARS = 1024 * 1024


def _refuse(message: str) -> NoReturn:
    typer.echo(f"gate admin: {message}", err=True)
    raise typer.Exit(2)


def _stdin_is_terminal() -> bool:
    return sys.stdin is not None and sys.stdin.isatty()


def read_secret_value(name: str) -> str:
    """The value of secret ``name``: typed twice at a prompt that does not show it when stdin
    is a terminal, else all of stdin less one trailing line ending (``printf``, ``echo`` and
    ``< file`` alike). Never from the command line, where the shell's history and the
    process list would keep it."""
    if _stdin_is_terminal():
        typed: str = typer.prompt(
            f"Value of {name} (not shown)", hide_input=True, confirmation_prompt=True, err=True
        )
        value = typed
    else:
        if sys.stdin is None:
            _refuse(f"no value for {name}: there is no stdin to read it from")
        try:
            value = sys.stdin.read(MAX_STDIN_CHARS + 1)
        except UnicodeDecodeError:
            _refuse(f"the value of {name} on stdin is not UTF-8 text")
        if len(value) > MAX_STDIN_CHARS:
            _refuse(f"stdin holds more than {MAX_STDIN_CHARS} characters: not a secret's value")
        value = value[:-2] if value.endswith("\r\n") else value.removesuffix("\n")
    if not value:
        _refuse(f"the value of {name} is empty (pipe it on stdin, or type it at the prompt)")
    return value


# Extra arguments reach the command (ctx.args) instead of Click's usage error, which would
# quote them: a value given on the command line is refused without being printed.
TAKES_NO_VALUE = {"allow_extra_args": True, "ignore_unknown_options": True}


@admin.command("secret-set", context_settings=TAKES_NO_VALUE)
def secret_set(ctx: typer.Context, project: str, name: str) -> None:
    """Store or replace a project secret: every case of the project gets it as the
    environment variable NAME. The value is read from stdin (printf %s "$KEY" | gate admin
    secret-set shop OPENAI_API_KEY), or typed at a prompt that does not show it; never
    given as an argument."""
    if ctx.args:
        _refuse(
            f"secret-set takes only PROJECT and NAME; got {len(ctx.args)} more argument(s), "
            "not shown. The value is never an argument (the shell's history and the process "
            "list would keep it): pipe it on stdin, or type it at the prompt. --url and "
            "--token go before the command"
        )
    value = read_secret_value(name)
    _call(ctx, lambda c: c.set_secret(project, name, value), conceal=value)


@admin.command("secrets")
def secret_list(ctx: typer.Context, project: str) -> None:
    """A project's secret names and when each was last set; never a value."""
    _call(ctx, lambda c: c.secrets(project))


@admin.command("secret-delete")
def secret_delete(ctx: typer.Context, project: str, name: str) -> None:
    """Remove a project secret: cases that start from now on no longer get it."""

    def delete(client: Any) -> dict[str, Any]:
        client.delete_secret(project, name)
        return {"project": project, "name": name, "deleted": True}

    _call(ctx, delete)


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
    _call(ctx, lambda c: c.verdict_rule(project))


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
    _call(ctx, lambda c: c.set_verdict_rule(project, rule.value))


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
    _call(ctx, lambda c: c.quarantine(project, body))


@admin.command("quarantine-list")
def quarantine_list(ctx: typer.Context, project: str) -> None:
    """A project's quarantines that hold, then those that ended in the last 30 days."""
    _call(ctx, lambda c: c.quarantines(project))


@admin.command("quarantine-clear")
def quarantine_clear(ctx: typer.Context, project: str, quarantine_id: str) -> None:
    """End a quarantine now, by its id (quarantine-list shows them)."""
    _call(ctx, lambda c: c.clear_quarantine(project, quarantine_id))


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
