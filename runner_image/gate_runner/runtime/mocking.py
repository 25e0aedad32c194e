"""Which code runs for a configured phase, the project's or its mock, and the strict flags
that forbid the real one.

A violation is recorded on the runtime as well as raised: it fails the invocation whatever
the run's own status says, even when user code catches the exception.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..mocks import StrictViolation

if TYPE_CHECKING:
    from .port import RuntimePort


def violate(rt: RuntimePort, message: str) -> None:
    rt.violations.append(message)
    raise StrictViolation(message)


def guard(rt: RuntimePort, check: Callable[[], None]) -> None:
    try:
        check()
    except StrictViolation as exc:
        violate(rt, str(exc))


def resolve_phase(
    rt: RuntimePort, kind: str, real: Callable[..., Any] | None, key: str, phase: str
) -> Callable[..., Any] | None:
    """The function that runs a configured phase: its mock if one matches, else the real
    one (unless the phase's strict flag forbids it). A mock never adds a missing phase."""
    if real is None:
        return None
    if kind == "hook":
        mock, strict = rt.mocks.hook(key, phase), rt.mocks.strict.hooks
    else:
        mock, strict = rt.mocks.middleware(phase), rt.mocks.strict.middleware
    if mock is not None:
        return mock
    if strict:
        violate(
            rt,
            f"strict_{kind}_mocks: the real {kind} {phase}() would run for {key}; the "
            "mocks module has no replacement for it",
        )
    return real
