"""Live models through the case's model gateway (gate_runner/gateway_wire.py), against a fake
gateway on a Unix socket: the reply and what it cost reach the model span, every error kind
becomes the agent's model error, the runner never retries on top, and record mode writes
recordings that replay."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from gate_runner import case_env
from gate_runner import gateway_wire as wire
from gate_runner.contract import CaseResult, Span
from gate_runner.invocations import Isolation
from gate_runner.models import (
    MAX_ANSWER_HEAD_BYTES,
    GatewayChannel,
    GatewayModel,
    LiveModel,
    ModelReply,
    ScriptedModel,
    choose_model,
    request_key,
)
from gate_runner.runtime_errors import AgentRunError, ModelCallError
from gate_service.runner_contract import parse_runner_output
from tests.fixtures.fake_gateway import FakeGateway, Undeclared, reply
from tests.fixtures.projects import live_project, write
from tests.fixtures.runner import judged

RUNNER_SOURCE = Path(__file__).resolve().parents[2] / "runner_image"
BUDGET = wire.GatewayError(
    kind="budget",
    message="the gate's token budget (gate.tokens) is 1000, and 1200 are used",
    limit="gate.tokens",
    allowed=1000,
    used=1200,
)


def through(gateway: FakeGateway, project: Path) -> CaseResult:
    """live-bot's case, run with the fake gateway as its model gateway channel. A case whose
    model call failed outside the agent is not judged (case_error): the tests say which."""
    return judged(
        project,
        "tests/live-bot.yaml",
        "answers",
        isolation=Isolation(gateway=gateway.channel),
        judgeable=False,
        fresh=gateway.rewind,
    )


def model_span(result: CaseResult) -> Span:
    return next(s for s in result.invocations[0].traces if s.type == "model_call")


def test_a_live_run_goes_through_the_gateway_and_its_span_shows_the_call(
    fake_gateway: FakeGateway, tmp_path: Path
) -> None:
    result = through(fake_gateway, live_project(tmp_path / "p"))
    assert result.passed, result.failure_reason
    [request] = fake_gateway.requests
    assert request["model"] == "openai/gpt-4o"
    assert request["agent"] == "live-bot"
    assert request["attempts"] == 3  # retry_options.attempts: the gateway retries, not us
    assert request["messages"][0] == {"role": "system", "content": "Be brief."}
    key = request_key(wire.CompletionRequest(**request).replay_request())
    span = model_span(result)
    assert span.status == "ok"
    assert {k: span.metadata[k] for k in ("mode", "request_hash", "tokens_in", "tokens_out")} == {
        "mode": "live",
        "request_hash": key,
        "tokens_in": 11,
        "tokens_out": 4,
    }
    assert (span.metadata["cost_usd"], span.metadata["latency_ms"], span.metadata["attempts"]) == (
        0.00012,
        37,
        1,
    )
    assert result.invocations[0].run_context["token_usage"]["total_tokens"] == 15


def test_a_budget_error_is_the_agents_model_error_and_is_not_retried(
    fake_gateway: FakeGateway, tmp_path: Path
) -> None:
    fake_gateway.script = [BUDGET]
    result = through(fake_gateway, live_project(tmp_path / "p"))
    assert not result.passed
    inv = result.invocations[0]
    assert inv.status == "failed"
    assert inv.error == f"model call to openai/gpt-4o failed: {BUDGET.message}"
    # A budget is the gate's configuration, not the agent's behaviour: the case is not judged.
    assert result.case_error is not None and BUDGET.message in result.case_error
    assert len(fake_gateway.requests) == 1  # attempts: 3, and still one request
    span = model_span(result)
    assert span.status == "error"
    assert span.metadata["error"] == inv.error
    assert {k: span.metadata[k] for k in ("error_kind", "limit", "allowed", "used")} == {
        "error_kind": "budget",
        "limit": "gate.tokens",
        "allowed": 1000,
        "used": 1200,
    }


def test_a_wrong_token_is_refused_and_the_refusal_surfaces(
    fake_gateway: FakeGateway, tmp_path: Path
) -> None:
    wrong = GatewayChannel(token="not-this-one", socket_path=str(fake_gateway.socket_path))
    result = judged(
        live_project(tmp_path / "p"),
        "tests/live-bot.yaml",
        "answers",
        isolation=Isolation(gateway=wrong),
        judgeable=False,
        fresh=fake_gateway.rewind,
    )
    assert fake_gateway.refused == 1 and not fake_gateway.requests
    error = result.invocations[0].error or ""
    assert error == "model call to openai/gpt-4o failed: this channel's token is not that"
    assert model_span(result).metadata["error_kind"] == "refused"
    assert result.case_error is not None and error in result.case_error


def test_a_gateway_that_is_gone_is_unreachable(fake_gateway: FakeGateway, tmp_path: Path) -> None:
    fake_gateway.stop()  # and its socket removed
    result = through(fake_gateway, live_project(tmp_path / "p"))
    error = result.invocations[0].error or ""
    assert error.startswith(
        f"model call to openai/gpt-4o failed: the model gateway is unreachable at "
        f"{fake_gateway.socket_path} (FileNotFoundError"
    ), error
    assert model_span(result).metadata["error_kind"] == "unreachable"


def test_a_gateway_that_hangs_up_without_answering_is_unreachable(
    fake_gateway: FakeGateway,
) -> None:
    fake_gateway.script = [None]
    model = GatewayModel(fake_gateway.channel, agent="a", attempts=1)
    with pytest.raises(
        ModelCallError,
        match=r"model gateway is unreachable .*GatewayHungUp: the gateway closed the connection",
    ):
        ask(model)


class RawAnswers:
    """A gateway that answers every connection with ``answer``'s bytes as they are, after
    reading the request's head, then hangs up; ``in_pieces``: a byte a send."""

    def __init__(self, path: Path, answer: bytes, *, in_pieces: bool = False) -> None:
        self.path, self.answer, self.in_pieces = path, answer, in_pieces
        self.server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.server.bind(str(path))
        self.server.listen(4)
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            with conn:
                head = b""
                while b"\r\n\r\n" not in head:
                    chunk = conn.recv(65536)
                    if not chunk:
                        break
                    head += chunk
                if self.in_pieces:
                    for i in range(len(self.answer)):
                        conn.sendall(self.answer[i : i + 1])
                else:
                    conn.sendall(self.answer)

    def close(self) -> None:
        self.server.close()


@pytest.mark.parametrize(
    ("answer", "why"),
    [
        (b"SSH-2.0-OpenSSH\r\n\r\n", "GatewayHungUp: the answer's status line is not HTTP"),
        (b"HTTP/1.0 200 OK\r\nContent-Length: 12abc\r\n\r\n{}", "is not a number"),
        (b"HTTP/1.0 200 OK\r\nContent-Length: \xb2\r\n\r\n{}", "is not a number"),
        (b"HTTP/1.0 \xb2\xb2\xb2 OK\r\n\r\n{}", "status line is not HTTP"),
        (
            b"HTTP/1.0 200 OK\r\nX-Pad: " + b"a" * 20_000 + b"\r\n\r\n{}",
            f"the answer's head is over {MAX_ANSWER_HEAD_BYTES} bytes",
        ),
        (b"HTTP/1.0 200 OK\r\nContent-Le", "closed the connection without an answer"),
    ],
    ids=[
        "not-http",
        "bad-length",
        "superscript-length",
        "superscript-status",
        "head-too-long",
        "cut-head",
    ],
)
def test_an_answer_that_is_not_the_gateways_is_unreachable(
    tmp_path: Path, answer: bytes, why: str
) -> None:
    raw = RawAnswers(tmp_path / "model.sock", answer)
    try:
        model = GatewayModel(GatewayChannel(token="t", socket_path=str(raw.path)), agent="a")
        with pytest.raises(ModelCallError, match="model gateway is unreachable") as caught:
            ask(model)
    finally:
        raw.close()
    assert why in str(caught.value)
    assert caught.value.span_metadata["error_kind"] == "unreachable"


def test_an_answer_read_in_pieces_is_whole(tmp_path: Path) -> None:
    body = json.dumps(
        {"content": "in pieces", "tool_calls": [], "usage": {}, "cost_usd": 0.0,
         "latency_ms": 1, "request_hash": "h", "attempts": 1}
    ).encode()  # fmt: skip
    answer = b"HTTP/1.0 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
    raw = RawAnswers(tmp_path / "model.sock", answer, in_pieces=True)
    try:
        model = GatewayModel(GatewayChannel(token="t", socket_path=str(raw.path)), agent="a")
        assert ask(model).content == "in pieces"
    finally:
        raw.close()


def ask(model: GatewayModel, content: str = "hi") -> ModelReply:
    return model.complete(
        model="openai/gpt-4o",
        messages=[{"role": "user", "content": content}],
        tools=[],
        temperature=0.0,
        context={},
    )


@pytest.mark.slow
@pytest.mark.parametrize("step", [bytes, Undeclared], ids=["declared", "undeclared"])
def test_an_oversized_reply_is_refused(fake_gateway: FakeGateway, step: type[bytes]) -> None:
    fake_gateway.script = [step(b" " * (wire.MAX_REPLY_BYTES + 1))]
    with pytest.raises(ModelCallError, match=f"reply is over {wire.MAX_REPLY_BYTES} bytes"):
        ask(GatewayModel(fake_gateway.channel, agent="a"))


def test_a_reply_that_is_not_a_completion_is_refused(fake_gateway: FakeGateway) -> None:
    fake_gateway.script = [b'{"content": "hi"}']
    with pytest.raises(ModelCallError, match="reply is not a completion"):
        ask(GatewayModel(fake_gateway.channel, agent="a"))


def test_tool_calls_come_back_as_the_models_tool_calls(fake_gateway: FakeGateway) -> None:
    call = {"id": "c1", "name": "add_numbers", "arguments": '{"a": 1, "b": 2}'}
    fake_gateway.script = [reply(None, tool_calls=[call])]
    answer = ask(GatewayModel(fake_gateway.channel, agent="a"))
    assert [(c.id, c.name, c.arguments) for c in answer.tool_calls] == [
        ("c1", "add_numbers", {"a": 1, "b": 2})
    ]


def test_record_mode_writes_a_recording_that_replays_under_the_same_key(
    fake_gateway: FakeGateway, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    project = live_project(tmp_path / "p")
    monkeypatch.setenv("GATE_MODEL_MODE", "record")
    recorded = through(fake_gateway, project)
    assert recorded.passed, recorded.failure_reason
    assert model_span(recorded).metadata["mode"] == "record"
    [path] = (project / "tests/recordings/live-bot").glob("*.json")
    record = json.loads(path.read_text())
    assert record["key"] == model_span(recorded).metadata["request_hash"]
    assert path.name == f"{record['key'][:24]}.json"
    assert record["response"]["content"] == "hello from the fake provider"
    monkeypatch.setenv("GATE_MODEL_MODE", "replay")
    replayed = judged(project, "tests/live-bot.yaml", "answers")  # no gateway at all
    assert replayed.passed, replayed.failure_reason
    assert model_span(replayed).metadata["mode"] == "replay"
    assert len(fake_gateway.requests) == 1


def test_record_mode_refuses_a_hash_that_would_not_replay(
    fake_gateway: FakeGateway, tmp_path: Path
) -> None:
    fake_gateway.script = [reply(request_hash="0" * 64)]
    model = GatewayModel(fake_gateway.channel, agent="a", record_to=tmp_path / "rec")
    with pytest.raises(AgentRunError, match="the recording would not replay"):
        ask(model)
    assert not (tmp_path / "rec").exists()


TOKEN_PROJECT = {
    "agents/peek.yaml": """
        version: "1.0"
        name: peek
        description: Shows its environment.
        type: tool
        tool_name: env_tools.peek
    """,
    "tools/env_tools.py": """
        import os
        import subprocess
        import sys


        def peek(payload: dict) -> dict:
            child = subprocess.run(
                [sys.executable, "-c", "import os, json; print(json.dumps(dict(os.environ)))"],
                capture_output=True, text=True, check=True,
            )
            return {"own": dict(os.environ), "child": child.stdout}
    """,
    "tests/peek.yaml": """
        tests:
          - name: peeks
            payload: hi
            expected_result: status == "completed"
    """,
}


@pytest.mark.slow
def test_the_token_is_not_in_the_invocations_environment(
    fake_gateway: FakeGateway, tmp_path: Path
) -> None:
    project = write(tmp_path / "p", TOKEN_PROJECT)
    isolation = Isolation(env={"PROJECT_KEY": "from-the-secrets"}, gateway=fake_gateway.channel)
    result = judged(
        project, "tests/peek.yaml", "peeks", isolation=isolation, fresh=fake_gateway.rewind
    )
    assert result.passed, result.failure_reason
    output = json.dumps(result.invocations[0].output)
    assert "from-the-secrets" in output  # the case's environment is there ...
    assert fake_gateway.token not in output  # ... and the token is not, nor in a child's


def test_choose_model_uses_the_gateway_for_live_and_record_only(tmp_path: Path) -> None:
    project = live_project(tmp_path / "p")
    channel = GatewayChannel(token="tok-secret", socket_path="/nonexistent")
    live = choose_model(project, "live-bot", None, attempts=2, gateway=channel)
    assert isinstance(live, GatewayModel) and (live.mode, live.attempts) == ("live", 2)
    record = choose_model(project, "live-bot", "record", gateway=channel)
    assert isinstance(record, GatewayModel) and record.mode == "record"
    (project / "tests/models").mkdir()
    (project / "tests/models/live-bot.py").write_text("def respond(m, t, c):\n    return 'x'\n")
    assert isinstance(choose_model(project, "live-bot", None, gateway=channel), ScriptedModel)
    assert "tok-secret" not in repr(channel)


def test_without_a_gateway_live_mode_is_litellm_as_before(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    project = live_project(tmp_path / "p")
    monkeypatch.setitem(sys.modules, "litellm", None)  # `import litellm` fails: not installed
    for mode in ("live", "record"):
        with pytest.raises(AgentRunError, match="no model gateway serves this case") as caught:
            choose_model(project, "live-bot", mode)
        assert f"({mode} mode)" in str(caught.value)
    monkeypatch.delitem(sys.modules, "litellm")
    pytest.importorskip("litellm")
    assert isinstance(choose_model(project, "live-bot", "live"), LiveModel)


@pytest.mark.slow
def test_the_runner_takes_the_token_from_its_handoff_to_the_model_call(
    fake_gateway: FakeGateway, tmp_path: Path
) -> None:
    # The whole path as a container runs it: the token on stdin, the runner's process, the
    # forked invocation, the request's bearer token.
    project = live_project(tmp_path / "p")
    nonce = "n" * 64
    stdin = case_env.encode({}, nonce, gateway_token=fake_gateway.token)
    argv = ["--project", str(project), "--suite", "tests/live-bot.yaml", "--case", "answers"]
    argv += ["--handoff", "--model-socket", str(fake_gateway.socket_path)]
    env = {k: v for k, v in os.environ.items() if k != "GATE_MODEL_MODE"}
    proc = subprocess.run(
        [sys.executable, "-m", "gate_runner", "run-case", *argv],
        input=stdin,
        env={**env, "PYTHONPATH": str(RUNNER_SOURCE)},
        capture_output=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")
    result = parse_runner_output(proc.stdout, nonce=nonce)
    assert result.passed, result.failure_reason
    assert len(fake_gateway.requests) == 1 and fake_gateway.refused == 0
