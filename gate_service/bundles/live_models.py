"""Which models a gate's cases would call live: read from the bundle before anything is built,
so that a model no key or route can answer ends the gate in validating (the worker checks
them against the project's secrets and routes, gateway/keys.py ``unrouted``).

An LLM agent's mode is the runner's choice (gate_runner/models.py ``choose_model``): the
gate's ``model_mode`` for every agent when the submission forced one, else scripted when
``tests/models/<agent>.py`` exists, replay when ``tests/recordings/<agent>/`` does, else live.
Only live agents call a provider.

The agents counted are those a selected case can run: its own agent, a sequential agent's
members (recursively) and, when the bundle names ``trigger_agent`` anywhere outside
``tests/`` (an agent's tools, a tool's or a hook's code), every agent of the bundle, since a
trigger may name any of them at run time.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

TRIGGER = b"trigger_agent"
# Model fields of an LLM agent that a run calls with.
MODEL_FIELDS = ("model", "fallback_model")


@dataclass(frozen=True)
class LiveModel:
    """One model an agent of the gate would call live: ``field`` is ``model`` or
    ``fallback_model``; ``source`` the agent's YAML file (None when the loader had none)."""

    agent: str
    field: str
    model: str
    source: str | None


def agent_mode(root: Path, agent: str, forced: str | None) -> str:
    """The agent's model mode as the runner chooses it (``choose_model``)."""
    if forced:
        return forced
    if (root / "tests" / "models" / f"{agent}.py").is_file():
        return "scripted"
    if (root / "tests" / "recordings" / agent).is_dir():
        return "replay"
    return "live"


def _triggers_agents(root: Path) -> bool:
    """Whether anything of the bundle outside tests/ names trigger_agent."""
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


def reachable_agents(root: Path, configs: Mapping[str, Any], start: Iterable[str]) -> set[str]:
    """The agents the cases of ``start`` can run (see the module's note)."""
    if _triggers_agents(root):
        return set(configs)
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


def live_models(
    root: Path, configs: Mapping[str, Any], case_agents: Iterable[str], forced: str | None
) -> list[LiveModel]:
    """Every model an agent the selected cases can run would call live, in agent order."""
    if forced in ("scripted", "replay"):
        return []  # a forced scripted or replay gate calls no provider
    found: list[LiveModel] = []
    for name in sorted(reachable_agents(root, configs, case_agents)):
        config = configs[name]
        if _type(config) != "llm" or agent_mode(root, name, forced) not in ("live", "record"):
            continue
        for field in MODEL_FIELDS:
            model = getattr(config, field, None)
            if isinstance(model, str) and model:
                source = getattr(config, "source_path", None)
                found.append(LiveModel(name, field, model, source))
    return found
