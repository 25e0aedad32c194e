"""An OpenAPI 3.x document as the tools of an `api:` prefix (spec 3.3): one tool an operation.

Naming, as the platform documents it: an ``operationId`` goes to snake_case with its first
word (the verb) moved last (``createCharge`` → ``charge_create``); without one the name is
built from the path and the method, ``{id}`` read as ``by_id`` (``GET /users/{id}`` →
``users_by_id_get``), with a leading ``/api`` and version segments (``v1``) left out.
Decided where the platform says nothing: two operations that come to one name keep the
first and fail the import naming both; disabling and renaming single tools is not offered.

A tool's parameters are one JSON-schema object: its path, query and header parameters, and
the properties of a JSON request body (a body that is not an object is the parameter
``body``). Local ``$ref``s are resolved, at most ``MAX_REF_DEPTH`` deep.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..endpoints import (
    BadUrl,
    Url,
    endpoint_problem,
    header_name_problem,
    header_problem,
    parse_url,
    shown,
)
from ..errors import RequestInvalid as BadRequest

METHODS = ("get", "put", "post", "delete", "patch", "head", "options")
PREFIX = re.compile(r"[a-z][a-z0-9_]{0,63}")
MAX_TOOLS = 500
MAX_REF_DEPTH = 12
# What a spec may come to once its $refs are inlined: the nodes resolved, and the JSON of
# its tools as stored on the project and handed to every case (whose handoff is bounded).
MAX_RESOLVED_NODES = 200_000
MAX_STORED_CHARS = 1_000_000
_WORD = re.compile(r"[A-Z]+(?=[A-Z][a-z0-9]|$)|[A-Z]?[a-z0-9]+|[A-Z]+")
_VERSION = re.compile(r"v\d+(\.\d+)*")


@dataclass(frozen=True, slots=True)
class ApiSpec:
    """A prefix's tools as stored on the project, and as the gateway calls them."""

    base_url: str
    headers: dict[str, str]
    tools: dict[str, dict[str, Any]]  # name → {description, method, path, parameters, in}

    def stored(self) -> dict[str, Any]:
        return {"base_url": self.base_url, "headers": dict(self.headers), "tools": self.tools}


def _map(value: Any) -> dict[str, Any]:
    return dict(value) if isinstance(value, Mapping) else {}


def _list(value: Any) -> list[Any]:
    return list(value) if isinstance(value, list) else []


def _words(text: str) -> list[str]:
    return [w.lower() for part in re.split(r"[^A-Za-z0-9]+", text) for w in _WORD.findall(part)]


def tool_name(method: str, path: str, operation_id: str | None) -> str:
    if operation_id:
        words = _words(operation_id)
        if len(words) > 1:
            words = [*words[1:], words[0]]
        return "_".join(words)
    segments = [s for s in path.strip("/").split("/") if s]
    if segments and segments[0].lower() == "api":
        segments = segments[1:]
    while segments and _VERSION.fullmatch(segments[0].lower()):
        segments = segments[1:]
    words = []
    for segment in segments:
        if segment.startswith("{") and segment.endswith("}"):
            words += ["by", *_words(segment[1:-1])]
        else:
            words += _words(segment)
    return "_".join([*words, method.lower()])


def _resolve(node: Any, document: Mapping[str, Any], budget: list[int], depth: int = 0) -> Any:
    """``node`` with every local ``$ref`` replaced by what it names (cycles end in {}); each
    node resolved takes one of ``budget``, and none left refuses the spec (a few KB of
    self-references would otherwise inline to many MB)."""
    budget[0] -= 1
    if budget[0] < 0:
        raise BadRequest(
            f"the spec's $refs expand to over {MAX_RESOLVED_NODES} nodes; inline less of it"
        )
    if depth > MAX_REF_DEPTH:
        return {}
    if isinstance(node, Mapping):
        ref = node.get("$ref")
        if isinstance(ref, str):
            if not ref.startswith("#/"):
                return {}
            target: Any = document
            for part in ref[2:].split("/"):
                part = part.replace("~1", "/").replace("~0", "~")
                target = target.get(part) if isinstance(target, Mapping) else None
            return _resolve(target if target is not None else {}, document, budget, depth + 1)
        return {k: _resolve(v, document, budget, depth + 1) for k, v in node.items()}
    if isinstance(node, list):
        return [_resolve(v, document, budget, depth + 1) for v in node]
    return node


def base_url_of(document: Mapping[str, Any], given: str | None) -> str:
    """The URL the spec's operations are called at: ``given`` (the request's base_url), else
    the spec's first server's; read once (endpoints.parse_url), so a URL no check or client
    can read is a 422 saying which and why, never an exception."""
    servers = document.get("servers")
    first = servers[0] if isinstance(servers, list) and servers else {}
    url = given or (first.get("url") if isinstance(first, Mapping) else None)
    where = "base_url" if given else "spec.servers[0].url"
    if not isinstance(url, str):
        raise BadRequest(
            "the spec's first server (servers[0].url) or base_url must be an absolute http(s) "
            f"URL, got {url!r}",
            problems=[{"location": f"body.{where}", "message": "not an http(s) URL"}],
        )
    problem = endpoint_problem(url)
    if problem is not None:
        raise BadRequest(
            f"the spec's base URL ({where}) cannot be called: {problem}",
            problems=[{"location": f"body.{where}", "message": problem}],
        )
    return url.rstrip("/")


def _path_problem(base: Url, path: str) -> str | None:
    """Why the operation path ``path`` cannot follow ``base`` in a call, or None: it starts
    with '/', holds no '?' or '#', and appended to the base URL (as the gateway appends it,
    build_call) is a URL of the same host and port."""
    if not path.startswith("/"):
        return "a path starts with '/'"
    if "?" in path or "#" in path:
        return "a path holds no '?' or '#' (a query parameter goes in `parameters`)"
    try:
        joined = parse_url(base.text + path)
    except BadUrl as exc:
        return f"appended to the base URL it is no URL the gateway can call: {exc}"
    if (joined.host, joined.port) != (base.host, base.port):
        return "appended to the base URL it names another host"
    return None


def _headers_of(headers: Mapping[str, str] | None) -> dict[str, str]:
    """The headers sent with every call, each one a tenant may set (endpoints.header_problem:
    not Host, hop-by-hop or another authority; no line break in a value)."""
    checked = dict(headers or {})
    for name, value in checked.items():
        problem = header_problem(name, value)
        if problem is not None:
            raise BadRequest(
                f"headers: {problem}",
                problems=[{"location": f"body.headers.{name[:64]}", "message": problem}],
            )
    return checked


def convert(
    document: Any, *, base_url: str | None = None, headers: Mapping[str, str] | None = None
) -> ApiSpec:
    """The tools of an OpenAPI 3.x ``document``; ``BadRequest`` naming what is wrong."""
    if not isinstance(document, Mapping) or not str(document.get("openapi", "")).startswith("3."):
        raise BadRequest("the spec must be an OpenAPI 3.x document (its `openapi` is 3.x)")
    paths = document.get("paths")
    if not isinstance(paths, Mapping) or not paths:
        raise BadRequest("the spec has no `paths`")
    url = base_url_of(document, base_url)
    base = parse_url(url)  # cannot fail: base_url_of read it
    sent_headers = _headers_of(headers)
    tools: dict[str, dict[str, Any]] = {}
    budget = [MAX_RESOLVED_NODES]
    for path, item in paths.items():
        if not isinstance(item, Mapping):
            continue
        shared = _list(item.get("parameters"))
        for method in METHODS:
            operation = item.get(method)
            if not isinstance(operation, Mapping):
                continue
            operation_id = operation.get("operationId")
            name = tool_name(
                method, str(path), operation_id if isinstance(operation_id, str) else None
            )
            if name in tools:
                raise BadRequest(
                    f"two operations of the spec are both named {name!r} (the second is "
                    f"{method.upper()} {path}); give one an operationId of its own"
                )
            wrong = _path_problem(base, str(path))
            if wrong is not None:
                raise BadRequest(
                    f"the spec's path {shown(str(path))} ({method.upper()}): {wrong}",
                    problems=[{"location": "body.spec.paths", "message": wrong}],
                )
            tools[name] = _tool(document, method, str(path), operation, shared, budget)
            if len(tools) > MAX_TOOLS:
                raise BadRequest(f"the spec has over {MAX_TOOLS} operations")
    spec = ApiSpec(base_url=url, headers=sent_headers, tools=tools)
    size = len(json.dumps(spec.stored()))
    if size > MAX_STORED_CHARS:
        raise BadRequest(
            f"the spec's tools take {size} characters once its $refs are inlined, over "
            f"{MAX_STORED_CHARS}; store a smaller spec or fewer operations"
        )
    return spec


def _tool(
    document: Mapping[str, Any],
    method: str,
    path: str,
    operation: Mapping[str, Any],
    shared: list[Any],
    budget: list[int],
) -> dict[str, Any]:
    properties: dict[str, Any] = {}
    required: list[str] = []
    where: dict[str, str] = {}
    for raw in [*shared, *_list(operation.get("parameters"))]:
        param = _map(_resolve(raw, document, budget))
        name, place = param.get("name"), param.get("in")
        if not isinstance(name, str) or place not in ("path", "query", "header"):
            continue
        why = header_name_problem(name) if place == "header" else None
        if why is not None:
            # The case would choose this header's value: refused with the spec, not at a call.
            raise BadRequest(
                f"{method.upper()} {shown(path)}: the header parameter {shown(name)} is "
                f"refused: {why}",
                problems=[{"location": "body.spec.paths", "message": why}],
            )
        schema = _map(param.get("schema"))
        described = param.get("description")
        properties[name] = {**schema, **({"description": described} if described else {})}
        where[name] = place
        if param.get("required") or place == "path":
            required.append(name)
    body = _map(_resolve(operation.get("requestBody") or {}, document, budget))
    json_body = _map(_map(body.get("content")).get("application/json"))
    if json_body:
        schema = _map(json_body.get("schema"))
        fields = _map(schema.get("properties"))
        if schema.get("type", "object") == "object" and fields:
            for name, prop in fields.items():
                properties.setdefault(name, prop)
                where.setdefault(name, "body")
            required += [r for r in _list(schema.get("required")) if isinstance(r, str)]
        else:
            # The whole body is one argument, named so as not to take a parameter's name.
            whole = next(n for n in ("body", "request_body", "_body") if n not in properties)
            properties[whole] = schema
            where[whole] = "body_whole"
            if body.get("required"):
                required.append(whole)
    summary = operation.get("summary") or operation.get("description")
    return {
        "description": str(summary) if summary else f"{method.upper()} {path}",
        "method": method.upper(),
        "path": path,
        "parameters": {
            "type": "object",
            "properties": properties,
            "required": sorted(set(required)),
        },
        "in": where,
    }


def loader_tools(stored: Mapping[str, Any]) -> dict[str, dict[str, dict[str, Any]]]:
    """A project's stored specs as the SDK loader's registry (``api_spec_tools``): by prefix,
    each tool's description, method, path and parameters; what the case may see of them
    (no base URL, no headers)."""
    registry: dict[str, dict[str, dict[str, Any]]] = {}
    for prefix, spec in stored.items():
        tools = _map(_map(spec).get("tools"))
        registry[str(prefix)] = {
            name: {k: _map(tool).get(k) for k in ("description", "method", "path", "parameters")}
            for name, tool in tools.items()
        }
    return registry
