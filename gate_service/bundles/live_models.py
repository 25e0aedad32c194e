"""Which models a gate's cases would call live: read from the bundle before anything is built,
so that a model no key or route can answer ends the gate in validating (the worker checks
them against the project's secrets and routes, gateway/keys.py ``unrouted``).

An LLM agent's mode is the runner's choice (gate_runner/models.py ``choose_model``): the
gate's ``model_mode`` for every agent when the submission forced one, else scripted when
``tests/models/<agent>.py`` exists, replay when ``tests/recordings/<agent>/`` does, else live.
Only live agents call a provider. ``agent_modes`` and ``mode_reason`` are what the worker
stores as the gate's ``model_modes`` and ``model_mode_reason`` when it enters building.

The agents counted are those a selected case can run: its own agent, a sequential agent's
members (recursively) and, when the bundle names ``trigger_agent`` anywhere outside
``tests/`` (an agent's tools, a tool's or a hook's code), every agent of the bundle, since a
trigger may name any of them at run time.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gate_runner.judge import JUDGED_TYPES

from .suites import CaseRef

TRIGGER = b"trigger_agent"
# Model fields of an LLM agent that a run calls with.
MODEL_FIELDS = ("model", "fallback_model")
# The field a LiveModel of the project's judge model names (the project setting's name).
GUARDRAIL_FIELD = "guardrail_model"


@dataclass(frozen=True)
class LiveModel:
    """One model an agent of the gate would call live: ``field`` is ``model``,
    ``fallback_model``, or for a judge model of the agent's judged ``guardrails`` ('input
    prompt_injection') ``guardrail_model`` (the project's) or the rule's own
    ``guardrails.<direction>.<type>.config.model``; ``source`` the agent's YAML file (None
    when the loader had none)."""

    agent: str
    field: str
    model: str
    source: str | None
    guardrails: tuple[str, ...] = ()


def agent_mode(root: Path, agent: str, forced: str | None) -> str:
    """The agent's model mode as the runner chooses it (``choose_model``)."""
    if forced:
        return forced
    if (root / "tests" / "models" / f"{agent}.py").is_file():
        return "scripted"
    if (root / "tests" / "recordings" / agent).is_dir():
        return "replay"
    return "live"


def triggers_agents(root: Path) -> bool:
    """Whether anything of the bundle outside tests/ names trigger_agent: a read of every
    file, so a caller that asks more than once (the worker in validating) asks once and
    hands the answer on as ``triggers``."""
    for path in root.rglob("*"):
        rel = path.relative_to(root)
        if rel.parts[0] == "tests" or not path.is_file():
            continue
        try:
            if TRIGGER in path.read_bytes():
                return True
        except OSError:
            return True  # unread: counted as if it triggered (the check stays sound)
    return False


def reachable_agents(
    root: Path, configs: Mapping[str, Any], start: Iterable[str], triggers: bool | None = None
) -> set[str]:
    """The agents the cases of ``start`` can run (see the module's note); ``triggers``:
    ``triggers_agents(root)`` when the caller has it already."""
    if triggers_agents(root) if triggers is None else triggers:
        return set(configs)
    return _members(configs, start)


def _members(configs: Mapping[str, Any], start: Iterable[str]) -> set[str]:
    """``start``'s agents and, recursively, their sequential members."""
    seen: set[str] = set()
    todo = [name for name in start if name in configs]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        todo.extend(n for n in getattr(configs[name], "agents", None) or [] if n in configs)
    return seen


def _type(config: Any) -> str:
    kind = getattr(config, "type", "llm")
    return str(getattr(kind, "value", kind))


def agent_modes(
    root: Path,
    configs: Mapping[str, Any],
    case_agents: Iterable[str],
    forced: str | None,
    triggers: bool | None = None,
) -> dict[str, str]:
    """Each LLM agent the selected cases can run, with its model mode (``agent_mode``)."""
    return {
        name: agent_mode(root, name, forced)
        for name in sorted(reachable_agents(root, configs, case_agents, triggers))
        if _type(configs[name]) == "llm"
    }


# Agents named per mode in a reason; the rest are counted (the gate's model_modes has all).
NAMED_PER_MODE = 5


def mode_reason(modes: Mapping[str, str], forced: str | None) -> str | None:
    """Why the agents run in ``modes``: None when the submission forced a mode (that is the
    why), else the default rule and the agents it put in each mode."""
    if forced:
        return None
    if not modes:
        return "chosen by default: no selected case reaches an LLM agent, so no model is called"
    parts = []
    for mode in ("scripted", "replay", "live"):
        names = sorted(agent for agent, m in modes.items() if m == mode)
        if not names:
            continue
        shown = ", ".join(names[:NAMED_PER_MODE])
        if len(names) > NAMED_PER_MODE:
            shown += f" and {len(names) - NAMED_PER_MODE} more"
        parts.append(f"{mode}: {shown}")
    return (
        "chosen by default (no model_mode was submitted): an agent with tests/models/<agent>.py "
        "runs scripted, one with tests/recordings/<agent>/ replay, the rest live ("
        + "; ".join(parts)
        + ")"
    )


def live_models(
    root: Path,
    configs: Mapping[str, Any],
    case_agents: Iterable[str],
    forced: str | None,
    guardrail_model: str | None = None,
    triggers: bool | None = None,
) -> list[LiveModel]:
    """Every model an agent the selected cases can run would call live, in agent order: an
    LLM agent's own, and the judge model of each judged guardrail of an agent of any kind
    (the rule's own ``config.model``, else ``guardrail_model``, the project's), which the
    runner asks in the agent's model mode."""
    if forced in ("scripted", "replay"):
        return []  # a forced scripted or replay gate calls no provider
    found: list[LiveModel] = []
    for name in sorted(reachable_agents(root, configs, case_agents, triggers)):
        config = configs[name]
        if agent_mode(root, name, forced) not in ("live", "record"):
            continue
        source = getattr(config, "source_path", None)
        for field in MODEL_FIELDS if _type(config) == "llm" else ():
            model = getattr(config, field, None)
            if isinstance(model, str) and model:
                found.append(LiveModel(name, field, model, source))
        found.extend(_judges(name, config, source, guardrail_model))
    return found


@dataclass(frozen=True)
class JudgedRule:
    """A guardrail rule of a judged type (gate_runner's ``JUDGED_TYPES``): its ``direction``
    (input, output), ``kind`` and own judge ``model`` (its ``config.model``; None: the
    project's guardrail model judges it)."""

    direction: str
    kind: str
    model: str | None

    def __str__(self) -> str:
        return f"{self.direction} {self.kind}"


def judged_guardrails(config: Any) -> tuple[JudgedRule, ...]:
    """The agent's judged guardrail rules, once each in its order."""
    rails = getattr(config, "guardrails", None)
    found: list[JudgedRule] = []
    for direction in ("input", "output"):
        for rule in getattr(rails, direction, None) or []:
            kind = getattr(rule, "type", None)
            if kind not in JUDGED_TYPES:
                continue
            options = getattr(rule, "config", None)
            own = options.get("model") if isinstance(options, Mapping) else None
            item = JudgedRule(direction, str(kind), str(own) if own else None)
            if item not in found:
                found.append(item)
    return tuple(found)


def _judges(
    agent: str, config: Any, source: str | None, guardrail_model: str | None
) -> list[LiveModel]:
    """The judge models of ``agent``'s judged guardrails, one LiveModel each with the rules
    it judges: a rule's own model under its field, the project's under GUARDRAIL_FIELD."""
    rules: dict[tuple[str, str], list[str]] = {}
    for rule in judged_guardrails(config):
        judge = rule.model or guardrail_model
        if judge:
            field = (
                f"guardrails.{rule.direction}.{rule.kind}.config.model"
                if rule.model
                else GUARDRAIL_FIELD
            )
            rules.setdefault((field, judge), []).append(str(rule))
    return [
        LiveModel(agent, field, judge, source, tuple(judged))
        for (field, judge), judged in rules.items()
    ]


# Cases a warning about skipped judged guardrails names; the rest are counted.
CASES_PER_WARNING = 10
UNJUDGED_KEY = "guardrails.judged"


def unjudged_warnings(
    root: Path,
    configs: Mapping[str, Any],
    cases: Sequence[CaseRef],
    forced: str | None,
    guardrail_model: str | None,
    project: str,
    triggers: bool | None = None,
) -> list[dict[str, Any]]:
    """A gate warning for each agent the selected ``cases`` can run whose judged guardrails
    the gate will skip, so they never block: a rule names no judge model of its own and the
    project no ``guardrail_model``, or the agent runs scripted (a scripted model calls no
    judge). Each names the guardrails, the
    selected cases that can run the agent (whose assertions they could change) and the fix."""
    judged = {
        name: rules for name, config in configs.items() if (rules := judged_guardrails(config))
    }
    if not judged:
        return []
    everyone = triggers_agents(root) if triggers is None else triggers
    reach: dict[str, set[str]] = {}
    for case in cases:
        if case.agent_name not in reach:
            reach[case.agent_name] = (
                set(configs) if everyone else _members(configs, [case.agent_name])
            )
    warnings = []
    for name in sorted(judged):
        mode = agent_mode(root, name, forced)
        # A scripted model calls no judge; otherwise a rule with no judge model is skipped.
        skipped = tuple(
            rule
            for rule in judged[name]
            if mode == "scripted" or not (rule.model or guardrail_model)
        )
        its_cases = [f"{c.suite}::{c.test_name}" for c in cases if name in reach[c.agent_name]]
        if skipped and its_cases:
            source = getattr(configs[name], "source_path", None)
            unjudged = _Skipped(project, name, skipped, mode, forced, guardrail_model)
            warnings.append(unjudged.warning(source, its_cases))
    return warnings


@dataclass(frozen=True)
class _Skipped:
    """Agent ``agent``'s judged guardrails ``rules``, which its gate skips."""

    project: str
    agent: str
    rules: tuple[JudgedRule, ...]
    mode: str  # the agent's model mode
    forced: str | None
    judge: str | None  # the project's guardrail model

    def why(self) -> str:
        reasons = []
        if self.mode == "scripted":
            reasons.append(
                "the gate runs every agent scripted (model_mode=scripted)"
                if self.forced == "scripted"
                else f"the agent runs its scripted model tests/models/{self.agent}.py",
            )
            reasons[-1] += ", and a scripted model calls no judge"
        if self._needs_a_judge():
            reasons.append("the project names no guardrail model")
        return "; and ".join(reasons)

    def _needs_a_judge(self) -> bool:
        """Whether naming the project's guardrail model is part of the fix."""
        return self.judge is None and any(rule.model is None for rule in self.rules)

    def fixes(self) -> str:
        fixes = []
        if self._needs_a_judge():
            fixes.append(
                f"name a judge model (PUT /v1/projects/{self.project}/guardrail-model with "
                f'{{"model": MODEL}}, or gate admin guardrail-model-set {self.project} MODEL)'
            )
            if self.mode == "replay":
                fixes[-1] += (
                    f" and record the agent again, so tests/recordings/{self.agent}/ holds "
                    "the judge's verdicts"
                )
        if self.mode == "scripted":
            fixes.append(
                "submit without model_mode=scripted"
                if self.forced == "scripted"
                else "submit with model_mode=live, or model_mode=replay with recordings in "
                f"tests/recordings/{self.agent}/"
            )
        return "; and ".join(fixes)

    def warning(self, source: str | None, cases: list[str]) -> dict[str, Any]:
        kinds = ", ".join(f"{rule.kind} ({rule.direction})" for rule in self.rules)
        shown = cases[:CASES_PER_WARNING]
        more = len(cases) - len(shown)
        listed = ", ".join(shown) + (f" and {more} more" if more else "")
        one = len(self.rules) == 1
        message = (
            f"the judged {'guardrail' if one else 'guardrails'} {kinds} "
            f"{'is' if one else 'are'} skipped in this gate and never "
            f"{'blocks' if one else 'block'}: {self.why()}. Cases whose assertions "
            f"{'it' if one else 'they'} could change: {listed}. To judge "
            f"{'it' if one else 'them'}: {self.fixes()}"
        )
        return {
            "file": source or "agents/",
            "agent": self.agent,
            "key": UNJUDGED_KEY,
            "support": "not_in_gate",
            "message": message,
            "guardrails": [str(rule) for rule in self.rules],
            "cases": shown,
            "more_cases": more,
        }
