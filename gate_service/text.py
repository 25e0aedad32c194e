"""Text a client sends that Postgres must store: no NUL, no lone UTF-16 surrogate."""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator


def unstorable(text: str) -> str | None:
    """Why Postgres cannot store ``text``, or None when it can."""
    if "\x00" in text:
        return "a NUL character (\\u0000)"
    for ch in text:
        if "\ud800" <= ch <= "\udfff":
            return f"a lone UTF-16 surrogate (\\u{ord(ch):04x}), which is not a character"
    return None


def _storable(value: str) -> str:
    why = unstorable(value)
    if why:
        raise ValueError(f"the text holds {why}")
    return value


# A request model's str field that reaches the database: a 422 names what is wrong instead
# of the insert failing.
StorableStr = Annotated[str, AfterValidator(_storable)]
