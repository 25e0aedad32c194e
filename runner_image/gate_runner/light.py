"""Loading a project without the SDK's loader, and without the SDK unless its code imports it.

Importing `connic` (and with it pydantic) and running its loader was most of what a case
container spent before its agent ran. A project needs nothing of the loader at run time but
what it makes of the agent files: configs, and each tool agent's function. The test image's
build (plan.py) loads the project once with the SDK, in validation mode, and, when the
project qualifies, keeps each agent's config as plain JSON and where its function lives. An
invocation then imports the tool modules itself, exactly as the SDK's loader does (same
module names, same `tools` package, same sys.path), and checks each function as the SDK
would; whenever a check is not plainly passed, it hands over to the SDK's loader, which
reuses the modules already imported (none runs twice) and decides as it always did. So the
light path never changes a verdict: it only skips the SDK where the SDK would have had
nothing to say. The SDK itself is imported only when user code imports it (the runtime
still patches `connic.tools` first: runtime/sdk.py).

A project qualifies (``light_agents``) when its load needs none of what the light path does
not do: every agent a tool, sequential or LLM agent without guardrails, approvals, MCP
servers or discoverable tools, an LLM agent's tools each a custom function named one by one
(no predefined or `api:` tool, no wildcard), described by the schema the SDK would make of it
(function_schema); no middleware, hook or guardrail modules and no `tools/__init__.py`; no
load error and no warning; and nothing at the bundle's top that would shadow a module the
SDK's path imports before user code (there, user code gets the module already imported;
here it could get the bundle's file, and so could the SDK when user code imports it).
"""

from __future__ import annotations

import abc
import ast
import builtins
import contextlib
import functools
import importlib.machinery
import importlib.util
import inspect
import io
import json
import subprocess
import sys
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeGuard

from . import BUNDLE_DEPS_DIR
from .runtime.sdk import SDK

LIGHT_KINDS = ("tool", "sequential", "llm")
PROJECT_PACKAGES = ("tools", "middleware", "hooks", "guardrails")  # the SDK's, loader.py
# Defaults the SDK compares with inspect.Parameter.empty, which cannot run user code.
PLAIN_DEFAULTS = (type(None), bool, int, float, complex, str, bytes, tuple, list, dict, set)


# The top-level modules the SDK's path has imported when user code runs: measured once per
# runner image, by its build (`gate_runner sdk-modules`).
SDK_MODULES_PATH = "/opt/gate-runner/sdk-modules.json"
SDK_PATH_IMPORTS = (
    "import gate_runner.__main__, gate_runner.case, gate_runner.approvals, "
    "gate_runner.builders, gate_runner.mocks, gate_runner.runtime.sdk\n"
    "from gate_runner.runtime import Runtime, Trace, install_predefined, jsonable\n"
    "from connic import ProjectLoader\n"
)


def measure_sdk_modules() -> list[str]:
    """In a fresh interpreter: the top-level names in sys.modules once the SDK's path has
    imported what it imports before user code (case.py's _invocation_body)."""
    script = SDK_PATH_IMPORTS + (
        "import json, sys\nprint(json.dumps(sorted({n.split('.')[0] for n in sys.modules})))"
    )
    # Isolated (-I) and from /: neither the working directory (the bundle, at build time)
    # nor the environment decides what it imports.
    out = subprocess.run(
        [sys.executable, "-I", "-c", script],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
        cwd="/",
    )
    return list(json.loads(out.stdout))


@functools.cache
def sdk_modules() -> frozenset[str]:
    """The runner image's measure (SDK_MODULES_PATH), or measured now (outside an image)."""
    try:
        with open(SDK_MODULES_PATH, encoding="utf-8") as file:
            return frozenset(json.load(file))
    except (OSError, ValueError):
        return frozenset(measure_sdk_modules())


class Namespace:
    """A config read as the SDK's pydantic model is read: attributes, and nested ones where
    the SDK's value is a model (``models``, from model_shapes at build time); a field the SDK
    types as a dict (an output schema, a conditional tool entry) stays a dict."""

    def __init__(self, values: Mapping[str, Any], models: Mapping[str, Any]) -> None:
        for name, value in values.items():
            setattr(self, name, _namespaced(value, models.get(name)))

    def __repr__(self) -> str:
        return f"Namespace({vars(self)!r})"


def _namespaced(value: Any, shape: Mapping[str, Any] | None) -> Any:
    if shape is None:
        return value
    if "model" in shape and isinstance(value, dict):
        return Namespace(value, shape["model"])
    if "items" in shape and isinstance(value, list):
        return [_namespaced(v, s) for v, s in zip(value, shape["items"], strict=True)]
    if "entries" in shape and isinstance(value, dict):
        return {k: _namespaced(v, shape["entries"].get(k)) for k, v in value.items()}
    return value


def model_shapes(model: Any) -> dict[str, Any]:
    """Where a pydantic model's fields hold models, nested in lists and dicts, for Namespace
    to rebuild from the model's JSON: {field: {"model": {...}} | {"items": [...]} |
    {"entries": {...}}}, fields holding no model left out."""
    shapes = {}
    for name in type(model).model_fields:
        shape = _shape_of(getattr(model, name, None))
        if shape is not None:
            shapes[name] = shape
    return shapes


def _shape_of(value: Any) -> dict[str, Any] | None:
    if hasattr(type(value), "model_fields"):
        return {"model": model_shapes(value)}
    if isinstance(value, list | tuple):
        items = [_shape_of(v) for v in value]
        return {"items": items} if any(s is not None for s in items) else None
    if isinstance(value, dict):
        entries = {str(k): s for k, v in value.items() if (s := _shape_of(v)) is not None}
        return {"entries": entries} if entries else None
    return None


@dataclass
class LightTool:
    """What the runtime reads of the SDK's Tool for a tool agent's own function."""

    name: str
    ref: str
    func: Any
    description: str = ""
    is_async: bool = False
    parameters: dict[str, Any] = field(default_factory=dict)
    is_predefined: bool = False
    condition: str | None = None


@dataclass
class LightAgent:
    config: Namespace
    tools: list[LightTool] = field(default_factory=list)
    discoverable_tools: list[LightTool] = field(default_factory=list)


class LightLoader:
    """The loader's part the runtime asks of it: the project qualified only without
    middleware, hook and guardrail modules, so there are none to load."""

    def load_middleware(self, name: str) -> None:
        return None

    def load_tool_hooks(self, name: str) -> None:
        return None

    def load_guardrail(self, name: str) -> None:
        return None


# --- at build time (plan.py), with the SDK -------------------------------------------------


def light_agents(project: Path) -> tuple[list[dict[str, Any]] | None, str]:
    """(each agent in the SDK's load order, "") when the project qualifies, else (None, why)."""
    from connic import ProjectLoader

    project = project.resolve()
    for package in ("middleware", "hooks", "guardrails"):
        if any((project / package).rglob("*.py")):
            return None, f"it has {package}/ modules"
    if (project / "tools" / "__init__.py").exists():
        return None, "it has tools/__init__.py"
    suffixes = tuple(importlib.machinery.all_suffixes())
    for entry in sorted(project.iterdir()):
        stem = entry.name.split(".", 1)[0]
        importable = entry.is_dir() or entry.name.endswith(suffixes)
        if importable and stem in sdk_modules() and stem not in PROJECT_PACKAGES:
            return None, f"{entry.name} would shadow the module {stem!r}"
    plugin = pydantic_plugin(Path(BUNDLE_DEPS_DIR))
    if plugin:
        return None, f"its dependency {plugin} declares a pydantic plugin"
    loader = ProjectLoader(str(project), validation_only=True)
    printed = io.StringIO()
    try:
        with contextlib.redirect_stdout(printed):
            agents = loader.load_agents()
    except Exception as exc:
        return None, f"its agents do not load: {exc}"
    if getattr(loader, "_load_errors", None) or getattr(loader, "_api_spec_warnings", None):
        return None, "its agents load with errors or warnings"
    if printed.getvalue():
        return None, "loading its agents prints warnings"
    modules = loader._discover_tool_modules()
    entries: list[dict[str, Any]] = []
    for agent in agents:
        config = agent.config
        kind = str(getattr(config.type, "value", config.type))
        if kind not in LIGHT_KINDS:
            return None, f"agent {config.name!r} is a {kind} agent"
        if config.guardrails or config.approval or config.mcp_servers:
            return None, f"agent {config.name!r} has guardrails, approvals or MCP servers"
        if agent.discoverable_tools:
            return None, f"agent {config.name!r} has discoverable tools"
        loaded: dict[str, Any] = {
            "config": config.model_dump(mode="json"),
            "models": model_shapes(config),
            "tool": None,
        }
        why = ""
        if kind == "tool":
            if len(agent.tools) != 1 or not agent.tools[0].ref:
                return None, f"agent {config.name!r} has no single custom tool"
            loaded["tool"], why = _tool_spec(agent.tools[0], modules)
        elif kind == "llm":
            loaded["tools"], why = _llm_tool_specs(config, agent.tools, modules)
        elif agent.tools:
            return None, f"agent {config.name!r} has tools"
        if why:
            return None, f"agent {config.name!r}: {why}"
        entries.append(loaded)
    return entries, ""


def _tool_spec(tool: Any, modules: Mapping[str, Path]) -> tuple[dict[str, Any], str]:
    """Where a custom tool's function lives, as an invocation imports it (LightLoad.tool)."""
    module, _, function = tool.ref.rpartition(".")
    path = modules.get(module)
    if path is None:
        return {}, f"tool module {module!r} not found"
    return {"module": module, "function": function, "file": str(path)}, ""


def _llm_tool_specs(
    config: Any, tools: list[Any], modules: Mapping[str, Path]
) -> tuple[list[dict[str, Any]], str]:
    """An LLM agent's tools, each a custom function of tools/ named one by one: a predefined
    or `api:` tool needs the SDK's stubs or specs, and what a wildcard matches is what the
    module holds when it runs, which the build's reading of it (validation mode, without
    running it) cannot promise."""
    entries = config.tools or []
    if any("*" in str(e if isinstance(e, str) else next(iter(e), "")) for e in entries):
        return [], "a wildcard names its tools"
    specs = []
    for tool in tools:
        ref = str(tool.ref or "")
        if tool.is_predefined or not ref or ref.startswith("api:"):
            return [], f"tool {tool.name!r} is a predefined or API tool"
        spec, why = _tool_spec(tool, modules)
        if why:
            return [], why
        specs.append({**spec, "condition": tool.condition})
    return specs, ""


def pydantic_plugin(deps: Path) -> str:
    """The first of the bundle's dependencies that declares a pydantic plugin, or "".

    On the SDK's path pydantic looks for plugins once, in the runner's process, before the
    bundle's dependencies are on its path, so it never finds theirs; imported later, in an
    invocation, it would. Such a project keeps the SDK's path."""
    for entry_points in sorted(deps.glob("*.dist-info/entry_points.txt")):
        with contextlib.suppress(OSError, UnicodeDecodeError):
            lines = entry_points.read_text(encoding="utf-8").splitlines()
            if any(line.strip() == "[pydantic]" for line in lines):
                return entry_points.parent.name
    return ""


def names_the_sdk(project: Path) -> bool:
    """Whether any Python file of the project names the SDK: a hint (a dynamic import is
    not seen) for the runner to import it once, before forking its invocations, rather than
    in each of them."""
    for path in project.rglob("*.py"):
        with contextlib.suppress(OSError):
            if SDK.encode() in path.read_bytes():
                return True
    return False


def shares_typing_forms(project: Path) -> bool:
    """Whether any Python file of the project writes a typing form whose evaluation may give
    back an equal one the SDK made first, in another order (_cache_proof): a `Literal` or
    `Union`, or a `|` inside a subscript. Then the runner imports the SDK before any of the
    project's code, as on the SDK's path, so that typing's cache holds the same forms when
    the project's annotations are evaluated, and the schemas its tools are offered with
    are the SDK path's. A file that does not parse counts (its import fails either way)."""
    for path in project.rglob("*.py"):
        try:
            tree = ast.parse(path.read_bytes())
        except (OSError, SyntaxError, ValueError, RecursionError, MemoryError):
            return True
        # One pass, each node once (the file is the project's): with whether it stands
        # inside a subscript's brackets.
        stack: list[tuple[ast.AST, bool]] = [(tree, False)]
        while stack:
            node, bracketed = stack.pop()
            if isinstance(node, ast.Name | ast.Attribute):
                if (node.id if isinstance(node, ast.Name) else node.attr) in ("Literal", "Union"):
                    return True
            elif bracketed and isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
                return True
            if isinstance(node, ast.Subscript):
                stack += [(node.value, bracketed), (node.slice, True)]
            else:
                stack += [(child, bracketed) for child in ast.iter_child_nodes(node)]
    return False


# --- in an invocation, without the SDK -----------------------------------------------------


class Fallback(Exception):
    """The light path cannot say what the SDK's loader would: let the SDK's decide."""


@dataclass
class LightLoad:
    """One invocation's load: what it imported so far, for the SDK to take over from."""

    project: Path
    modules: dict[str, types.ModuleType] = field(default_factory=dict)  # by tool module name
    failed: dict[str, BaseException] = field(default_factory=dict)
    path_added: bool = False
    # Whether the SDK was imported before any of the project's code, as on its path: then
    # typing's cache is as the SDK's path has it (shares_typing_forms).
    sdk_first: bool = field(default_factory=lambda: SDK in sys.modules)

    def agents(self, entries: list[dict[str, Any]]) -> dict[str, LightAgent]:
        """The project's agents, as the SDK's full load would give them, or Fallback."""
        loaded: dict[str, LightAgent] = {}
        for entry in entries:
            config = Namespace(entry["config"], entry["models"])
            tools = []
            if entry["tool"] is not None:
                tools.append(self.tool(entry["tool"]))
            # An LLM agent's tools, in the order the SDK resolves them (its config's).
            tools += [self.tool(spec, offered=True) for spec in entry.get("tools") or ()]
            loaded[entry["config"]["name"]] = LightAgent(config=config, tools=tools)
        return loaded

    def tool(self, spec: Mapping[str, Any], *, offered: bool = False) -> LightTool:
        """A tool agent's function, or with ``offered`` a tool an LLM agent offers its model,
        described by the schema the SDK's loader would give it (function_schema)."""
        module_name, function = spec["module"], spec["function"]
        module = self.modules.get(module_name)
        if module is None:
            try:
                module = self._import(module_name, Path(spec["file"]))
            except Exception as exc:
                self.failed[module_name] = exc
                raise Fallback(f"tools.{module_name} raised on import") from exc
            self.modules[module_name] = module
        # From the module's namespace: a module-level __getattr__ (user code) runs only on
        # the SDK's path, once; and the SDK's getattr reads that namespace only while the
        # module is a plain module (the project may replace its class).
        if type(module) is not types.ModuleType:
            raise Fallback(f"tools.{module_name} is not a plain module")
        func = module.__dict__.get(function)
        if not (
            _plain_function(func, f"tools.{module_name}") and (offered or _takes_a_payload(func))
        ):
            raise Fallback(f"{module_name}.{function} is not a plain tool function")
        hints = _type_hints(func) if offered else {}
        if not self.sdk_first and not all(map(_cache_proof, hints.values())):
            raise Fallback(f"{module_name}.{function}: an annotation typing's cache may reorder")
        return LightTool(
            name=function,
            ref=f"{module_name}.{function}",
            func=func,
            description=inspect.getdoc(func) or "No description provided.",
            is_async=inspect.iscoroutinefunction(func),
            parameters=function_schema(func, hints) if offered else {},
            condition=spec.get("condition"),
        )

    def _import(self, module_name: str, file: Path) -> types.ModuleType:
        """The SDK loader's full-mode import of one tool module (_load_tool_module, with
        _activate_tool_imports and _ensure_tool_package the first time)."""
        if not self.path_added:
            sys.path.insert(0, str(self.project))
            self.path_added = True
            importlib.invalidate_caches()
            tools_path = str((self.project / "tools").resolve())
            spec = importlib.util.spec_from_loader("tools", loader=None, is_package=True)
            assert spec is not None
            package = importlib.util.module_from_spec(spec)
            package.__path__ = [tools_path]
            spec.submodule_search_locations = package.__path__
            sys.modules["tools"] = package
        import_name = f"tools.{module_name}"
        spec = importlib.util.spec_from_file_location(import_name, file)
        if not spec or not spec.loader:
            raise ImportError(f"Could not load module spec for {file}")
        module = importlib.util.module_from_spec(spec)
        sys.modules[import_name] = module
        try:
            spec.loader.exec_module(module)
        except Exception:
            if sys.modules.get(import_name) is module:
                del sys.modules[import_name]
            raise
        return module

    def hand_over(self, loader: Any) -> None:
        """Seed the SDK's loader with what this load imported, so that it reuses those
        modules (and raises again what an import raised) instead of running them twice."""
        loader._runtime_tool_modules = {
            name: module
            for name, module in sys.modules.items()
            if name.split(".", 1)[0] in PROJECT_PACKAGES
        }
        loader._loaded_modules = dict(self.modules)
        real = loader._load_tool_module
        failed = dict(self.failed)

        def load(module_name: str) -> Any:
            if module_name in failed:
                raise failed.pop(module_name)  # what the SDK's own first import raised
            return real(module_name)

        loader._load_tool_module = load
        if self.path_added:
            # Where the SDK's loader would be after its first tool module (whether or not it
            # reaches its own import now): the project first on sys.path once, its modules
            # as this load left them.
            with contextlib.suppress(ValueError):
                sys.path.remove(str(self.project))
            loader._activate_tool_imports()


def function_schema(
    func: types.FunctionType, hints: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The JSON schema of a plain tool function's parameters, exactly as the SDK's loader
    makes it (ProjectLoader._generate_schema, with _type_to_schema and
    _parse_docstring_params, in the SDK the runner image pins; a unit test holds the two
    equal): a hidden `context` skipped, each parameter's type from its evaluated annotation,
    its description from a Google-style `Args:` section, required where it has no default.
    ``hints``: the function's _type_hints, when the caller has them already."""
    signature = inspect.signature(func)
    hints = _type_hints(func) if hints is None else hints
    described = _docstring_params(func.__doc__ or "")
    properties: dict[str, Any] = {}
    required = []
    for name, param in signature.parameters.items():
        if name == "context":
            continue
        schema = _type_schema(hints.get(name, param.annotation))
        if name in described:
            schema["description"] = described[name]
        properties[name] = schema
        if param.default == inspect.Parameter.empty:
            required.append(name)
    return {"type": "object", "properties": properties, "required": required}


def _type_hints(func: types.FunctionType) -> dict[str, Any]:
    """The SDK's evaluation of a tool's annotations: get_type_hints, or none when it fails
    (then each parameter's annotation as written)."""
    try:
        return typing.get_type_hints(func)
    except Exception:
        return {}


def _cache_proof(annotation: Any, nested: bool = False, depth: int = 0) -> bool:
    """Whether ``annotation``'s evaluation gives the SDK's process the same object, in the
    same order, as this one. typing caches its constructs by their arguments, and a Union or
    a Literal argument is equal to one of the same members in any order (Literal[0, 1] to
    Literal[False, True] too): where the SDK's process (connic, pydantic) made the equal one
    first, its evaluation hands that back, and a Literal's enum or a union's first type, both
    in the schema, are in that order. So: no Union of two types or more and no Literal of two
    values or more inside another construct, and no Literal of a bool, 0 or 1."""
    if depth > 8:
        return False
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Literal:
        if any(type(v) is bool or (type(v) is int and v in (0, 1)) for v in args):
            return False
        return not (nested and len(args) > 1)
    if origin is typing.Union or origin is types.UnionType:
        if nested and len([a for a in args if a is not type(None)]) > 1:
            return False
    return all(_cache_proof(a, True, depth + 1) for a in args)


_BASIC_SCHEMAS: dict[Any, dict[str, str]] = {
    str: {"type": "string"},
    int: {"type": "integer"},
    float: {"type": "number"},
    bool: {"type": "boolean"},
    list: {"type": "array"},
    dict: {"type": "object"},
    type(None): {"type": "null"},
}


def _type_schema(annotation: Any) -> dict[str, Any]:
    """The SDK's _type_to_schema: what a model is told a parameter of this type takes."""
    if annotation == inspect.Parameter.empty:
        return {"type": "string"}
    if annotation is type(None):
        return {"type": "null"}
    if annotation in _BASIC_SCHEMAS:
        return _BASIC_SCHEMAS[annotation].copy()
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Literal:
        schema: dict[str, Any] = {"enum": list(args)}
        if len({type(value) for value in args}) == 1:
            schema.update(_type_schema(type(args[0])))
        return schema
    if origin is typing.Union or origin is types.UnionType:
        # Optional[X] is X; any other union its first type that is not None.
        not_none = [a for a in args if a is not type(None)]
        return _type_schema(not_none[0]) if not_none else {"type": "string"}
    if origin is list:
        schema = {"type": "array"}
        if args:
            schema["items"] = _type_schema(args[0])
        return schema
    if origin is dict:
        schema = {"type": "object"}
        if len(args) >= 2:
            schema["additionalProperties"] = _type_schema(args[1])
        return schema
    return {"type": "string"}  # any other type


def _docstring_params(docstring: str) -> dict[str, str]:
    """The SDK's _parse_docstring_params: each parameter's description in a Google-style
    `Args:` (or `Arguments:`, `Parameters:`) section, up to the next line ending in ':'."""
    params: dict[str, str] = {}
    in_args = False
    current: str | None = None
    words: list[str] = []
    for line in docstring.split("\n"):
        stripped = line.strip()
        if stripped.lower() in ("args:", "arguments:", "parameters:"):
            in_args = True
            continue
        if stripped.lower().endswith(":") and not stripped.startswith(" "):
            if in_args and current:
                params[current] = " ".join(words).strip()
            in_args, current, words = False, None, []
            continue
        if in_args and stripped:
            if ":" in stripped and not stripped.startswith(" "):
                if current:
                    params[current] = " ".join(words).strip()
                name, _, rest = stripped.partition(":")
                name = name.strip()
                current = name.split("(")[0].strip() if "(" in name else name
                words = [rest.strip()]
            elif current:
                words.append(stripped)
    if current:
        params[current] = " ".join(words).strip()
    return params


def _takes_a_payload(func: types.FunctionType) -> bool:
    """A tool agent's function as the SDK takes it without a word
    (_tool_agent_signature_error): `payload`, and optionally `context`."""
    params = inspect.signature(func).parameters
    return "payload" in params and not set(params) - {"payload", "context"}


def _plain_function(func: Any, module: str) -> TypeGuard[types.FunctionType]:
    """Whether the SDK's full load would take ``func`` as a tool of the module, and describe
    it, without running any user code doing so (_resolve_tools, _generate_schema): a plain
    function of the module, with named parameters, plain defaults and annotations of plain
    types (which function_schema then reads as the SDK does)."""
    if type(func) is not types.FunctionType:  # not isinstance: no __class__ of the project's
        return False
    # Each attribute read below of the plain type its reading runs no code of (a str
    # subclass's ==, a dict subclass's keys() would be the project's).
    attributes = (func.__module__, func.__qualname__, func.__dict__, func.__globals__)
    if tuple(map(type, attributes)) != (str, str, dict, dict) or func.__module__ != module:
        return False
    # What inspect.signature would follow, and the marker that makes asyncio (the SDK's
    # is_async) see a coroutine function where inspect does not.
    if {"__wrapped__", "__signature__", "_is_coroutine"} & func.__dict__.keys():
        return False
    if not (func.__doc__ is None or type(func.__doc__) is str):
        return False
    if func.__doc__ is None and "." in func.__qualname__:
        return False  # inspect.getdoc would look for it on an enclosing class
    params = inspect.signature(func).parameters
    for name, param in params.items():
        if param.kind not in (param.POSITIONAL_OR_KEYWORD, param.KEYWORD_ONLY):
            return False
        if name != "context" and not (
            param.default is param.empty or type(param.default) in PLAIN_DEFAULTS
        ):
            return False
    # The SDK evaluates every annotation (get_type_hints): only ones whose evaluation runs no
    # user code, and whose value its schema reads without a word, are taken here. Only an LLM
    # agent's tools have them evaluated here (function_schema, as the SDK would): for such
    # annotations the evaluation has no effect (its names are looked up, each plain), so a
    # hand-over that evaluates one a second time is not seen.
    annotations = func.__annotations__  # a plain function's own dict
    if type(annotations) is not dict:
        return False
    names = {**vars(builtins), **func.__globals__}
    return all(_plain_annotation(a, names) for a in annotations.values())


# What a plain annotation may be made of: classes of the default metaclass (their == and
# hash are type's own), None, and the typing and types constructs over them.
PLAIN_FORMS = (types.GenericAlias, types.UnionType)


def _plain_annotation(annotation: Any, names: Mapping[str, Any], depth: int = 0) -> bool:
    """Whether evaluating ``annotation`` (get_type_hints) runs no user code and gives what
    the SDK's _type_to_schema reads without raising."""
    if depth > 8:
        return False
    if annotation is None or annotation is inspect.Parameter.empty:
        return True
    if type(annotation) is str:
        return _plain_text(annotation, names, depth + 1)
    if type(annotation) is type:
        return True
    if type(annotation) is typing.ForwardRef:
        return _plain_text(annotation.__forward_arg__, names, depth + 1)
    if type(annotation) in PLAIN_FORMS or _of_typing(type(annotation)):
        origin = typing.get_origin(annotation)
        if origin is typing.Literal:
            return all(type(a) in (str, int, bool, type(None)) for a in typing.get_args(annotation))
        # A generic's class (its hash and == are read): of the default metaclass, or abc's,
        # or one of typing's forms.
        if not (origin is None or type(origin) in (type, abc.ABCMeta) or _of_typing(type(origin))):
            return False
        return all(_plain_annotation(a, names, depth + 1) for a in typing.get_args(annotation))
    return False


def _of_typing(cls: type) -> bool:
    """Whether ``cls`` is the typing module's own class of that name (not one that only
    says it is typing's with a __module__ of its own)."""
    return type(cls) is type and vars(typing).get(cls.__name__) is cls


def _builtin(cls: type) -> bool:
    """Whether ``cls`` is the builtins' class of that name (dict, list...)."""
    return type(cls) is type and vars(builtins).get(cls.__name__) is cls


def _plain_text(text: str, names: Mapping[str, Any], depth: int) -> bool:
    """A string annotation: names (looked up, never called), dotted names on the typing
    module, subscripts, `|` and None, each name's value plain."""
    try:
        tree = ast.parse(text, mode="eval").body
    except (SyntaxError, ValueError, RecursionError):
        return False
    return _plain_node(tree, names, depth)


def _plain_node(node: ast.AST, names: Mapping[str, Any], depth: int) -> bool:
    if isinstance(node, ast.Name):
        return node.id in names and _plain_annotation(names[node.id], names, depth + 1)
    if isinstance(node, ast.Attribute):
        base = node.value
        return (
            isinstance(base, ast.Name)
            and names.get(base.id) is typing
            and _plain_annotation(getattr(typing, node.attr, _MISSING), names, depth + 1)
        )
    if isinstance(node, ast.Subscript):
        # Subscripted: a typing construct or a builtin class (dict[...]), whose [] is never
        # the project's __class_getitem__.
        items = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
        if _value_of(node.value, names) is typing.Literal:  # values, not annotations
            return _plain_node(node.value, names, depth) and all(map(_literal_value, items))
        return (
            _plain_node(node.value, names, depth)
            and _generic(_value_of(node.value, names))
            and all(_plain_node(i, names, depth) for i in items)
        )
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        return _plain_node(node.left, names, depth) and _plain_node(node.right, names, depth)
    if isinstance(node, ast.Constant):
        value = node.value
        return value is None or (type(value) is str and _plain_text(value, names, depth + 1))
    return False


def _literal_value(node: ast.AST) -> bool:
    """A value of a Literal[...] as _plain_annotation takes one: a str, int, bool or None,
    written as a constant (a negative number is a unary minus on one)."""
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        node = node.operand
        return isinstance(node, ast.Constant) and type(node.value) is int
    return isinstance(node, ast.Constant) and type(node.value) in (str, int, bool, type(None))


def _value_of(node: ast.AST, names: Mapping[str, Any]) -> Any:
    """What a name or a typing attribute that _plain_node took stands for."""
    if isinstance(node, ast.Name):
        return names.get(node.id, _MISSING)
    if isinstance(node, ast.Attribute):
        return getattr(typing, node.attr, _MISSING)
    return _MISSING


def _generic(value: Any) -> bool:
    if type(value) is type:
        return _builtin(value)
    return _of_typing(type(value))


_MISSING = object()
