"""The model span's request on a real Postgres (issue 38, item 8): a gate's run stores each
model span's request (system prompt, messages, tools, response format) with a project
secret that reached a message redacted, and the run page shows it escaped, collapsed under
the model span. The worker is the fake-sandbox one (the real runner in-process, with the
case's environment applied, so the tool really reads the secret)."""

from __future__ import annotations

import re
from pathlib import Path

from fastapi.testclient import TestClient
from sqlalchemy import text
from sqlalchemy.orm import Session, sessionmaker

from gate_service.models import DEFAULT_PROJECT
from gate_service.worker.loop import Worker
from tests.fixtures.auth import ADMIN_TOKEN
from tests.fixtures.projects import bundle_of, write
from tests.fixtures.sandbox import FakeSandbox

SECRET = "sk-request-secret-8c41d2f0b7"

PROJECT = {
    "agents/keeper.yaml": """
        version: "1.0"
        name: keeper
        description: Reads a key with a tool, then answers.
        model: openai/gpt-4o
        system_prompt: "Answer <b>briefly</b> & in JSON."
        output_schema: answer
        tools: [vault.read_key]
    """,
    "tools/vault.py": """
        import os


        def read_key(name: str) -> str:
            \"\"\"Read a key.

            Args:
                name: the key's name
            \"\"\"
            return "the key is " + os.environ.get(name, "unset")
    """,
    "schemas/answer.json": '{"type": "object", "required": ["ok"], "properties": {"ok": {"type": "boolean"}}}',
    "tests/models/keeper.py": """
        import json


        def respond(messages, tools, context):
            if not [m for m in messages if m["role"] == "tool"]:
                return {"tool_calls": [{"name": "read_key", "arguments": {"name": "API_KEY"}}]}
            return {"content": json.dumps({"ok": True})}
    """,
    "tests/keeper.yaml": """
        tests:
          - name: reads_the_key
            payload: "<script>alert(1)</script> read it"
            expected_result: output.ok == true
    """,
}


def test_the_stored_span_holds_the_request_redacted_and_the_run_page_shows_it(
    client: TestClient,
    worker: Worker,
    sandbox: FakeSandbox,
    sessions: sessionmaker[Session],
    tmp_path: Path,
) -> None:
    sandbox.apply_env = True
    secrets = f"/v1/projects/{DEFAULT_PROJECT}/secrets/API_KEY"
    assert client.put(secrets, json={"value": SECRET}).status_code == 201
    bundle = bundle_of(write(tmp_path / "p", PROJECT))
    answer = client.post("/v1/gates", files={"bundle": ("b.tgz", bundle)})
    assert answer.status_code == 202, answer.text
    assert worker.run_once()
    gate = client.get(f"/v1/gates/{answer.json()['id']}").json()
    assert gate["status"] == "passed", gate
    (run_id,) = gate["cases"][0]["agent_run_ids"]

    run = client.get(f"/v1/runs/{run_id}")
    assert SECRET not in run.text
    first, second = (s for s in run.json()["traces"] if s["type"] == "model_call")
    asked = first["metadata"]["request"]
    assert asked["system_prompt"] == "Answer <b>briefly</b> & in JSON."
    assert asked["messages"] == [{"role": "user", "content": "<script>alert(1)</script> read it"}]
    assert [t["name"] for t in asked["tools"]] == ["read_key"]
    assert asked["tools"][0]["parameters"]["properties"]["name"]["type"] == "string"
    assert asked["response_format"]["json_schema"]["name"] == "answer"
    result = second["metadata"]["request"]["messages"][-1]
    assert result["role"] == "tool"
    assert result["content"] == "the key is [REDACTED:API_KEY]"
    with sessions() as s:  # nor any row of the gate's
        for table in ("runs", "cases", "gates"):
            dump = s.execute(text(f"SELECT coalesce(json_agg(t)::text, '') FROM {table} t"))
            assert SECRET not in dump.scalar_one(), table

    page = TestClient(client.app, follow_redirects=False, headers={"Origin": "http://testserver"})
    signed = page.post("/ui/sign-in", data={"token": ADMIN_TOKEN, "next": "/ui"})
    assert signed.status_code == 303, signed.text
    shown = page.get(f"/ui/runs/{run_id}")
    assert shown.status_code == 200
    html = shown.text
    # Collapsed under each model span: its summary, then prompt, messages, tools and format.
    summaries = re.findall(r'<details class="request">\s*<summary>([^<]*)</summary>', html)
    assert summaries == [
        "request: 1 message, 1 tool, response_format json_schema",
        "request: 3 messages, 1 tool, response_format json_schema",
    ]
    assert '<details class="request" open' not in html
    assert "Answer &lt;b&gt;briefly&lt;/b&gt; &amp; in JSON." in html
    assert "<b>briefly" not in html and "<script>alert(1)" not in html
    assert (
        '<span class="role">user</span><pre>&lt;script&gt;alert(1)&lt;/script&gt; read it' in html
    )
    assert '<span class="role">assistant</span><pre>→ read_key({&#34;name&#34;: ' in html
    assert '<span class="role">tool read_key</span><pre>the key is [REDACTED:API_KEY]' in html
    assert "<code>read_key</code>" in html and "<summary>schema</summary>" in html
    assert "&#34;json_schema&#34;" in html and SECRET not in html
    # The request is not shown a second time among the span's other metadata.
    assert "<dt>request</dt>" not in html
