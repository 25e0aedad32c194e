"""Guardrails (spec §4.3): the built-in `regex` and `pii` checks, `moderation` through the
model gateway (live) or its recordings (replay), the judged types through a judge model
(judge.py), and custom ones.

A rule checks a content string and answers passed / blocked / warned / redacted. A check that
needs a provider the run has none for (scripted mode; a judged type without a judge model) is
recorded as skipped rather than silently passed.
"""

from __future__ import annotations

import re
import time
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .judge import JUDGED_TYPES, JudgeVerdict
from .runtime_errors import AgentRunError

# Deliberately simple, documented patterns: a gate must be predictable more than clever.
# Compiled when a pii guardrail first runs (in re's own cache): most cases have none, and compiling
# these at import was a millisecond or two of every case container's start.
PII_PATTERNS: dict[str, str] = {
    "email": r"[A-Za-z0-9._%+-]+@[A-Za-z0-9.-]+\.[A-Za-z]{2,}",
    "phone": r"(?<!\w)\+?\d[\d\s().-]{7,}\d(?!\w)",
    "ssn": r"\b\d{3}-\d{2}-\d{4}\b",
    "credit_card": r"\b(?:\d[ -]?){13,19}\b",
    "iban": r"\b[A-Z]{2}\d{2}[A-Z0-9]{11,30}\b",
    "ip_address": r"\b(?:\d{1,3}\.){3}\d{1,3}\b",
    "api_key": r"\b(?:sk|pk|rk|cnc|ghp|xox[abp])[-_][A-Za-z0-9_-]{16,}\b",
}
PII_INPUT_DEFAULT = tuple(PII_PATTERNS)
PII_OUTPUT_DEFAULT = ("ssn", "credit_card", "api_key")  # pii_leakage's defaults
MODERATION_THRESHOLD = 0.7  # spec 4.3's default
# (text, moderation model) -> {"flagged", "categories", "category_scores"}; None: the agent's
# model mode has no moderation (scripted), so the rule is recorded skipped.
Moderate = Callable[[str, str], dict[str, Any]]


# A judged rule's verdict and what its span shows (judge model, tokens, ...).
Judged = tuple[JudgeVerdict, dict[str, Any]]


@dataclass(frozen=True)
class Judging:
    """How the judged types (judge.py) are checked in this run: ``ask(kind, config, text)``
    gives the judge's verdict, or why the rule is skipped; without ``ask`` every such rule is
    skipped, for ``unavailable``."""

    ask: Callable[[str, Mapping[str, Any], str], Judged | str] | None
    unavailable: str = ""


NO_JUDGE = Judging(None, "it needs a judge model, and the project names none")


@dataclass
class Verdict:
    status: str  # passed | blocked | warned | redacted | skipped
    content: str
    message: str | None = None
    detail: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict)  # for the rule's span


def _luhn(digits: str) -> bool:
    total, parity = 0, len(digits) % 2
    for i, ch in enumerate(digits):
        d = int(ch)
        if i % 2 == parity:
            d *= 2
            if d > 9:
                d -= 9
        total += d
    return total % 10 == 0


def pii_findings(text: str, entities: tuple[str, ...]) -> list[tuple[str, str]]:
    found = []
    for entity in entities:
        if entity not in PII_PATTERNS:
            raise AgentRunError(f"pii guardrail: unknown entity {entity!r}")
        for match in re.finditer(PII_PATTERNS[entity], text):
            value = match.group(0)
            if entity == "credit_card" and not _luhn(re.sub(r"\D", "", value)):
                continue
            found.append((entity, value))
    return found


def check_rule(
    rule: Any,
    direction: str,
    content: str,
    context: dict[str, Any],
    custom: Callable[[str], Callable[..., Any] | None],
    call: Callable[..., Any],
    moderate: Moderate | None = None,
    judging: Judging = NO_JUDGE,
) -> Verdict:
    kind, mode, config = rule.type, rule.mode, dict(rule.config or {})
    configured = config.get("rejection_message")
    if kind == "topic_restriction":
        configured = configured or config.get("off_topic_message")
    rejection = configured or f"Request blocked by the {kind} guardrail."
    if kind in JUDGED_TYPES:
        answer = judging.ask(kind, config, content) if judging.ask else judging.unavailable
        if isinstance(answer, str):
            return Verdict("skipped", content, f"{kind}: {answer}")
        verdict, metadata = answer
        if not verdict.violation:
            return Verdict("passed", content, verdict.reason or None, metadata=metadata)
        found = _violation(mode, content, rejection, f"{kind}: {verdict.reason or 'violation'}")
        found.metadata = metadata
        return found
    if kind == "moderation":
        return _moderation(config, mode, content, rejection, moderate)
    if kind == "regex":
        for entry in config.get("patterns") or []:
            pattern = entry.get("pattern") if isinstance(entry, Mapping) else str(entry)
            if pattern and re.search(pattern, content):
                message = entry.get("message") if isinstance(entry, Mapping) else None
                return _violation(mode, content, configured or message or rejection, message)
        return Verdict("passed", content)
    if kind in ("pii", "pii_leakage"):
        default = PII_OUTPUT_DEFAULT if kind == "pii_leakage" else PII_INPUT_DEFAULT
        findings = pii_findings(content, tuple(config.get("entities") or default))
        if not findings:
            return Verdict("passed", content)
        if mode == "redact":
            redacted = content
            for entity, value in findings:
                redacted = redacted.replace(value, f"[{entity.upper()}_REDACTED]")
            return Verdict("redacted", redacted, f"redacted {len(findings)} value(s)")
        return _violation(mode, content, rejection, f"found {findings[0][0]}")
    if kind == "custom":
        check = custom(rule.name)
        if check is None:
            raise AgentRunError(
                f"custom guardrail {rule.name!r}: guardrails/{rule.name}.py not found"
            )
        try:
            result = call(check, content, context)
        except Exception:
            # Spec §4.3: an exception counts as a violation handled by the rule's mode.
            return _violation(mode, content, rejection, traceback.format_exc(limit=3))
        passed = getattr(result, "passed", None)
        if passed is None:
            raise AgentRunError(
                f"custom guardrail {rule.name!r}: check() must return a GuardrailResult"
            )
        if passed:
            return Verdict("passed", content)
        # The configured rejection message is what the caller sees; the check's own message
        # is the detail the trace keeps.
        detail = getattr(result, "message", None)
        return _violation(mode, content, configured or detail or rejection, detail)
    raise AgentRunError(f"guardrail type {kind!r} is not known")


def _moderation(
    config: dict[str, Any],
    mode: str,
    content: str,
    rejection: str,
    moderate: Moderate | None,
) -> Verdict:
    """OpenAI's moderation endpoint through the model gateway (live, record) or its recording
    (replay): a violation when a category's score reaches ``threshold`` (0.7), among
    ``categories`` when given, else among all. Scripted mode calls no provider: skipped."""
    provider = str(config.get("provider") or "openai")
    if provider != "openai":
        return Verdict(
            "skipped", content, f"moderation provider {provider!r} is not called in a gate"
        )
    if moderate is None:
        return Verdict("skipped", content, "moderation needs a provider: scripted mode calls none")
    threshold = float(config.get("threshold", MODERATION_THRESHOLD))
    from .gateway_wire import DEFAULT_MODERATION_MODEL

    model = str(config.get("model") or DEFAULT_MODERATION_MODEL)
    verdict = moderate(content, model)
    scores: dict[str, float] = verdict["category_scores"]
    wanted = [str(c) for c in config.get("categories") or []] or sorted(scores)
    over = [(c, scores[c]) for c in wanted if scores.get(c, 0.0) >= threshold]
    if not over:
        return Verdict("passed", content)
    found = ", ".join(f"{c} {score:.2f}" for c, score in over)
    return _violation(mode, content, rejection, f"moderation: {found} (threshold {threshold:g})")


def _violation(mode: str, content: str, message: str, detail: str | None = None) -> Verdict:
    if mode == "warn":
        return Verdict("warned", content, detail or message)
    return Verdict("blocked", content, message, detail)


class GuardrailBlocked(Exception):
    """A block-mode guardrail stopped the run; ``message`` replaces the output."""

    def __init__(self, message: str, *, fail_run: bool, direction: str) -> None:
        super().__init__(message)
        self.message = message
        self.fail_run = fail_run
        self.direction = direction


def run_rules(
    rules: list[Any],
    direction: str,
    content: str,
    context: dict[str, Any],
    *,
    custom: Callable[[str], Callable[..., Any] | None],
    call: Callable[..., Any],
    record: Callable[[str, str, str, str | None, int, dict[str, Any]], None],
    moderate: Moderate | None = None,
    judging: Judging = NO_JUDGE,
) -> str:
    """Apply every rule in order; returns the (possibly redacted) content or raises blocked."""
    for rule in rules:
        started = time.monotonic()
        verdict = check_rule(rule, direction, content, context, custom, call, moderate, judging)
        name = rule.name or rule.type
        record(
            name,
            direction,
            verdict.status,
            verdict.detail or verdict.message,
            int((time.monotonic() - started) * 1000),
            verdict.metadata,
        )
        if verdict.status == "blocked":
            fail_run = bool((rule.config or {}).get("fail_run", False))
            raise GuardrailBlocked(
                verdict.message or "blocked", fail_run=fail_run, direction=direction
            )
        content = verdict.content
    return content
