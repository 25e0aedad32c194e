"""A case's identity across gates, and the hash of everything that can change its outcome.

Identity: the project, the suite's path, the agent and the test name (``case_key``). The
closure hash (``closure_hashes``) covers, for each case:

- every file of the bundle but the suites' YAML: the project root is on the invocations'
  ``sys.path``, so any module or data file may reach any case (a tool importing
  ``lib/pricing.py``, a builder opening a fixture by path); the suites are left out so that
  editing one case does not change every other's hash;
- the case itself: its resolved YAML and the files it names (``definition``, also stored
  alone: a baseline's case is comparable only when that is equal);
- every agent's model mode, the project's guardrail judge model and verdict rule;
- what reaches the invocations from outside the bundle: the project's secrets (by name and
  the digest of their stored ciphertext) and the GATE_CASE_ENV values (``environment_digest``).

Erring wide is the safe side: a hash that changes when nothing relevant did only starts a
new history (no comparison across it, no reuse); one that stayed equal when something
relevant changed would let an incremental gate report a changed case as passed. Not covered:
the service's own version, and what an unpinned requirement resolves to.

Each file is read and hashed once per gate, whatever the number of cases (a bundle is at
most 25 MiB), and a case's hash combines a few digests: linear in the bundle's size.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..bundles.live_models import live_models, reachable_agents
from ..bundles.suites import CaseRef, discover_suites

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


@dataclass(frozen=True)
class Closure:
    """A case's two hashes: ``closure`` (everything that can change its outcome) and
    ``definition`` (the test itself: its resolved YAML and the files it names)."""

    closure: str
    definition: str


def environment_digest(secrets: Iterable[tuple[str, str]], case_env: Mapping[str, str]) -> str:
    """What a case's invocations get from outside the bundle, as one digest: each project
    secret's name and the sha256 of its stored ciphertext (a secret set again changes it, even
    to the same value: erring wide, and no value is read), and the GATE_CASE_ENV names and
    values."""
    return _digest(
        [
            *(f"secret {name} {digest}" for name, digest in sorted(secrets)),
            *(
                f"env {name} {hashlib.sha256(value.encode('utf-8', 'surrogatepass')).hexdigest()}"
                for name, value in sorted(case_env.items())
            ),
        ]
    )


def closure_hashes(
    root: Path,
    cases: Sequence[CaseRef],
    modes: Mapping[str, str],
    *,
    guardrail_model: str | None,
    verdict_rule: str,
    environment: str,
) -> list[Closure]:
    """Each case's hashes, in the order of ``cases`` (see the module)."""
    digests = file_digests(root)
    suites = {path.relative_to(root).as_posix() for path in discover_suites(root)}
    bundle = _digest(f"{rel} {d}" for rel, d in digests.items() if rel not in suites)
    common = _digest(
        [
            "closure v2",
            f"bundle {bundle}",
            *(f"mode {agent} {mode}" for agent, mode in sorted(modes.items())),
            f"guardrail_model {guardrail_model or '-'}",
            f"verdict_rule {verdict_rule}",
            f"environment {environment}",
        ]
    )
    found = []
    for case in cases:
        definition = _digest(
            [
                "definition v1",
                f"case {case.definition}",
                *(f"ref {ref} {digests.get(ref, '-')}" for ref in case.references),
            ]
        )
        found.append(Closure(_digest([common, definition]), definition))
    return found


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
    if agent not in configs:
        return "its agent is unknown"
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
