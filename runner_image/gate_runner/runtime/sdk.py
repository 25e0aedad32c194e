"""The SDK's names the runtime needs, looked up only once something has imported the SDK.

A case whose project never imports `connic` does not pay for its import (with pydantic's,
the larger part of a case container's start): the runtime imports it only on the SDK's
loading path (case.py). User code can raise the SDK's StopProcessing or AbortTool only after
importing `connic`, so while it is not imported no exception is one of them.

`after_sdk_import` is how the runtime still patches ``connic.tools`` (triggers.py) before
user code binds its names, when the SDK is imported late: by a project module that the
plan did not see import it, or by one of the bundle's dependencies.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # importlib.abc imports importlib.resources: a cost each case would pay
    from importlib.abc import Loader
    from importlib.machinery import ModuleSpec

SDK = "connic"


class _NeverRaised(Exception):
    """Stands for an SDK exception class while the SDK is not imported: nothing raises it."""


def sdk_class(name: str) -> type[BaseException]:
    """The SDK's exception class ``name`` if the SDK is imported, else one never raised."""
    found = getattr(sys.modules.get(SDK), name, None)
    if isinstance(found, type) and issubclass(found, BaseException):
        return found
    return _NeverRaised


def stop_processing() -> type[BaseException]:
    return sdk_class("StopProcessing")


def abort_tool() -> type[BaseException]:
    return sdk_class("AbortTool")


class _Announcing:
    """The SDK's own loader, then ``then()`` once the package has executed."""

    def __init__(self, loader: Loader, watch: _SdkWatch) -> None:
        self.loader, self.watch = loader, watch

    def create_module(self, spec: ModuleSpec) -> ModuleType | None:
        return self.loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        # The package sees its own loader, as if this one were never there.
        module.__loader__ = self.loader
        if module.__spec__ is not None:
            module.__spec__.loader = self.loader
        self.loader.exec_module(module)
        self.watch.imported()


class _SdkWatch:
    """A meta path finder (by protocol) that announces the SDK's import: its execution, not
    a mere lookup (importlib.util.find_spec), which leaves the watch in place."""

    def __init__(self, then: Callable[[], None]) -> None:
        self.then, self.done = then, False

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        if fullname != SDK or self.done:
            return None
        for finder in sys.meta_path:  # the others, in their order, as if this were not here
            if finder is self:
                continue
            find = getattr(finder, "find_spec", None)
            spec: ModuleSpec | None = find(fullname, path, target) if find is not None else None
            if spec is not None:
                if spec.loader is not None:
                    spec.loader = _Announcing(spec.loader, self)  # type: ignore[assignment]
                return spec
        return None

    def imported(self) -> None:
        if self.done:
            return
        self.done = True
        with contextlib.suppress(ValueError):  # user code may have rebuilt sys.meta_path
            sys.meta_path.remove(self)
        self.then()


def after_sdk_import(then: Callable[[], Any]) -> None:
    """Call ``then()`` now if the SDK is imported, else right after whatever imports it."""
    if SDK in sys.modules:
        then()
    else:
        sys.meta_path.insert(0, _SdkWatch(then))
