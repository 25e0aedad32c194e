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
not do: every agent a tool or sequential agent without guardrails, approvals, MCP servers or
discoverable tools; no middleware, hook or guardrail modules and no `tools/__init__.py`; no
load error and no warning; and nothing at the bundle's top that would shadow a module the
SDK's path imports before user code (there, user code gets the module already imported;
here it could get the bundle's file, and so could the SDK when user code imports it).
"""

from __future__ import annotations

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
from typing import Any

from . import BUNDLE_DEPS_DIR
from .runtime.sdk import SDK

LIGHT_KINDS = ("tool", "sequential")
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
    """A config read as the SDK's pydantic model is read: attributes, nested."""

    def __init__(self, values: Mapping[str, Any]) -> None:
        for name, value in values.items():
            setattr(self, name, _namespaced(value))

    def __repr__(self) -> str:
        return f"Namespace({vars(self)!r})"


def _namespaced(value: Any) -> Any:
    if isinstance(value, dict):
        return Namespace(value)
    if isinstance(value, list):
        return [_namespaced(v) for v in value]
    return value


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
        tool = None
        if kind == "tool":
            if len(agent.tools) != 1 or not agent.tools[0].ref:
                return None, f"agent {config.name!r} has no single custom tool"
            module, _, function = agent.tools[0].ref.rpartition(".")
            path = modules.get(module)
            if path is None:
                return None, f"agent {config.name!r}: tool module {module!r} not found"
            tool = {"module": module, "function": function, "file": str(path)}
        elif agent.tools:
            return None, f"agent {config.name!r} has tools"
        entries.append({"config": config.model_dump(mode="json"), "tool": tool})
    return entries, ""


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

    def agents(self, entries: list[dict[str, Any]]) -> dict[str, LightAgent]:
        """The project's agents, as the SDK's full load would give them, or Fallback."""
        loaded: dict[str, LightAgent] = {}
        for entry in entries:
            config = Namespace(entry["config"])
            tools = []
            if entry["tool"] is not None:
                tools.append(self.tool(entry["tool"]))
            loaded[entry["config"]["name"]] = LightAgent(config=config, tools=tools)
        return loaded

    def tool(self, spec: Mapping[str, str]) -> LightTool:
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
        # the SDK's path, once.
        func = module.__dict__.get(function)
        if not _plain_tool_function(func, f"tools.{module_name}"):
            raise Fallback(f"{module_name}.{function} is not a plain tool function")
        return LightTool(
            name=function,
            ref=f"{module_name}.{function}",
            func=func,
            description=inspect.getdoc(func) or "No description provided.",
            is_async=inspect.iscoroutinefunction(func),
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


def _plain_tool_function(func: Any, module: str) -> bool:
    """Whether the SDK's full load would take ``func`` as a tool agent's function without a
    word, and without running any user code doing so (_resolve_tools, _generate_schema,
    _tool_agent_signature_error): a plain function of the module, with `payload` and
    optionally `context`, plain defaults and annotations of plain types."""
    if type(func) is not types.FunctionType or func.__module__ != module:
        return False
    if "__wrapped__" in func.__dict__ or "__signature__" in func.__dict__:
        return False
    if not (func.__doc__ is None or type(func.__doc__) is str):
        return False
    if func.__doc__ is None and "." in func.__qualname__:
        return False  # inspect.getdoc would look for it on an enclosing class
    params = inspect.signature(func).parameters
    if "payload" not in params or set(params) - {"payload", "context"}:
        return False
    for name, param in params.items():
        if param.kind not in (param.POSITIONAL_OR_KEYWORD, param.KEYWORD_ONLY):
            return False
        if name != "context" and not (
            param.default is param.empty or type(param.default) in PLAIN_DEFAULTS
        ):
            return False
    # The SDK evaluates every annotation (get_type_hints): only ones whose evaluation runs no
    # user code, and whose value its schema reads without a word, are taken here. Nothing is
    # evaluated: for such annotations the evaluation has no effect (its names are looked up,
    # each plain), so a hand-over never evaluates one a second time.
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
    if isinstance(annotation, PLAIN_FORMS) or type(annotation).__module__ == "typing":
        if typing.get_origin(annotation) is typing.Literal:
            return all(type(a) in (str, int, bool, type(None)) for a in typing.get_args(annotation))
        return all(_plain_annotation(a, names, depth + 1) for a in typing.get_args(annotation))
    return False


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


def _value_of(node: ast.AST, names: Mapping[str, Any]) -> Any:
    """What a name or a typing attribute that _plain_node took stands for."""
    if isinstance(node, ast.Name):
        return names.get(node.id, _MISSING)
    if isinstance(node, ast.Attribute):
        return getattr(typing, node.attr, _MISSING)
    return _MISSING


def _generic(value: Any) -> bool:
    if type(value) is type:
        return value.__module__ == "builtins"
    return type(value).__module__ == "typing"


_MISSING = object()
