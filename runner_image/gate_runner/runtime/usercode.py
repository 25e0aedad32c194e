"""Calling the project's own functions, which may be sync or async."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any


def call_user_function(func: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Call sync or async user code and return its result."""
    result = func(*args, **kwargs)
    if inspect.isawaitable(result):
        import asyncio  # here: sync user code never pays for its import

        async def _await() -> Any:
            return await result

        return asyncio.run(_await())
    return result


def accepts(func: Callable[..., Any], name: str) -> bool:
    """Whether a user function declares a parameter called ``name`` (``context``, mostly)."""
    try:
        return name in inspect.signature(func).parameters
    except (TypeError, ValueError):
        return False
