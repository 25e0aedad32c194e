"""A gate's ``baseline`` as a submission names it: a gate id, or ``label:key=value`` (the
project's last passing gate with that label). Checked at submission, plain parsing only."""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from ..errors import BadRequest
from ..text import unstorable

MAX_BASELINE_CHARS = 300
LABEL_PREFIX = "label:"


@dataclass(frozen=True)
class BaselineSpec:
    gate_id: uuid.UUID | None = None
    label_key: str | None = None
    label_value: str | None = None

    def describe(self) -> str:
        if self.gate_id is not None:
            return f"gate {self.gate_id}"
        return f"the last passing gate labelled {self.label_key}={self.label_value}"


def parse_baseline(raw: str) -> BaselineSpec:
    """``raw`` as a BaselineSpec; BadRequest (what, and the two forms) for anything else."""
    if len(raw) > MAX_BASELINE_CHARS:
        raise BadRequest(f"baseline must be at most {MAX_BASELINE_CHARS} characters")
    why = unstorable(raw)
    if why:
        raise BadRequest(f"baseline holds {why}")
    if raw.startswith(LABEL_PREFIX):
        key, sep, value = raw[len(LABEL_PREFIX) :].partition("=")
        if not sep or not key:
            raise BadRequest(
                f"baseline {raw[:60]!r} must look like label:key=value (e.g. label:branch=main)"
            )
        return BaselineSpec(label_key=key, label_value=value)
    try:
        return BaselineSpec(gate_id=uuid.UUID(raw))
    except ValueError:
        raise BadRequest(
            f"baseline {raw[:60]!r} is neither a gate id nor label:key=value "
            "(e.g. baseline=label:branch=main)"
        ) from None
