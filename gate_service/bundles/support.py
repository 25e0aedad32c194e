"""What a gate does with each agent field, predefined tool and guardrail type of the format
(issue 21): supported as the platform runs it, partial (it runs, and what differs), or not
in a gate (and why). docs/support.md's table is this table; a bundle whose agents use a
partial or not-in-a-gate item gets a warning naming file, agent and key, so a pass is never
silently partial.

tests/unit/test_support_table.py walks the SDK's AgentConfig, so a field a later SDK adds
that this table does not cover fails there.
"""

from __future__ import annotations

import ast
from collections.abc import Mapping, Set
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

Status = Literal["supported", "partial", "not_in_gate"]


@dataclass(frozen=True, slots=True)
class Support:
    status: Status
    note: str = ""


def _table(rows: Mapping[str, tuple[Status, str]]) -> dict[str, Support]:
    return {key: Support(status, note) for key, (status, note) in rows.items()}


NO_BROWSER = (
    "no browser in a gate: every call fails, and the model is offered the tool without parameters"
)
NO_FILES = (
    "no file store in a gate: every call fails, and the model is offered the tool without "
    "parameters"
)


def _judged(what: str) -> str:
    """A judged guardrail type's note: ``what`` the judge model checks the text for."""
    return (
        f"judged {what} by the rule's config.model or else the project's guardrail model "
        "(PUT /v1/projects/{name}/guardrail-model), with the gate's own prompt "
        "(docs/judged-guardrails.md) and a strict JSON verdict: through the model gateway in "
        "live and record mode, from recordings in replay; skipped (never blocks, and the gate "
        "warns) without a judge model or when the agent's model is scripted; the platform's "
        "own check may judge the same text differently"
    )


# Every field of connic.core.AgentConfig, in the SDK's order.
AGENT_FIELDS: Mapping[str, Support] = _table(
    {
        "version": (
            "supported",
            'checked by the SDK loader: must be "1.0"',
        ),
        "name": (
            "supported",
            "the agent's identity: suites, children and sequential stages find it by name",
        ),
        "description": (
            "supported",
            "metadata only; nothing in a run depends on it",
        ),
        "type": (
            "supported",
            "llm, tool and sequential agents each run",
        ),
        "model": (
            "supported",
            (
                "used by scripted, replay and live models; live calls need the provider's key or a"
                " model route, so connic/ managed models need a route"
            ),
        ),
        "voice_config": (
            "not_in_gate",
            (
                "voice is not simulated: the agent runs as a text LLM agent and every voice "
                "setting is ignored"
            ),
        ),
        "fallback_model": (
            "supported",
            (
                "after a failed primary request (tried once) the fallback gets "
                "retry_options.attempts and answers the rest of the run; the run context gets "
                "fallback_model_used"
            ),
        ),
        "system_prompt": (
            "supported",
            "sent as the system message, with {var} placeholders filled from the run context",
        ),
        "temperature": (
            "supported",
            "sent with every model call and part of the replay key",
        ),
        "tools": (
            "supported",
            (
                "custom and predefined tools run, with conditions, hooks and mocks; see each "
                "predefined tool, and api: tools below"
            ),
        ),
        "discoverable_tools": (
            "supported",
            (
                "found by search_tools (shared words of name, ref and description) and run "
                "through use_tool like a listed tool; assertions see each under its own name"
            ),
        ),
        "agents": (
            "supported",
            "the stages run in order, each fed the previous stage's output",
        ),
        "tool_name": (
            "supported",
            (
                "the tool agent's function is called with payload (and context), with hooks and "
                "mocks around it"
            ),
        ),
        "database": (
            "not_in_gate",
            (
                "access rules are not enforced: db_* tools may read, write and delete any "
                "collection of the in-memory store"
            ),
        ),
        "retrieval": (
            "not_in_gate",
            (
                "access rules are not enforced: retrieval_* tools may use any namespace; "
                "prevent_write and prevent_delete are ignored"
            ),
        ),
        "files": (
            "not_in_gate",
            (
                "file tools do not exist in a gate, so folder permissions and session_only have "
                "nothing to apply to"
            ),
        ),
        "mcp_servers": (
            "partial",
            (
                "connected through the case's model gateway, only to hosts on the project's "
                "egress allowlist; each list and call is an MCP session of its own; a server "
                "with bridge or oauth is skipped (its own warning says why; oauth's "
                "connect_tool is offered)"
            ),
        ),
        "output_schema": (
            "supported",
            (
                "sent with every model request as OpenAI's response_format (LiteLLM maps it "
                "for each provider; not with tools on a Claude model where LiteLLM would force "
                "its JSON tool; scripted models read it in options); the final answer must be "
                "JSON valid for the whole schema (Draft 2020-12, or its $schema's draft)"
            ),
        ),
        "output_schema_dict": (
            "supported",
            "set by the loader",
        ),
        "source_path": (
            "supported",
            "set by the loader",
        ),
        "is_test_variant": (
            "supported",
            "set by the loader",
        ),
        "base_agent_name": (
            "supported",
            "set by the loader",
        ),
        "test_name": (
            "supported",
            "set by the loader",
        ),
        "reasoning_effort": (
            "supported",
            (
                "sent with every request (off as LiteLLM's none); dropped for a model LiteLLM's "
                "map says does not take it"
            ),
        ),
        "reasoning_budget": (
            "supported",
            "deprecated; sent as the provider's thinking budget",
        ),
        "reasoning": (
            "supported",
            "deprecated; the SDK turns it into reasoning_effort",
        ),
        "max_concurrent_runs": (
            "partial",
            (
                "limits only how many of a case's invocations run at once (at most 8); children "
                "triggered during a run are not limited"
            ),
        ),
        "retry_options": (
            "partial",
            (
                "attempts count a tool or sequential agent's operation (with backoff) and each "
                "model request of an LLM agent (the gateway's live tries; a scripted respond() "
                "that raises is asked again at once); without retry_options a model request gets "
                "3 attempts and an operation 1; attempt_timeout is ignored"
            ),
        ),
        "timeout": (
            "partial",
            (
                "the tested agent's timeout counts from invocation start, builder build() "
                "included; at the limit the run is stopped and fails, its middleware cleanup "
                "still runs within a 5 s grace, and a process still there after it is killed"
            ),
        ),
        "max_iterations": (
            "supported",
            "the model loop fails the run after this many model calls without a final answer",
        ),
        "concurrency": (
            "partial",
            (
                "key and on_conflict apply between a case's invocations only; children triggered "
                "within a run are not serialised by key"
            ),
        ),
        "session": (
            "partial",
            (
                "kept per invocation: runs within one invocation continue its history, keyed as "
                "configured; invocations never share one; ttl and browser do not apply"
            ),
        ),
        "context_compression": (
            "partial",
            (
                "older messages summarised past max_prompt_tokens or on a context-window "
                "refusal, keeping keep_recent_messages; session_history compaction does not run"
            ),
        ),
        "guardrails": (
            "supported",
            (
                "input and output rules run for every agent kind, with block, warn and redact; see"
                " each rule type"
            ),
        ),
        "approval": (
            "supported",
            (
                "tools, conditions, inputs and on_rejection work with scripted approval_decisions;"
                " timeout and message are not used"
            ),
        ),
    }
)
# The SDK's predefined tools (connic.loader's names and aliases) and the gate's discovery pair.
PREDEFINED_TOOLS: Mapping[str, Support] = _table(
    {
        "trigger_agent": (
            "partial",
            (
                "waited children run in-process with their own run; with wait_for_response=false "
                "the call is recorded but the child never runs"
            ),
        ),
        "trigger_agent_at": (
            "partial",
            (
                "recorded with its payload, never run; delay and unix_timestamp are not checked "
                "and scheduled_at is the time of the call"
            ),
        ),
        "send_connector": (
            "not_in_gate",
            "not provided: calling it from code raises the SDK stub's error",
        ),
        "retrieval_query": (
            "partial",
            (
                "in-memory store, empty when each invocation starts; scored by word overlap, not "
                "embeddings, so paraphrases may fall below min_score"
            ),
        ),
        "retrieval_store": (
            "partial",
            (
                "stores into the invocation's in-memory store, indexed at once; nothing persists "
                "after the invocation"
            ),
        ),
        "retrieval_delete": (
            "partial",
            "deletes from the invocation's in-memory store, which starts empty",
        ),
        "retrieval_list_namespaces": (
            "partial",
            "lists only namespaces stored during this invocation",
        ),
        "web_search": (
            "not_in_gate",
            "always fails: a gate has no search provider",
        ),
        "web_read_page": (
            "partial",
            (
                "through the model gateway, hosts on the project's egress allowlist only, each "
                "page recorded and replayed; HTML is flattened to plain text, not markdown"
            ),
        ),
        "web_browser_open": (
            "not_in_gate",
            NO_BROWSER,
        ),
        "web_browser_observe": (
            "not_in_gate",
            NO_BROWSER,
        ),
        "web_browser_read": (
            "not_in_gate",
            NO_BROWSER,
        ),
        "web_browser_act": (
            "not_in_gate",
            NO_BROWSER,
        ),
        "web_browser_close": (
            "not_in_gate",
            NO_BROWSER,
        ),
        "web_browser_screenshot": (
            "not_in_gate",
            NO_BROWSER,
        ),
        "web_browser_mouse": (
            "not_in_gate",
            NO_BROWSER,
        ),
        "web_browser_tabs": (
            "not_in_gate",
            NO_BROWSER,
        ),
        "web_browser_dialog": (
            "not_in_gate",
            NO_BROWSER,
        ),
        "web_browser_eval": (
            "not_in_gate",
            NO_BROWSER,
        ),
        "web_browser_console": (
            "not_in_gate",
            NO_BROWSER,
        ),
        "web_browser_network": (
            "not_in_gate",
            NO_BROWSER,
        ),
        "web_browser_upload": (
            "not_in_gate",
            NO_BROWSER,
        ),
        "web_browser_download": (
            "not_in_gate",
            NO_BROWSER,
        ),
        "web_browser_pdf": (
            "not_in_gate",
            NO_BROWSER,
        ),
        "db_find": (
            "partial",
            "in-memory store, empty when each invocation starts (builders seed it)",
        ),
        "db_insert": (
            "partial",
            (
                "inserts into the invocation's in-memory store; nothing persists after the "
                "invocation"
            ),
        ),
        "db_update": (
            "partial",
            "updates the invocation's in-memory store, which starts empty",
        ),
        "db_upsert": (
            "partial",
            "upserts into the invocation's in-memory store, which starts empty",
        ),
        "db_delete": (
            "partial",
            "deletes from the invocation's in-memory store, which starts empty",
        ),
        "db_count": (
            "partial",
            "counts documents stored during this invocation only",
        ),
        "db_list_collections": (
            "partial",
            "lists collections created during this invocation only; size_bytes is the JSON size",
        ),
        "file_list": (
            "not_in_gate",
            NO_FILES,
        ),
        "file_read": (
            "not_in_gate",
            NO_FILES,
        ),
        "file_write": (
            "not_in_gate",
            NO_FILES,
        ),
        "file_update": (
            "not_in_gate",
            NO_FILES,
        ),
        "file_delete": (
            "not_in_gate",
            NO_FILES,
        ),
        "query_knowledge": (
            "partial",
            (
                "alias of retrieval_query: in-memory store, empty when each invocation starts, "
                "scored by word overlap, not embeddings"
            ),
        ),
        "store_knowledge": (
            "partial",
            (
                "alias of retrieval_store: the invocation's in-memory store; nothing persists "
                "after the invocation"
            ),
        ),
        "delete_knowledge": (
            "partial",
            "alias of retrieval_delete: the invocation's in-memory store, which starts empty",
        ),
        "kb_list_namespaces": (
            "partial",
            "alias of retrieval_list_namespaces: only namespaces stored during this invocation",
        ),
        "search_tools": (
            "partial",
            (
                "ranks the agent's discoverable tools by words shared with the query (at most "
                "10, with their schemas), not by meaning; no hooks run for it"
            ),
        ),
        "use_tool": (
            "supported",
            (
                "calls the discoverable tool it names (name or ref) with approval, hooks, mocks "
                "and strict flags, as a listed tool"
            ),
        ),
    }
)
# Guardrail rule types (spec 4.3).
GUARDRAIL_TYPES: Mapping[str, Support] = _table(
    {
        "regex": (
            "supported",
            "each pattern is searched in the text; a match blocks or warns with its message",
        ),
        "pii": (
            "supported",
            (
                "email, phone, ssn, credit_card (Luhn-checked), iban, ip_address and api_key by "
                "the gate's own patterns; block, warn or redact"
            ),
        ),
        "pii_leakage": (
            "supported",
            "as pii, on output; ssn, credit_card and api_key by default",
        ),
        "custom": (
            "supported",
            (
                "guardrails/<name>.py check(content, context) runs, or its mock; an exception "
                "counts as a violation"
            ),
        ),
        "moderation": (
            "partial",
            (
                "OpenAI moderation through the model gateway (live) or recordings (replay); "
                "skipped when the agent's model is scripted, and for provider perspective"
            ),
        ),
        "prompt_injection": (
            "partial",
            _judged("for attempts to override the agent's instructions"),
        ),
        "topic_restriction": (
            "partial",
            _judged("against the topics of the rule's config"),
        ),
        "system_prompt_leakage": (
            "partial",
            _judged("for text that reveals the agent's system prompt"),
        ),
        "data_exfiltration": (
            "partial",
            _judged("for attempts to move data out of the agent"),
        ),
        "relevance": (
            "partial",
            _judged("for the text's relevance to the agent's task"),
        ),
    }
)
# A tool reference `api:<spec>.<operation>` (an OpenAPI spec's operation, spec 3.2).
API_TOOLS = Support(
    "partial",
    "from the project's OpenAPI spec stored under its prefix (PUT /v1/projects/{name}/"
    "api-specs/{prefix}), called by the model gateway at hosts on the egress allowlist and "
    "recorded; single tools cannot be disabled or renamed",
)
# An api: ref whose spec the project has not stored: the SDK loader drops it.
API_TOOLS_MISSING = Support(
    "not_in_gate",
    "the project has no OpenAPI spec stored (PUT /v1/projects/{name}/api-specs/{prefix}), "
    "so the SDK loader drops the tool and the agent runs without it",
)

# An MCP server a gate skips for every run, by the field that makes it so (runtime/mcp.py).
MCP_SKIPPED: Mapping[str, Support] = {
    "bridge": Support(
        "not_in_gate",
        "a bridge tunnels to the platform's agent containers; a self-hosted gate cannot use "
        "one, so the server is skipped and its tools are not offered",
    ),
    "oauth": Support(
        "not_in_gate",
        "per-user OAuth needs a stored token, and a gate stores none, so the server is "
        "skipped as the SDK skips one without a token; with connect_tool the agent gets "
        "connect_<server>, whose answer says a gate has no sign-in (its link never resolves)",
    ),
}

# The MCP mock ladder (gate_runner/mocks.py, Mocks.mcp_tool) is the gate's own: spec 8.2 makes
# only custom file tools eligible for tool-result mocks. A case whose mocks module defines
# one is warned (decided, issue 39), under the key MCP_MOCKS_KEY.
MCP_MOCKS_KEY = "mocks.mock_mcp"
MCP_MOCKS = Support(
    "partial",
    "a gate extension: mock_mcp_<server>_<tool>, mock_mcp_<server> and mock_mcp replace MCP "
    "calls in a gate only; the platform mocks custom file tools alone (spec 8.2), so there "
    "these calls reach the real MCP server",
)


def mcp_mock_names(source: str) -> list[str]:
    """The top-level functions of a mocks module's text that are on the gate's MCP ladder
    (``mock_mcp``, ``mock_mcp_*``); none when the text does not parse."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return []
    return sorted(
        node.name
        for node in tree.body
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and (node.name == "mock_mcp" or node.name.startswith("mock_mcp_"))
    )


def mcp_mock_warning(file: str, agent: str, names: list[str]) -> dict[str, Any]:
    """The warning for a case of ``agent`` using the mocks module ``file``, which defines
    the MCP mocks ``names``."""
    warning = _warning(file, agent, MCP_MOCKS_KEY, MCP_MOCKS)
    warning["message"] += f" ({', '.join(names)})"
    return warning


# At most this many warnings a gate keeps (one per agent, key and item); the rest are left out.
MAX_WARNINGS = 200


def _warning(file: str, agent: str, key: str, support: Support) -> dict[str, Any]:
    what = "not in a gate" if support.status == "not_in_gate" else "partial"
    return {
        "file": file,
        "agent": agent,
        "key": key,
        "support": support.status,
        "message": f"{key} is {what}: {support.note}",
    }


def agent_warnings(
    file: str,
    raw: Mapping[str, Any],
    predefined: Mapping[str, list[str]],
    api_prefixes: Set[str] = frozenset(),
) -> list[dict[str, Any]]:
    """The warnings of one agent file: from its YAML mapping ``raw`` (the keys it sets, not
    the SDK's defaults) and the predefined tools the loader resolved for it, by field
    (``tools``, ``discoverable_tools``; wildcards expanded)."""
    agent = str(raw.get("name") or Path(file).stem)
    found = []
    for key in raw:
        support = AGENT_FIELDS.get(str(key))
        if support is not None and support.status != "supported":
            found.append(_warning(file, agent, str(key), support))
    for field in ("tools", "discoverable_tools"):
        entries = raw.get(field)
        refs = [
            str(next(iter(e))) if isinstance(e, Mapping) and len(e) == 1 else str(e)
            for e in (entries if isinstance(entries, list) else [])
        ]
        # With no spec at all the SDK loader drops api: refs; with specs, a ref they lack is
        # the loader's error, a problem of the bundle rather than a warning.
        if not api_prefixes and any(ref.startswith("api:") for ref in refs):
            found.append(_warning(file, agent, f"{field}.api:", API_TOOLS_MISSING))
    servers = raw.get("mcp_servers")
    for server in servers if isinstance(servers, list) else []:
        for key, support in MCP_SKIPPED.items():
            if isinstance(server, Mapping) and server.get(key):
                name = str(server.get("name") or "?")
                found.append(_warning(file, agent, f"mcp_servers.{name}", support))
    for field, names in predefined.items():
        for name in names:
            support = PREDEFINED_TOOLS.get(name)
            if support is not None and support.status != "supported":
                found.append(_warning(file, agent, f"{field}.{name}", support))
    rails = raw.get("guardrails")
    for direction in ("input", "output"):
        rules = rails.get(direction) if isinstance(rails, Mapping) else None
        for rule in rules if isinstance(rules, list) else []:
            kind = rule.get("type") if isinstance(rule, Mapping) else None
            support = GUARDRAIL_TYPES.get(str(kind))
            if support is not None and support.status != "supported":
                found.append(_warning(file, agent, f"guardrails.{direction}.{kind}", support))
    return found


_SHOWN: Mapping[Status, str] = {
    "supported": "supported",
    "partial": "partial",
    "not_in_gate": "not in a gate",
}


def _row(kind: str, name: str, support: Support) -> str:
    note = support.note.replace("|", "\\|")
    return f"| {kind} | `{name}` | {_SHOWN[support.status]} | {note} |"


def markdown_table() -> str:
    """docs/support.md's table: every agent field, predefined tool and guardrail type."""
    lines = ["| Kind | Name | In a gate | What differs, or why not |", "|---|---|---|---|"]
    for kind, rows in (
        ("agent field", AGENT_FIELDS),
        ("predefined tool", PREDEFINED_TOOLS),
        ("guardrail type", GUARDRAIL_TYPES),
    ):
        for name, support in rows.items():
            lines.append(_row(kind, name, support))
        if kind == "agent field":
            for key, support in MCP_SKIPPED.items():
                lines.append(_row("MCP server field", f"mcp_servers[].{key}", support))
        if kind == "predefined tool":
            lines.append(_row("tool reference", "api:<spec>.<operation>", API_TOOLS))
            lines.append(_row("mocks module", "mock_mcp_<server>_<tool>", MCP_MOCKS))
    return "\n".join(lines) + "\n"
