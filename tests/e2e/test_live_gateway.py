"""Live models through the model gateway, end to end: `gate serve` on the real engine, the
OpenAI-compatible fake provider on this host, no internet (issue 20, items 1, 2 and 8).

A live case's agent answers through its worker's gateway, which calls the provider with the
project's key. Inside a case of the same gate, a tool finds that key nowhere (its
environment, every file it can read), finds no TCP or UDP address that answers (cloud
metadata, the engine's bridge gateway where the gate's API and the provider listen, loopback,
a neighbour container on the bridge standing in for another case, an outside address), finds
the gateway refusing a token that is not its channel's, and finds no provider library to
import (the runner image carries none); the engine shows every case container with network
`none`. The gate's recordings then replay it with no model call. The probing project is
tests/fixtures/escape.py's, which the compose test submits too.
"""

from __future__ import annotations

import json
import secrets
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from gate_service.client.api import GateClient
from tests.e2e.conftest import running
from tests.fixtures.auth import ADMIN_TOKEN, bearer, project_token
from tests.fixtures.db import create_database, drop_database
from tests.fixtures.escape import (
    ESCAPE_CASES,
    LIVE_BOT,
    CaseNetworks,
    assert_no_network,
    bridge_gateway,
    case_statuses,
    engine_netns_pid,
    escape_project,
    failure_reasons,
    neighbour,
    wait_answering,
)
from tests.fixtures.fake_llm import FakeProvider
from tests.fixtures.projects import bundle_of, write

pytestmark = pytest.mark.docker


@pytest.fixture
def provider() -> Iterator[FakeProvider]:
    # On every address (its url names loopback): a case that reached the bridge gateway at
    # its port would find it answering.
    fake = FakeProvider(host="0.0.0.0")
    try:
        yield fake
    finally:
        fake.close()


@pytest.fixture
def serve(
    docker_engine: None, pg_server_url: str, gate_url: str, tmp_path: Path
) -> Iterator[dict[str, Any]]:
    """``gate_url`` first: its serve has prepared the images, so this one starts quickly. It
    listens on every address of this host (GATE_HOST), as a server's would, so the bridge
    gateway at its port answers whoever reaches it."""
    database = create_database(pg_server_url)
    try:
        with running("serve", tmp_path, GATE_DATABASE_URL=database, GATE_HOST="0.0.0.0") as served:
            yield {"url": served.url, "port": int(served.url.rsplit(":", 1)[1])}
    finally:
        drop_database(pg_server_url, database)


def test_a_live_gate_passes_and_its_cases_find_no_key_and_no_way_out(
    serve: dict[str, Any], provider: FakeProvider, tmp_path: Path
) -> None:
    key = f"sk-{secrets.token_hex(16)}"
    bridge = bridge_gateway()
    # The gate's API and the provider at the bridge's address: where the engine's bridge is
    # in a network namespace of its own (CI's runsc engine), nothing of this host's listens
    # there, so they are targets still but cannot first be shown to answer.
    answering = (
        [
            (bridge, serve["port"]),  # the gate's API
            (bridge, provider.port),  # the provider
        ]
        if engine_netns_pid() is None
        else []
    )
    # What answers this host must not answer a case: each of these probes could fail.
    wait_answering(answering)
    with httpx.Client(base_url=serve["url"], headers=bearer(ADMIN_TOKEN), timeout=60) as admin:
        token = project_token(admin, "live", ["submit", "read"])
        for name, value in {"OPENAI_API_KEY": key, "OPENAI_API_BASE": provider.url}.items():
            r = admin.put(f"/v1/projects/live/secrets/{name}", json={"value": value})
            assert r.status_code == 201, r.text
    live = GateClient(serve["url"], token=token)
    project = tmp_path / "p"
    try:
        # Another case's container, had a misconfiguration put it on the bridge (it answers
        # this host by TCP and UDP: neighbour() checks).
        with neighbour() as other, CaseNetworks() as networks:
            targets = [
                ("169.254.169.254", 80),
                (bridge, serve["port"]),
                (bridge, provider.port),
                *other.targets(),
                ("127.0.0.1", serve["port"]),
                ("127.0.0.1", provider.port),
                ("1.1.1.1", 443),
                ("1.1.1.1", 53),
            ]
            gate = live.submit(escape_project(project, key, targets))
            done = live.wait(gate["id"], timeout_s=600)
        # The live gate as a replay suite: its recordings, written into the project, give
        # the same verdicts with no model call.
        exported = live.recordings(gate["id"])["recordings"]
        for recording in exported:
            target = project / recording["path"]
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(json.dumps(recording["content"]))
        again = live.submit(bundle_of(project), model_mode="replay")
        replayed = live.wait(again["id"], timeout_s=600)
    finally:
        live.close()
    assert case_statuses(done) == dict.fromkeys(ESCAPE_CASES, "passed"), failure_reasons(done)
    assert done["status"] == "passed"
    assert_no_network(networks, done)
    # The one call the gate made reached the provider with the project's key.
    assert [auth for auth, _ in provider.calls] == [f"Bearer {key}"]
    assert done["model_calls"]["calls"] == 1 and len(exported) == 1
    assert replayed["status"] == "passed", [c.get("failure_reason") for c in replayed["cases"]]
    assert len(provider.calls) == 1 and replayed["model_calls"]["calls"] == 0


def live_bot(root: Path, cases: int) -> bytes:
    """``cases`` cases of one live agent, which tries a call twice at most."""
    files = {
        "agents/live-bot.yaml": LIVE_BOT,
        "tests/live-bot.yaml": "tests:\n"
        + "".join(
            f"  - name: answers_{i}\n    payload: hi {i}\n"
            '    expected_result: output == "hello from the fake provider"\n'
            for i in range(cases)
        ),
    }
    return bundle_of(write(root, files))


@pytest.fixture
def budgeted(
    docker_engine: None, pg_server_url: str, gate_url: str, tmp_path: Path
) -> Iterator[str]:
    """`gate serve` whose gateway allows each gate two model calls."""
    database = create_database(pg_server_url)
    try:
        with running(
            "serve", tmp_path, GATE_DATABASE_URL=database, GATE_GATEWAY_GATE_MAX_CALLS="2"
        ) as served:
            yield served.url
    finally:
        drop_database(pg_server_url, database)


def test_a_429_then_success_a_budget_reached_and_two_projects_with_their_own_keys(
    budgeted: str, provider: FakeProvider, tmp_path: Path
) -> None:
    clients = {}
    with httpx.Client(base_url=budgeted, headers=bearer(ADMIN_TOKEN), timeout=60) as admin:
        for name in ("alpha", "beta"):
            token = project_token(admin, name, ["submit", "read"])
            for secret, value in {
                "OPENAI_API_KEY": f"sk-{name}",
                "OPENAI_API_BASE": provider.url,
            }.items():
                r = admin.put(f"/v1/projects/{name}/secrets/{secret}", json={"value": value})
                assert r.status_code == 201, r.text
            clients[name] = GateClient(budgeted, token=token)
    alpha, beta = clients["alpha"], clients["beta"]
    one, three = live_bot(tmp_path / "one", 1), live_bot(tmp_path / "three", 3)
    try:
        # A 429 goes back to the gateway's retry (Retry-After: 0), within the agent's 2 tries.
        provider.script = ["429:0"]
        retried = alpha.wait(alpha.submit(one)["id"], timeout_s=600)
        assert retried["status"] == "passed", retried
        assert len(provider.calls) == 2 and retried["model_calls"]["calls"] == 1

        # Two calls per gate: of three cases, the third call fails naming the budget. A
        # budget is no behaviour of the agent's: that case is not judged, and the gate is
        # error (docs/semantics.md, "Provider failures are not agent failures").
        capped = alpha.wait(alpha.submit(three)["id"], timeout_s=600)
        statuses = sorted(case["status"] for case in capped["cases"])
        assert statuses == ["error", "passed", "passed"], capped
        assert capped["status"] == "error"
        (over,) = [c for c in capped["cases"] if c["status"] == "error"]
        assert "gate.calls budget of 2 reached" in over["failure_reason"]

        # Two projects' gates at once (both calls wait at the provider until both came).
        before = len(provider.calls)
        provider.block_limit_s = 300
        provider.script = ["block", "block"]
        gates = [c.submit(one)["id"] for c in (alpha, beta)]
        for _ in gates:
            assert provider.blocked.acquire(timeout=300), "both gates' calls are in flight"
        provider.release()
        for client, gate_id in zip((alpha, beta), gates, strict=True):
            assert client.wait(gate_id, timeout_s=600)["status"] == "passed"
        keys = sorted(str(auth) for auth, _ in provider.calls[before:])
        assert keys == ["Bearer sk-alpha", "Bearer sk-beta"]
    finally:
        provider.release()
        for client in clients.values():
            client.close()


REPORT_SCHEMA = {
    "type": "object",
    "required": ["title", "items"],
    "properties": {
        "title": {"type": "string"},
        "items": {"type": "array", "minItems": 1, "items": {"$ref": "#/$defs/item"}},
    },
    "$defs": {"item": {"type": "object", "properties": {"level": {"enum": ["low", "high"]}}}},
}


def test_a_structured_output_agent_sends_its_schema_live_and_replays(
    serve: dict[str, Any], provider: FakeProvider, tmp_path: Path
) -> None:
    """Issue 38, item 1: the output_schema goes to the provider as response_format, and the
    case's runner (its image carries jsonschema) checks the answer against the whole schema:
    an empty list fails on minItems, live and in replay alike."""
    with httpx.Client(base_url=serve["url"], headers=bearer(ADMIN_TOKEN), timeout=60) as admin:
        token = project_token(admin, "shaped", ["submit", "read"])
        for name, value in {"OPENAI_API_KEY": "sk-shaped", "OPENAI_API_BASE": provider.url}.items():
            r = admin.put(f"/v1/projects/shaped/secrets/{name}", json={"value": value})
            assert r.status_code == 201, r.text

    def answer(body: dict[str, Any]) -> dict[str, Any]:
        empty = "empty" in json.dumps(body["messages"][-1])
        return {"title": "R", "items": [] if empty else [{"level": "high"}]}

    provider.structured_answer = answer
    project = write(
        tmp_path / "p",
        {
            "agents/reporter.yaml": """
                version: "1.0"
                name: reporter
                description: Answers a report.
                model: openai/gpt-4o
                system_prompt: Report.
                output_schema: report
            """,
            "schemas/report.json": json.dumps(REPORT_SCHEMA),
            "tests/reporter.yaml": """
                tests:
                  - name: answers_a_report
                    payload: full
                    expected_result: output.items[0].level == "high"
                  - name: an_empty_report_fails
                    payload: empty
                    expected_result: status == "failed" and "minItems" in error
            """,
        },
    )
    shaped = GateClient(serve["url"], token=token)
    try:
        done = shaped.wait(shaped.submit(bundle_of(project))["id"], timeout_s=600)
        exported = shaped.recordings(done["id"])["recordings"]
        for recording in exported:
            target = project / recording["path"]
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(json.dumps(recording["content"]))
        again = shaped.submit(bundle_of(project), model_mode="replay")
        replayed = shaped.wait(again["id"], timeout_s=600)
    finally:
        shaped.close()
    assert done["status"] == "passed", failure_reasons(done)
    assert len(provider.calls) == 2
    for _, body in provider.calls:
        shape = body["response_format"]
        assert shape["type"] == "json_schema"
        assert shape["json_schema"]["name"] == "report"
        assert shape["json_schema"]["schema"] == REPORT_SCHEMA
    assert len(exported) == 2
    assert all(r["content"]["request"]["response_format"] for r in exported)
    assert replayed["status"] == "passed", failure_reasons(replayed)
    assert len(provider.calls) == 2 and replayed["model_calls"]["calls"] == 0


JUDGED_RULES = {
    # type -> (direction, config)
    "prompt_injection": ("input", {}),
    "topic_restriction": ("input", {"allowed_topics": ["billing"]}),
    "system_prompt_leakage": ("output", {}),
    "data_exfiltration": ("output", {"allowed_domains": ["example.com"]}),
    "relevance": ("output", {}),
}


def judged_project(root: Path) -> Path:
    """An agent per judged guardrail type, each with a case the judge blocks; and two agents
    whose provider fails them: a refused key and an endpoint that does not answer."""
    files: dict[str, str] = {}
    for kind, (direction, config) in JUDGED_RULES.items():
        name = kind.replace("_", "-")
        files[f"agents/{name}.yaml"] = f"""
            version: "1.0"
            name: {name}
            description: Behind a {kind} guardrail.
            model: openai/gpt-4o
            system_prompt: You are the billing assistant.
            guardrails:
              {direction}:
                - type: {kind}
                  config: {json.dumps(config)}
        """
        files[f"tests/{name}.yaml"] = """
            tests:
              - name: blocked
                payload: "VIOLATE: please"
                expected_result: status == "blocked"
        """
    for name, model in (("refused", "openai/gpt-4o"), ("unreachable", "mistral/small")):
        files[f"agents/{name}.yaml"] = f"""
            version: "1.0"
            name: {name}
            description: Its provider fails it.
            model: {model}
            system_prompt: Be brief.
            retry_options: {{attempts: 1, initial_delay: 0, max_delay: 1}}
        """
        files[f"tests/{name}.yaml"] = """
            tests:
              - name: answers
                payload: hi
                expected_result: output == "hello from the fake provider"
        """
    # A model LiteLLM would send to the Responses API, on a project route: chat completions.
    files["agents/pro.yaml"] = """
        version: "1.0"
        name: pro
        description: On a routed model.
        model: openai/gpt-5-pro
        system_prompt: Think hard.
        reasoning_effort: high
    """
    files["tests/pro.yaml"] = """
        tests:
          - name: answers
            payload: hi
            expected_result: status == "completed"
    """
    return write(root, files)


def test_provider_failures_end_error_and_each_judged_guardrail_blocks_live_and_replays(
    serve: dict[str, Any], provider: FakeProvider, tmp_path: Path
) -> None:
    """Issue 38, items 5, 6 and 9: a 401 and an unreachable endpoint end their cases error
    with the provider's reason (the gate error), never failed; each judged guardrail asks the
    project's judge model through the gateway, blocks on its verdict, and replays from the
    gate's recordings with no model call."""
    with socket.socket() as closed:  # a port nothing listens on
        closed.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{closed.getsockname()[1]}/v1"
    with httpx.Client(base_url=serve["url"], headers=bearer(ADMIN_TOKEN), timeout=60) as admin:
        token = project_token(admin, "judged", ["submit", "read"])
        for name, value in {
            "OPENAI_API_KEY": "sk-judged",
            "OPENAI_API_BASE": provider.url,
            "MISTRAL_API_KEY": "sk-mistral",
            "MISTRAL_API_BASE": dead,
        }.items():
            r = admin.put(f"/v1/projects/judged/secrets/{name}", json={"value": value})
            assert r.status_code == 201, r.text
        route = {"pattern": "openai/gpt-5-pro", "api_base": provider.url, "key_secret": "CORP"}
        r = admin.put("/v1/projects/judged/secrets/CORP", json={"value": "sk-corp"})
        assert r.status_code == 201, r.text
        r = admin.put("/v1/projects/judged/model-routes", json={"routes": [route]})
        assert r.status_code == 200, r.text
        r = admin.put("/v1/projects/judged/guardrail-model", json={"model": "openai/gpt-4o-mini"})
        assert r.status_code in (200, 201), r.text

    def decide(body: dict[str, Any]) -> str:
        # The refused agent's request is told by its system prompt; every other is ok.
        return "401" if body["messages"][0]["content"] == "Be brief." else "ok"

    def verdict(body: dict[str, Any]) -> dict[str, Any]:
        violation = "VIOLATE" in json.dumps(body["messages"])
        return {"violation": violation, "reason": "the judge saw VIOLATE"}

    provider.decide = decide
    provider.structured_answer = verdict
    provider.answer = "VIOLATE: an answer the output rules judge"
    project = judged_project(tmp_path / "p")
    judged = GateClient(serve["url"], token=token)
    try:
        done = judged.wait(judged.submit(bundle_of(project))["id"], timeout_s=900)
        exported = judged.recordings(done["id"])["recordings"]
        for recording in exported:
            target = project / recording["path"]
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(json.dumps(recording["content"]))
        for name in ("refused", "unreachable", "pro"):  # the replay: only the guardrails
            (project / "agents" / f"{name}.yaml").unlink()
            (project / "tests" / f"{name}.yaml").unlink()
        calls = len(provider.calls)
        again = judged.submit(bundle_of(project), model_mode="replay")
        replayed = judged.wait(again["id"], timeout_s=900)
    finally:
        judged.close()
    cases = {c["agent_name"]: c for c in done["cases"]}
    assert done["status"] == "error", done
    assert cases["refused"]["status"] == "error", cases["refused"]
    assert "HTTP 401" in cases["refused"]["failure_reason"], cases["refused"]
    assert "Incorrect API key" in cases["refused"]["failure_reason"]
    assert cases["unreachable"]["status"] == "error", cases["unreachable"]
    assert "could not be reached" in cases["unreachable"]["failure_reason"]
    for kind in JUDGED_RULES:
        case = cases[kind.replace("_", "-")]
        assert case["status"] == "passed", (kind, case)
    assert cases["pro"]["status"] == "passed", cases["pro"]
    (pro,) = [i for i, (_, b) in enumerate(provider.calls) if "gpt-5-pro" in b.get("model", "")]
    assert provider.paths[pro] == "/v1/chat/completions"
    assert provider.calls[pro][0] == "Bearer sk-corp"
    judge_calls = [b for _, b in provider.calls if b.get("model") == "gpt-4o-mini"]
    assert len(judge_calls) == len(JUDGED_RULES), [b.get("model") for _, b in provider.calls]
    assert all(b["response_format"]["json_schema"]["name"] == "guardrail_verdict"
               for b in judge_calls)  # fmt: skip
    assert replayed["status"] == "passed", failure_reasons(replayed)
    assert len(provider.calls) == calls and replayed["model_calls"]["calls"] == 0
