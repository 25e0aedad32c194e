"""An `api:` tool's HTTP request, built from the spec its project stored (api_specs/), never
from what the case sends beyond the tool's name and arguments: the case cannot choose the
host, the path's shape, the method or the headers.

Each argument goes where the spec put its parameter (``in``): into the path (quoted as one
segment), the query, a header, or the JSON body; an argument the spec does not name is
refused, as is a missing path parameter.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

from gate_runner.gateway_wire import ApiRequest

from .failure import Failure


@dataclass(frozen=True, slots=True)
class ApiCall:
    method: str
    url: str
    query: dict[str, str] = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)  # the spec's: ${NAME} unfilled
    # The tool's header arguments: values, sent as they are (never filled from secrets).
    argument_headers: dict[str, str] = field(default_factory=dict)
    body: Any = None


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
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
    query: dict[str, str] = {}
    arguments: dict[str, str] = {}
    body: dict[str, Any] = {}
    whole: Any = None
    for name, value in request.arguments.items():
        place = where[name]
        if place == "path":
            path = path.replace("{" + name + "}", quote(_text(value), safe=""))
        elif place == "query":
            query[name] = _text(value)
        elif place == "header":
            arguments[name] = _text(value)
        elif place == "body_whole":
            whole = value
        else:
            body[name] = value
    missing = [n for n, p in where.items() if p == "path" and "{" + n + "}" in path]
    if missing:
        raise Failure("bad_request", f"{ref}: missing path argument(s): {', '.join(missing)}")
    return ApiCall(
        method=str(tool["method"]),
        url=str(spec["base_url"]).rstrip("/") + path,
        query=query,
        headers=dict(spec.get("headers", {})),
        argument_headers=arguments,
        body=whole if whole is not None else (body or None),
    )
