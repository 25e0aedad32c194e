"""One project uses every agent field the support table marks supported or partial, and a
gate runs it in live mode against the fake provider, which answers every model with plain
text (issue 21, item 7). Every case ends passed, or failed with a reason from an assertion
or a warning: never a crash of the runner, and never "not available".

The project is checked against the table itself, so a field that becomes supported or
partial must be used here. Real Postgres, the real worker and gateway (LiteLLM, a socket per
case) and the fake provider on loopback; the sandbox runs the real runner in this process.
"""

from __future__ import annotations

import re
import shutil
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session, sessionmaker

from gate_service.bundles.support import AGENT_FIELDS
from gate_service.config import Settings
from gate_service.gateway import ModelGateway
from gate_service.worker.handler import WorkerContext
from gate_service.worker.loop import Worker
from tests.fixtures.auth import as_token, project_token
from tests.fixtures.fake_llm import FakeProvider
from tests.fixtures.projects import bundle_of, write
from tests.fixtures.sandbox import FakeSandbox

# Set by the SDK's loader, never written in an agent file.
LOADER_FIELDS = {"output_schema_dict", "source_path", "is_test_variant", "base_agent_name",
                 "test_name"}  # fmt: skip
ANSWER = "hello from the fake provider"

PROJECT = {
    "agents/talker.yaml": """
        version: "1.0"
        name: talker
        description: Every LLM option a gate honours.
        type: llm
        model: openai/primary-model
        fallback_model: openai/backup-model
        system_prompt: "You talk about {topic}."
        temperature: 0.4
        reasoning_effort: low
        max_iterations: 3
        timeout: 60
        retry_options: {attempts: 2, initial_delay: 0, max_delay: 1}
        max_concurrent_runs: 2
        concurrency: {key: input.user, on_conflict: queue}
        session: {key: input.user}
        context_compression: {max_prompt_tokens: 100000, keep_recent_messages: 4}
        tools: [notes.save, db_find, retrieval_query]
        discoverable_tools: [notes.count]
        guardrails:
          input:
            - {type: regex, config: {patterns: [{pattern: "forbidden", message: No.}]}}
            - {type: pii, mode: redact}
          output:
            - {type: pii_leakage}
            - {type: moderation}
        approval: {tools: [notes.save], on_rejection: continue}
        # Off the project's egress allowlist (it has none) and optional: skipped, its reason
        # in context["mcp_errors"], and the run goes on without its tools.
        mcp_servers:
          - {name: orders, url: "http://mcp.invalid/mcp", optional: true, tools: [lookup]}
    """,
    "agents/thinker.yaml": """
        version: "1.0"
        name: thinker
        description: The deprecated reasoning switches.
        model: openai/thinker-model
        system_prompt: Think.
        reasoning: true
        reasoning_budget: 1024
    """,
    "agents/shaped.yaml": """
        version: "1.0"
        name: shaped
        description: Must answer in a schema the plain-text provider cannot meet.
        model: openai/gpt-4o
        system_prompt: Answer in JSON.
        output_schema: answer
    """,
    "agents/counter.yaml": """
        version: "1.0"
        name: counter
        description: A tool agent.
        type: tool
        tool_name: notes.count
    """,
    "agents/chain.yaml": """
        version: "1.0"
        name: chain
        description: A sequence of a tool agent and an LLM agent.
        type: sequential
        agents: [counter, talker]
    """,
    "schemas/answer.json": '{"type": "object", "required": ["answer"]}',
    "tools/notes.py": """
        def save(text: str) -> str:
            return "saved"


        def count(payload: dict | None = None) -> dict:
            return {"user": "u1", "text": "how many notes?", "topic": "notes"}
    """,
    "tests/talker.yaml": f"""
        tests:
          - name: talks
            payload: '{{"user": "u1", "text": "hi", "topic": "weather"}}'
            runs: 2
            expected_result: output == "{ANSWER}"
          - name: regex_blocks
            payload: this is forbidden
            expected_result: status == "blocked" and output == "No."
    """,
    "tests/thinker.yaml": f"""
        tests:
          - name: thinks
            payload: hi
            expected_result: output == "{ANSWER}"
    """,
    "tests/shaped.yaml": """
        tests:
          - name: misses_its_schema
            payload: hi
            expected_result: output.answer != null
    """,
    "tests/chain.yaml": f"""
        tests:
          - name: chains
            payload: '{{}}'
            expected_result: output == "{ANSWER}"
    """,
}


def fields_used(files: dict[str, str]) -> set[str]:
    used: set[str] = set()
    for path, text in files.items():
        if path.startswith("agents/"):
            used |= set(yaml.safe_load(text))
    return used


def test_the_project_uses_every_field_the_table_marks_supported_or_partial() -> None:
    honoured = {k for k, v in AGENT_FIELDS.items() if v.status != "not_in_gate"}
    assert honoured - LOADER_FIELDS <= fields_used(PROJECT), honoured - fields_used(PROJECT)


@pytest.fixture
def gateway() -> Iterator[ModelGateway]:
    root = Path(tempfile.mkdtemp(prefix="gw-"))  # a Unix socket's path stays short
    try:
        yield ModelGateway(socket_root=root, retry_backoff_s=0.0)
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def provider() -> Iterator[FakeProvider]:
    fake = FakeProvider()
    # The primary model is down: the fallback answers (and the run stays with it).
    fake.decide = lambda body: "500" if body.get("model") == "primary-model" else "ok"
    try:
        yield fake
    finally:
        fake.close()


# What a runner crash or an unrun feature would say in a case's reason.
CRASH = re.compile(r"not available|Traceback|runner (crashed|failed)|internal error", re.I)


def test_a_live_gate_of_every_honoured_field_ends_each_case_on_an_assertion(
    client: TestClient,
    settings: Settings,
    sessions: sessionmaker[Session],
    gateway: ModelGateway,
    provider: FakeProvider,
    tmp_path: Path,
) -> None:
    token = project_token(client, "every", ["submit", "read"])
    for name, value in {"OPENAI_API_KEY": "sk-every", "OPENAI_API_BASE": provider.url}.items():
        r = client.put(f"/v1/projects/every/secrets/{name}", json={"value": value})
        assert r.status_code == 201, r.text
    project = as_token(client, token)
    bundle = bundle_of(write(tmp_path / "p", PROJECT))
    created = project.post(
        "/v1/gates", files={"bundle": ("b.tgz", bundle)}, data={"model_mode": "live"}
    )
    assert created.status_code == 202, created.text
    sandbox = FakeSandbox()
    sandbox.apply_env = True
    ctx = WorkerContext(
        settings=settings,
        sessions=sessions,
        sandbox=sandbox,
        stop=threading.Event(),
        gateway=gateway,
    )
    assert Worker(ctx, name="every-field").run_once()
    gate: dict[str, Any] = project.get(f"/v1/gates/{created.json()['id']}").json()

    assert gate["status"] in ("passed", "failed"), (gate["failure_reason"], gate["problems"])
    outcomes = {c["test_name"]: (c["status"], c.get("failure_reason")) for c in gate["cases"]}
    for name, (status, reason) in outcomes.items():
        assert status in ("passed", "failed"), (name, status, reason)
        assert not CRASH.search(reason or ""), (name, reason)
    assert {n: s for n, (s, _) in outcomes.items()} == {
        "talks": "passed",
        "regex_blocks": "passed",
        "thinks": "passed",
        "misses_its_schema": "failed",
        "chains": "passed",
    }, outcomes
    # The one failure is the schema, said as such: the provider was sent it as
    # response_format, and its answer (a JSON document of the schema's properties, none)
    # lacks the required one.
    assert "'answer' is a required property (required)" in (outcomes["misses_its_schema"][1] or "")
    shaped = [body["response_format"] for _, body in provider.calls if "response_format" in body]
    assert shaped and {s["json_schema"]["name"] for s in shaped} == {"answer"}
    # What the gate does not run as the platform would is a warning, not a silent pass.
    assert {(w["agent"], w["key"]) for w in gate["warnings"]} >= {
        ("talker", "session"),
        ("talker", "context_compression"),
        ("talker", "timeout"),
        ("talker", "mcp_servers"),
    }
