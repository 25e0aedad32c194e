"""Sessions and context compression (issue 21, item 4): a session agent's runs within one
invocation continue its history, keyed as configured, and no two invocations share one;
compression summarises older messages when a prompt passed max_prompt_tokens or the
provider refused it for its context window, keeping the recent ones, with a span that says
what it did.

The real runner in-process (forked invocations), scripted models."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.fixtures.projects import write
from tests.fixtures.runner import judged

CHAT = """
    import json


    def respond(messages, tools, context):
        said = [m["content"] for m in messages if m["role"] == "user"]
        return {"content": json.dumps(said)}
"""
BOSS = """
    from connic.tools import trigger_agent


    async def talk(payload: dict) -> dict:
        answers = []
        for chat, text in payload["turns"]:
            done = await trigger_agent("chat", {"chat": chat, "text": text})
            answers.append(done["response"])
        return {"answers": answers}
"""


def session_project(root: Path, session: str) -> Path:
    return write(
        root,
        {
            "agents/chat.yaml": f"""
                version: "1.0"
                name: chat
                description: Remembers what was said in its session.
                model: openai/gpt-4o
                system_prompt: Chat.
                session: {session}
            """,
            "agents/boss.yaml": """
                version: "1.0"
                name: boss
                description: Talks to chat several times in one run.
                type: tool
                tool_name: boss.talk
            """,
            "tools/boss.py": BOSS,
            "tests/models/chat.py": CHAT,
            "tests/boss.yaml": """
                tests:
                  - name: three_turns
                    payload: '{"turns": [["a", "hi"], ["b", "hello"], ["a", "again"]]}'
                    runs: 2
                    expected_result: output != null
            """,
        },
    )


def said(answer: str) -> list[str]:
    return [json.loads(text)["text"] for text in json.loads(answer)]


def test_a_keyed_session_continues_within_the_invocation_and_not_beyond(tmp_path: Path) -> None:
    result = judged(session_project(tmp_path / "p", "{key: input.chat}"), "tests/boss.yaml",
                    "three_turns")  # fmt: skip
    assert result.passed, result.failure_reason
    for run in result.invocations:  # the second invocation starts with no history again
        answers = run.output["answers"]  # type: ignore[index]
        assert [said(a) for a in answers] == [["hi"], ["hello"], ["hi", "again"]]
    chats = [s for s in result.invocations[0].traces if s.type == "agent" and s.name == "chat"]
    assert [s.metadata["session"]["history_messages"] for s in chats] == [0, 0, 2]


def test_a_session_without_a_key_is_shared_by_every_run_of_the_agent(tmp_path: Path) -> None:
    result = judged(session_project(tmp_path / "p", "true"), "tests/boss.yaml", "three_turns")
    assert result.passed, result.failure_reason
    answers = result.invocations[0].output["answers"]  # type: ignore[index]
    assert [said(a) for a in answers] == [["hi"], ["hi", "hello"], ["hi", "hello", "again"]]


def test_history_false_keeps_no_history(tmp_path: Path) -> None:
    root = session_project(tmp_path / "p", "{history: false}")
    result = judged(root, "tests/boss.yaml", "three_turns")
    answers = result.invocations[0].output["answers"]  # type: ignore[index]
    assert [said(a) for a in answers] == [["hi"], ["hello"], ["again"]]


LOOPER = """
    import json


    def respond(messages, tools, context):
        if messages[0]["content"].startswith("Summarise"):
            older = [json.loads(line) for line in messages[1]["content"].splitlines()]
            return {"content": "SUMMARY of " + str(len(older))}
        results = [m for m in messages if m["role"] == "tool"]
        if len(results) < 4 and not any("SUMMARY" in str(m["content"]) for m in messages):
            return {"tool_calls": [{"name": "echo", "arguments": {"n": len(results)}}],
                    "usage": {"prompt_tokens": 100 * (len(results) + 1), "completion_tokens": 1}}
        return {"content": json.dumps([m["role"] for m in messages]),
                "usage": {"prompt_tokens": 10, "completion_tokens": 1}}
"""


def compression_project(root: Path, model: str, compression: str) -> Path:
    return write(
        root,
        {
            "agents/looper.yaml": f"""
                version: "1.0"
                name: looper
                description: Calls a tool until its prompt is long.
                model: openai/gpt-4o
                system_prompt: Loop.
                tools: [echo.echo]
                context_compression: {compression}
            """,
            "tools/echo.py": "def echo(n: int) -> int:\n    return n\n",
            "tests/models/looper.py": model,
            "tests/looper.yaml": """
                tests:
                  - name: loops
                    payload: go
                    expected_result: output != null
            """,
        },
    )


def spans(result: Any, kind: str) -> list[Any]:
    return [s for s in result.invocations[0].traces if s.type == kind]


def test_a_prompt_over_max_prompt_tokens_is_compressed_keeping_the_recent_messages(
    tmp_path: Path,
) -> None:
    root = compression_project(
        tmp_path / "p", LOOPER, "{max_prompt_tokens: 250, keep_recent_messages: 2}"
    )
    result = judged(root, "tests/looper.yaml", "loops")
    assert result.passed, result.failure_reason
    (span,) = spans(result, "context_compression")
    assert span.metadata["reason"] == (
        "the last prompt took 300 tokens, over max_prompt_tokens (250)"
    )
    # system, user, then three turns of (assistant call, tool result) when the third prompt
    # reported 300 tokens: the user message and two turns are summarised, the last turn kept.
    assert (span.metadata["compressed_messages"], span.metadata["kept_messages"]) == (5, 2)
    assert span.metadata["summary"] == "SUMMARY of 5"
    roles = json.loads(result.invocations[0].output)  # type: ignore[arg-type]
    assert roles == ["system", "user", "assistant", "tool"]


REFUSED = """
    import json


    def respond(messages, tools, context):
        if messages[0]["content"].startswith("Summarise"):
            return {"content": "short"}
        summarised = any(str(m["content"]).startswith("[Summary") for m in messages)
        if any(m["role"] == "tool" for m in messages) and not summarised:
            raise RuntimeError("ContextWindowExceededError: this model's maximum context length is 8 tokens")
        if not any(m["role"] == "tool" for m in messages):
            return {"tool_calls": [{"name": "echo", "arguments": {"n": 1}}]}
        return {"content": json.dumps([m["role"] for m in messages])}
"""


def test_a_context_window_refusal_is_repaired_once_by_compression(tmp_path: Path) -> None:
    root = compression_project(tmp_path / "p", REFUSED, "{keep_recent_messages: 1}")
    result = judged(root, "tests/looper.yaml", "loops")
    assert result.passed, result.failure_reason
    (span,) = spans(result, "context_compression")
    assert span.metadata["reason"] == "the provider refused the prompt for its context window"
    calls = spans(result, "model_call")
    assert [c.status for c in calls] == ["ok", "error", "ok"]
    # keep_recent_messages 1 would keep only the tool result: its call is kept with it.
    assert (span.metadata["compressed_messages"], span.metadata["kept_messages"]) == (1, 2)
    roles = json.loads(result.invocations[0].output)  # type: ignore[arg-type]
    assert roles == ["system", "user", "assistant", "tool"]


def test_without_compression_the_refusal_fails_the_run(tmp_path: Path) -> None:
    root = compression_project(tmp_path / "p", REFUSED, "{enabled: false}")
    result = judged(root, "tests/looper.yaml", "loops")
    assert not result.passed
    assert "maximum context length" in (result.invocations[0].error or "")
    assert spans(result, "context_compression") == []


def test_the_summary_request_cuts_long_messages() -> None:
    from gate_runner.runtime.sessions import MAX_MESSAGE_CHARS, transcript

    text = transcript([{"role": "tool", "content": "x" * (MAX_MESSAGE_CHARS + 500)}])
    assert json.loads(text)["content"].endswith("…[500 characters cut]")
    assert len(text) < MAX_MESSAGE_CHARS + 100


def test_a_prompt_of_exactly_max_prompt_tokens_is_not_compressed(tmp_path: Path) -> None:
    # Decided (issue 39): SDK ContextCompressionConfig.max_prompt_tokens is a "prompt-token
    # budget", and a prompt that used exactly its budget kept to it: only a prompt over it
    # (`>`) compresses before the next call. Here the prompts report 100, 200, 300, 400.
    root = compression_project(
        tmp_path / "p", LOOPER, "{max_prompt_tokens: 300, keep_recent_messages: 2}"
    )
    result = judged(root, "tests/looper.yaml", "loops")
    assert result.passed, result.failure_reason
    (span,) = spans(result, "context_compression")
    assert span.metadata["reason"] == (
        "the last prompt took 400 tokens, over max_prompt_tokens (300)"
    )
