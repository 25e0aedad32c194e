"""The model gateway's service side through its real parts: a channel's Unix socket, LiteLLM
imported once, and the OpenAI-compatible fake provider on loopback. No Docker, no Postgres.

No assertion here is on wall-clock time: retries and deadlines are judged by what the
provider saw and by the error's kind."""

from __future__ import annotations

import logging
import os
import shutil
import socket
import stat
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from gate_runner.gateway_wire import COMPLETE_PATH, MAX_REQUEST_BYTES, SOCKET_NAME
from gate_runner.models import ReplayModel, request_key
from gate_service.gateway import Budgets, Limits, ModelGateway, ModelRoute
from gate_service.gateway.gateway import LITELLM_LOGGERS
from gate_service.gateway.transport import RefusedAddress, guarded_client
from tests.fixtures.fake_llm import FakeProvider
from tests.fixtures.gateway import Gateways, ask, moderate, post, request
from tests.fixtures.pages import PageServer

KEY_A = "sk-project-a-0001"
KEY_B = "sk-project-b-0002"


def openai(provider: FakeProvider, key: str = KEY_A) -> dict[str, str]:
    return {"OPENAI_API_KEY": key, "OPENAI_API_BASE": provider.url}


def error(answer: dict[str, Any]) -> dict[str, Any]:
    body: dict[str, Any] = answer["error"]
    return body


def test_litellm_logs_no_lines_of_its_own_for_a_call_and_its_warnings_reach_the_service_log(
    gateways: Gateways, fake_provider: FakeProvider, caplog: pytest.LogCaptureFixture
) -> None:
    # LiteLLM logged two INFO lines a call, on a stdout handler of its own and again on the
    # service's: noise in the log that the call's record already says better.
    channel = gateways.open(openai(fake_provider))
    assert ask(channel, "hi")[0] == 200  # LiteLLM imported (its import logs at DEBUG)
    with caplog.at_level(logging.DEBUG):
        status, answer = ask(channel, "hello?")
        assert status == 200, answer
        assert [r.getMessage() for r in caplog.records if r.name.startswith("LiteLLM")] == []
        assert all(logging.getLogger(name).handlers == [] for name in LITELLM_LOGGERS)
        caplog.clear()
        logging.getLogger("LiteLLM").warning("the provider is deprecating this model")
    said = [(r.name, r.getMessage()) for r in caplog.records]
    assert said == [("LiteLLM", "the provider is deprecating this model")]


@pytest.mark.slow
def test_a_call_reaches_the_provider_with_the_projects_key_and_is_recorded(
    gateways: Gateways, fake_provider: FakeProvider, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The process environment points elsewhere: key and endpoint must come from the secrets.
    monkeypatch.setenv("OPENAI_API_BASE", "http://127.0.0.1:9/v1")
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:9/v1")
    channel = gateways.open(openai(fake_provider))
    assert stat.S_IMODE(channel.folder.stat().st_mode) == 0o755
    assert stat.S_IMODE((channel.folder / SOCKET_NAME).stat().st_mode) == 0o666
    assert channel.folder.parent == gateways.root

    status, answer = ask(channel, "hello?")
    assert status == 200, answer
    assert answer["content"] == fake_provider.answer
    assert answer["usage"] == {"prompt_tokens": 3, "completion_tokens": 4}
    assert answer["attempts"] == 1
    assert fake_provider.calls == [
        (
            f"Bearer {KEY_A}",
            {
                "model": "gpt-4o",
                "messages": [{"role": "user", "content": "hello?"}],
                "temperature": 0.0,
            },
        )
    ]
    (record,) = channel.records
    key = request_key(request("hello?").replay_request())
    assert answer["request_hash"] == record.request_hash == key
    assert record.request == request("hello?").replay_request()
    assert record.status == "ok"
    assert record.error is None
    assert record.reply is not None
    assert record.reply.raw() == {
        "content": fake_provider.answer,
        "usage": {"prompt_tokens": 3, "completion_tokens": 4},
    }
    assert (record.tokens_in, record.tokens_out, record.attempts) == (3, 4, 1)
    assert record.cost_usd > 0  # gpt-4o is in LiteLLM's local cost map
    assert answer["cost_usd"] == record.cost_usd
    assert record.latency_ms >= 0
    assert answer["latency_ms"] == record.latency_ms

    channel.close()
    assert not channel.folder.exists()
    channel.close()  # idempotent


def test_two_projects_at_once_each_reach_the_provider_with_their_own_key(
    gateways: Gateways, fake_provider: FakeProvider
) -> None:
    a = gateways.open(openai(fake_provider, KEY_A), gate="ga", project="pa")
    b = gateways.open(openai(fake_provider, KEY_B), gate="gb", project="pb")
    # The first two calls wait at the provider until both are there: the two projects'
    # calls are in flight in the gateway at the same time.
    fake_provider.script = ["block", "block"]
    jobs = [(a, f"{KEY_A} #{i}") for i in range(4)] + [(b, f"{KEY_B} #{i}") for i in range(4)]
    order = [jobs[0], jobs[4], *jobs[1:4], *jobs[5:]]
    with ThreadPoolExecutor(max_workers=4) as pool:
        first = [pool.submit(ask, channel, text) for channel, text in order[:2]]
        assert fake_provider.blocked.acquire(timeout=30)
        assert fake_provider.blocked.acquire(timeout=30)
        fake_provider.release()
        rest = [pool.submit(ask, channel, text) for channel, text in order[2:]]
        answers = [future.result(timeout=60) for future in first + rest]
    assert [status for status, _ in answers] == [200] * 8
    assert len(fake_provider.calls) == 8
    for authorization, body in fake_provider.calls:
        text = body["messages"][0]["content"]
        assert authorization == f"Bearer {text.split(' #')[0]}", (authorization, text)
    assert len(a.records) == len(b.records) == 4


def test_a_foreign_missing_or_outlived_token_is_refused_and_nothing_is_forwarded(
    gateways: Gateways, fake_provider: FakeProvider
) -> None:
    mine = gateways.open(openai(fake_provider), gate="g1", case="c1")
    other_case = gateways.open(openai(fake_provider), gate="g1", case="c2")
    other_gate = gateways.open(openai(fake_provider), gate="g2", case="c1")
    for token in (other_case.token, other_gate.token, None, "", mine.token + "x"):
        status, answer = post(mine.folder, request(), token=token)
        assert status == 403, (token, answer)
        assert error(answer)["kind"] == "refused"
    status, answer = post(
        mine.folder, request(), token=None, headers={"Authorization": mine.token}
    )  # not Bearer
    assert (status, error(answer)["kind"]) == (403, "refused")

    other_case.close()
    with pytest.raises((FileNotFoundError, ConnectionRefusedError)):
        post(other_case.folder, request(), token=other_case.token)
    assert not other_case.folder.exists()
    assert fake_provider.calls == []
    assert mine.records == other_case.records == other_gate.records == []
    # The channel that was not closed still answers its own token.
    assert ask(mine)[0] == 200


def test_closing_a_channel_cuts_its_call_in_flight(
    gateways: Gateways, fake_provider: FakeProvider
) -> None:
    channel = gateways.open(openai(fake_provider))
    fake_provider.script = ["block"]
    outcome: list[Any] = []

    def call() -> None:
        try:
            outcome.append(ask(channel))
        except Exception as exc:  # the connection cut under it
            outcome.append(exc)

    thread = threading.Thread(target=call)
    thread.start()
    assert fake_provider.blocked.acquire(timeout=30)
    channel.close()
    thread.join(timeout=30)
    fake_provider.release()
    assert len(outcome) == 1
    assert not (isinstance(outcome[0], tuple) and outcome[0][0] == 200), outcome


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"{not json", "not JSON"),
        (b"[]", "JSON object"),
        (b'{"model": "openai/gpt-4o", "messages": [], "extra": 1}', "unknown field"),
        (b'{"model": "", "messages": []}', "model"),
        (b'{"model": "openai/gpt-4o", "messages": "hi"}', "messages"),
        (b'{"model": "openai/gpt-4o", "messages": [], "attempts": 0}', "attempts"),
        (b'{"model": "openai/gpt-4o", "messages": [], "agent": "../x"}', "agent"),
    ],
)
def test_a_request_that_is_not_a_completion_request_is_a_bad_request(
    gateways: Gateways, fake_provider: FakeProvider, body: bytes, message: str
) -> None:
    channel = gateways.open(openai(fake_provider))
    status, answer = post(channel.folder, body, token=channel.token)
    assert (status, error(answer)["kind"]) == (400, "bad_request")
    assert message in error(answer)["message"]
    assert fake_provider.calls == []


def test_a_request_over_the_size_limit_is_refused_unread(
    gateways: Gateways, fake_provider: FakeProvider
) -> None:
    channel = gateways.open(openai(fake_provider))
    # Only the header claims the size, and no body follows: the gateway answers unread.
    head = (
        f"POST {COMPLETE_PATH} HTTP/1.1\r\nHost: gateway\r\n"
        f"Authorization: Bearer {channel.token}\r\n"
        f"Content-Length: {MAX_REQUEST_BYTES + 1}\r\n\r\n"
    )
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(30)
        sock.connect(str(channel.folder / SOCKET_NAME))
        sock.sendall(head.encode())
        answer = sock.makefile("rb").read().decode()
    assert answer.startswith("HTTP/1.0 400 "), answer
    assert '"kind": "bad_request"' in answer
    assert str(MAX_REQUEST_BYTES) in answer
    assert fake_provider.calls == []


def test_no_route_names_the_secret_it_looked_for(
    gateways: Gateways, fake_provider: FakeProvider
) -> None:
    # The worker's environment holds OPENAI_API_KEY (the fixture): it must not be used.
    assert os.environ["OPENAI_API_KEY"]
    channel = gateways.open({"ANTHROPIC_API_KEY": "sk-ant-0001"})
    status, answer = ask(channel)
    assert (status, error(answer)["kind"]) == (424, "no_route")
    assert "OPENAI_API_KEY" in error(answer)["message"]
    status, answer = ask(channel, model="gemini/gemini-1.5-pro")
    assert "GEMINI_API_KEY" in error(answer)["message"]
    assert fake_provider.calls == []
    assert [r.status for r in channel.records] == ["no_route", "no_route"]


def test_a_project_route_sends_matching_models_to_its_endpoint_with_its_key(
    gateways: Gateways, fake_provider: FakeProvider
) -> None:
    routes = [ModelRoute("corp/*", fake_provider.url, "CORP_LLM_KEY")]
    channel = gateways.open({"CORP_LLM_KEY": "sk-corp-0001"}, routes=routes)
    status, answer = ask(channel, model="corp/llama-3")
    assert status == 200, answer
    assert fake_provider.calls[0][0] == "Bearer sk-corp-0001"
    assert fake_provider.calls[0][1]["model"] == "corp/llama-3"
    missing = gateways.open({}, case="c2", routes=routes)
    status, answer = ask(missing, model="corp/llama-3")
    assert (status, error(answer)["kind"]) == (424, "no_route")
    assert "CORP_LLM_KEY" in error(answer)["message"]


def test_a_route_or_a_base_secret_at_a_link_local_address_is_never_called(
    gateways: Gateways, fake_provider: FakeProvider
) -> None:
    routes = [ModelRoute("meta/*", "http://169.254.169.254/v1")]
    channel = gateways.open(
        {"OPENAI_API_KEY": KEY_A, "OPENAI_API_BASE": "http://[fe80::1]:8080/v1"}, routes=routes
    )
    for model in ("meta/llama", "openai/gpt-4o"):
        status, answer = ask(channel, model=model)
        assert (status, error(answer)["kind"]) == (424, "no_route"), answer
        assert "link-local" in error(answer)["message"]
    assert "route 'meta/*'" in error(ask(channel, model="meta/x")[1])["message"]
    # The base secret's value is the project's secret: the agent is told its name only.
    message = error(ask(channel, model="openai/gpt-4o")[1])["message"]
    assert "http://[fe80::1]:8080/v1" not in message and "[REDACTED:OPENAI_API_BASE]" in message
    assert fake_provider.calls == []


@pytest.mark.slow
@pytest.mark.parametrize(
    ("limits", "answered", "limit", "allowed", "used"),
    [
        (Budgets(gate=Limits(calls=2)), 2, "gate.calls", 2, 2),
        # Each call spends 3 + 4 tokens; the one that crosses 10 is answered.
        (Budgets(gate=Limits(tokens=10)), 2, "gate.tokens", 10, 14),
        (Budgets(gate=Limits(cost_usd=0.00001)), 1, "gate.cost_usd", 0.00001, None),
        (Budgets(project=Limits(calls=1)), 1, "project.calls", 1, 1),
        (Budgets(project=Limits(tokens=5)), 1, "project.tokens", 5, 7),
    ],
)
def test_a_call_over_a_budget_fails_naming_the_limit_and_the_amount_used(
    gateways: Gateways,
    fake_provider: FakeProvider,
    limits: Budgets,
    answered: int,
    limit: str,
    allowed: float,
    used: float | None,
) -> None:
    # Each call on a channel of its own: gate budgets are shared by the gate's channels and
    # project budgets by the project's, whichever gate.
    statuses = []
    last: dict[str, Any] = {}
    for i in range(answered + 1):
        gate = "g1" if limit.startswith("gate") else f"g{i}"
        channel = gateways.open(openai(fake_provider), gate=gate, case=f"c{i}", budgets=limits)
        status, last = ask(channel, f"call {i}")
        statuses.append(status)
    assert statuses == [200] * answered + [429]
    refused = error(last)
    assert refused["kind"] == "budget"
    assert refused["limit"] == limit
    assert refused["allowed"] == allowed
    spent = gateways.channels[0].records[0].cost_usd * answered
    assert refused["used"] == pytest.approx(used if used is not None else spent)
    assert refused["message"].startswith(f"{limit} budget of ")
    assert "reached (" in refused["message"]
    assert len(fake_provider.calls) == answered
    assert gateways.channels[-1].records[-1].status == "budget"


def test_a_budget_store_that_does_not_answer_refuses_the_call_as_a_budget(
    fake_provider: FakeProvider,
) -> None:
    """Fail closed, and not as a provider fault: a provider error would send the agent to
    its fallback model, which the same store would refuse."""
    from sqlalchemy import create_engine
    from sqlalchemy.orm import sessionmaker

    from gate_service.gateway.spend import ProjectSpend

    engine = create_engine("postgresql+psycopg://nobody@127.0.0.1:9/none", pool_pre_ping=False)
    root = Path(tempfile.mkdtemp(prefix="gw-"))
    gateway = ModelGateway(
        budgets=Budgets(project=Limits(calls=5)),
        socket_root=root,
        project_spend=ProjectSpend(sessionmaker(bind=engine)),
    )
    channel = gateway.open_channel(
        gate_id="g1", case_id="c1", project_id=str(uuid.uuid4()), secrets=openai(fake_provider),
        deadline=time.monotonic() + 60,
    )  # fmt: skip
    try:
        status, answer = ask(channel, "hello?")
    finally:
        channel.close()
        engine.dispose()
        shutil.rmtree(root, ignore_errors=True)
    assert (status, error(answer)["kind"]) == (429, "budget"), answer
    assert "could not be checked (the gate's database did not answer)" in error(answer)["message"]
    assert fake_provider.calls == []


def wait_for(condition: Callable[[], bool], what: str) -> None:
    for _ in range(3000):
        if condition():
            return
        time.sleep(0.01)
    raise AssertionError(f"not within 30 s: {what}")


@pytest.mark.parametrize("scope", ["gate", "project"])
def test_a_call_over_the_concurrent_limit_waits_for_the_one_in_flight(
    gateways: Gateways, fake_provider: FakeProvider, scope: str
) -> None:
    budgets = Budgets(**{scope: Limits(concurrent_calls=1)})  # type: ignore[arg-type]
    first = gateways.open(openai(fake_provider), gate="g1", case="c1", budgets=budgets)
    second = gateways.open(
        openai(fake_provider), gate="g1" if scope == "gate" else "g2", case="c2", budgets=budgets
    )
    fake_provider.script = ["block"]
    ledger = gateways.gateway._ledger
    with ThreadPoolExecutor(max_workers=2) as pool:
        in_flight = pool.submit(ask, first)
        assert fake_provider.blocked.acquire(timeout=30)
        waiting = pool.submit(ask, second)
        wait_for(lambda: ledger.waiting == 1, "the second call waits for a place")
        assert len(fake_provider.calls) == 1  # not forwarded, not refused: waiting
        fake_provider.release()
        assert in_flight.result(timeout=30)[0] == 200
        assert waiting.result(timeout=30)[0] == 200
    assert len(fake_provider.calls) == 2


@pytest.mark.slow
def test_a_call_waiting_for_a_concurrent_place_ends_at_the_gates_deadline(
    gateways: Gateways, fake_provider: FakeProvider
) -> None:
    budgets = Budgets(gate=Limits(concurrent_calls=1))
    first = gateways.open(openai(fake_provider), case="c1", budgets=budgets)
    second = gateways.open(openai(fake_provider), case="c2", budgets=budgets, deadline_s=1)
    fake_provider.script = ["block"]
    with ThreadPoolExecutor(max_workers=1) as pool:
        in_flight = pool.submit(ask, first)
        assert fake_provider.blocked.acquire(timeout=30)
        status, answer = ask(second)
        fake_provider.release()
        assert in_flight.result(timeout=30)[0] == 200
    assert (status, error(answer)["kind"]) == (504, "deadline")
    assert error(answer)["limit"] == "gate.concurrent_calls"
    assert "until the gate's deadline" in error(answer)["message"]
    assert len(fake_provider.calls) == 1


def test_a_429_is_retried_after_its_retry_after_then_succeeds(
    gateways: Gateways, fake_provider: FakeProvider, monkeypatch: pytest.MonkeyPatch
) -> None:
    channel = gateways.open(openai(fake_provider))
    waits: list[float] = []
    monkeypatch.setattr(channel, "wait", lambda seconds: waits.append(seconds) or False)
    fake_provider.script = ["429:3", "ok"]
    status, answer = ask(channel, attempts=2)
    assert status == 200, answer
    assert answer["attempts"] == 2
    assert waits == [3.0]  # the provider's Retry-After, as it said
    assert len(fake_provider.calls) == 2
    assert channel.records[0].attempts == 2


def test_a_5xx_is_retried_then_succeeds(gateways: Gateways, fake_provider: FakeProvider) -> None:
    channel = gateways.open(openai(fake_provider))
    fake_provider.script = ["500", "ok"]
    status, answer = ask(channel, attempts=3)
    assert status == 200, answer
    assert answer["attempts"] == 2
    assert len(fake_provider.calls) == 2


def test_429s_beyond_the_attempts_are_rate_limited(
    gateways: Gateways, fake_provider: FakeProvider
) -> None:
    channel = gateways.open(openai(fake_provider))
    fake_provider.script = ["429", "429", "429"]
    status, answer = ask(channel, attempts=2)
    assert (status, error(answer)["kind"]) == (503, "rate_limited")
    assert len(fake_provider.calls) == 2
    assert KEY_A not in error(answer)["message"]
    (record,) = channel.records
    assert (record.status, record.attempts, record.reply) == ("rate_limited", 2, None)


def test_a_provider_error_is_not_retried_when_the_agent_allows_one_try(
    gateways: Gateways, fake_provider: FakeProvider
) -> None:
    channel = gateways.open(openai(fake_provider))
    fake_provider.script = ["500"]
    status, answer = ask(channel)
    assert (status, error(answer)["kind"]) == (502, "provider")
    assert len(fake_provider.calls) == 1


def test_a_retry_after_past_the_deadline_ends_at_once_with_deadline(
    gateways: Gateways, fake_provider: FakeProvider
) -> None:
    # Waiting out the 600 s would hang this test; the gateway must not even start to.
    channel = gateways.open(openai(fake_provider), deadline_s=60)
    fake_provider.script = ["429:600", "ok"]
    status, answer = ask(channel, attempts=3)
    assert (status, error(answer)["kind"]) == (504, "deadline")
    assert "600 s" in error(answer)["message"]
    assert len(fake_provider.calls) == 1


def test_no_call_is_forwarded_after_the_deadline(
    gateways: Gateways, fake_provider: FakeProvider
) -> None:
    channel = gateways.open(openai(fake_provider), deadline_s=-1)
    status, answer = ask(channel, attempts=3)
    assert (status, error(answer)["kind"]) == (504, "deadline")
    assert fake_provider.calls == []


def test_recorded_calls_export_as_recordings_replay_finds_by_key(
    gateways: Gateways, fake_provider: FakeProvider, tmp_path: Path
) -> None:
    channel = gateways.open(openai(fake_provider))
    assert ask(channel, "first")[0] == 200
    assert ask(channel, "second", agent="helper")[0] == 200
    fake_provider.script = ["500"]
    assert ask(channel, "failed")[0] == 502
    written = channel.export_recordings(tmp_path / "recordings")
    assert sorted(p.parent.name for p in written) == ["bot", "helper"]
    for path in written:
        record = next(r for r in channel.records if r.request_hash[:24] == path.stem)
        assert path.name == f"{record.request_hash[:24]}.json"
    replay = ReplayModel(tmp_path / "recordings" / "bot")
    reply = replay.complete(
        model="openai/gpt-4o",
        messages=[{"role": "user", "content": "first"}],
        tools=[],
        temperature=0.0,
        context={},
    )
    assert reply.content == fake_provider.answer
    assert dict(reply.usage) == {"prompt_tokens": 3, "completion_tokens": 4}
    totals = channel.totals()
    assert (totals.calls, totals.tokens_in, totals.tokens_out, totals.tokens) == (3, 6, 8, 14)
    assert (totals.answered, totals.failed) == (2, 1)  # the provider's 500 was no answer
    assert totals.cost_usd == pytest.approx(2 * channel.records[0].cost_usd)


def test_a_gate_s_budget_is_forgotten_when_it_ends(
    gateways: Gateways, fake_provider: FakeProvider
) -> None:
    budgets = Budgets(gate=Limits(calls=1))
    assert ask(gateways.open(openai(fake_provider), budgets=budgets))[0] == 200
    assert ask(gateways.open(openai(fake_provider), case="c2", budgets=budgets))[0] == 429
    gateways.gateway.end_gate("g1")
    assert ask(gateways.open(openai(fake_provider), case="c3", budgets=budgets))[0] == 200


@pytest.mark.slow
def test_an_attempt_is_cut_at_the_deadline_and_not_retried(
    gateways: Gateways, fake_provider: FakeProvider
) -> None:
    # The provider never answers; the attempt's own timeout (60 s) is longer than the time
    # left, so the gate's deadline ends it, and no retry follows.
    channel = gateways.open(openai(fake_provider), deadline_s=1.0)
    fake_provider.script = ["hang", "ok"]
    status, answer = ask(channel, attempts=3, timeout_s=60)
    assert (status, error(answer)["kind"]) == (504, "deadline")
    assert len(fake_provider.calls) == 1
    assert channel.records[0].attempts == 1


def test_a_fault_of_the_gateway_is_a_model_error_not_a_dropped_connection(
    gateways: Gateways, fake_provider: FakeProvider, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(*args: Any) -> Any:
        raise RuntimeError("a bug")

    monkeypatch.setattr(gateways.gateway, "complete", broken)
    channel = gateways.open(openai(fake_provider))
    status, answer = ask(channel)
    assert (status, error(answer)["kind"]) == (502, "provider")
    assert "a bug" not in error(answer)["message"]


def test_a_tool_call_answer_is_passed_on_and_replays(
    gateways: Gateways, fake_provider: FakeProvider, tmp_path: Path
) -> None:
    channel = gateways.open(openai(fake_provider))
    fake_provider.script = ["tool"]
    tools = [{"type": "function", "function": {"name": "lookup", "parameters": {}}}]
    status, answer = ask(channel, "look it up", tools=tools)
    assert status == 200, answer
    assert answer["content"] is None
    assert answer["tool_calls"] == [{"id": "call_1", "name": "lookup", "arguments": '{"q": "x"}'}]
    assert fake_provider.calls[0][1]["tools"] == tools
    channel.export_recordings(tmp_path)
    reply = ReplayModel(tmp_path / "bot").complete(
        model="openai/gpt-4o",
        messages=[{"role": "user", "content": "look it up"}],
        tools=tools,
        temperature=0.0,
        context={},
    )
    assert [(c.id, c.name, c.arguments) for c in reply.tool_calls] == [
        ("call_1", "lookup", {"q": "x"})
    ]


def test_a_moderation_reaches_the_providers_moderation_endpoint_and_counts_as_a_call(
    gateways: Gateways, fake_provider: FakeProvider
) -> None:
    channel = gateways.open(openai(fake_provider), budgets=Budgets(gate=Limits(calls=2)))
    status, answer = moderate(channel, "we attack at dawn")
    assert status == 200, answer
    assert answer["flagged"] is True and answer["category_scores"]["violence"] == 0.95
    ((auth, body),) = fake_provider.calls
    assert auth == f"Bearer {KEY_A}"
    assert body == {"input": "we attack at dawn", "model": "omni-moderation-latest"}
    (record,) = channel.records
    key = request_key(
        {"moderation": {"model": "omni-moderation-latest", "input": "we attack at dawn"}}
    )
    assert (record.status, record.request_hash, record.agent) == ("ok", key, "bot")
    assert record.reply is not None and record.reply.raw()["moderation"]["flagged"] is True
    # A 429 is retried by the gateway within the tries asked for, and by nothing else (the
    # OpenAI client's own retries would have sent a third request).
    fake_provider.script = ["429:0"]
    status, answer = moderate(channel, "a calm day", attempts=2)
    assert status == 200 and answer["flagged"] is False, answer
    assert (len(fake_provider.calls), channel.records[-1].attempts) == (3, 2)
    status, answer = moderate(channel, "one more")
    assert (status, error(answer)["kind"], error(answer)["limit"]) == (429, "budget", "gate.calls")


def test_a_moderation_s_429_and_5xx_fail_after_the_tries_allowed_and_no_more(
    gateways: Gateways, fake_provider: FakeProvider
) -> None:
    channel = gateways.open(openai(fake_provider))
    fake_provider.script = ["429:0", "500"]
    status, answer = moderate(channel, "hi")
    assert (status, error(answer)["kind"]) == (503, "rate_limited"), answer
    status, answer = moderate(channel, "hi")
    assert (status, error(answer)["kind"]) == (502, "provider"), answer
    assert error(answer)["message"].startswith("moderation: openai answered HTTP 500 to POST ")
    assert len(fake_provider.calls) == 2


def test_a_moderation_with_no_key_is_no_route_and_nothing_is_sent(
    gateways: Gateways, fake_provider: FakeProvider
) -> None:
    channel = gateways.open({"ANTHROPIC_API_KEY": "sk-ant"})
    status, answer = moderate(channel, "hi")
    assert (status, error(answer)["kind"]) == (424, "no_route")
    assert "OPENAI_API_KEY" in error(answer)["message"]
    status, answer = post(
        channel.folder, {"model": "m", "input": 3}, token=channel.token, path="/v1/moderate"
    )
    assert (status, error(answer)["kind"]) == (400, "bad_request")
    assert fake_provider.calls == []


@pytest.mark.parametrize(
    ("model", "options", "sent"),
    [
        ("openai/o3-mini", {"reasoning_effort": "low"}, "low"),
        ("openai/gpt-5.1", {"reasoning_effort": "off"}, "none"),
        # A model LiteLLM knows takes no reasoning effort: dropped, not a failed call.
        ("openai/gpt-4o", {"reasoning_effort": "high"}, None),
        ("openai/gpt-4o", {}, None),
    ],
)
def test_reasoning_options_reach_the_provider_where_the_model_takes_them(
    gateways: Gateways,
    fake_provider: FakeProvider,
    model: str,
    options: dict[str, Any],
    sent: str | None,
) -> None:
    channel = gateways.open(openai(fake_provider))
    status, answer = ask(channel, model=model, options=options)
    assert status == 200, answer
    ((_, body),) = fake_provider.calls
    assert body.get("reasoning_effort") == sent
    (record,) = channel.records
    # The replay key covers the options the agent set, and only when it set one.
    assert ("options" in record.request) == bool(options)


def test_options_the_wire_does_not_know_are_a_bad_request(
    gateways: Gateways, fake_provider: FakeProvider
) -> None:
    channel = gateways.open(openai(fake_provider))
    for options in ({"reasoning_effort": "extreme"}, {"top_k": 3}, {"reasoning_budget": 0}):
        status, answer = ask(channel, options=options)
        assert (status, error(answer)["kind"]) == (400, "bad_request"), options
    assert fake_provider.calls == []


def fetch(channel: Any, url: str, **fields: Any) -> tuple[int, dict[str, Any]]:
    body = {"url": url, "agent": "bot", **fields}
    return post(channel.folder, body, token=channel.token, path="/v1/fetch")


def test_a_page_on_the_egress_allowlist_is_fetched_recorded_and_every_redirect_checked(
    gateways: Gateways,
) -> None:
    pages = PageServer()
    try:
        channel = gateways.open({}, egress=["127.0.0.1"])
        status, answer = fetch(channel, f"{pages.url}/page")
        assert status == 200, answer
        assert (answer["status"], answer["text"]) == (200, "Prices Tea costs 3 coins.")
        (record,) = channel.records
        assert record.request == {"fetch": {"url": f"{pages.url}/page", "follow_redirects": True}}
        # A redirect within the allowlist is followed; one to a host off it is refused.
        status, answer = fetch(channel, f"{pages.url}/to/{pages.url}/page")
        assert (status, answer["url"]) == (200, f"{pages.url}/page")
        off = f"http://localhost:{pages.port}/page"
        status, answer = fetch(channel, f"{pages.url}/to/{off}")
        assert (status, error(answer)["kind"]) == (424, "no_route"), answer
        assert "localhost is not on the project's egress allowlist" in error(answer)["message"]
        # Not followed when the agent asks not to: the redirect is the answer.
        status, answer = fetch(channel, f"{pages.url}/to/{off}", follow_redirects=False)
        assert (status, answer["redirect_url"]) == (200, off)
        assert pages.paths.count("/page") == 2  # localhost's page was never fetched
    finally:
        pages.close()


def test_a_page_with_a_query_is_fetched_and_a_request_with_one_is_not_refused(
    gateways: Gateways,
) -> None:
    """A query is no reason to refuse a request (a page's search, an API's parameters,
    Azure's api-version); only a configured endpoint may not have one."""
    pages = PageServer()
    try:
        channel = gateways.open({}, egress=["127.0.0.1"])
        status, answer = fetch(channel, f"{pages.url}/page?q=tea#top")
        assert status == 200, answer
        assert pages.paths == ["/page?q=tea"]
    finally:
        pages.close()
    with guarded_client() as client:
        with pytest.raises(RefusedAddress, match="link-local"):
            client.get("http://169.254.169.254/latest?x=1")


@pytest.mark.parametrize(
    ("egress", "url", "says"),
    [
        ([], "http://127.0.0.1:9/page", "not on the project's egress allowlist"),
        (["example.com"], "http://api.example.com/", "not on the project's egress allowlist"),
        (["169.254.169.254"], "http://169.254.169.254/latest", "link-local"),
        (["127.0.0.1"], "file:///etc/passwd", "http:// or https://"),
    ],
)
def test_a_page_off_the_allowlist_or_at_metadata_is_never_fetched(
    gateways: Gateways, egress: list[str], url: str, says: str
) -> None:
    channel = gateways.open({}, egress=egress)
    status, answer = fetch(channel, url)
    assert (status, error(answer)["kind"]) == (424, "no_route"), answer
    assert says in error(answer)["message"]


def test_a_model_endpoint_s_redirect_is_not_followed(gateways: Gateways) -> None:
    # A project's endpoint answers a redirect (it could point at cloud metadata): the
    # gateway's clients follow none, so the target is never asked.
    pages = PageServer()
    try:
        base = f"{pages.url}/to/{pages.url}/elsewhere"
        channel = gateways.open({}, routes=[ModelRoute("corp/*", base)])
        status, answer = ask(channel, model="corp/llm", attempts=1)
        assert status == 424, answer  # no_route: no other try gets past it
        secrets = {"OPENAI_API_KEY": "k", "OPENAI_API_BASE": base}
        status, answer = moderate(gateways.open(secrets, case="c2"), "hi")
        assert status == 424, answer
        # Each endpoint asked once; the redirect's target, /elsewhere..., never.
        assert [p.startswith("/to/") for p in pages.paths] == [True, True], pages.paths
    finally:
        pages.close()


def test_the_guarded_transport_refuses_metadata_before_connecting() -> None:
    with guarded_client(timeout=5) as client:
        for url in ("http://169.254.169.254/latest", "http://[fd00:ec2::254]/", "http://0.0.0.0/"):
            with pytest.raises(RefusedAddress, match="the gateway does not call it"):
                client.get(url)
