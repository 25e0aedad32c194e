"""The results pages under /ui: server-rendered (Jinja2), served with every asset, no CDN.

A person signs in with a token of the read scope; the session is a server-side row whose
random id is the only thing the HttpOnly, SameSite=Strict cookie holds. Each page shows the
session's project only (another project's gate is 404, as in the API). Forms that change
state carry the session's form token and are refused from another Origin.
"""

from __future__ import annotations

import hashlib
import uuid
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import quote, urlencode, urlsplit

import anyio.to_thread
from fastapi import APIRouter, Depends, FastAPI, Query, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from fastapi.templating import Jinja2Templates
from jinja2 import Environment, FileSystemLoader, select_autoescape

from ..app_state import state_of
from ..auth.deps import check_token
from ..auth.service import record_by
from ..auth.tokens import Scope
from ..baselines.figures import runs_done
from ..baselines.history import one_case_history
from ..db import session_scope
from ..deps import SessionDep, SettingsDep
from ..errors import BadRequest, Forbidden, GateError, TooManyRequests, Unauthorized
from ..gates import views as gates
from ..gates.labels import parse_label_filter
from ..gates.submission import request_cancel
from ..links import UI_PREFIX, gate_page_path
from ..models import GateStatus, utcnow
from . import sessions, views

HERE = Path(__file__).parent
PAGE_SIZE = 25
LIVE_POLL_SECONDS = 2

# Pages are hostile text rendered on our origin: no script but ours, no inline anything,
# nothing framed, forms only to us.
PAGE_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; "
    "img-src 'self'; connect-src 'self'; form-action 'self'; frame-ancestors 'none'; "
    "base-uri 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}

router = APIRouter(prefix=UI_PREFIX, include_in_schema=False)
dashboard_router = APIRouter(include_in_schema=False)


class SignInNeeded(Exception):
    """No valid session: the page answers a redirect to the form, which returns here."""

    def __init__(self, back_to: str) -> None:
        super().__init__(back_to)
        self.back_to = back_to


def make_templates() -> Jinja2Templates:
    env = Environment(
        loader=FileSystemLoader(HERE / "templates"),
        autoescape=select_autoescape(default=True, default_for_string=True),
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["duration"] = views.duration
    env.filters["money"] = views.money
    env.filters["cut"] = views.cut
    env.filters["span_word"] = views.span_word
    env.filters["span_css"] = views.span_outcome_css
    env.globals["result_view"] = views.result_view
    env.globals["cause_title"] = views.cause_title
    env.filters["size"] = views.size
    env.filters["shown"] = views.shown
    env.globals["result_word"] = views.result_word
    env.globals["is_short"] = views.is_short
    env.globals["case_notes"] = views.case_notes
    env.globals["baseline_cell"] = views.baseline_cell
    env.globals["interval_text"] = views.interval_text
    env.globals["runs_done"] = runs_done
    env.filters["css_word"] = views.css_word
    return Jinja2Templates(env=env)


def _templates(request: Request) -> Jinja2Templates:
    templates: Jinja2Templates = request.app.state.ui_templates
    return templates


def render(
    request: Request,
    name: str,
    context: dict[str, Any],
    *,
    status_code: int = 200,
    headers: dict[str, str] | None = None,
) -> HTMLResponse:
    response = _templates(request).TemplateResponse(
        request, name, context, status_code=status_code, headers={**PAGE_HEADERS, **(headers or {})}
    )
    return response


def _back_to(request: Request) -> str:
    path = request.url.path
    query = [(k, v) for k, v in request.query_params.multi_items() if k != "fragment"]
    return path + (f"?{urlencode(query)}" if query else "")


def safe_next(value: str | None) -> str:
    """Where sign-in returns to: a path of the pages only, never another site (an open
    redirect would lend this origin to a phishing link)."""
    if not value or not value.startswith(UI_PREFIX) or "\\" in value:
        return UI_PREFIX
    parts = urlsplit(value)
    if parts.scheme or parts.netloc or any(ord(ch) < 0x20 for ch in value):
        return UI_PREFIX
    if parts.path != UI_PREFIX and not parts.path.startswith(UI_PREFIX + "/"):
        return UI_PREFIX
    return value


def current(request: Request, session: SessionDep) -> sessions.SignedIn:
    """The page's caller, or a redirect to the sign-in form that comes back here."""
    who = sessions.signed_in(session, request.cookies.get(sessions.COOKIE))
    if who is None:
        raise SignInNeeded(_back_to(request))
    return who


SignedInDep = Annotated[sessions.SignedIn, Depends(current)]


def _own_origin(request: Request) -> str:
    """This service's origin as the browser names it: GATE_PUBLIC_URL's, else the request's
    own scheme and Host (behind a TLS proxy, set GATE_PUBLIC_URL)."""
    public = state_of(request).settings.public_url
    if public:
        parts = urlsplit(public)
        return f"{parts.scheme}://{parts.netloc}"
    return f"{request.url.scheme}://{request.headers.get('host', '')}"


def _same_origin(request: Request) -> None:
    """A form is taken only from our own pages: browsers send Origin (or at least Referer)
    on a form's POST, so a request with neither, or from another origin, is refused. With
    SameSite=Strict (no cookie on another site's POST) and the form token, the third lock;
    for sign-in, which has no session yet, the one that stops a forged sign-in."""
    origin = request.headers.get("origin")
    if origin is None or origin == "null":
        referer = request.headers.get("referer")
        try:
            parts = urlsplit(referer) if referer else None
        except ValueError:  # "http://[::1": not a URL, so no origin of ours either
            parts = None
        origin = f"{parts.scheme}://{parts.netloc}" if parts and parts.netloc else None
    if origin is None:
        raise Forbidden("this form must come from the service's own page (no Origin or Referer)")
    if origin != _own_origin(request):
        raise Forbidden(f"this form was sent from another site ({origin})")


async def _form(request: Request) -> dict[str, str]:
    form = await request.form(max_files=0, max_fields=10, max_part_size=64 * 1024)
    return {k: v for k, v in form.items() if isinstance(v, str)}


def _check_form(request: Request, form: dict[str, str]) -> str:
    """The session cookie of a state-changing form that passed its checks."""
    _same_origin(request)
    cookie = request.cookies.get(sessions.COOKIE) or ""
    if not cookie or not sessions.csrf_matches(cookie, form.get("csrf", "")):
        raise Forbidden("this form's token is missing or stale; reload the page and try again")
    return cookie


# -- sign-in --------------------------------------------------------------------------------


@router.get("/sign-in")
def sign_in_form(
    request: Request,
    session: SessionDep,
    next: str | None = None,
    checked: bool = False,
) -> Response:
    back_to = safe_next(next)
    if sessions.signed_in(session, request.cookies.get(sessions.COOKIE)) is not None:
        return RedirectResponse(back_to, status_code=303)
    # A link from another site (the pipeline's log) is a cross-site navigation, which carries
    # no SameSite=Strict cookie: the form first reloads itself once, from this origin, so a
    # browser that is signed in goes straight on to the page.
    bounce = (
        None if checked else f"{UI_PREFIX}/sign-in?{urlencode({'next': back_to, 'checked': 1})}"
    )
    return render(request, "sign_in.html", {"next": back_to, "error": None, "bounce": bounce})


@router.post("/sign-in")
async def sign_in(request: Request) -> Response:
    form = await _form(request)
    back_to = safe_next(form.get("next"))
    _same_origin(request)
    token = (form.get("token") or "").strip() or None
    try:
        # Database work in a thread: the event loop also serves the API's long-polls.
        cookie, expires = await anyio.to_thread.run_sync(_open, request, token)
    except (Unauthorized, Forbidden, TooManyRequests) as exc:
        return render(
            request,
            "sign_in.html",
            {"next": back_to, "error": f"Not signed in: {exc.detail}.", "bounce": None},
            status_code=exc.status_code,
            headers={k: v for k, v in exc.headers.items() if k == "Retry-After"},
        )
    response = RedirectResponse(back_to, status_code=303)
    response.set_cookie(
        sessions.COOKIE,
        cookie,
        max_age=max(1, int((expires - utcnow()).total_seconds())),
        path=UI_PREFIX,
        httponly=True,
        samesite="strict",
        secure=_secure(request),
    )
    return response


def _open(request: Request, token: str | None) -> tuple[str, datetime]:
    """A new session of ``token`` (judged and braked as a bearer header is); a session the
    browser held before ends, so signing in again leaves no second one behind."""
    who = check_token(request, token, missing="enter a token")
    if not who.has(Scope.read):
        raise Forbidden("this token lacks the read scope")
    state = state_of(request)
    with session_scope(state.sessions) as session:
        sessions.close_session(session, request.cookies.get(sessions.COOKIE))
        cookie, expires = sessions.open_session(session, who, hours=state.settings.ui_session_hours)
        record_by(session, who, "ui.signed_in")
    return cookie, expires


def _secure(request: Request) -> bool:
    public = state_of(request).settings.public_url
    return request.url.scheme == "https" or public.startswith("https://")


@router.post("/sign-out")
async def sign_out(request: Request) -> Response:
    cookie = _check_form(request, await _form(request))
    await anyio.to_thread.run_sync(_close, request, cookie)
    response = RedirectResponse(f"{UI_PREFIX}/sign-in", status_code=303)
    response.delete_cookie(sessions.COOKIE, path=UI_PREFIX, httponly=True, samesite="strict")
    return response


def _close(request: Request, cookie: str) -> None:
    with session_scope(state_of(request).sessions) as session:
        who = sessions.signed_in(session, cookie)
        sessions.close_session(session, cookie)
        if who is not None:
            record_by(session, who.who, "ui.signed_out")


# -- pages ----------------------------------------------------------------------------------


@router.get("")
def gate_list(
    request: Request,
    session: SessionDep,
    settings: SettingsDep,
    me: SignedInDep,
    status: str = "",
    label: Annotated[str, Query(max_length=400)] = "",
    page: Annotated[int, Query(ge=1, le=100_000)] = 1,
) -> HTMLResponse:
    wanted_status: GateStatus | None = None
    if status:
        try:
            wanted_status = GateStatus(status)
        except ValueError:
            raise BadRequest(
                f"status must be one of {', '.join(s.value for s in GateStatus)}; got {status!r}"
            ) from None
    labels = [part.strip() for part in label.split(",") if part.strip()]
    wanted = parse_label_filter(labels)
    listing = gates.list_gates(
        session,
        project_id=me.who.project_id,
        status=wanted_status,
        label=wanted or None,
        limit=PAGE_SIZE,
        offset=(page - 1) * PAGE_SIZE,
        public_url="",
    )
    pages = max(1, -(-listing.total // PAGE_SIZE))

    def link(to_page: int) -> str:
        query = [f"page={to_page}"]
        if status:
            query.append(f"status={quote(status)}")
        if label:
            query.append(f"label={quote(label)}")
        return f"{UI_PREFIX}?{'&'.join(query)}"

    return render(
        request,
        "gates.html",
        {
            "me": me,
            "listing": listing,
            "statuses": [s.value for s in GateStatus],
            "status": status,
            "label": label,
            "page": page,
            "pages": pages,
            "prev_link": link(page - 1) if page > 1 else None,
            "next_link": link(page + 1) if page < pages else None,
            "first": (page - 1) * PAGE_SIZE + 1 if listing.items else 0,
            "last": (page - 1) * PAGE_SIZE + len(listing.items),
        },
    )


def _etag(gate_id: uuid.UUID, revision: int, me: sessions.SignedIn, fragment: bool) -> str:
    # The page differs per session (its form token, its scopes) and between the whole page
    # and its live part, not only per revision.
    seed = f"{revision}.{me.session_digest}.{int(fragment)}"
    tag = hashlib.sha256(seed.encode()).hexdigest()[:20]
    return f'W/"ui.{gate_id}.{tag}"'


@router.get("/gates/{gate_id}")
def gate_page(
    gate_id: uuid.UUID,
    request: Request,
    session: SessionDep,
    settings: SettingsDep,
    me: SignedInDep,
    fragment: bool = False,
) -> Response:
    revision = gates.gate_revision(session, gate_id, me.who.project_id)
    etag = _etag(gate_id, revision, me, fragment)
    if request.headers.get("if-none-match") == etag:
        return Response(status_code=304, headers={"ETag": etag, **PAGE_HEADERS})
    revision, gate = gates.read_gate_view(
        session, gate_id, me.who.project_id, public_url=settings.public_url
    )
    etag = _etag(gate_id, revision, me, fragment)
    cases = views.ordered_cases(gate.cases)
    context = {
        "me": me,
        "gate": gate,
        "etag": etag,
        "cases": cases,
        "title": views.gate_title(gate),
        "groups": views.cause_groups(cases),
        "counts": views.verdict_counts(cases),
        "progress": views.progress(gate),
        "live": gate.status not in views.TERMINAL,
        "gate_ms": views.gate_duration(gate),
        "can_cancel": me.who.has(Scope.submit) and gate.status not in views.TERMINAL,
        "poll_seconds": LIVE_POLL_SECONDS,
    }
    name = "gate_live.html" if fragment else "gate.html"
    return render(request, name, context, headers={"ETag": etag})


@router.post("/gates/{gate_id}/cancel")
async def cancel(gate_id: uuid.UUID, request: Request) -> Response:
    cookie = _check_form(request, await _form(request))
    # In a thread: the cancel waits for the gate's row lock, which a worker may hold.
    await anyio.to_thread.run_sync(_cancel, request, cookie, gate_id)
    return RedirectResponse(gate_page_path(gate_id), status_code=303)


def _cancel(request: Request, cookie: str, gate_id: uuid.UUID) -> None:
    with session_scope(state_of(request).sessions) as session:
        me = sessions.signed_in(session, cookie)
        if me is None:
            raise SignInNeeded(gate_page_path(gate_id))
        if not me.who.has(Scope.submit):
            raise Forbidden(f"this token of project {me.who.project_name!r} lacks the submit scope")
        gate = request_cancel(session, gate_id, me.who.project_id)
        state_of(request).metrics.gate_ended_unstarted(session, gate)
        record_by(session, me.who, "gate.cancelled", gate=str(gate_id))


@router.get("/cases/{case_id}")
def case_page(
    case_id: uuid.UUID, request: Request, session: SessionDep, me: SignedInDep
) -> HTMLResponse:
    case = gates.get_case(session, case_id, me.who.project_id)
    runs = gates.read_case_runs(session, case)
    history = (
        one_case_history(
            session, me.who.project_id, case.case_key, state_of(request).settings.history_gates
        )
        if case.case_key is not None
        else []
    )
    context = {
        "me": me,
        "case": case,
        "runs": runs,
        "notes": views.row_notes(case),
        "result": views.row_result(case),
        "sandbox": gates.case_sandbox(session, case),
        "history": views.history_rows(history),
    }
    return render(request, "case.html", context)


@router.get("/runs/{run_id}")
def run_page(
    run_id: uuid.UUID, request: Request, session: SessionDep, me: SignedInDep
) -> HTMLResponse:
    run = gates.read_run(session, run_id, me.who.project_id)
    case = gates.get_case(session, run.case_id, me.who.project_id)
    return render(
        request,
        "run.html",
        {
            "me": me,
            "case": case,
            "run": run,
            "tree": views.trace_tree(run.traces),
            "sandbox": run.sandbox,
        },
    )


# -- the connic CLI's link, and the service's root ------------------------------------------


@dashboard_router.get("/projects/{pid}/deployments/{deployment_id}")
def connic_dashboard_link(pid: str, deployment_id: uuid.UUID) -> RedirectResponse:
    """`connic test` prints {CONNIC_BASE_URL}/projects/<pid>/deployments/<deployment_id>;
    a test run's deployment_id is its gate's id, so the link opens the gate's page (the page
    itself decides who may see it)."""
    return RedirectResponse(gate_page_path(deployment_id), status_code=303)


@dashboard_router.get("/")
def root() -> RedirectResponse:
    return RedirectResponse(UI_PREFIX, status_code=303)


# -- wiring ---------------------------------------------------------------------------------


def error_page(request: Request, exc: GateError) -> Response | None:
    """A page's error as a page (None for the API's routes, which answer JSON)."""
    if not request.url.path.startswith(UI_PREFIX + "/") and request.url.path != UI_PREFIX:
        return None
    if request.url.path.startswith(f"{UI_PREFIX}/static/"):
        return None
    return render(
        request,
        "error.html",
        {"me": None, "status": exc.status_code, "detail": exc.detail},
        status_code=exc.status_code,
        headers={k: v for k, v in exc.headers.items() if k == "Retry-After"},
    )


def install_ui(app: FastAPI) -> None:
    app.state.ui_templates = make_templates()

    @app.exception_handler(SignInNeeded)
    async def _sign_in(_: Request, exc: SignInNeeded) -> Response:
        return RedirectResponse(
            f"{UI_PREFIX}/sign-in?next={quote(exc.back_to, safe='')}", status_code=303
        )

    app.include_router(router)
    app.include_router(dashboard_router)
    app.mount(f"{UI_PREFIX}/static", StaticFiles(directory=HERE / "static"), name="ui-static")
