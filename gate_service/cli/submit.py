"""`gate submit` (a project to a gate, followed to its verdict) and `gate coverage`.

Exit codes, for pipelines: 0 passed; 1 failed or cancelled; 2 the gate could not judge
(status error), the upload was refused (locally or by the API), the token was refused, or
the gate could not be reached or did not finish in time. Usage errors are 2 as well.
"""

from __future__ import annotations

import json
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from .options import DEFAULT_URL, Token, Url

if TYPE_CHECKING:
    from rich.console import Console

    from ..client.api import GateAPIError, GateClient
    from ..client.shapes import GateView

EXIT_PASSED, EXIT_FAILED, EXIT_ERROR = 0, 1, 2


class ModelMode(StrEnum):
    scripted = "scripted"
    replay = "replay"
    live = "live"


def parse_labels(values: list[str] | None) -> dict[str, str]:
    """``key=value`` pairs; anything else is a usage error naming the bad one."""
    labels: dict[str, str] = {}
    for item in values or []:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise typer.BadParameter(f"expected key=value, got {item!r}", param_hint="--label")
        labels[key.strip()] = value
    return labels


def _check_labels(values: list[str] | None) -> list[str] | None:
    parse_labels(values)
    return values


def _stderr() -> Console:
    from rich.console import Console

    return Console(stderr=True, highlight=False)


def _fail(
    message: str, problems: list[Any] | None = None, notes: list[str] | None = None
) -> typer.Exit:
    """Exit 2 with ``message`` on stderr, then each of ``problems`` as one line, then
    ``notes`` (what to do, sizes, files), which are wrapped at the terminal's width."""
    from rich.text import Text

    from ..client.render import visible

    err = _stderr()
    err.print(Text(visible(message), style="bold red"), soft_wrap=True)
    for problem in problems or []:
        if isinstance(problem, dict):
            where = problem.get("file") or ""
            text = problem.get("message") or problem.get("detail") or json.dumps(problem)
            line = f"  - {where}: {text}" if where else f"  - {text}"
        else:
            line = f"  - {problem}"
        err.print(Text(visible(line)), soft_wrap=True)
    for note in notes or []:
        err.print(Text(visible(f"  {note}")))
    return typer.Exit(EXIT_ERROR)


# What a refused or missing token's error says to do.
TOKEN_HINT = "Set GATE_TOKEN (or pass --token) to a token of the project with the submit scope."
NOTHING_SENT = "Nothing was packed or uploaded."


def shown_token(token: str) -> str:
    """A token as an error may show it: its first 8 characters (of a short one, half of
    them: never the whole token) and "…"."""
    from ..client.render import visible

    return visible(token[: min(8, len(token) // 2)]) + "…"


def _usable_token(token: str | None) -> str:
    """The token, or exit 2 before any request: none at all, or one no header can carry."""
    if token is None or not token.strip():
        raise _fail(
            "no token: gate submit needs a token of the project, and none was given",
            notes=[TOKEN_HINT, NOTHING_SENT],
        )
    if not (token.isascii() and token.isprintable()):
        raise _fail(
            f"the token {shown_token(token)} holds a character no token has (a line break, "
            "a control or a non-ASCII character)",
            notes=[TOKEN_HINT, NOTHING_SENT],
        )
    return token


def _check_token(client: GateClient, token: str, url: str) -> None:
    """Ask the gate whether the token may submit (``GET /v1/whoami?scope=submit``) before
    anything is packed: a refusal names the token by its prefix, what it lacks, and
    GATE_TOKEN."""
    from ..client.api import GateAPIError

    shown = shown_token(token)
    try:
        client.whoami(scope="submit")
    except GateAPIError as exc:
        if exc.status_code in (404, 405):
            return  # a gate older than /v1/whoami: the upload's answer judges the token
        if exc.status_code == 401:
            # "the token is not known" / "was revoked" / "has expired", said of this token.
            why = exc.detail.removeprefix("the token ")
            told = why if why != exc.detail else f"was refused: {exc.detail}"
            raise _fail(
                f"the token {shown} {told} (the gate at {url})",
                notes=[TOKEN_HINT, NOTHING_SENT],
            ) from exc
        if exc.status_code == 403:
            raise _fail(_lacking(shown, exc), notes=[TOKEN_HINT, NOTHING_SENT]) from exc
        raise _fail(f"the gate at {url} refused the token check: {exc}", exc.problems) from exc


def _lacking(shown: str, exc: GateAPIError) -> str:
    """A 403's sentence: the token's prefix, the scopes it holds and the one it lacks (from
    the answer's problem; its detail when an older or other server sent none)."""
    first = exc.problems[0] if isinstance(exc.problems, list) and exc.problems else None
    problem: dict[str, Any] = first if isinstance(first, dict) else {}
    scopes, needed = problem.get("scopes"), problem.get("needed")
    if isinstance(scopes, list) and isinstance(needed, str):
        held = ", ".join(str(s) for s in scopes) or "no scope"
        project = problem.get("project")
        of = f" of project {project}" if isinstance(project, str) else ""
        return f"the token {shown}{of} lacks the {needed} scope: it holds {held}"
    return f"the token {shown} cannot submit: {exc.detail}"


def _bundle(source: Path, console: Console, quiet: bool) -> tuple[bytes, str]:
    from ..client.pack import OverLimit, PackError, pack

    if source.is_dir():
        try:
            packed = pack(source)
        except OverLimit as exc:
            raise _fail(str(exc), notes=exc.notes) from exc
        except PackError as exc:
            raise _fail(str(exc)) from exc
        if not packed.test_files:
            raise _fail("No tests/ directory found in project — nothing to run.")
        if not quiet:
            console.print(
                f"  → {len(packed.files)} files, {len(packed.test_files)} test file(s), "
                f"{len(packed.data):,} bytes packed",
                highlight=False,
            )
        return packed.data, f"{source.resolve().name}.tar.gz"
    if source.is_file():
        return source.read_bytes(), source.name
    raise _fail(f"{source}: no such project folder or archive")


def _write_junit(path: Path, gate: GateView) -> None:
    from ..client.junit import write_junit

    try:
        write_junit(path, gate)
    except OSError as exc:
        raise _fail(f"could not write the JUnit report {path}: {exc}") from exc


def _write_markdown(path: Path, summary: str) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(summary, encoding="utf-8")
    except OSError as exc:
        raise _fail(f"could not write the Markdown summary {path}: {exc}") from exc


def submit(
    path: Annotated[
        Path, typer.Argument(help="project folder (packed as `connic test` does) or archive")
    ],
    wait: Annotated[
        bool,
        typer.Option(
            "--wait/--no-wait",
            help="follow the gate to its verdict and exit with it (--no-wait: exit 0 once "
            "the gate is queued)",
        ),
    ] = True,
    as_json: Annotated[
        bool, typer.Option("--json", help="print only the final JSON (the format CLI's shape)")
    ] = False,
    junit: Annotated[
        Path | None,
        typer.Option("--junit", metavar="FILE", dir_okay=False, help="write a JUnit XML report"),
    ] = None,
    show_requests: Annotated[
        bool,
        typer.Option(
            "--show-requests",
            help="in a failed run's trace, each model request in full (system prompt, "
            "messages, tools, response format), not only its summary line",
        ),
    ] = False,
    verbose: Annotated[
        bool,
        typer.Option(
            "--verbose",
            "-v",
            help="every failed run with its input, output and whole trace, and every warning "
            "(without it: the first failed run, collapsed to its failing check and the spans "
            "on the way to it)",
        ),
    ] = False,
    name_filter: Annotated[
        str | None, typer.Option("--filter", help="only cases whose name contains this")
    ] = None,
    label: Annotated[
        list[str] | None,
        typer.Option(
            "--label",
            metavar="KEY=VALUE",
            help="label the gate (repeatable)",
            callback=_check_labels,
        ),
    ] = None,
    model_mode: Annotated[
        ModelMode | None,
        typer.Option("--model-mode", help="how every LLM agent's model answers"),
    ] = None,
    timeout: Annotated[
        float, typer.Option(min=1, help="seconds to wait for the verdict before exit 2")
    ] = 3600,
    baseline: Annotated[
        str | None,
        typer.Option(
            "--baseline",
            metavar="GATE",
            help="compare each case with this gate's: a gate id, or label:KEY=VALUE (the "
            "project's last passing gate with that label, e.g. label:branch=main); a "
            "regression fails the gate",
        ),
    ] = None,
    changed_only: Annotated[
        bool,
        typer.Option(
            "--changed-only",
            help="reuse the baseline's passing cases whose closure is unchanged instead of "
            "running them (needs --baseline; scripted or replay cases only)",
        ),
    ] = False,
    markdown: Annotated[
        Path | None,
        typer.Option(
            "--markdown",
            metavar="FILE",
            dir_okay=False,
            help="write the gate's Markdown summary (for a pull-request comment)",
        ),
    ] = None,
    url: Url = DEFAULT_URL,
    token: Token = None,
) -> None:
    """Submit a project folder or archive to a gate and report its verdict."""
    import httpx
    from rich.console import Console
    from rich.text import Text

    from ..client.api import GateAPIError, GateClient
    from ..client.render import (
        GateProgress,
        failed_cases,
        json_result,
        render_results,
        visible,
    )
    from ..client.shapes import FailedRuns, GateView

    if changed_only and not baseline:
        raise typer.BadParameter(
            "needs --baseline: the cases it reuses are those that passed there",
            param_hint="--changed-only",
        )
    if markdown is not None and not wait:
        raise typer.BadParameter(
            "the summary needs the verdict: drop --no-wait", param_hint="--markdown"
        )
    labels = parse_labels(label)
    console = Console(highlight=False)
    if not (path.is_dir() or path.is_file()):
        raise _fail(f"{path}: no such project folder or archive")
    token = _usable_token(token)
    client = GateClient(url, token=token)
    try:
        # The token first: a bad one is named before a large project is packed and sent.
        _check_token(client, token, url)
        bundle, filename = _bundle(path, console, as_json)
        try:
            queued = GateView.of(
                client.submit(
                    bundle,
                    filename=filename,
                    name_filter=name_filter,
                    labels=labels,
                    model_mode=model_mode.value if model_mode else None,
                    baseline=baseline,
                    changed_only=changed_only,
                )
            )
        except GateAPIError as exc:
            # A token refused here (an older gate, or one revoked since the check) gets
            # the same advice as one refused before packing.
            notes = [TOKEN_HINT] if exc.status_code in (401, 403) else None
            raise _fail(f"gate refused the bundle: {exc}", exc.problems, notes) from exc
        if not as_json:
            console.print(f"  → gate {queued.id} queued ({len(bundle):,} bytes)")
        if not wait:
            if as_json:
                typer.echo(json.dumps(json_result(queued), indent=2))
            raise typer.Exit(EXIT_PASSED)
        progress = GateProgress(console, quiet=as_json)
        try:
            with progress.running():
                answer = client.wait(str(queued.id), timeout_s=timeout, on_change=progress.update)
        except TimeoutError as exc:
            raise _fail(f"{exc}; giving up (the gate goes on; see GET /v1/gates/{{id}})") from exc
        except GateAPIError as exc:
            raise _fail(f"lost the gate while waiting: {exc}") from exc
        gate = GateView.of(answer)
        # An error gate's unjudged cases have runs too (a provider failed them): their
        # traces say why, as a failed case's do.
        if gate.status in ("failed", "error"):
            unpassed = [c for c in failed_cases(gate.cases) if c.agent_run_ids]
            # The terminal shows one failed run unless --verbose; --json and JUnit carry each
            # failed case's first few.
            every = verbose or as_json or junit is not None
            for case in unpassed if every else unpassed[:1]:
                case.failed_runs = FailedRuns.of(client.failed_runs(case))
        # The summary is the comment's, not the verdict's: when it cannot be fetched the
        # JUnit report and the results still come, then exit 2 says so.
        summary: str | None = None
        summary_refused: str | None = None
        if markdown is not None:
            try:
                summary = client.summary_markdown(str(gate.id))
            except GateAPIError as exc:
                summary_refused = f"could not fetch the gate's Markdown summary: {exc}"
    except httpx.HTTPError as exc:
        raise _fail(f"cannot reach the gate at {url}: {exc or type(exc).__name__}") from exc
    finally:
        client.close()

    if junit is not None:
        _write_junit(junit, gate)
    if markdown is not None and summary is not None:
        _write_markdown(markdown, summary)
    status = gate.status
    if status == "error":
        if not as_json:
            render_results(console, gate, show_requests=show_requests, verbose=verbose)
        reason = gate.failure_reason or gate.error or "unknown error"
        if summary_refused:
            _stderr().print(Text(visible(summary_refused), style="bold red"), soft_wrap=True)
        raise _fail(f"Gate errored: {reason}", gate.problems if as_json else None)
    if as_json:
        typer.echo(json.dumps(json_result(gate), indent=2))
    else:
        render_results(console, gate, show_requests=show_requests, verbose=verbose)
    if summary_refused:
        raise _fail(summary_refused)
    raise typer.Exit(EXIT_PASSED if status == "passed" else EXIT_FAILED)


def coverage(
    path: Annotated[
        Path, typer.Argument(exists=True, file_okay=False, help="the project folder")
    ] = Path("."),
    as_json: Annotated[
        bool,
        typer.Option("--json", help="print the report as JSON (exit 1 if it holds an error)"),
    ] = False,
) -> None:
    """Static per-agent test coverage (`connic test --coverage`); no gate, no token."""
    from rich.console import Console

    from ..coverage import compute_coverage, render_coverage

    report = compute_coverage(path)
    if as_json:
        typer.echo(json.dumps(report, indent=2))
        # As connic-composer-sdk 0.1.57 does (spec §11 says 0, from an older release): a
        # report with an error or a suite that does not parse fails the pipeline step.
        broken = report.get("error") or any(row.get("parse_error") for row in report["agents"])
        raise typer.Exit(1 if broken else 0)
    raise typer.Exit(render_coverage(report, Console(highlight=False)))


def register(app: typer.Typer) -> None:
    app.command()(submit)
    app.command()(coverage)
