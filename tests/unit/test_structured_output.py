"""Structured output (issue 38, item 1): an LLM agent's output_schema goes with every model
request as OpenAI's response_format, to a scripted model (in ``options``), through the
gateway and real LiteLLM to the provider, into recordings and replay keys (only when
present), and the final answer is validated against the whole schema with jsonschema."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, ClassVar

import pytest

from gate_runner import gateway_wire as wire
from gate_runner.models import (
    ReplayModel,
    ScriptedModel,
    litellm_response_format,
    request_key,
    write_recording,
)
from gate_runner.runtime.output_schema import response_format, schema_problem
from tests.fixtures.fake_llm import FakeProvider, instance_of
from tests.fixtures.gateway import Gateways, ask
from tests.fixtures.projects import write
from tests.fixtures.runner import judged

# A schema whose deep keywords the old checker (type, required, properties, items, enum)
# ignored: minItems, pattern, an enum in a nested object, $ref into $defs.
REPORT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "required": ["title", "items"],
    "properties": {
        "title": {"type": "string", "pattern": "^[A-Z]"},
        "items": {"type": "array", "minItems": 1, "items": {"$ref": "#/$defs/item"}},
    },
    "$defs": {
        "item": {
            "type": "object",
            "additionalProperties": False,
            "required": ["name", "meta"],
            "properties": {
                "name": {"type": "string"},
                "meta": {
                    "type": "object",
                    "additionalProperties": False,
                    "required": ["level"],
                    "properties": {"level": {"enum": ["low", "high"]}},
                },
            },
        }
    },
}
GOOD = {"title": "Report", "items": [{"name": "a", "meta": {"level": "high"}}]}


class Config:
    output_schema = "report"
    output_schema_dict: ClassVar = REPORT_SCHEMA


# --- the replay key ---------------------------------------------------------------------


def test_without_a_response_format_the_replay_key_is_what_it_was() -> None:
    # Keys computed with the wire before response_format existed (git HEAD's gateway_wire).
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]
    tools = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}]
    old = request_key(wire.replay_request("openai/gpt-4o", messages, tools, 0.2,
                                          {"reasoning_effort": "low"}))  # fmt: skip
    assert old == "a8dc9049fe6850e89b20675473c3d9f7a7ca30d9d9969b899ae4d1e0934f67a8"
    bare = wire.CompletionRequest(
        model="openai/gpt-4o", messages=[{"role": "user", "content": "hi"}]
    ).replay_request()
    assert "response_format" not in bare
    assert request_key(bare) == "7aad6252ca8b874f38fc43035a2b760ce93f7da6278bc4ef325fd29de24593e2"
    shaped = wire.CompletionRequest(
        model="openai/gpt-4o",
        messages=[{"role": "user", "content": "hi"}],
        response_format=response_format(Config()),
    ).replay_request()
    assert shaped["response_format"] == response_format(Config())
    assert request_key(shaped) != request_key(bare)


def test_response_format_is_openais_shape_strict_only_when_openai_takes_it() -> None:
    shape = response_format(Config())
    assert shape == {
        "type": "json_schema",
        "json_schema": {"name": "report", "schema": REPORT_SCHEMA, "strict": True},
    }

    class Open:
        output_schema = "my schema/v2"
        output_schema_dict: ClassVar = {"type": "object", "properties": {"a": {"type": "string"}}}

    loose = response_format(Open())
    assert loose is not None
    assert loose["json_schema"]["name"] == "my_schema_v2"
    assert loose["json_schema"]["strict"] is False

    class Without:
        output_schema = None
        output_schema_dict = None

    assert response_format(Without()) is None


# --- validation with jsonschema ---------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ({"title": "Report", "items": []}, "output.items: [] should be non-empty (minItems)"),
        ({**GOOD, "title": "report"}, "output.title: 'report' does not match '^[A-Z]' (pattern)"),
        (
            {"title": "R", "items": [{"name": "a", "meta": {"level": "mid"}}]},
            "output.items[0].meta.level: 'mid' is not one of ['low', 'high'] (enum)",
        ),
        (
            {"title": "R", "items": [{"name": 1, "meta": {"level": "low"}}]},
            "output.items[0].name: 1 is not of type 'string' (type)",
        ),
    ],
)
def test_a_deep_keyword_the_old_checker_ignored_fails_naming_path_and_keyword(
    value: Any, expected: str
) -> None:
    assert schema_problem(value, REPORT_SCHEMA) == expected


def test_a_valid_answer_passes_and_errors_are_capped() -> None:
    assert schema_problem(GOOD, REPORT_SCHEMA) is None
    many = {"title": "r", "items": [{"name": i, "meta": {"level": "x"}} for i in range(50)]}
    problem = schema_problem(many, REPORT_SCHEMA)
    assert problem is not None
    assert problem.count("; ") == 3  # three errors, then how many more
    assert "more error(s)" in problem
    assert len(problem) <= 1001


def test_the_draft_the_schema_declares_is_used() -> None:
    # Draft 7's tuple form of items; Draft 2020-12 (the default) would refuse the schema.
    tuple_schema = {"$schema": "http://json-schema.org/draft-07/schema#",
                    "type": "array", "items": [{"type": "string"}]}  # fmt: skip
    assert schema_problem(["a"], tuple_schema) is None
    assert schema_problem([1], tuple_schema) == "output[0]: 1 is not of type 'string' (type)"
    undeclared = {"type": "array", "items": [{"type": "string"}]}
    problem = schema_problem(["a"], undeclared)
    assert problem is not None and problem.startswith("the schema itself is not valid")
    # 2020-12's prefixItems, by default.
    prefixed = {"type": "array", "prefixItems": [{"type": "string"}]}
    assert schema_problem([1], prefixed) == "output[0]: 1 is not of type 'string' (type)"
    draft7 = {"$schema": "http://json-schema.org/draft-07/schema#", **prefixed}
    assert schema_problem([1], draft7) is None  # prefixItems is no keyword of Draft 7


def test_a_remote_ref_is_never_fetched() -> None:
    remote = {"$ref": "http://127.0.0.1:9/schema.json"}
    problem = schema_problem({}, remote)
    assert problem is not None and problem.startswith("the schema cannot be applied")


# --- scripted models ----------------------------------------------------------------------


SCRIPT = """
import json

SEEN = []  # the response format's name at each request of the run (None: none)


def respond(messages, tools, context, options):
    shape = options.get("response_format")
    SEEN.append(shape["json_schema"]["name"] if shape else "none")
    if "empty" in json.dumps(messages[1]):
        return {"content": {"title": "Report", "items": []}}
    results = [m for m in messages if m["role"] == "tool"]
    if tools and not results:
        return {"tool_calls": [{"name": "add_numbers", "arguments": {"a": 2, "b": 3}}]}
    return {"content": {"title": "Sum", "items": [
        {"name": f"{results[-1]['content']}|{','.join(SEEN)}", "meta": {"level": "high"}}
    ]}}
"""


def structured_project(root: Path) -> Path:
    return write(
        root,
        {
            "agents/reporter.yaml": """
                version: "1.0"
                name: reporter
                description: Answers a report, after a tool.
                model: openai/gpt-4o
                system_prompt: Report.
                max_iterations: 4
                output_schema: report
                tools: [arith.add_numbers]
            """,
            "schemas/report.json": json.dumps(REPORT_SCHEMA),
            "tools/arith.py": '''
                def add_numbers(a: int, b: int) -> int:
                    """Add two integers.

                    Args:
                        a: the first
                        b: the second
                    """
                    return a + b
            ''',
            "tests/models/reporter.py": SCRIPT,
            "tests/reporter.yaml": """
                tests:
                  - name: answers_a_valid_report
                    payload: add
                    expected_result: output.items[0].name == "5|report,report"
                  - name: an_empty_report_fails_on_min_items
                    payload: empty
                    expected_result: status == "failed" and "minItems" in error
            """,
        },
    )


def test_a_scripted_model_reads_the_response_format_on_every_request(tmp_path: Path) -> None:
    project = structured_project(tmp_path / "p")
    result = judged(project, "tests/reporter.yaml", "answers_a_valid_report")
    assert result.passed, result.failure_reason


def test_a_scripted_answer_failing_a_deep_keyword_fails_the_run(tmp_path: Path) -> None:
    project = structured_project(tmp_path / "p")
    result = judged(project, "tests/reporter.yaml", "an_empty_report_fails_on_min_items")
    assert result.passed, result.failure_reason
    error = result.invocations[0].error or ""
    assert "output.items: [] should be non-empty (minItems)" in error, error


def test_scripted_options_hold_a_copy_of_the_response_format(tmp_path: Path) -> None:
    module = tmp_path / "bot.py"
    module.write_text(
        "def respond(messages, tools, context, options):\n"
        "    options['response_format']['json_schema']['name'] = 'changed'\n"
        "    return {'content': options['response_format']['json_schema']['name']}\n"
    )
    shape = response_format(Config())
    assert shape is not None
    reply = ScriptedModel(module, "bot").complete(
        model="m", messages=[], tools=[], temperature=0.0, context={}, response_format=shape
    )
    assert reply.content == "changed"
    assert shape["json_schema"]["name"] == "report"


# --- replay -------------------------------------------------------------------------------


def test_replay_finds_a_recording_by_the_key_with_the_response_format_and_an_older_one(
    tmp_path: Path,
) -> None:
    shape = response_format(Config())
    messages = [{"role": "user", "content": "hi"}]
    args: dict[str, Any] = {"model": "openai/gpt-4o", "messages": messages, "tools": [],
                            "temperature": 0.0}  # fmt: skip
    with_format = wire.replay_request(**args, response_format=shape)
    write_recording(tmp_path / "new", request_key(with_format), with_format, {"content": "new"})
    older = wire.replay_request(**args)
    write_recording(tmp_path / "old", request_key(older), older, {"content": "old"})
    for folder, expected in (("new", "new"), ("old", "old")):
        reply = ReplayModel(tmp_path / folder).complete(**args, context={}, response_format=shape)
        assert reply.content == expected


# --- the fake provider, the gateway and LiteLLM -------------------------------------------


def test_the_fake_provider_answers_a_document_valid_for_the_schema() -> None:
    assert schema_problem(instance_of(REPORT_SCHEMA), REPORT_SCHEMA) is not None  # minItems 1
    loose = {**REPORT_SCHEMA, "properties": {"title": {"type": "string"},
             "items": {"type": "array", "items": {"$ref": "#/$defs/item"}}}}  # fmt: skip
    assert schema_problem(instance_of(loose), loose) is None


def test_the_gateway_sends_the_response_format_through_litellm_and_records_it(
    gateways: Gateways, fake_provider: FakeProvider, tmp_path: Path
) -> None:
    channel = gateways.open({"OPENAI_API_KEY": "sk-a", "OPENAI_API_BASE": fake_provider.url})
    shape = response_format(Config())
    fake_provider.structured_answer = GOOD
    tools = [{"type": "function", "function": {"name": "lookup", "parameters": {}}}]
    status, answer = ask(channel, "report", tools=tools, response_format=shape)
    assert status == 200, answer
    assert json.loads(answer["content"]) == GOOD
    (sent,) = [body for _, body in fake_provider.calls]
    assert sent["response_format"] == shape  # with the tools offered, as decided
    assert sent["tools"] == tools
    (record,) = channel.records
    assert record.request["response_format"] == shape
    channel.export_recordings(tmp_path)
    reply = ReplayModel(tmp_path / "bot").complete(
        model="openai/gpt-4o",
        messages=[{"role": "user", "content": "report"}],
        tools=tools,
        temperature=0.0,
        context={},
        response_format=shape,
    )
    assert json.loads(reply.content or "") == GOOD


@pytest.mark.parametrize(
    ("shape", "why"),
    [
        ([1], "response_format"),
        ({"json_schema": {}}, "response_format"),
        ({"type": "json_schema", "json_schema": {"name": "x"}}, "response_format.json_schema"),
        (
            {"type": "json_schema", "json_schema": {"name": "x", "schema": {"d": "y" * 300_000}}},
            "response_format",
        ),
    ],
)
def test_the_gateway_refuses_a_response_format_that_is_not_one(
    gateways: Gateways, fake_provider: FakeProvider, shape: Any, why: str
) -> None:
    channel = gateways.open({"OPENAI_API_KEY": "sk-a", "OPENAI_API_BASE": fake_provider.url})
    status, answer = ask(channel, "report", response_format=shape)
    assert (status, answer["error"]["kind"]) == (400, "bad_request")
    assert f"the request's {why} must be" in answer["error"]["message"]
    assert fake_provider.calls == []


LIVE_AGENT = """
    version: "1.0"
    name: live-reporter
    description: Answers a report from a real provider.
    model: openai/gpt-4o
    system_prompt: Report.
    output_schema: report
    retry_options: {attempts: 1, initial_delay: 0, max_delay: 1}
"""


def test_live_through_litellm_then_recorded_then_replayed(
    fake_provider: FakeProvider, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import litellm  # noqa: F401  (imported once, before the runner forks invocations)

    project = write(
        tmp_path / "p",
        {
            "agents/live-reporter.yaml": LIVE_AGENT,
            "schemas/report.json": json.dumps(REPORT_SCHEMA),
            "tests/live-reporter.yaml": """
                tests:
                  - name: answers_a_report
                    payload: hi
                    expected_result: output.items[0].meta.level == "high"
            """,
        },
    )
    fake_provider.structured_answer = GOOD
    monkeypatch.setenv("GATE_MODEL_MODE", "record")
    result = judged(
        project, "tests/live-reporter.yaml", "answers_a_report", fresh=fake_provider.requests.clear
    )
    assert result.passed, result.failure_reason
    (sent,) = fake_provider.requests
    assert sent["response_format"] == response_format(Config())
    (recording,) = (project / "tests/recordings/live-reporter").glob("*.json")
    assert json.loads(recording.read_text())["request"]["response_format"]["type"] == "json_schema"
    monkeypatch.setenv("GATE_MODEL_MODE", "replay")
    monkeypatch.setenv("OPENAI_API_BASE", "http://127.0.0.1:9/v1")
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:9/v1")
    replayed = judged(project, "tests/live-reporter.yaml", "answers_a_report")
    assert replayed.passed, replayed.failure_reason
    assert len(fake_provider.requests) == 1


@pytest.mark.parametrize(
    ("model", "with_tools", "sent"),
    [
        ("openai/gpt-4o", True, True),
        ("gemini/gemini-2.0-flash", True, True),
        ("anthropic/claude-opus-4-5-20251101", True, True),  # native structured output
        # LiteLLM would force its JSON tool over the agent's own tools: not with tools.
        ("anthropic/claude-sonnet-4-20250514", True, False),
        ("anthropic/claude-sonnet-4-20250514", False, True),
        ("no-such-provider/model", True, True),  # LiteLLM's own call says what is wrong
    ],
)
def test_the_response_format_goes_to_litellm_unless_its_json_tool_would_hide_the_tools(
    model: str, with_tools: bool, sent: bool
) -> None:
    import litellm

    shape = response_format(Config())
    tools = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}]
    extra = litellm_response_format(litellm, model, tools if with_tools else [], shape)
    assert extra == ({"response_format": shape} if sent else {})
    assert litellm_response_format(litellm, model, tools, None) == {}
