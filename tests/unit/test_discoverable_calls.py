"""Discoverable tools run and are asserted under their own name (issue 19, item 10; issue
21, item 2; SDK test_schema.py: "Discoverable calls use the actual tool name or canonical
ref in every tool assertion, with that tool's parameters and result").

`search_tools(query)` finds the agent's discoverable tools by the words of their name, ref
and description; `use_tool(tool_name, arguments)` calls one through the path of a listed
tool (approval, hooks, mocks, strict flags, trace), and the span's `discovered` makes every
tool assertion see that tool's own call.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gate_runner.assertions import calls_in_scope, check_tool_calls, compile_assertions
from tests.fixtures.projects import write
from tests.fixtures.runner import judged

FINDER = {
    "agents/finder.yaml": """
        version: "1.0"
        name: finder
        description: Finds its adder through tool discovery.
        model: openai/gpt-4o
        system_prompt: Add.
        discoverable_tools: [calc.add]
    """,
    "tools/calc.py": "def add(a: int, b: int) -> int:\n    return a + b\n",
    "tests/models/finder.py": """
        def respond(messages, tools, context):
            if any(m["role"] == "tool" for m in messages):
                return {"content": "done"}
            offered = {t["function"]["name"] for t in tools}
            assert {"search_tools", "use_tool"} <= offered, offered
            return {"tool_calls": [{"name": "use_tool",
                                    "arguments": {"tool_name": "add", "arguments": {"a": 2, "b": 3}}}]}
    """,
    "tests/finder.yaml": """
        tests:
          - name: no_add
            payload: add
            expected_no_tool_calls: [add]
          - name: add_by_ref_with_its_params
            payload: add
            expected_tool_calls: [{calc.add: params.a == 2 and params.b == 3 and invocations == 1}]
            expected_no_tool_calls: [use_tool]
          - name: add_returned
            payload: add
            expected_tool_calls: [{add: result == 5}]
    """,
}


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write(tmp_path_factory.mktemp("finder") / "p", FINDER)


def test_a_call_through_use_tool_is_the_tools_call(project: Path) -> None:
    no_add = judged(project, "tests/finder.yaml", "no_add")
    assert no_add.invocations[0].failed_assertions == ["expected no call to add, saw 1"]
    (span,) = [s for s in no_add.invocations[0].traces if s.type == "tool_call"]
    assert (span.name, span.status, span.metadata["discovered"], span.metadata["result"]) == (
        "use_tool",
        "ok",
        {"tool_name": "add", "tool_ref": "calc.add", "params": {"a": 2, "b": 3}},
        5,
    )
    by_ref = judged(project, "tests/finder.yaml", "add_by_ref_with_its_params")
    assert by_ref.passed, by_ref.failure_reason


def test_it_runs_and_assertions_see_its_result(project: Path) -> None:
    returned = judged(project, "tests/finder.yaml", "add_returned")
    assert returned.passed, returned.failure_reason


SEARCHER = {
    "agents/searcher.yaml": """
        version: "1.0"
        name: searcher
        description: Searches for its tools, then uses the one it found.
        model: openai/gpt-4o
        system_prompt: Help.
        tools: [calc.add]
        discoverable_tools: [calc.multiply, calc.weather_for, db_count]
    """,
    "tools/calc.py": """
        def add(a: int, b: int) -> int:
            \"\"\"Add two numbers.\"\"\"
            return a + b


        def multiply(a: int, b: int) -> int:
            \"\"\"Multiply two numbers together.\"\"\"
            return a * b


        def weather_for(city: str) -> str:
            \"\"\"The weather forecast of a city.\"\"\"
            return "sunny"
    """,
    "hooks/searcher.py": """
        def before(tool_name, params):
            if tool_name == "multiply":
                return {"b": params["b"] + 1}
    """,
    "tests/models/searcher.py": """
        import json


        def respond(messages, tools, context):
            results = [json.loads(m["content"]) for m in messages if m["role"] == "tool"]
            offered = sorted(t["function"]["name"] for t in tools)
            if not results:
                return {"tool_calls": [{"name": "search_tools",
                                        "arguments": {"query": "multiply numbers"}}]}
            if len(results) == 1:
                found = results[0]["tools"]
                return {"tool_calls": [{"name": "use_tool", "arguments": {
                    "tool_name": found[0]["name"], "arguments": {"a": 3, "b": 4}}}]}
            return {"content": json.dumps({"offered": offered, "found": results[0],
                                           "product": results[1]})}
    """,
    "tests/mocks/swapped.py": """
        def mock_calc_multiply(tool_name, params, context):
            return -1
    """,
    "tests/searcher.yaml": """
        tests:
          - name: finds_and_uses_it
            payload: go
            expected_tool_calls: [{multiply: params.a == 3 and result == 15}]
          - name: its_mock_serves_it
            payload: go
            mocks: swapped
            expected_result: output.product == -1
    """,
}


def test_search_tools_finds_by_words_and_use_tool_goes_through_hooks_and_mocks(
    tmp_path: Path,
) -> None:
    root = write(tmp_path / "p", SEARCHER)
    ran = judged(root, "tests/searcher.yaml", "finds_and_uses_it")
    assert ran.passed, ran.failure_reason
    answer = json.loads(ran.invocations[0].output)
    # Offered upfront: the listed tool and the discovery pair, not the discoverable tools.
    assert answer["offered"] == ["add", "search_tools", "use_tool"]
    found = answer["found"]
    # "multiply numbers": multiply shares two words, add's docstring is not discoverable,
    # weather_for and db_count share none.
    assert [t["name"] for t in found["tools"]] == ["multiply"] and found["count"] == 1
    assert found["tools"][0]["parameters"]["required"] == ["a", "b"]
    assert answer["product"] == 15  # the before hook made b 5
    mocked = judged(root, "tests/searcher.yaml", "its_mock_serves_it")
    assert mocked.passed, mocked.failure_reason


def test_use_tool_naming_no_discoverable_tool_tells_the_model_which_there_are(
    tmp_path: Path,
) -> None:
    files = dict(SEARCHER)
    files["tests/models/searcher.py"] = """
        import json


        def respond(messages, tools, context):
            results = [json.loads(m["content"]) for m in messages if m["role"] == "tool"]
            if not results:
                return {"tool_calls": [{"name": "use_tool", "arguments": {"tool_name": "add"}}]}
            return {"content": json.dumps(results[0])}
    """
    # A discoverable tool whose condition does not hold is neither found nor usable.
    files["agents/searcher.yaml"] = SEARCHER["agents/searcher.yaml"].replace(
        "calc.weather_for", '{calc.weather_for: "context.run_id == null"}'
    )
    files["tests/searcher.yaml"] = """
        tests:
          - name: names_a_listed_tool
            payload: go
            expected_no_tool_calls: [add]
    """
    root = write(tmp_path / "p", files)
    ran = judged(root, "tests/searcher.yaml", "names_a_listed_tool")
    assert ran.passed, ran.failure_reason
    error = json.loads(ran.invocations[0].output)["error"]
    assert "'add' is not one of this agent's discoverable tools" in error
    assert "they are: db_count, multiply)" in error


def test_once_it_runs_assertions_see_its_result() -> None:
    # The span the runtime will write once it runs the tool: the same `discovered`, executed,
    # with the tool's result.
    root = {"span_id": "s1", "parent_span_id": None, "type": "agent", "name": "f", "metadata": {}}
    ran = {
        "span_id": "s2",
        "parent_span_id": "s1",
        "type": "tool_call",
        "name": "use_tool",
        "metadata": {
            "tool_name": "use_tool",
            "tool_ref": "use_tool",
            "params": {"tool_name": "add", "arguments": {"a": 2, "b": 3}},
            "discovered": {"tool_name": "add", "tool_ref": "calc.add", "params": {"a": 2, "b": 3}},
            "result": 5,
        },
    }
    calls = calls_in_scope([root, ran], None)
    held = compile_assertions(
        {
            "expected_tool_calls": [{"calc.add": "params.a == 2 and result == 5"}],
            "expected_tool_call_order": ["add"],
            "expected_no_tool_calls": ["use_tool"],
        }
    )
    assert check_tool_calls(held, calls, {}) == []
    refused = compile_assertions({"expected_no_tool_calls": ["add"]})
    assert check_tool_calls(refused, calls, {}) == ["expected no call to add, saw 1"]


def test_params_are_what_the_discovered_tool_received_after_its_before_hook(
    tmp_path: Path,
) -> None:
    # Issue 39, item 1 (SDK test_schema.py: "with that tool's parameters and result"; spec
    # 6.2: params are what the tool received, after hooks): as for a listed tool, a before
    # hook's rewrite is what assertions see, not the model's raw arguments.
    root = write(tmp_path / "p", SEARCHER)
    ran = judged(root, "tests/searcher.yaml", "finds_and_uses_it")
    (span,) = [
        s for s in ran.invocations[0].traces if s.type == "tool_call" and s.name == "use_tool"
    ]
    assert span.metadata["discovered"]["params"] == {"a": 3, "b": 5}
    files = dict(SEARCHER)
    files["tests/searcher.yaml"] = """
        tests:
          - name: sees_the_hooked_params
            payload: go
            expected_tool_calls: [{multiply: params.b == 5 and result == 15}]
    """
    root = write(tmp_path / "q", files)
    hooked = judged(root, "tests/searcher.yaml", "sees_the_hooked_params")
    assert hooked.passed, hooked.failure_reason


def test_hooks_see_the_discovered_tool_only_and_approval_sees_the_models_arguments(
    tmp_path: Path,
) -> None:
    # Decided (issue 39): no hook runs for search_tools, for use_tool's own call or for an
    # approval input (they have no implementation a hook could wrap); hooks see the
    # discovered tool under its own name. Approval is checked on the model's arguments,
    # before the before hook (spec 8.5: "before hooks run"), so `param.b == 4` holds though
    # the hook makes b 5.
    files = dict(SEARCHER)
    files["agents/searcher.yaml"] = """
        version: "1.0"
        name: searcher
        description: Searches, asks for a note, then multiplies under approval.
        model: openai/gpt-4o
        system_prompt: Help.
        discoverable_tools: [calc.multiply]
        approval:
          tools:
            - calc.multiply: param.b == 4
          inputs:
            - get_note:
                prompt: Ask for a note.
                label: Note
    """
    files["hooks/searcher.py"] = """
        def before(tool_name, params, context):
            context.setdefault("hooked", []).append("before " + tool_name)
            if tool_name == "multiply":
                return {"b": params["b"] + 1}


        def after(tool_name, params, result, context):
            context.setdefault("hooked", []).append("after " + tool_name)
    """
    files["tests/models/searcher.py"] = """
        import json


        def respond(messages, tools, context):
            done = [m for m in messages if m["role"] == "tool"]
            steps = [
                ("search_tools", {"query": "multiply"}),
                ("get_note", {}),
                ("use_tool", {"tool_name": "multiply", "arguments": {"a": 3, "b": 4}}),
            ]
            if len(done) < len(steps):
                name, args = steps[len(done)]
                return {"tool_calls": [{"name": name, "arguments": args}]}
            return {"content": json.dumps({"hooked": context.get("hooked"),
                                           "product": json.loads(done[-1]["content"])})}
    """
    files["tests/searcher.yaml"] = """
        tests:
          - name: hooked_and_approved
            payload: go
            strict_approval_decisions: true
            approval_decisions:
              - {tool: get_note, decision: approve, response: fine}
              - {tool: calc.multiply, params: params.b == 4, decision: approve}
            expected_tool_calls: [{multiply: params.b == 5 and result == 15}]
    """
    root = write(tmp_path / "p", files)
    ran = judged(root, "tests/searcher.yaml", "hooked_and_approved")
    assert ran.passed, ran.failure_reason
    answer = json.loads(ran.invocations[0].output)
    assert answer == {"hooked": ["before multiply", "after multiply"], "product": 15}
