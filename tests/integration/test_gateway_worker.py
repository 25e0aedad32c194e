"""The worker serves live cases from its model gateway: each case gets a channel of its own,
the project's provider keys stay with the worker, and two projects' gates call with their own
keys at once.

Real Postgres, the real queue and worker, a real gateway (LiteLLM, a Unix socket per case)
and the OpenAI-compatible fake provider on loopback; the sandbox is the fake one, which runs
the real runner in this process and hands it the channel as the engine's bind mount would
(the engine's side is tests/contract/test_sandbox_port.py and tests/e2e/test_live_gateway.py).
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session, sessionmaker

from gate_service.config import Settings
from gate_service.gateway import ModelGateway
from gate_service.worker.handler import WorkerContext
from gate_service.worker.loop import Worker
from tests.fixtures.api_server import ApiServer
from tests.fixtures.auth import as_token, project_token
from tests.fixtures.fake_llm import FakeProvider
from tests.fixtures.mcp_server import McpServer
from tests.fixtures.pages import PageServer
from tests.fixtures.projects import bundle_of, write
from tests.fixtures.sandbox import FakeSandbox

OTHER_SECRET = "not-a-provider-key-value"


def live_bot(root: Path, greeting: str) -> bytes:
    """A live agent (no scripted model, no recordings) whose case says ``greeting``."""
    files = {
        "agents/live-bot.yaml": """
            version: "1.0"
            name: live-bot
            description: Talks to a real provider.
            model: openai/gpt-4o
            system_prompt: Be brief.
            retry_options: {attempts: 2, initial_delay: 0, max_delay: 1}
        """,
        "tests/live-bot.yaml": f"""
            tests:
              - name: answers
                payload: {greeting}
                expected_result: output == "hello from the fake provider"
        """,
    }
    return bundle_of(write(root, files))


def tenant(client: TestClient, name: str, provider: FakeProvider) -> TestClient:
    """A project with its own provider key (and endpoint) among its secrets."""
    c = as_token(client, project_token(client, name, ["submit", "read"]))
    for key, value in {
        "OPENAI_API_KEY": f"sk-{name}",
        "OPENAI_API_BASE": provider.url,
        "OTHER_SETTING": OTHER_SECRET,
    }.items():
        r = client.put(f"/v1/projects/{name}/secrets/{key}", json={"value": value})
        assert r.status_code == 201, r.text
    return c


def worker(
    settings: Settings, sessions: sessionmaker[Session], sandbox: FakeSandbox, gw: ModelGateway
) -> Worker:
    sandbox.apply_env = True  # as the real runner gives each invocation the case's environment
    ctx = WorkerContext(
        settings=settings, sessions=sessions, sandbox=sandbox, stop=threading.Event(), gateway=gw
    )
    return Worker(ctx, name="gateway-worker")


def test_a_live_case_calls_through_its_channel_and_never_gets_the_key(
    client: TestClient,
    settings: Settings,
    sessions: sessionmaker[Session],
    gateway: ModelGateway,
    provider: FakeProvider,
    tmp_path: Path,
) -> None:
    alpha = tenant(client, "alpha", provider)
    sandbox = FakeSandbox()
    r = alpha.post("/v1/gates", files={"bundle": ("b.tgz", live_bot(tmp_path / "p", "hi"))})
    assert r.status_code == 202, r.text
    assert worker(settings, sessions, sandbox, gateway).run_once()

    gate = alpha.get(f"/v1/gates/{r.json()['id']}").json()
    assert gate["status"] == "passed", gate
    assert [auth for auth, _ in provider.calls] == ["Bearer sk-alpha"]
    # The gateway's record, not the runner's word: one call, the provider's token counts.
    totals = gate["model_calls"]
    assert (totals["calls"], totals["tokens_in"], totals["tokens_out"]) == (1, 3, 4)
    assert gate["cases"][0]["model_calls"]["calls"] == 1
    # The case got the project's other secret, and none of the provider's.
    (env,) = sandbox.envs
    assert env["OTHER_SETTING"] == OTHER_SECRET
    assert not {"OPENAI_API_KEY", "OPENAI_API_BASE"} & env.keys()
    # Its channel was its own, and is gone with the case.
    (channel,) = sandbox.model_channels
    assert channel is not None and not channel.folder.exists()


def test_two_projects_gates_at_once_each_call_with_their_own_key(
    client: TestClient,
    settings: Settings,
    sessions: sessionmaker[Session],
    gateway: ModelGateway,
    provider: FakeProvider,
    tmp_path: Path,
) -> None:
    names = ("alpha", "beta")
    tenants = {name: tenant(client, name, provider) for name in names}
    # Both calls wait at the provider until both have arrived: the two gates overlap.
    provider.script = ["block", "block"]
    for name, c in tenants.items():
        bundle = live_bot(tmp_path / name, f"hi from {name}")
        assert c.post("/v1/gates", files={"bundle": ("b.tgz", bundle)}).status_code == 202
    workers = [worker(settings, sessions, FakeSandbox(), gateway) for _ in names]
    threads = [threading.Thread(target=w.run_once) for w in workers]
    for thread in threads:
        thread.start()
    try:
        for _ in names:
            assert provider.blocked.acquire(timeout=120), "both calls reach the provider"
    finally:
        provider.release()
        for thread in threads:
            thread.join(timeout=120)

    by_greeting = {body["messages"][-1]["content"]: auth for auth, body in provider.calls}
    assert by_greeting == {"hi from alpha": "Bearer sk-alpha", "hi from beta": "Bearer sk-beta"}
    for c in tenants.values():
        (gate,) = c.get("/v1/gates").json()["items"]
        assert gate["status"] == "passed", gate


def test_a_live_gates_recordings_replay_it_with_no_model_call(
    client: TestClient,
    settings: Settings,
    sessions: sessionmaker[Session],
    gateway: ModelGateway,
    provider: FakeProvider,
    tmp_path: Path,
) -> None:
    alpha = tenant(client, "alpha", provider)
    project = tmp_path / "p"
    live = alpha.post("/v1/gates", files={"bundle": ("b.tgz", live_bot(project, "hi"))})
    assert worker(settings, sessions, FakeSandbox(), gateway).run_once()
    assert alpha.get(f"/v1/gates/{live.json()['id']}").json()["status"] == "passed"

    exported = alpha.get(f"/v1/gates/{live.json()['id']}/recordings")
    assert exported.status_code == 200, exported.text
    (recording,) = exported.json()["recordings"]
    assert recording["path"].startswith("tests/recordings/live-bot/")
    target = project / recording["path"]
    target.parent.mkdir(parents=True)
    target.write_text(json.dumps(recording["content"]))

    calls_before = len(provider.calls)
    replayed = alpha.post(
        "/v1/gates",
        files={"bundle": ("b.tgz", bundle_of(project))},
        data={"model_mode": "replay"},
    )
    assert replayed.status_code == 202, replayed.text
    assert worker(settings, sessions, FakeSandbox(), gateway).run_once()
    gate = alpha.get(f"/v1/gates/{replayed.json()['id']}").json()
    assert gate["status"] == "passed", gate
    assert len(provider.calls) == calls_before and gate["model_calls"]["calls"] == 0


def test_live_cases_waiting_on_their_model_do_not_hold_the_case_slot(
    client: TestClient,
    settings: Settings,
    sessions: sessionmaker[Session],
    gateway: ModelGateway,
    provider: FakeProvider,
    tmp_path: Path,
) -> None:
    cases = 4
    alpha = tenant(client, "alpha", provider)
    bundle_dir = tmp_path / "p"
    live_bot(bundle_dir, "hi")
    write(
        bundle_dir,
        {
            "tests/live-bot.yaml": "tests:\n"
            + "".join(
                f"  - name: answers_{i}\n    payload: hi {i}\n"
                '    expected_result: output == "hello from the fake provider"\n'
                for i in range(cases)
            )
        },
    )
    provider.script = ["block"] * cases
    # No call is answered before all have arrived: were a waiting case to keep its slot, the
    # next case could not start, and its call would never come.
    provider.block_limit_s = 300
    r = alpha.post("/v1/gates", files={"bundle": ("b.tgz", bundle_of(bundle_dir))})
    assert r.status_code == 202, r.text
    # One case slot, room for four containers: all four wait on the provider at once.
    one_slot = settings.model_copy(update={"case_concurrency": 1, "max_case_containers": cases})
    judging = threading.Thread(target=worker(one_slot, sessions, FakeSandbox(), gateway).run_once)
    judging.start()
    try:
        for i in range(cases):
            assert provider.blocked.acquire(timeout=60), f"call {i + 1} reaches the provider"
    finally:
        provider.release()
        judging.join(timeout=120)
    gate = alpha.get(f"/v1/gates/{r.json()['id']}").json()
    assert gate["status"] == "passed", gate
    assert gate["model_calls"]["calls"] == cases


def test_a_project_route_sends_its_models_to_its_endpoint_and_its_key_stays_out(
    client: TestClient,
    settings: Settings,
    sessions: sessionmaker[Session],
    gateway: ModelGateway,
    provider: FakeProvider,
    tmp_path: Path,
) -> None:
    """Routes are set through the admin API, read by the worker as each case starts, and
    the route's key secret is withheld from the case like a provider key."""
    alpha = tenant(client, "alpha", provider)
    r = client.put("/v1/projects/alpha/secrets/CORP_KEY", json={"value": "sk-corp-route"})
    assert r.status_code == 201, r.text
    routes = [{"pattern": "corp/*", "api_base": provider.url, "key_secret": "CORP_KEY"}]
    r = client.put("/v1/projects/alpha/model-routes", json={"routes": routes})
    assert r.status_code == 200, r.text
    assert client.get("/v1/projects/alpha/model-routes").json() == {
        "project": "alpha",
        "routes": [{**routes[0], "responses_api": False}],  # chat completions by default
    }
    project = tmp_path / "p"
    live_bot(project, "hi")
    agent = (project / "agents/live-bot.yaml").read_text()
    (project / "agents/live-bot.yaml").write_text(agent.replace("openai/gpt-4o", "corp/llama-3"))
    sandbox = FakeSandbox()
    gate = alpha.post("/v1/gates", files={"bundle": ("b.tgz", bundle_of(project))}).json()
    assert worker(settings, sessions, sandbox, gateway).run_once()

    done = alpha.get(f"/v1/gates/{gate['id']}").json()
    assert done["status"] == "passed", done
    ((auth, body),) = provider.calls
    assert (auth, body["model"]) == ("Bearer sk-corp-route", "corp/llama-3")
    (env,) = sandbox.envs
    assert "CORP_KEY" not in env and env["OTHER_SETTING"] == OTHER_SECRET
    audit = client.get("/v1/audit", params={"action": "project.model_routes_set"}).json()
    assert [e["detail"]["routes"] for e in audit["items"]] == [
        [{**routes[0], "responses_api": False}]
    ]


@pytest.mark.parametrize(
    ("route", "says"),
    [
        ({"pattern": "x/*", "api_base": "http://169.254.169.254/v1"}, "link-local"),
        ({"pattern": "x/*", "api_base": "http://u:p@proxy/v1"}, "credentials"),
        ({"pattern": "x/*", "api_base": "file:///etc/passwd"}, "http://"),
        ({"pattern": "", "api_base": "http://proxy/v1"}, "at least 1 character"),
        ({"pattern": "x/*", "api_base": "http://proxy/v1", "key_secret": "lower"}, "secret name"),
        ({"pattern": "x/*", "api_base": "http://proxy/v1", "extra": 1}, "Extra inputs"),
    ],
)
def test_a_route_the_gateway_would_not_call_is_refused_saying_why(
    client: TestClient, route: dict[str, object], says: str
) -> None:
    project_token(client, "alpha", ["read"])
    r = client.put("/v1/projects/alpha/model-routes", json={"routes": [route]})
    assert r.status_code == 422, r.text
    assert says in r.text
    assert client.get("/v1/projects/alpha/model-routes").json()["routes"] == []


def test_routes_are_their_projects_own_and_need_the_admin_scope(client: TestClient) -> None:
    alpha_admin = as_token(client, project_token(client, "alpha", ["admin"]))
    beta_submit = as_token(client, project_token(client, "beta", ["submit", "read"]))
    routes = {"routes": [{"pattern": "*", "api_base": "http://proxy/v1"}]}
    assert alpha_admin.put("/v1/projects/alpha/model-routes", json=routes).status_code == 200
    assert alpha_admin.get("/v1/projects/beta/model-routes").status_code == 404
    assert alpha_admin.put("/v1/projects/beta/model-routes", json=routes).status_code == 404
    assert beta_submit.get("/v1/projects/beta/model-routes").status_code == 403
    too_many = {"routes": routes["routes"] * 33}
    r = alpha_admin.put("/v1/projects/alpha/model-routes", json=too_many)
    assert r.status_code == 422 and "at most 32" in r.text


def moderated_bot(root: Path) -> Path:
    """A live agent behind a moderation input guardrail: one case passes it, one is blocked
    (the fake provider flags "attack" as violence)."""
    files = {
        "agents/guarded.yaml": """
            version: "1.0"
            name: guarded
            description: Talks to a real provider, behind a moderation guardrail.
            model: openai/gpt-4o
            system_prompt: Be brief.
            retry_options: {attempts: 2, initial_delay: 0, max_delay: 1}
            guardrails:
              input:
                - type: moderation
                  config: {categories: [violence, hate], threshold: 0.8, rejection_message: Not that.}
        """,
        "tests/guarded.yaml": """
            tests:
              - name: calm_text_passes
                payload: a calm day
                expected_result: output == "hello from the fake provider"
              - name: violent_text_is_blocked
                payload: we attack at dawn
                expected_result: status == "blocked" and output == "Not that."
        """,
    }
    return write(root, files)


def test_moderation_runs_through_the_gateway_live_and_replays_from_its_recordings(
    client: TestClient,
    settings: Settings,
    sessions: sessionmaker[Session],
    gateway: ModelGateway,
    provider: FakeProvider,
    tmp_path: Path,
) -> None:
    """Issue 20 item 7: a provider-backed guardrail is called through the gateway in live
    mode, replayed from the gate's recordings in replay mode, and skipped in scripted mode."""
    alpha = tenant(client, "alpha", provider)
    project = moderated_bot(tmp_path / "p")
    live = alpha.post("/v1/gates", files={"bundle": ("b.tgz", bundle_of(project))}).json()
    assert worker(settings, sessions, FakeSandbox(), gateway).run_once()
    gate = alpha.get(f"/v1/gates/{live['id']}").json()
    assert gate["status"] == "passed", [c.get("failure_reason") for c in gate["cases"]]
    paths = sorted(body.get("input", "chat") for _, body in provider.calls)
    # Two moderations (one each), one model call: the blocked case's agent never ran.
    assert paths == ["a calm day", "chat", "we attack at dawn"], provider.calls
    assert gate["model_calls"]["calls"] == 3

    exported = alpha.get(f"/v1/gates/{live['id']}/recordings").json()["recordings"]
    assert len(exported) == 3
    for recording in exported:
        target = project / recording["path"]
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(json.dumps(recording["content"]))
    before = len(provider.calls)
    replayed = alpha.post(
        "/v1/gates",
        files={"bundle": ("b.tgz", bundle_of(project))},
        data={"model_mode": "replay"},
    ).json()
    assert worker(settings, sessions, FakeSandbox(), gateway).run_once()
    again = alpha.get(f"/v1/gates/{replayed['id']}").json()
    assert again["status"] == "passed", [c.get("failure_reason") for c in again["cases"]]
    assert len(provider.calls) == before and again["model_calls"]["calls"] == 0

    # Scripted: no provider is called, so the rule is skipped and the block expected fails,
    # naming the skipped guardrail.
    write(project, {"tests/models/guarded.py": """
        def respond(messages, tools, context):
            return {"content": "hello from the fake provider"}
    """})  # fmt: skip
    scripted = alpha.post(
        "/v1/gates",
        files={"bundle": ("b.tgz", bundle_of(project))},
        data={"model_mode": "scripted"},
    ).json()
    assert worker(settings, sessions, FakeSandbox(), gateway).run_once()
    ended = alpha.get(f"/v1/gates/{scripted['id']}").json()
    by_name = {c["test_name"]: c for c in ended["cases"]}
    assert by_name["calm_text_passes"]["status"] == "passed"
    assert by_name["violent_text_is_blocked"]["status"] == "failed"
    assert "moderation (input)" in by_name["violent_text_is_blocked"]["failure_reason"]
    assert len(provider.calls) == before


def test_a_fallback_model_answers_through_the_gateway_after_one_failed_primary_request(
    client: TestClient,
    settings: Settings,
    sessions: sessionmaker[Session],
    gateway: ModelGateway,
    provider: FakeProvider,
    tmp_path: Path,
) -> None:
    """Issue 21 item 3: the primary is tried once, the fallback gets retry_options.attempts
    (a 429 then an answer here), the reasoning option reaches the provider, and the run
    shows which model answered."""
    alpha = tenant(client, "alpha", provider)
    steps = {"primary": ["500"], "backup": ["429:0", "ok"]}
    provider.decide = lambda body: steps[body["model"]].pop(0) if steps[body["model"]] else "ok"
    project = write(
        tmp_path / "p",
        {
            "agents/live-bot.yaml": """
                version: "1.0"
                name: live-bot
                description: Falls back to another model.
                model: openai/primary
                fallback_model: openai/backup
                reasoning_effort: high
                system_prompt: Be brief.
                retry_options: {attempts: 2, initial_delay: 0, max_delay: 1}
            """,
            "tests/live-bot.yaml": """
                tests:
                  - name: answers
                    payload: hi
                    expected_result: output == "hello from the fake provider"
            """,
        },
    )
    gate = alpha.post("/v1/gates", files={"bundle": ("b.tgz", bundle_of(project))}).json()
    assert worker(settings, sessions, FakeSandbox(), gateway).run_once()
    done = alpha.get(f"/v1/gates/{gate['id']}").json()
    assert done["status"] == "passed", [c.get("failure_reason") for c in done["cases"]]
    assert [body["model"] for _, body in provider.calls] == ["primary", "backup", "backup"]
    # Unknown to LiteLLM's model map, so the option is passed as set.
    assert {body.get("reasoning_effort") for _, body in provider.calls} == {"high"}
    (run_id,) = done["cases"][0]["agent_run_ids"]
    run = alpha.get(f"/v1/runs/{run_id}").json()
    assert run["run_context"]["fallback_model_used"] == "openai/backup"
    spans = [s for s in run["traces"] if s["type"] == "model_call"]
    assert [(s["name"], s["status"]) for s in spans] == [
        ("openai/primary", "error"),
        ("openai/backup", "ok"),
    ]
    assert spans[1]["metadata"]["attempts"] == 2  # the fallback's budget: 429, then answered


def test_a_context_window_refusal_through_the_gateway_is_repaired_by_compression(
    client: TestClient,
    settings: Settings,
    sessions: sessionmaker[Session],
    gateway: ModelGateway,
    provider: FakeProvider,
    tmp_path: Path,
) -> None:
    """Issue 21 item 4: the provider's context-window 400 reaches the agent through the
    gateway as an error it recognises; one summary request and one repaired request follow."""
    alpha = tenant(client, "alpha", provider)
    provider.script = ["tool", "context", "ok", "ok"]
    project = write(
        tmp_path / "p",
        {
            "agents/live-bot.yaml": """
                version: "1.0"
                name: live-bot
                description: Looks something up, then runs out of context.
                model: openai/gpt-4o
                system_prompt: Be brief.
                tools: [look.lookup]
                context_compression: {keep_recent_messages: 2}
                retry_options: {attempts: 1}
            """,
            "tools/look.py": "def lookup(q: str) -> str:\n    return 'found ' + q\n",
            "tests/live-bot.yaml": """
                tests:
                  - name: answers
                    payload: hi
                    expected_result: output == "hello from the fake provider"
            """,
        },
    )
    gate = alpha.post("/v1/gates", files={"bundle": ("b.tgz", bundle_of(project))}).json()
    assert worker(settings, sessions, FakeSandbox(), gateway).run_once()
    done = alpha.get(f"/v1/gates/{gate['id']}").json()
    assert done["status"] == "passed", [c.get("failure_reason") for c in done["cases"]]
    bodies = [body for _, body in provider.calls]
    assert len(bodies) == 4
    summary_request = bodies[2]["messages"]
    assert summary_request[0]["content"].startswith("Summarise the conversation")
    repaired = bodies[3]["messages"]
    assert repaired[1]["content"].startswith("[Summary of the earlier conversation]")
    assert [m["role"] for m in repaired] == ["system", "user", "assistant", "tool"]
    (run_id,) = done["cases"][0]["agent_run_ids"]
    spans = alpha.get(f"/v1/runs/{run_id}").json()["traces"]
    (compressed,) = [s for s in spans if s["type"] == "context_compression"]
    assert compressed["metadata"]["reason"].endswith("for its context window")


def test_web_read_page_goes_through_the_gateway_and_its_allowlist_and_replays(
    client: TestClient,
    settings: Settings,
    sessions: sessionmaker[Session],
    gateway: ModelGateway,
    provider: FakeProvider,
    tmp_path: Path,
) -> None:
    """Issue 21 item 6: a case's web_read_page reaches a host only through the gateway and
    only on the project's egress allowlist; its page is recorded like a model call, so the
    gate's recordings replay it with the server gone."""
    alpha = tenant(client, "alpha", provider)
    pages = PageServer()
    try:
        bad = client.put("/v1/projects/alpha/egress", json={"hosts": ["169.254.169.254"]})
        assert bad.status_code == 422 and "link-local" in bad.text
        r = client.put("/v1/projects/alpha/egress", json={"hosts": ["127.0.0.1"]})
        assert r.status_code == 200 and r.json()["hosts"] == ["127.0.0.1"]
        project = write(
            tmp_path / "p",
            {
                "agents/reader.yaml": """
                    version: "1.0"
                    name: reader
                    description: Reads a page.
                    type: tool
                    tool_name: web.read
                """,
                "tools/web.py": """
                    from connic.tools import web_read_page


                    async def read(payload: dict) -> dict:
                        return await web_read_page(payload["url"])
                """,
                "tests/reader.yaml": f"""
                    tests:
                      - name: reads_the_price
                        payload: '{{"url": "{pages.url}/page"}}'
                        expected_result: '"Tea costs 3 coins" in output.markdown'
                      - name: is_refused_off_the_allowlist
                        payload: '{{"url": "http://localhost:{pages.port}/page"}}'
                        expected_result: error != null
                """,
            },
        )
        live = alpha.post("/v1/gates", files={"bundle": ("b.tgz", bundle_of(project))}).json()
        assert worker(settings, sessions, FakeSandbox(), gateway).run_once()
        done = alpha.get(f"/v1/gates/{live['id']}").json()
        assert done["status"] == "passed", [c.get("failure_reason") for c in done["cases"]]
        assert pages.paths == ["/page"]  # localhost (off the allowlist) was never asked
    finally:
        pages.close()
    exported = alpha.get(f"/v1/gates/{live['id']}/recordings").json()["recordings"]
    (recording,) = exported
    assert recording["path"].startswith("tests/recordings/reader/")
    target = project / recording["path"]
    target.parent.mkdir(parents=True)
    target.write_text(json.dumps(recording["content"]))
    replayed = alpha.post(
        "/v1/gates",
        files={"bundle": ("b.tgz", bundle_of(project))},
        data={"model_mode": "replay"},
    ).json()
    assert worker(settings, sessions, FakeSandbox(), gateway).run_once()
    again = alpha.get(f"/v1/gates/{replayed['id']}").json()
    by_name = {c["test_name"]: c for c in again["cases"]}
    # The page from its recording, the server gone; the refused one has none to replay.
    assert by_name["reads_the_price"]["status"] == "passed", by_name["reads_the_price"]
    assert again["model_calls"]["calls"] == 0


def mcp_desk(root: Path, url: str) -> Path:
    """A live agent with one MCP server, whose case asserts on the call the fake provider's
    ``tool`` step makes (``lookup``)."""
    return write(
        root,
        {
            "agents/desk.yaml": f"""
                version: "1.0"
                name: desk
                description: Looks orders up on an MCP server.
                model: openai/gpt-4o
                system_prompt: Help.
                retry_options: {{attempts: 1}}
                mcp_servers:
                  - name: orders
                    url: {url}
                    headers: {{Authorization: "Bearer ${{ORDERS_TOKEN}}"}}
            """,
            "tests/desk.yaml": """
                tests:
                  - name: looks_it_up
                    payload: where is my order?
                    expected_tool_calls:
                      - lookup: >-
                          result.is_error == false
                          and "order for x: shipped" in result.parts[0].text
            """,
        },
    )


def test_an_mcp_server_is_reached_through_the_gateway_on_the_allowlist_and_replays(
    client: TestClient,
    settings: Settings,
    sessions: sessionmaker[Session],
    gateway: ModelGateway,
    provider: FakeProvider,
    tmp_path: Path,
) -> None:
    """Issue 21 item 5 through the worker: the project's egress allowlist and secrets reach
    the case's channel; a secret the server echoes is stored redacted; the gate's recordings
    replay the MCP list and call with the server gone."""
    alpha = tenant(client, "alpha", provider)
    r = client.put("/v1/projects/alpha/secrets/ORDERS_TOKEN", json={"value": "orders-s3cret"})
    assert r.status_code == 201, r.text
    r = client.put("/v1/projects/alpha/egress", json={"hosts": ["127.0.0.1"]})
    assert r.status_code == 200, r.text

    def judge(project: Path, **data: str) -> dict[str, Any]:
        provider.script = ["tool", "ok"]
        bundle = {"bundle": ("b.tgz", bundle_of(project))}
        gate = alpha.post("/v1/gates", files=bundle, data=data).json()
        assert worker(settings, sessions, FakeSandbox(), gateway).run_once()
        done: dict[str, Any] = alpha.get(f"/v1/gates/{gate['id']}").json()
        assert done["status"] == "passed", [c.get("failure_reason") for c in done["cases"]]
        return done

    echoing = McpServer(echo_auth=True)
    try:
        done = judge(mcp_desk(tmp_path / "echo", echoing.url))
    finally:
        echoing.close()
    (run_id,) = done["cases"][0]["agent_run_ids"]
    stored = json.dumps(alpha.get(f"/v1/runs/{run_id}").json())
    assert "shipped (auth=Bearer [REDACTED:ORDERS_TOKEN])" in stored
    assert "orders-s3cret" not in stored

    server = McpServer()
    project = mcp_desk(tmp_path / "p", server.url)
    try:
        live = judge(project)
        assert server.calls == ["lookup"]
    finally:
        server.close()
    exported = alpha.get(f"/v1/gates/{live['id']}/recordings").json()["recordings"]
    assert len(exported) == 4  # two completions, the tool list and the call
    for recording in exported:
        target = project / recording["path"]
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(json.dumps(recording["content"]))
    again = judge(project, model_mode="replay")
    assert again["model_calls"]["calls"] == 0


def test_an_api_tool_runs_from_the_projects_stored_spec_through_the_gateway(
    client: TestClient,
    settings: Settings,
    sessions: sessionmaker[Session],
    gateway: ModelGateway,
    provider: FakeProvider,
    tmp_path: Path,
) -> None:
    """Issue 21 item 6 through the API and the worker: a project's admin stores an OpenAPI
    spec under a prefix; the gate validates api: refs against it, the case's loader offers
    its tools, and the gateway calls the API from the stored spec at a host on the egress
    allowlist, with the header's secret filled there."""
    alpha = tenant(client, "alpha", provider)
    api = ApiServer()
    try:
        for prefix, body, says in [
            ("Bad-Prefix", {"spec": api.spec()}, "must be 1 to 64 characters"),
            ("orders", {"spec": {"openapi": "2.0"}}, "OpenAPI 3.x"),
            ("orders", {"spec": api.spec(), "base_url": "http://169.254.169.254"}, "link-local"),
        ]:
            r = client.put(f"/v1/projects/alpha/api-specs/{prefix}", json=body)
            assert r.status_code == 422 and says in r.text, r.text
        r = client.put(
            "/v1/projects/alpha/api-specs/orders",
            json={"spec": api.spec(), "headers": {"Authorization": "Bearer ${OTHER_SETTING}"}},
        )
        assert r.status_code == 200, r.text
        assert r.json()["tools"] == ["order_get", "orders_post"]
        listed = client.get("/v1/projects/alpha/api-specs").json()["specs"]
        assert [(s["prefix"], s["headers"]) for s in listed] == [("orders", ["Authorization"])]
        assert client.put("/v1/projects/alpha/egress", json={"hosts": ["127.0.0.1"]}).is_success
        project = write(
            tmp_path / "p",
            {
                "agents/desk.yaml": """
                    version: "1.0"
                    name: desk
                    description: Looks orders up through the orders API.
                    model: openai/gpt-4o
                    system_prompt: Help.
                    retry_options: {attempts: 1}
                    tools: [api:orders.order_get]
                """,
                "tests/desk.yaml": """
                    tests:
                      - name: looks_it_up
                        payload: where is x?
                        expected_tool_calls:
                          - api:orders.order_get: result.status == 200 and params.id == "x"
                """,
            },
        )
        provider.tool_call = ("order_get", {"id": "x"})
        provider.script = ["tool", "ok"]
        gate = alpha.post("/v1/gates", files={"bundle": ("b.tgz", bundle_of(project))}).json()
        assert worker(settings, sessions, FakeSandbox(), gateway).run_once()
        done = alpha.get(f"/v1/gates/{gate['id']}").json()
        assert done["status"] == "passed", (done["failure_reason"], done["cases"])
        assert not [w for w in done["warnings"] if "api:" in w["key"]], done["warnings"]
        assert api.seen == [("GET", "/api/v1/orders/x", f"Bearer {OTHER_SECRET}", None)]
        # A ref to a tool the project's spec does not have is the bundle's problem.
        (project / "agents/desk.yaml").write_text(
            (project / "agents/desk.yaml").read_text().replace("order_get", "order_delete")
        )
        bad = alpha.post("/v1/gates", files={"bundle": ("b.tgz", bundle_of(project))}).json()
        assert worker(settings, sessions, FakeSandbox(), gateway).run_once()
        refused = alpha.get(f"/v1/gates/{bad['id']}").json()
        assert refused["status"] == "error", refused
        assert "order_delete" in json.dumps(refused["problems"]), refused["problems"]
    finally:
        api.close()
    assert client.delete("/v1/projects/alpha/api-specs/orders").status_code == 204
    assert client.get("/v1/projects/alpha/api-specs").json()["specs"] == []
