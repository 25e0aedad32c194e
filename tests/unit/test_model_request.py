"""The model span's request (issue 38, item 8): what a `model_call` span records of the
request (system prompt, messages, tools, response format), its cap of 64 KiB a span and
128 KiB an invocation, cut deterministically and always valid JSON; then the same through
the real runner (in-process, scripted models)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gate_runner.case import MAX_STORED_STRING_CHARS, compact
from gate_runner.runtime.model_request import (
    MAX_REQUEST_BYTES,
    MAX_STRING_CHARS,
    MAX_TRACE_REQUEST_BYTES,
    json_size,
    record_request,
    request_record,
)
from gate_runner.runtime.trace import Trace
from tests.fixtures.projects import llm_project, write
from tests.fixtures.runner import judged

SYSTEM = {"role": "system", "content": "You are terse."}
TOOL = {
    "type": "function",
    "function": {
        "name": "lookup",
        "description": "Look a customer up.",
        "parameters": {"type": "object", "properties": {"customer": {"type": "string"}}},
    },
}
FORMAT = {"type": "json_schema", "json_schema": {"name": "answer", "schema": {"type": "object"}}}


def user(i: int, chars: int = 3000) -> dict[str, Any]:
    return {"role": "user", "content": f"{i}:" + "x" * chars}


def valid(record: dict[str, Any], cap: int = MAX_REQUEST_BYTES) -> dict[str, Any]:
    """``record`` is JSON text within ``cap`` and reads back the same."""
    text = json.dumps(record, ensure_ascii=False, allow_nan=False)
    assert json.loads(text) == record
    assert json_size(record) <= cap
    return record


def test_a_small_request_is_recorded_whole_in_its_shape() -> None:
    messages = [SYSTEM, {"role": "user", "content": "who is Ada?"}]
    record = valid(request_record(messages, [TOOL], FORMAT))
    assert record == {
        "system_prompt": "You are terse.",
        "messages": [{"role": "user", "content": "who is Ada?"}],
        "tools": [
            {
                "name": "lookup",
                "description": "Look a customer up.",
                "parameters": TOOL["function"]["parameters"],  # type: ignore[index]
            }
        ],
        "response_format": FORMAT,
    }
    # A copy: the loop goes on appending to its messages after the request.
    messages.append({"role": "assistant", "content": "later"})
    assert len(record["messages"]) == 1
    assert request_record([{"role": "user", "content": "hi"}], [], None) == {
        "system_prompt": None,
        "messages": [{"role": "user", "content": "hi"}],
        "tools": [],
        "response_format": None,
    }


def test_past_the_cap_the_oldest_messages_go_first_and_are_counted() -> None:
    messages = [SYSTEM, *(user(i) for i in range(100))]
    record = valid(request_record(messages, [TOOL], FORMAT))
    kept = record["messages"]
    assert record["system_prompt"] == "You are terse." and record["response_format"] == FORMAT
    assert [t["name"] for t in record["tools"]] == ["lookup"]
    assert kept[-1] == messages[-1]  # the last message stays, and the ones before it
    assert kept == messages[-len(kept) :]
    assert record["messages_dropped"] == 100 - len(kept) > 0
    assert json_size(record) > MAX_REQUEST_BYTES - 3100  # as many as fit, not fewer
    assert list(record) == [
        "system_prompt",
        "messages",
        "messages_dropped",
        "tools",
        "response_format",
    ]
    assert request_record(messages, [TOOL], FORMAT) == record  # deterministic


def test_a_long_string_keeps_its_head_and_says_how_much_was_cut() -> None:
    prompt = "é" * 50_000  # two bytes each in UTF-8
    record = valid(request_record([{"role": "system", "content": prompt}], [], None))
    cut = 2 * (50_000 - MAX_STRING_CHARS)
    assert record["system_prompt"] == "é" * MAX_STRING_CHARS + f"…[{cut} bytes cut]"
    # Short of the runner's compaction, which would keep only 1 KiB of it.
    assert MAX_STRING_CHARS + 30 < MAX_STORED_STRING_CHARS
    assert compact(record) == record


def test_one_huge_last_message_is_cut_shorter_rather_than_dropped() -> None:
    big = {"role": "tool", "tool_call_id": "c1", "name": "lookup", "content": "y" * 500_000}
    messages = [SYSTEM, *(user(i) for i in range(3)), big]
    record = valid(request_record(messages, [TOOL] * 3, FORMAT))
    assert record["messages"][-1]["tool_call_id"] == "c1"
    assert record["messages"][-1]["content"].startswith("y" * 1000)
    assert record["messages"][-1]["content"].endswith("bytes cut]")
    assert record["system_prompt"] == "You are terse."


@pytest.mark.slow
def test_a_request_whose_structure_alone_is_too_large_keeps_names_then_counts() -> None:
    tools = [{**TOOL, "function": {**TOOL["function"], "name": f"t{i}"}} for i in range(2000)]
    names = valid(request_record([SYSTEM, user(1)], tools, FORMAT))
    assert names["tool_schemas_dropped"] == 2000
    assert names["tools"][1999] == {"name": "t1999"}
    assert names["messages"][-1]["content"].startswith("1:x")
    counts = valid(request_record([SYSTEM, user(1)], tools * 20, FORMAT))
    assert counts == {
        "messages_dropped": 1,
        "tools_dropped": 40_000,
        "response_format": {"type": "json_schema"},
        "omitted": f"the request's structure alone is over {MAX_REQUEST_BYTES} bytes of JSON",
    }


def test_what_cannot_be_json_is_still_valid_json() -> None:
    deep: Any = "leaf"
    for _ in range(5000):
        deep = [deep]
    weird = [SYSTEM, {"role": "user", "content": deep}, {"role": "user", "content": b"bytes"}]
    record = valid(request_record(weird, [], {"type": "json_schema", "x": float("nan")}))
    assert record["response_format"]["x"] == "NaN"
    assert record["messages"][0] == "…[not recorded: nests too deeply]"
    assert record["messages"][1] == {"role": "user", "content": "b'bytes'"}


def test_an_invocation_keeps_its_latest_requests_within_its_budget() -> None:
    trace = Trace()
    spans = []
    conversation = [SYSTEM]
    for i in range(12):
        conversation.append(user(i, chars=10_000))
        span = trace.open("model_call", "m", None)
        record_request(trace, span, conversation, [TOOL], FORMAT)
        spans.append(span)
    requests = [s.metadata["request"] for s in spans]
    assert sum(json_size(r) for r in requests) <= MAX_TRACE_REQUEST_BYTES + 12 * 300
    assert requests[-1]["messages"][-1] == conversation[-1]  # the newest whole
    full = [r for r in requests if "omitted" not in r]
    assert sum(json_size(r) for r in full) <= MAX_TRACE_REQUEST_BYTES
    assert requests[: len(requests) - len(full)] == [
        {
            "messages_dropped": i + 1,
            "tools_dropped": 1,
            "response_format": {"type": "json_schema"},
            "omitted": (
                f"the invocation keeps its latest model requests, {MAX_TRACE_REQUEST_BYTES} "
                "bytes of JSON in all: a later model call of the same agent repeats this "
                "conversation"
            ),
        }
        for i in range(len(requests) - len(full))
    ]
    # Another invocation's trace has a budget of its own.
    other = Trace()
    span = other.open("model_call", "m", None)
    record_request(other, span, conversation[:2], [TOOL], FORMAT)
    assert "omitted" not in span.metadata["request"]


def test_each_model_span_of_the_loop_records_its_request_through_the_runner(
    tmp_path: Path,
) -> None:
    project = llm_project(tmp_path / "proj")
    result = judged(project, "tests/assistant.yaml", "adds_with_hooked_params_and_a_child")
    assert result.passed, result.failure_reason
    first, second = (s for s in result.invocations[0].traces if s.type == "model_call")
    asked = first.metadata["request"]
    assert asked["system_prompt"] == "You help assistant; {unknown} stays as written."
    assert asked["messages"] == [{"role": "user", "content": "add please"}]
    assert [t["name"] for t in asked["tools"]] == ["add_numbers", "stop_now", "trigger_agent"]
    assert asked["tools"][0]["parameters"]["required"] == ["a", "b"]
    assert asked["response_format"]["type"] == "json_schema"
    assert asked["response_format"]["json_schema"]["name"] == "answer"
    # The second request holds the first answer's tool calls and their results.
    then = second.metadata["request"]["messages"]
    assert [m["role"] for m in then] == ["user", "assistant", "tool", "tool"]
    assert [c["function"]["name"] for c in then[1]["tool_calls"]] == [
        "add_numbers",
        "trigger_agent",
    ]
    assert then[2] == {
        "role": "tool",
        "tool_call_id": then[1]["tool_calls"][0]["id"],
        "name": "add_numbers",
        "content": "15",
    }


def test_a_sensitive_inputs_answer_reaches_the_model_and_not_the_recorded_request(
    tmp_path: Path,
) -> None:
    project = write(
        tmp_path / "p",
        {
            "agents/login.yaml": """
                version: "1.0"
                name: login
                description: Asks a person for an MFA code.
                model: openai/gpt-4o
                system_prompt: Log in.
                approval:
                  inputs:
                    - get_mfa:
                        prompt: Use this tool when the login needs an MFA code.
                        label: MFA code
                        sensitive: true
                        params:
                          - reason: str
            """,
            "tests/models/login.py": """
                def respond(messages, tools, context):
                    done = [m for m in messages if m["role"] == "tool"]
                    if not done:
                        return {"tool_calls": [{"name": "get_mfa", "arguments": {"reason": "x"}}]}
                    return {"content": "logged in" if done[0]["content"] == "654321" else "no"}
            """,
            "tests/login.yaml": """
                tests:
                  - name: logs_in
                    payload: log in
                    approval_decisions: [{tool: get_mfa, decision: approve, response: "654321"}]
                    expected_result: output == "logged in"
            """,
        },
    )
    result = judged(project, "tests/login.yaml", "logs_in")
    assert result.passed, result.failure_reason  # the model had the answer
    spans = result.invocations[0].traces
    asked = [s.metadata["request"] for s in spans if s.type == "model_call"][-1]
    assert asked["messages"][-1]["content"] == "[sensitive]"
    assert "get_mfa" in [t["name"] for t in asked["tools"]]
    assert "654321" not in json.dumps([s.metadata for s in spans])
