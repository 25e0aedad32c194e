"""JSON that keeps the types a builder's context may hold: Decimal, tuple, non-string keys.

A builder's context crosses from the invocation process to the runner as JSON. Plain JSON
would turn Decimal("42.5") into a string, a tuple into a list and int keys into strings, and
assertions would then see another context than build() left (issue 10, rule 5). These few
tagged forms carry them; decoding builds only these plain types, never anything from code.
"""

from __future__ import annotations

from decimal import Decimal, InvalidOperation
from typing import Any

TAGS = ("$decimal", "$tuple", "$dict", "$repr")


def encode(value: Any) -> Any:
    """A JSON-ready form of ``value``; what JSON cannot hold otherwise is kept as its repr."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, Decimal):
        return {"$decimal": str(value)}
    if isinstance(value, tuple):
        return {"$tuple": [encode(v) for v in value]}
    if isinstance(value, list):
        return [encode(v) for v in value]
    if isinstance(value, dict):
        if all(isinstance(k, str) for k in value) and not any(k in TAGS for k in value):
            return {k: encode(v) for k, v in value.items()}
        return {"$dict": [[encode(k), encode(v)] for k, v in value.items()]}
    return {"$repr": repr(value)}


def decode(value: Any) -> Any:
    """The inverse of encode; a malformed tag stays as the plain data it is."""
    if isinstance(value, list):
        return [decode(v) for v in value]
    if not isinstance(value, dict):
        return value
    if len(value) == 1:
        ((tag, inner),) = value.items()
        if tag == "$decimal" and isinstance(inner, str):
            try:
                return Decimal(inner)
            except InvalidOperation:
                return inner
        if tag == "$tuple" and isinstance(inner, list):
            return tuple(decode(v) for v in inner)
        if tag == "$repr" and isinstance(inner, str):
            return inner
        if tag == "$dict" and isinstance(inner, list):
            pairs = [p for p in inner if isinstance(p, list) and len(p) == 2]
            out: dict[Any, Any] = {}
            for k, v in pairs:
                key = decode(k)
                try:
                    out[key] = decode(v)
                except TypeError:  # an unhashable key: keep its text
                    out[repr(key)] = decode(v)
            return out
    return {k: decode(v) for k, v in value.items()}
