"""No parse of tenant text is super-linear: every validator the API runs on free text an
admin or client sends, and every parser the model gateway runs on what a case sends (or a
page a case fetches), answers a 100,000-character pathological string within BOUND_S.

These are catastrophe detectors, not speed targets: a linear parse of 100 KB takes
milliseconds, a quadratic one minutes, an exponential one forever (the egress allowlist's
host-name pattern once stalled the API for every project for 25 s on 29 characters). Each
string repeats a prefix of some pattern's alphabet (``"a" * N + "!"``, ``"${" * N``,
``"[::" * N``, ...), the shape that makes a backtracking pattern rescan from every start.

A call still running past STOP_S is interrupted (SIGALRM; the regex engine checks for
signals as it runs) and reported, so a catastrophic parse fails this test instead of hanging
it. Each case also catches only the refusals its parser documents: anything else it raises
(an exception the API would answer with a 500) fails the test too.
"""

from __future__ import annotations

import json
import signal
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from gate_runner.gateway_wire import ApiRequest
from gate_runner.predefined import page_text
from gate_service import endpoints
from gate_service.api_specs import convert, tool_name
from gate_service.auth.routes import AUDIT_ACTION
from gate_service.auth.service import PROJECT_NAME
from gate_service.connic_api.body import TestRunBody
from gate_service.connic_api.routes import bounds_its_own_body
from gate_service.errors import GateError
from gate_service.gates.labels import parse_label_filter, parse_labels
from gate_service.gateway import Failure, ModelRoute, resolve_route
from gate_service.gateway.api_call import build_call
from gate_service.gateway.channel import (
    parse_api,
    parse_fetch,
    parse_mcp,
    parse_moderation,
    parse_request,
)
from gate_service.gateway.mcp import fill_secrets
from gate_service.gateway.records import safe_agent
from gate_service.incidents import scrub
from gate_service.projects.schemas import EgressPut, GuardrailModelPut, ModelRouteSpec
from gate_service.secrets.schemas import SecretPut
from gate_service.secrets.service import check_name

N = 100_000
BOUND_S = 1.0
STOP_S = 5.0
# Prefixes of the alphabets of the patterns and parsers below: host names and addresses,
# placeholders, tags, URLs, JSON, headers, operation ids, and characters outside ASCII
# (Arabic-Indic and fullwidth digits, which IDNA maps to ASCII ones; a lone surrogate).
PIECES = [
    "a", "a.", "a-", "-", ".", "_", "0", "1.", "0x", "0x7f.", "a:", ":", "::", "[::", "[", "]",
    "%", "%25", "&", "=", "${", "$", "{", "}", "${context.", "<", "<a", "/", "//", "\\", "@",
    "a@", "a:@", "*.", "?", "#", "A", "Aa", "AB", "v1.", "host=", "http://", "xn--", " ",
    "\t", "\r\n", "\x00", "é", "\u0661", "\uff10", "\ud800",
]  # fmt: skip
# Short ones too: a pattern behind a length check (a host name's 253 characters) is still
# exponential below it; the old host-name pattern took 25 s on "a" * 29 + "!".
SIZES = (30, 250, N)
TEXTS = [
    piece * (size // len(piece)) + tail for size in SIZES for piece in PIECES for tail in ("", "!")
]


class _TooSlow(Exception):
    pass


def _stop(signum: int, frame: Any) -> None:
    raise _TooSlow


def _timed(parse: Callable[[str], object], text: str) -> float:
    """How long ``parse(text)`` took; STOP_S + 1 when it had to be interrupted."""
    previous = signal.signal(signal.SIGALRM, _stop)
    signal.setitimer(signal.ITIMER_REAL, STOP_S)
    started = time.perf_counter()
    try:
        parse(text)
    except _TooSlow:
        return STOP_S + 1
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    return time.perf_counter() - started


def refused(parse: Callable[[str], object], *kinds: type[BaseException]) -> Callable[[str], None]:
    """``parse``, with the refusals it documents (``kinds``) taken as answers."""

    def call(text: str) -> None:
        try:
            parse(text)
        except kinds:
            pass

    return call


def _spec(**parts: Any) -> dict[str, Any]:
    operation: dict[str, Any] = {"operationId": parts.get("operation_id", "getThing")}
    if "header_parameter" in parts:
        operation["parameters"] = [{"name": parts["header_parameter"], "in": "header"}]
    return {
        "openapi": "3.0.3",
        "servers": [{"url": parts.get("server", "http://api.example.com/v1")}],
        "paths": {parts.get("path", "/things/{id}"): {"get": operation}},
    }


STORED_SPEC = {
    "orders": convert(
        {
            "openapi": "3.0.3",
            "servers": [{"url": "http://127.0.0.1:9"}],
            "paths": {
                "/orders/{id}": {
                    "get": {
                        "operationId": "getOrder",
                        "parameters": [
                            {"name": "id", "in": "path"},
                            {"name": "q", "in": "query"},
                            {"name": "X-Trace", "in": "header"},
                        ],
                    }
                }
            },
        }
    ).stored()
}


def _api_call(text: str, where: str) -> None:
    arguments = {"id": "1", where: text}
    build_call(STORED_SPEC, ApiRequest(api="orders", tool="order_get", arguments=arguments))


def _body(**fields: Any) -> bytes:
    return json.dumps(fields).encode()


def _mcp_body(text: str) -> bytes:
    return _body(
        server=text[:256],
        url=text[:8192],
        headers={text[:256]: text[:8192]},
        context_values={"context.x": text[:8192]},
    )


def _connic_body(text: str) -> None:
    # Outside files_data the body is read byte by byte into its skeleton; inside, in spans.
    for raw in (
        text.encode("utf-8", "surrogatepass"),
        b'{"files_data": "' + text.encode("utf-8", "surrogatepass") + b'"}',
    ):
        body = TestRunBody(upload_limit_bytes=10 * N, skeleton_limit_bytes=128 * 1024)
        for at in range(0, len(raw), 64 * 1024):
            body.feed(raw[at : at + 64 * 1024])
        body.close()


SECRETS = {"TOKEN": "t-1"}
# name -> a call on one text. The API's validators first, then the gateway's parsers.
CASES: dict[str, Callable[[str], object]] = {
    # Model routes (PUT .../model-routes) and API spec base URLs.
    "endpoint_problem": endpoints.endpoint_problem,
    "endpoint_problem(http://…)": lambda t: endpoints.endpoint_problem("http://" + t),
    "endpoint_problem(http://[…)": lambda t: endpoints.endpoint_problem("http://[" + t),
    "endpoint_problem(http://h/…)": lambda t: endpoints.endpoint_problem("http://h:1/" + t),
    "ModelRouteSpec": refused(lambda t: ModelRouteSpec(pattern=t, api_base=t), ValidationError),
    # Egress allowlist entries (PUT .../egress).
    "egress_problem": endpoints.egress_problem,
    "egress_problem(*.…)": lambda t: endpoints.egress_problem("*." + t),
    "EgressPut": refused(lambda t: EgressPut(hosts=[t, "*." + t]), ValidationError),
    # The project's judge model (PUT .../guardrail-model).
    "GuardrailModelPut": refused(lambda t: GuardrailModelPut(model=t), ValidationError),
    "GuardrailModelPut(…[:200])": refused(
        lambda t: GuardrailModelPut(model=t[:200]), ValidationError
    ),
    # API specs (PUT .../api-specs/{prefix}): every free-text field of a spec.
    "convert(servers[0].url)": refused(lambda t: convert(_spec(server="http://" + t)), GateError),
    "convert(base_url)": refused(lambda t: convert(_spec(), base_url=t), GateError),
    "convert(path)": refused(lambda t: convert(_spec(path="/" + t)), GateError),
    "convert(operationId)": refused(lambda t: convert(_spec(operation_id=t)), GateError),
    "convert(header name)": refused(lambda t: convert(_spec(), headers={t: "v"}), GateError),
    "convert(header value)": refused(lambda t: convert(_spec(), headers={"X-Key": t}), GateError),
    "convert(header parameter)": refused(lambda t: convert(_spec(header_parameter=t)), GateError),
    "tool_name": lambda t: tool_name("get", "/" + t, t),
    # Project names, secrets, the audit filter, gate labels, the connic route's body.
    "PROJECT_NAME": lambda t: (PROJECT_NAME.match(t), PROJECT_NAME.fullmatch(t)),
    "secret name": refused(check_name, GateError),
    "SecretPut": refused(lambda t: SecretPut(value=t), ValidationError),
    "AUDIT_ACTION": AUDIT_ACTION.fullmatch,
    "parse_labels": refused(parse_labels, GateError),
    "parse_labels(json)": refused(lambda t: parse_labels(json.dumps({t: t})), GateError),
    "parse_label_filter": refused(lambda t: parse_label_filter([t, f"k={t}"]), GateError),
    "connic body": _connic_body,
    "connic route path": lambda t: bounds_its_own_body("POST", "/v1/projects/" + t),
    # The gateway: what a case sends over its channel, and what the gateway makes of it.
    "parse_request": refused(
        lambda t: parse_request(_body(model=t[:256], messages=[{"role": "user", "content": t}])),
        Failure,
    ),
    "parse_moderation": refused(lambda t: parse_moderation(_body(model=t, input=t)), Failure),
    "parse_fetch": refused(lambda t: parse_fetch(_body(url=t[:8192], agent=t)), Failure),
    "parse_mcp": refused(lambda t: parse_mcp(_mcp_body(t)), Failure),
    "parse_api": refused(lambda t: parse_api(_body(api=t, tool=t, arguments={t: t})), Failure),
    "fill_secrets(value)": refused(
        lambda t: fill_secrets({"X-Key": t}, "who", SECRETS, (), {"context.x": t}), Failure
    ),
    "fill_secrets(name)": refused(lambda t: fill_secrets({t: "v"}, "who", SECRETS, ()), Failure),
    "build_call(path)": refused(lambda t: _api_call(t, "id"), Failure),
    "build_call(query)": refused(lambda t: _api_call(t, "q"), Failure),
    "build_call(header)": refused(lambda t: _api_call(t, "X-Trace"), Failure),
    "url_problem": lambda t: endpoints.url_problem("http://" + t),
    "refused_address": lambda t: endpoints.refused_address("https://" + t + "/x?" + t),
    "host_address": endpoints.host_address,
    "host_allowed": lambda t: endpoints.host_allowed(t, ["*.example.com", "127.0.0.1", t]),
    "header_problem": lambda t: endpoints.header_problem(t, t),
    "safe_agent": safe_agent,
    "resolve_route": refused(
        lambda t: resolve_route(t[:256], SECRETS, [ModelRoute(t[:200], "http://h/v1")]), Failure
    ),
    "page_text": page_text,
    "scrub": scrub,
}


@pytest.fixture(autouse=True)
def _no_name_server(monkeypatch: pytest.MonkeyPatch) -> None:
    """Names are not looked up: what is timed is the parse, not a name server."""

    def unresolvable(*args: object, **kwargs: object) -> list[Any]:
        raise socket.gaierror(socket.EAI_NONAME, "not looked up in this test")

    monkeypatch.setattr(socket, "getaddrinfo", unresolvable)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(CASES))
def test_no_parse_of_tenant_text_takes_more_than_linear_time(name: str) -> None:
    parse = CASES[name]
    slow = {}
    for text in TEXTS:
        took = _timed(parse, text)
        if took > BOUND_S:
            slow[f"{text[:12]!r}… ({len(text)} chars)"] = (
                "interrupted" if took > STOP_S else f"{took:.2f} s"
            )
    assert slow == {}, f"{name} is super-linear on: {slow}"


@pytest.mark.slow
def test_reading_a_bundles_typing_forms_is_linear(tmp_path: Path) -> None:
    """The test image's build reads each of the bundle's Python files for typing forms
    (light.shares_typing_forms): subscripts nested 180 deep around 14,000 names, 100 KB, are
    one pass over the tree (a walk of each subscript's brackets from each took 4.8 s)."""
    from gate_runner.light import shares_typing_forms

    names = ", ".join(f"b{i}" for i in range(14_000))
    (tmp_path / "deep.py").write_text("x = " + "a[" * 180 + names + "]" * 180 + "\n")
    took = _timed(lambda _: shares_typing_forms(tmp_path), "")
    assert took <= BOUND_S, f"{took:.2f} s"
    (tmp_path / "deep.py").write_text("x = " + "a[" * 180 + names + " | c" + "]" * 180 + "\n")
    assert shares_typing_forms(tmp_path)  # and it still finds what it looks for
