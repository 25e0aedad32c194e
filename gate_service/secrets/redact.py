"""Redaction: every secret value that reached a case becomes `[REDACTED:NAME]` before storage.

One function does it for everything stored or returned for a case (the runner's result,
stored failure reasons). It matches values exactly; a bundle that encodes or splits a value
gets it past this, which docs/threat-model.md says plainly. Where two values overlap in a text (one
ends with what the other starts with), the leftmost is replaced whole and the other from
where it ends.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import fields, replace
from typing import Any, TypeVar

from ahocorasick_rs import AhoCorasick, MatchKind

from gate_runner.contract import CaseResult, Invocation, Span

from ..runner_contract import UntrustedResult

# Values shorter than this are passed to the case but not redacted: replacing "1", "on" or
# "eu" everywhere would garble every output and trace while hiding nothing worth hiding (a
# value that short is guessed in a few thousand tries anyway).
MIN_REDACTED_LENGTH = 4


# In a Python string every code point in this range is a lone surrogate (a valid pair is one
# code point); stored results show it as U+FFFD.
SURROGATE = re.compile("[\ud800-\udfff]")


def marker(name: str) -> str:
    return f"[REDACTED:{name}]"


def _without_surrogates(value: str) -> str:
    return SURROGATE.sub("\ufffd", value)


class Redactor:
    """Replaces the values of ``secrets`` (name -> value) in strings, lists and dicts.

    One Aho-Corasick automaton over every value (BurntSushi's aho-corasick, through
    ahocorasick-rs), matching leftmost-longest: linear in the text whatever the number and
    size of the values, so a result cannot make redaction slow, and a value that contains
    another is replaced whole. Replacing from the matches' positions means a marker just
    written is never searched again.
    """

    def __init__(self, secrets: Mapping[str, str]) -> None:
        by_value: dict[str, str] = {}
        for name in sorted(secrets):  # a value held by two names gets the first name
            value = _without_surrogates(secrets[name])
            if len(value) >= MIN_REDACTED_LENGTH:
                by_value.setdefault(value, name)
        self._values = list(by_value)
        self._markers = [marker(by_value[v]) for v in self._values]
        self._matcher = (
            AhoCorasick(self._values, matchkind=MatchKind.LeftmostLongest) if self._values else None
        )

    def __bool__(self) -> bool:
        return self._matcher is not None

    def text(self, value: str) -> str:
        if self._matcher is None:
            return value
        try:
            matches = self._matcher.find_matches_as_indexes(value)
        except UnicodeEncodeError:  # a lone surrogate, which the matcher's strings cannot hold
            value = _without_surrogates(value)
            matches = self._matcher.find_matches_as_indexes(value)
        if not matches:
            return value
        parts: list[str] = []
        last = 0
        for index, start, end in matches:  # in order, never overlapping
            parts += (value[last:start], self._markers[index])
            last = end
        parts.append(value[last:])
        return "".join(parts)

    def __call__(self, value: Any) -> Any:
        """``value`` with every secret replaced, in dict keys and values, lists and strings."""
        if self._matcher is None:
            return value
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, list | tuple):
            return [self(v) for v in value]
        if isinstance(value, dict):
            return {self(k): self(v) for k, v in value.items()}
        return value


def redact(value: Any, secrets: Mapping[str, str]) -> Any:
    """``value`` with each secret's value replaced by `[REDACTED:NAME]` (see Redactor)."""
    return Redactor(secrets)(value)


_Shape = TypeVar("_Shape", Span, Invocation, CaseResult)


def _redacted(redactor: Redactor, shape: _Shape, *, keep: tuple[str, ...] = ()) -> _Shape:
    """``shape`` with every field but ``keep`` redacted, its field names kept (a secret must
    not rename `status`)."""
    changes = {
        f.name: redactor(getattr(shape, f.name)) for f in fields(shape) if f.name not in keep
    }
    return replace(shape, **changes)


def redact_result(result: CaseResult, redactor: Redactor) -> CaseResult:
    """The runner's result with every secret redacted: outputs, inputs, errors, reasons,
    failed assertions, run context and every span (metadata and log spans included).

    UntrustedResult when it nests too deeply to walk: then nothing of it is stored.
    """
    if not redactor:
        return result
    try:
        invocations = [
            replace(
                _redacted(redactor, inv, keep=("traces",)),
                traces=[_redacted(redactor, span) for span in inv.traces],
            )
            for inv in result.invocations
        ]
        redacted = _redacted(redactor, result, keep=("invocations", "nonce"))
    except RecursionError:
        raise UntrustedResult("the result nests too deeply to redact its secrets") from None
    return replace(redacted, invocations=invocations)
