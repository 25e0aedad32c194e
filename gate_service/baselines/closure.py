"""A case's identity across gates, and the hash of everything that can change its outcome.

Identity: the project, the suite's path, the agent and the test name (``case_key``). The
closure hash (``closure_hashes``) covers, for each case:

- the case as resolved with its suite's defaults, and the files it names (fixtures, its
  builder, its mocks module);
- every agent it can run (its own, a sequential agent's members, and every agent when the
  bundle names ``trigger_agent``: bundles/live_models.py ``reachable_agents``): each one's
  YAML, ``middleware/<agent>.py``, ``hooks/<agent>.py``, its scripted model
  ``tests/models/<agent>.py`` or recordings ``tests/recordings/<agent>/``, and its model mode;
- what every agent may import or read, so is counted for all: ``tools/``, ``guardrails/``,
  ``schemas/``, helpers (``middleware/_*.py``, ``hooks/_*.py``), every ``_defaults.yaml``
  and ``requirements.txt``;
- the project's guardrail judge model.

Model names are in the agents' YAML. Erring wide is the safe side: a hash that changes when
nothing relevant did only starts a new history (no comparison, no reuse); one that stayed
equal when something relevant changed would compare or reuse the wrong thing.

Each file is read and hashed once per gate, whatever the number of cases (a bundle is at
most 25 MiB), and a case's hash combines a few digests: linear in the bundle's size.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ..bundles.live_models import live_models, reachable_agents
from ..bundles.suites import CaseRef

SHARED_DIRS = ("tools", "guardrails", "schemas")
READ_CHUNK = 1024 * 1024


def case_key(suite: str, agent_name: str, test_name: str) -> str:
    """The sha256 of a case's identity within its project (NUL-separated: no name holds one,
    since stored text refuses NUL)."""
    return hashlib.sha256(
        "\0".join((suite, agent_name, test_name)).encode("utf-8", "surrogatepass")
    ).hexdigest()


def _digest(parts: Iterable[str]) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(part.encode("utf-8", "surrogatepass"))
        h.update(b"\n")
    return h.hexdigest()


def file_digests(root: Path) -> dict[str, str]:
    """Every regular file of the bundle by its POSIX path, with the sha256 of its bytes."""
    digests: dict[str, str] = {}
    for path in sorted(root.rglob("*")):
        if not path.is_file() or path.is_symlink():
            continue
        h = hashlib.sha256()
        with open(path, "rb") as file:
            while chunk := file.read(READ_CHUNK):
                h.update(chunk)
        digests[path.relative_to(root).as_posix()] = h.hexdigest()
    return digests


def _shared(rel: str) -> bool:
    parts = rel.split("/")
    if parts[0] in SHARED_DIRS or rel == "requirements.txt":
        return True
    if parts[0] in ("middleware", "hooks") and parts[-1].startswith("_"):
        return True
    return parts[0] == "agents" and parts[-1] in ("_defaults.yaml", "_defaults.yml")


def _agent_files(rel: str, agent: str, source: str | None) -> bool:
    return (
        rel == source
        or rel in (f"middleware/{agent}.py", f"hooks/{agent}.py", f"tests/models/{agent}.py")
        or rel.startswith(f"tests/recordings/{agent}/")
    )


def closure_hashes(
    root: Path,
    configs: Mapping[str, Any],
    cases: Sequence[CaseRef],
    modes: Mapping[str, str],
    *,
    guardrail_model: str | None,
    triggers: bool | None,
) -> list[str]:
    """Each case's closure hash, in the order of ``cases`` (see the module)."""
    digests = file_digests(root)
    shared = _digest(f"{rel} {d}" for rel, d in digests.items() if _shared(rel))
    by_agent: dict[str, str] = {}

    def agent_digest(agent: str) -> str:
        if agent not in by_agent:
            config = configs.get(agent)
            source = getattr(config, "source_path", None)
            files = (f"{rel} {d}" for rel, d in digests.items() if _agent_files(rel, agent, source))
            by_agent[agent] = _digest([f"agent {agent} mode {modes.get(agent, '-')}", *files])
        return by_agent[agent]

    reached: dict[str, list[str]] = {}
    hashes = []
    for case in cases:
        if case.agent_name not in reached:
            reached[case.agent_name] = sorted(
                reachable_agents(root, configs, [case.agent_name], triggers)
            )
        hashes.append(
            _digest(
                [
                    "closure v1",
                    f"case {case.definition}",
                    *(f"ref {ref} {digests.get(ref, '-')}" for ref in case.references),
                    *(f"agent {agent_digest(a)}" for a in reached[case.agent_name]),
                    f"shared {shared}",
                    f"guardrail_model {guardrail_model or '-'}",
                ]
            )
        )
    return hashes


def why_not_reusable(
    root: Path,
    configs: Mapping[str, Any],
    agent: str,
    model_mode: str | None,
    guardrail_model: str | None,
    triggers: bool | None,
) -> str | None:
    """Why a case of ``agent`` may not be reused from a baseline by an incremental gate, or
    None when its inputs are deterministic: no agent it can run calls a model live (its own,
    a fallback, a guardrail's judge) and none reaches outside the bundle (MCP servers,
    ``api:`` tools, web pages), whose answers may change while the bundle does not."""
    live = live_models(root, configs, [agent], model_mode, guardrail_model, triggers)
    if live:
        return f"agent {live[0].agent!r} calls {live[0].model} live"
    for name in sorted(reachable_agents(root, configs, [agent], triggers)):
        config = configs[name]
        if getattr(config, "mcp_servers", None):
            return f"agent {name!r} has MCP servers"
        refs = [*(getattr(config, "tools", None) or [])]
        refs += getattr(config, "discoverable_tools", None) or []
        for ref in refs:
            text = ref if isinstance(ref, str) else json.dumps(ref, default=str)
            if "api:" in text:
                return f"agent {name!r} calls API tools"
            if "web_read_page" in text:
                return f"agent {name!r} reads web pages"
    return None
