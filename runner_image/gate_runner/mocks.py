"""Mocks (spec 8.2, 8.3): `tests/mocks/<name>.py`, resolved by the most specific function.

Tools: `mock_a_b_c` → `mock_a_b` → `mock_a` → `mock` for the ref `a.b.c`. Hooks:
`mock_<path>_hook_before|after` down to `mock_hook_before|after`. Middleware:
`middleware_before|after`. Custom guardrails: `guardrail_<direction>_<name>` →
`guardrail_<direction>` → `guardrail`. A mock replaces a phase that exists; it never adds
one. Each strict flag fails the invocation just before the real code it guards would run.
"""

from __future__ import annotations

import importlib.util
import inspect
import re
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .runtime_errors import AgentRunError

_NON_ALNUM = re.compile(r"[^A-Za-z0-9]+")


class StrictViolation(AgentRunError):
    """A strict flag, or a mocked call's arguments, fail the invocation outright."""


def normalise(ref: str) -> list[str]:
    """`api:weather-v2.lookup` → ["api", "weather_v2", "lookup"]: each segment's runs of
    non-alphanumeric characters become `_`, and nothing is stripped (issue 19, item 8): the
    ref `notes.list_` is looked up as `mock_notes_list_` first, never as the mock of a
    sibling `notes.list`."""
    return [_NON_ALNUM.sub("_", segment) for segment in re.split(r"[.:]", ref)]


@dataclass(frozen=True)
class StrictFlags:
    tools: bool = False
    hooks: bool = False
    middleware: bool = False
    guardrails: bool = False


class Mocks:
    def __init__(self, module: types.ModuleType | None, strict: StrictFlags) -> None:
        self.module = module
        self.strict = strict

    @classmethod
    def load(cls, project: Path, name: str | None, strict: StrictFlags) -> Mocks:
        if not name:
            return cls(None, strict)
        stem = name.removesuffix(".py")
        path = project / "tests" / "mocks" / f"{stem}.py"
        spec = importlib.util.spec_from_file_location(f"gate_mocks_{stem}", path)
        if spec is None or spec.loader is None or not path.is_file():
            raise AgentRunError(f"mocks module tests/mocks/{stem}.py does not exist")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return cls(module, strict)

    def _find(self, *names: str) -> Callable[..., Any] | None:
        if self.module is None:
            return None
        for name in names:
            func = getattr(self.module, name, None)
            if callable(func):
                return func  # type: ignore[no-any-return]
        return None

    def _ladder(self, ref: str, prefix: str, suffix: str) -> list[str]:
        parts = normalise(ref)
        names = [f"{prefix}_{'_'.join(parts[:n])}{suffix}" for n in range(len(parts), 0, -1)]
        return [*names, f"{prefix}{suffix}"]

    def tool(self, ref: str) -> Callable[..., Any] | None:
        return self._find(*self._ladder(ref, "mock", ""))

    def mcp_tool(self, server: str, tool: str) -> Callable[..., Any] | None:
        """An MCP tool's mock: `mock_mcp_<server>_<tool>` → `mock_mcp_<server>` → `mock_mcp`.
        Decided: the catch-all `mock` is not on this ladder, because on the platform it
        covers custom file tools only and a suite's `mock` expects one of those."""
        return self._find(*self._ladder(f"mcp:{server}.{tool}", "mock", "")[:-1])

    def mcp_server_mocked(self, server: str, tools: list[str] | None) -> bool:
        """Whether every call to ``server`` has a mock without knowing its tool list: a
        server-wide mock, or (with a ``tools:`` filter) one for each listed tool."""
        if self._find(*self._ladder(f"mcp:{server}", "mock", "")[:-1]) is not None:
            return True
        return bool(tools) and all(self.mcp_tool(server, name) is not None for name in tools or [])

    def hook(self, ref: str, phase: str) -> Callable[..., Any] | None:
        return self._find(*self._ladder(ref, "mock", f"_hook_{phase}"))

    def middleware(self, phase: str) -> Callable[..., Any] | None:
        return self._find(f"middleware_{phase}")

    def guardrail(self, direction: str, name: str) -> Callable[..., Any] | None:
        key = "_".join(normalise(name))
        return self._find(f"guardrail_{direction}_{key}", f"guardrail_{direction}", "guardrail")


_SIMPLE = {str: "string", int: "integer", float: "number", bool: "boolean", list: "array",
           dict: "object"}  # fmt: skip


def _type_ok(value: Any, annotation: Any) -> bool:
    if annotation is inspect.Parameter.empty or annotation is Any:
        return True
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        return any(_type_ok(value, arg) for arg in typing.get_args(annotation))
    if annotation is type(None):
        return value is None
    target = origin or annotation
    if target is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if target is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if target in _SIMPLE:
        return isinstance(value, target)
    return True  # a type we do not check


def check_arguments(func: Callable[..., Any], params: dict[str, Any], ref: str) -> None:
    """A mocked call must still fit the real function (spec §8.2)."""
    try:
        signature = inspect.signature(func)
        hints = typing.get_type_hints(func)
    except (TypeError, ValueError, NameError):
        return
    accepted = {n: p for n, p in signature.parameters.items() if n != "context"}
    problems = []
    for name, param in accepted.items():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        if name not in params and param.default is inspect.Parameter.empty:
            problems.append(f"missing required argument {name!r}")
        elif name in params and not _type_ok(params[name], hints.get(name, param.annotation)):
            wanted = hints.get(name, param.annotation)
            problems.append(
                f"argument {name!r} should be {getattr(wanted, '__name__', wanted)}, "
                f"got {type(params[name]).__name__}"
            )
    if not any(p.kind == p.VAR_KEYWORD for p in signature.parameters.values()):
        unknown = sorted(set(params) - set(accepted))
        problems += [f"unknown argument {name!r}" for name in unknown]
    if problems:
        raise StrictViolation(
            f"mocked call to {ref} does not fit its signature: " + "; ".join(problems)
        )
