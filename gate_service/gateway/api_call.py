"""An `api:` tool's HTTP request, built from the spec its project stored (api_specs/), never
from what the case sends beyond the tool's name and arguments: the case cannot choose the
host, the path's shape, the method or the headers.

Each argument goes where the spec put its parameter (``in``): into the path (quoted as one
segment), the query, a header, or the JSON body; an argument the spec does not name is
refused, as is a missing path parameter, and a header argument whose name or value no
tenant may send (endpoints.header_problem: ``Host``, hop-by-hop, a line break).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

import httpx

from gate_runner.gateway_wire import ApiRequest

from ..endpoints import header_problem
from .failure import Failure


@dataclass(frozen=True, slots=True)
class ApiCall:
    method: str
    url: str
    query: dict[str, str | list[str]] = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)  # the spec's: ${NAME} unfilled
    # The tool's header arguments: values, sent as they are (never filled from secrets).
    argument_headers: dict[str, str] = field(default_factory=dict)
    body: Any = None


def _text(value: Any) -> str:
    """A scalar as OpenAPI's default styles write it; a list as its items joined by commas
    (the ``simple`` style of path and header parameters)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list | tuple):
        return ",".join(_text(v) for v in value)
    if isinstance(value, dict):
        return json.dumps(value, separators=(",", ":"), sort_keys=True)
    return str(value)


def build_call(specs: Mapping[str, Any], request: ApiRequest) -> ApiCall:
    ref = f"api:{request.api}.{request.tool}"
    spec = specs.get(request.api)
    spec = spec if isinstance(spec, Mapping) else {}
    tool = spec.get("tools", {}).get(request.tool)
    if not isinstance(tool, Mapping):
        raise Failure(
            "no_route",
            f"{ref}: the project has no such API tool (PUT /v1/projects/{{name}}/api-specs/"
            f"{request.api})",
        )
    where: Mapping[str, str] = tool.get("in", {})
    unknown = sorted(set(request.arguments) - set(where))
    if unknown:
        raise Failure("bad_request", f"{ref}: unknown argument(s): {', '.join(unknown)}")
    path = str(tool["path"])
    query: dict[str, str | list[str]] = {}
    arguments: dict[str, str] = {}
    body: dict[str, Any] = {}
    whole: Any = None
    for name, value in request.arguments.items():
        place = where[name]
        if place == "path":
            segment = _text(value)
            # One whole segment, never a step up or an empty one: quote() keeps "." and "..",
            # and httpx removes dot segments, which would reach another path of the host.
            if segment in ("", ".", ".."):
                raise Failure(
                    "bad_request", f"{ref}: the path argument {name} may not be {segment!r}"
                )
            try:
                quoted = quote(segment, safe="")
            except UnicodeEncodeError:  # a lone surrogate, which JSON can carry
                raise Failure(
                    "bad_request", f"{ref}: the path argument {name} is not UTF-8 text"
                ) from None
            path = path.replace("{" + name + "}", quoted)
        elif place == "query":
            # A list is one query parameter a value (OpenAPI's default form, exploded).
            query[name] = [_text(v) for v in value] if isinstance(value, list) else _text(value)
        elif place == "header":
            # The name is the spec's (refused when stored, checked again for one stored
            # before), the value the case's: neither may reach another host or smuggle a
            # second header in.
            text = _text(value)
            problem = header_problem(name, text)
            if problem is not None:
                raise Failure("bad_request", f"{ref}: the argument {name}: {problem}")
            arguments[name] = text
        elif place == "body_whole":
            whole = value
        else:
            body[name] = value
    missing = [n for n, p in where.items() if p == "path" and "{" + n + "}" in path]
    if missing:
        raise Failure("bad_request", f"{ref}: missing path argument(s): {', '.join(missing)}")
    base = str(spec["base_url"]).rstrip("/")
    url = base + path
    # What httpx sends must be the base's path and then the template's, segment for segment.
    try:
        sent = httpx.URL(url).raw_path.split(b"?", 1)[0].decode("ascii")
        expected = httpx.URL(base).raw_path.split(b"?", 1)[0].decode("ascii").rstrip("/") + path
    except (httpx.InvalidURL, ValueError) as exc:
        # A spec stored before its paths were checked (api_specs.convert refuses them now).
        raise Failure("bad_request", f"{ref}: the spec's URL cannot be called: {exc}") from None
    if sent != expected:
        raise Failure("bad_request", f"{ref}: the arguments change the shape of its path")
    return ApiCall(
        method=str(tool["method"]),
        url=url,
        query=query,
        headers=dict(spec.get("headers", {})),
        argument_headers=arguments,
        body=whole if whole is not None else (body or None),
    )
