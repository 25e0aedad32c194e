"""The light path (gate_runner/light.py): a project is loaded without the SDK's loader, and
without the SDK unless its code imports it, and every case is judged exactly as the SDK's
loader would judge it.

`judged()` (tests/fixtures/runner.py) runs every case of a qualifying project both ways and
holds the two results equal; here the cases are the ones the light path cannot decide alone,
and a fresh interpreter shows which modules each path imported.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

import gate_runner
from gate_runner.light import pydantic_plugin
from gate_runner.plan_build import build_plan
from gate_runner.reports import BUILDER, CLEANUP, INVOCATION, SPAN, Shape, checked
from tests.fixtures.projects import write
from tests.fixtures.runner import judged

AGENT = """
    version: "1.0"
    name: {name}
    description: A tool agent.
    type: tool
    tool_name: {tool}
"""
PROBE = """
    import sys


    def probe(payload: dict, context: dict) -> dict:
        # The SDK's name spelled so that the plan does not see the project name it.
        names = {"sdk": "con" + "nic", "pydantic": "pydantic", "yaml": "yaml", "asyncio": "asyncio"}
        return {key: name in sys.modules for key, name in names.items()}
"""
SUITE = """
    agent: {agent}
    tests:
      - name: {case}
        payload: '{{"a": 1}}'
        expected_result: {expect}
"""


def project_with(
    root: Path, tool_module: str, *, expect: str = "output.x == 1", **more: str
) -> Path:
    return write(
        root,
        {
            "agents/probe.yaml": AGENT.format(name="probe", tool="checks.probe"),
            "tools/checks.py": tool_module,
            "tests/probe.yaml": SUITE.format(agent="probe", case="runs", expect=expect),
            **more,
        },
    )


def run_fresh(project: Path, suite: str, case: str, *, light: bool = True) -> dict[str, Any]:
    """The case run by a fresh interpreter (as a case container's runner: nothing imported
    but the runner), from the project's plan (without its light path unless ``light``); its
    result, and the runner's own modules."""
    plan = project.parent / "plan.json"
    built = build_plan(project)
    plan.write_text(json.dumps(built if light else {**built, "light": None}))
    script = textwrap.dedent(
        f"""
        import json, sys
        from pathlib import Path
        from gate_runner.case import run_case
        plan = json.loads(Path({str(plan)!r}).read_text())
        result = run_case(Path({str(project)!r}), {suite!r}, {case!r}, plan=plan)
        print(json.dumps({{
            "result": json.loads(result.to_json()),
            "runner": sorted(n for n in ("connic", "pydantic", "yaml") if n in sys.modules),
        }}))
        """
    )
    # The runner this test imports, whatever another checkout installed.
    runner_root = str(Path(gate_runner.__file__).parent.parent)
    out = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": runner_root},
    )
    return dict(json.loads(out.stdout.splitlines()[-1]))


def test_a_tool_case_runs_without_the_sdk_pydantic_yaml_or_asyncio(tmp_path: Path) -> None:
    project = project_with(tmp_path / "p", PROBE, expect="output.sdk == false")
    assert build_plan(project)["light"] is not None
    ran = run_fresh(project, "tests/probe.yaml", "runs")
    assert ran["runner"] == []
    assert ran["result"]["invocations"][0]["output"] == {
        "sdk": False,
        "pydantic": False,
        "yaml": False,
        "asyncio": False,
    }
    judged(project, "tests/probe.yaml", "runs")  # the same both ways (with the SDK imported)


# What the light path cannot tell alone: the SDK's loader decides, with the modules already
# imported (the probe sees the SDK imported: the SDK's loader ran).
HANDED_OVER = {
    "decorated": """
        import functools
        import sys


        def traced(func):
            @functools.wraps(func)
            def call(*args, **kwargs):
                return func(*args, **kwargs)
            return call


        @traced
        def probe(payload: dict, context: dict) -> dict:
            return {"sdk": "con" + "nic" in sys.modules}
    """,
    "annotation_of_its_own": """
        import sys


        class Meta(type):
            pass


        class Payload(metaclass=Meta):
            pass


        def probe(payload: Payload, context: dict) -> dict:
            return {"sdk": "con" + "nic" in sys.modules}
    """,
    "annotation_evaluated_with_a_side_effect": """
        from __future__ import annotations

        import sys
        from typing import Annotated


        def register():
            print("evaluated")
            return "doc"


        def probe(payload: Annotated[dict, register()], context: dict) -> dict:
            return {"sdk": "con" + "nic" in sys.modules}
    """,
    "annotation_the_schema_cannot_read": """
        import sys
        import types


        def probe(payload: types.SimpleNamespace(a=1)) -> dict:
            return {"sdk": "con" + "nic" in sys.modules}
    """,
    "replaced_by_an_object": """
        import sys


        def probe(payload: dict) -> dict:
            return {}


        class Probe:
            def __call__(self, payload: dict) -> dict:
                return {"sdk": "con" + "nic" in sys.modules}


        probe = Probe()
    """,
}


@pytest.mark.slow
@pytest.mark.parametrize("variant", sorted(HANDED_OVER))
def test_what_the_light_path_cannot_tell_the_sdk_decides(tmp_path: Path, variant: str) -> None:
    project = project_with(tmp_path / "p", HANDED_OVER[variant], expect="output.sdk == true")
    assert build_plan(project)["light"] is not None
    fresh = run_fresh(project, "tests/probe.yaml", "runs")["result"]
    in_process = judged(project, "tests/probe.yaml", "runs")  # and the same both ways
    assert fresh["invocations"][0]["failure_reason"] == in_process.invocations[0].failure_reason
    # Handed over before any of the project's code ran a second time: what its module and
    # its annotations print, they print once, as on the SDK's path.
    logs = [
        s["metadata"]["message"] for s in fresh["invocations"][0]["traces"] if s["type"] == "log"
    ]
    assert len(logs) == len(set(logs)), logs


def test_a_tool_module_that_raises_is_imported_once_and_fails_as_with_the_sdk(
    tmp_path: Path,
) -> None:
    marks = tmp_path / "marks"
    marks.mkdir()
    broken = f"""
        import os
        open(os.path.join({str(marks)!r}, str(os.getpid())), "w").close()
        print("importing")
        raise ValueError("no config for this module")


        def probe(payload: dict) -> dict:
            return {{}}
    """
    project = project_with(tmp_path / "p", broken)
    result = judged(project, "tests/probe.yaml", "runs", fresh=lambda: None)
    # The SDK's loader keeps a tool agent whose tool did not resolve, with no tool: the run
    # then fails as it always did on the SDK's path (see the closing note of issue 23).
    assert "IndexError" in (result.invocations[0].failure_reason or "")
    # One import per invocation and per path: the SDK's loader raised what the light path's
    # import raised, without running the module again.
    assert len(list(marks.iterdir())) == 2
    logs = [s.metadata["message"] for s in result.invocations[0].traces if s.type == "log"]
    assert logs.count("importing") == 1, logs


def test_a_hand_over_leaves_the_project_on_sys_path_as_the_sdk_would(tmp_path: Path) -> None:
    # The only tool module raises on import; the SDK's loader is handed the exception, not
    # the import, and the project must still be first on sys.path for the builder's import.
    project = write(
        tmp_path / "p",
        {
            "agents/stage.yaml": AGENT.format(name="stage", tool="broken.run"),
            "agents/chain.yaml": """
                version: "1.0"
                name: chain
                description: one stage.
                type: sequential
                agents: [stage]
            """,
            "tools/broken.py": """
                raise ValueError("no config for this module")


                def run(payload: dict) -> dict:
                    return {}
            """,
            "helpers.py": "VALUE = 7\n",
            "tests/builders/uses_helpers.py": """
                def build(context, builder_args, test_name, payload, files):
                    import helpers

                    return {"n": helpers.VALUE}
            """,
            "tests/chain.yaml": """
                agent: chain
                tests:
                  - name: runs
                    builder: uses_helpers
                    expected_result: status == "failed"
            """,
        },
    )
    assert build_plan(project)["light"] is not None
    result = judged(project, "tests/chain.yaml", "runs")
    assert result.passed, result.failure_reason


def test_a_lookup_of_the_sdk_is_not_its_import(tmp_path: Path) -> None:
    # importlib.util.find_spec finds the SDK without importing it; the import after it must
    # still put the runtime's connic.tools in place.
    caller = """
        import asyncio
        import importlib
        import importlib.util


        def probe(payload: dict) -> dict:
            assert importlib.util.find_spec("con" + "nic") is not None
            tools = importlib.import_module("con" + "nic.tools")
            answer = asyncio.run(tools.trigger_agent("adder", {"a": payload["a"]}))
            return {"child": answer["response"]}
    """
    project = project_with(
        tmp_path / "p",
        caller,
        expect="output.child.sum == 2",
        **{
            "agents/adder.yaml": AGENT.format(name="adder", tool="adding.add"),
            "tools/adding.py": "def add(payload: dict) -> dict:\n    return {'sum': payload['a'] + 1}\n",
        },
    )
    fresh = run_fresh(project, "tests/probe.yaml", "runs")["result"]
    assert fresh["passed"], fresh["failure_reason"]


def test_a_dependency_with_a_pydantic_plugin_keeps_the_sdks_path(tmp_path: Path) -> None:
    deps = tmp_path / "deps"
    (deps / "plain-1.0.dist-info").mkdir(parents=True)
    (deps / "plain-1.0.dist-info" / "entry_points.txt").write_text("[console_scripts]\nx = y\n")
    assert pydantic_plugin(deps) == ""
    (deps / "logfire-1.0.dist-info").mkdir()
    (deps / "logfire-1.0.dist-info" / "entry_points.txt").write_text(
        "[pydantic]\nlogfire = logfire.integrations.pydantic:plugin\n"
    )
    assert pydantic_plugin(deps) == "logfire-1.0.dist-info"


def test_two_agents_share_one_import_of_their_module(tmp_path: Path) -> None:
    project = write(
        tmp_path / "p",
        {
            "agents/one.yaml": AGENT.format(name="one", tool="shared.first"),
            "agents/two.yaml": AGENT.format(name="two", tool="shared.second"),
            "agents/both.yaml": """
                version: "1.0"
                name: both
                description: one, then two.
                type: sequential
                agents: [one, two]
            """,
            "tools/shared.py": """
                print("imported")


                def first(payload: dict) -> dict:
                    return {"n": payload["n"] + 1}


                def second(payload: dict) -> dict:
                    return {"n": payload["n"] * 10}
            """,
            "tests/both.yaml": """
                agent: both
                tests:
                  - name: chain
                    payload: '{"n": 1}'
                    expected_result: output.n == 20
            """,
        },
    )
    assert build_plan(project)["light"] is not None
    result = judged(project, "tests/both.yaml", "chain")
    assert result.passed, result.failure_reason
    logs = [s.metadata["message"] for s in result.invocations[0].traces if s.type == "log"]
    assert logs == ["imported"]


CALLERS = {
    # The project's own import, at the top of its module, binds the name at import time.
    "imported_at_the_top": """
        import asyncio

        from connic.tools import trigger_agent


        def probe(payload: dict) -> dict:
            answer = asyncio.run(trigger_agent("adder", {"a": payload["a"]}))
            return {"child": answer["response"]}
    """,
    # Imported late, by a name the plan cannot see.
    "imported_late": """
        import asyncio
        import importlib


        def probe(payload: dict) -> dict:
            tools = importlib.import_module("con" + "nic.tools")
            answer = asyncio.run(tools.trigger_agent("adder", {"a": payload["a"]}))
            return {"child": answer["response"]}
    """,
}


@pytest.mark.parametrize("caller", sorted(CALLERS))
def test_code_that_imports_the_sdk_gets_the_runtimes_trigger_agent(
    tmp_path: Path, caller: str
) -> None:
    # Whenever user code imports the SDK, connic.tools is the runtime's before it binds a
    # name of it: trigger_agent runs the child here, not the SDK's stub.
    project = project_with(
        tmp_path / "p",
        CALLERS[caller],
        expect="output.child.sum == 2",
        **{
            "agents/adder.yaml": AGENT.format(name="adder", tool="adding.add"),
            "tools/adding.py": """
                def add(payload: dict) -> dict:
                    return {"sum": payload["a"] + 1}
            """,
        },
    )
    assert build_plan(project)["light"] is not None
    fresh = run_fresh(project, "tests/probe.yaml", "runs")["result"]
    assert fresh["passed"], fresh["failure_reason"]
    result = judged(project, "tests/probe.yaml", "runs")
    assert result.passed, result.failure_reason
    assert [s.name for s in result.invocations[0].traces if s.type == "agent"] == [
        "probe",
        "adder",
    ]


@pytest.mark.parametrize(
    ("files", "why"),
    [
        (
            {"middleware/probe.py": "def before(content, context):\n    return content\n"},
            "middleware/",
        ),
        ({"tools/__init__.py": ""}, "tools/__init__.py"),
        # A tool only a module __getattr__ gives: validation mode does not see it.
        (
            {"tools/checks.py": "def __getattr__(name):\n    return lambda payload: {}\n"},
            "load with errors",
        ),
        ({"yaml.py": "x = 1\n"}, "yaml.py would shadow the module 'yaml'"),
        ({"pydantic/__init__.py": ""}, "pydantic would shadow"),
        (
            {
                "agents/bot.yaml": 'version: "1.0"\nname: bot\ndescription: b\n'
                "model: openai/gpt-4o\nsystem_prompt: hi\ntools: [web_search]\n"
            },
            "agent 'bot': tool 'web_search' is a predefined or API tool",
        ),
        (
            {
                "agents/bot.yaml": 'version: "1.0"\nname: bot\ndescription: b\n'
                "model: openai/gpt-4o\nsystem_prompt: hi\ntools: [checks.*]\n"
            },
            "agent 'bot': a wildcard names its tools",
        ),
    ],
)
def test_a_project_needing_more_than_the_light_path_keeps_the_sdk(
    tmp_path: Path, files: dict[str, str], why: str
) -> None:
    plan = build_plan(project_with(tmp_path / "p", PROBE, **files))
    assert plan["light"] is None
    assert why in plan["light_refused"]


# The runner's fast check of its invocations' reports takes exactly what pydantic's strict
# models take, and gives the same data; pydantic still explains a refusal.
A_SPAN = {
    "span_id": "s1",
    "parent_span_id": None,
    "span_order": 1,
    "type": "agent",
    "name": "a",
    "status": "ok",
    "duration_ms": 3,
    "metadata": {"k": [1, {"x": None}]},
}
SAMPLES: list[tuple[Shape, Any]] = [
    (INVOCATION, {"status": "completed"}),
    (INVOCATION, {"status": "completed", "output": {"a": 1}, "traces": [A_SPAN], "violations": []}),
    (INVOCATION, {"status": "failed", "error": None, "setup_error": "x", "input": [1, 2]}),
    (INVOCATION, {"status": 1}),
    (INVOCATION, {"status": True}),
    (INVOCATION, {"output": 1}),
    (INVOCATION, {"status": "completed", "surprise": 1}),
    (INVOCATION, {"status": "completed", "traces": [{**A_SPAN, "span_order": True}]}),
    (INVOCATION, {"status": "completed", "traces": [{**A_SPAN, "span_order": 1.0}]}),
    (INVOCATION, {"status": "completed", "traces": [{**A_SPAN, "extra": 1}]}),
    (
        INVOCATION,
        {"status": "completed", "traces": [{k: v for k, v in A_SPAN.items() if k != "name"}]},
    ),
    (INVOCATION, {"status": "completed", "traces": [{**A_SPAN, "duration_ms": 10**30}]}),
    (INVOCATION, {"status": "completed", "traces": {"0": A_SPAN}}),
    (INVOCATION, {"status": "completed", "violations": ["a", 1]}),
    (INVOCATION, {"status": "completed", "run_context": []}),
    (INVOCATION, {"status": "completed", "cleanup_failure": 0}),
    (INVOCATION, ["status"]),
    (INVOCATION, None),
    (BUILDER, {"context": {}, "input": {"a": 1}}),
    (BUILDER, {"input": {}}),
    (BUILDER, {"context": "x"}),
    (CLEANUP, {}),
    (CLEANUP, {"failure": None}),
    (CLEANUP, {"failure": 3}),
]


@pytest.mark.parametrize(("shape", "data"), SAMPLES)
def test_the_fast_report_check_agrees_with_pydantic(shape: Shape, data: Any) -> None:
    from pydantic import ValidationError

    from gate_runner import report_models

    model = getattr(report_models, shape.model)
    try:
        expected: Any = model.model_validate(data).model_dump(exclude_unset=True)
    except ValidationError:
        expected = None
    got, why = checked({"r": data}, "r", shape)
    assert got == expected
    assert shape.fits(data) is (expected is not None)
    assert (why is None) is (expected is not None)


def test_the_fast_shapes_are_the_models_fields() -> None:
    from gate_runner import report_models

    for shape in (INVOCATION, BUILDER, CLEANUP):
        fields = getattr(report_models, shape.model).model_fields
        assert {n for n, f in fields.items() if f.is_required()} == set(shape.required)
        assert {n for n, f in fields.items() if not f.is_required()} == set(shape.optional)
    assert set(report_models.SpanReport.model_fields) == set(SPAN.required)


# --- LLM agents ---------------------------------------------------------------------------

# Tool functions whose schema the light path makes itself (function_schema): each must be
# the SDK loader's, for the SDK the runner image pins.
SCHEMA_CORPUS = {
    "bare": "def f(q):\n    return q\n",
    "basics": (
        "def f(s: str, i: int, x: float, b: bool, items: list, d: dict, n: None) -> dict:\n"
        "    return {}\n"
    ),
    "generics": (
        "from typing import Dict, List, Optional, Union\n\n\n"
        "def f(a: list[str], b: List[int], c: dict[str, int], d: Dict[str, list[bool]],\n"
        "      e: Optional[int], g: int | None, h: Union[str, int], k: list, m: dict[str, 'int'],\n"
        "      n: list[list[float]], o: tuple[int, str], p: set[str]) -> None:\n"
        "    pass\n"
    ),
    "literals": (
        "from typing import Literal, Optional\n\n\n"
        "def f(a: Literal['x', 'y'], b: Literal[1, 2], c: Literal['x', 1],\n"
        "      d: Optional[Literal[True, False]] = None) -> None:\n"
        "    pass\n"
    ),
    "strings": (
        "from __future__ import annotations\n\nimport typing\n\n\n"
        "def f(a: int, b: typing.Optional[str], c: list[int] | None = None,\n"
        "      d: 'dict[str, float]' = {}) -> str:\n"
        "    return ''\n"
    ),
    "string_literals": (
        "from __future__ import annotations\n\nimport typing\nfrom typing import Literal\n\n\n"
        "def f(a: Literal['x', 'y'], b: typing.Literal[-1, 2] = 2, c: Literal[None, True] = None,\n"
        "      d: list[Literal['u']] | None = None) -> None:\n"
        "    pass\n"
    ),
    "defaults_and_context": (
        "def f(a: int, b: str = 'x', *, c: bool = False, d: int, context: dict) -> None:\n"
        "    pass\n"
    ),
    "docstring": (
        "def f(city: str, days: int = 3, units: str = 'metric', note=None) -> dict:\n"
        '    """Forecast for a city.\n\n'
        "    Args:\n"
        "        city: The city's name,\n"
        "            as people spell it.\n"
        "        days (int): How many days.\n"
        "        units: metric or imperial: either\n"
        "        unknown: not a parameter\n\n"
        "    Returns:\n"
        "        note: not an argument\n"
        '    """\n'
        "    return {}\n"
    ),
    "parameters_section": (
        "def f(a: int, b: int) -> int:\n"
        '    """Adds.\n\nParameters:\n    a: first\nb: second\nRaises:\n    c: no\n"""\n'
        "    return a + b\n"
    ),
    "a_class_of_its_own": (
        "class Point:\n    pass\n\n\n"
        "def f(p: Point, ps: list[Point], q: 'Point | None' = None) -> None:\n"
        "    pass\n"
    ),
    "async": "async def f(q: str) -> str:\n    return q\n",
}


@pytest.mark.parametrize("name", sorted(SCHEMA_CORPUS))
def test_an_llm_tools_schema_is_the_sdks(tmp_path: Path, name: str) -> None:
    from connic import ProjectLoader

    from gate_runner.light import _plain_function, function_schema

    namespace: dict[str, Any] = {"__name__": "tools.corpus"}
    # Its own future imports only, not this module's.
    exec(compile(SCHEMA_CORPUS[name], f"<{name}>", "exec", dont_inherit=True), namespace)
    func = namespace["f"]
    assert _plain_function(func, "tools.corpus")  # what the light path describes itself
    expected = ProjectLoader(str(tmp_path))._generate_schema(func)
    assert function_schema(func) == expected


LLM_PROJECT = {
    "agents/helper.yaml": """
        version: "1.0"
        name: helper
        description: Looks things up with its tools.
        model: openai/gpt-4o
        system_prompt: Use your tools.
        max_iterations: 3
        retry_options: {attempts: 2, initial_delay: 0, max_delay: 1}
        tools:
          - weather.forecast
          - weather.alerts: "context.get('region') == 'north'"
          - lookup.find
    """,
    "tools/weather.py": '''
        from typing import Optional


        def forecast(city: str, days: int = 3, units: str = "metric"):
            """Forecast for a city.

            Args:
                city: The city's name.
                days: How many days ahead.
            """
            return {"city": city, "days": days}


        def alerts(region: Optional[str] = None) -> list:
            return []
    ''',
    "tools/lookup.py": """
        import sys


        def find(q: str, context: dict) -> dict:
            # The SDK's name spelled so that the plan does not see the project name it.
            return {"found": q, "sdk": "con" + "nic" in sys.modules}
    """,
    # What the model is offered, as it sees it, is the run's output.
    "tests/models/helper.py": """
        import json


        def respond(messages, tools, context, options):
            results = [m for m in messages if m["role"] == "tool"]
            if not results:
                return {"tool_calls": [{"name": "find", "arguments": {"q": "umbrellas"}}]}
            return {"content": {"tools": tools, "found": json.loads(results[-1]["content"])}}
    """,
    "tests/helper.yaml": """
        tests:
          - name: offers_its_tools
            payload: what should I take?
            expected_result: output.found.found == "umbrellas"
    """,
}


def test_an_llm_agent_runs_without_the_sdk_and_offers_the_sdks_tools(tmp_path: Path) -> None:
    project = write(tmp_path / "p", LLM_PROJECT)
    plan = build_plan(project)
    assert plan["light"] is not None, plan.get("light_refused")
    fresh = run_fresh(project, "tests/helper.yaml", "offers_its_tools")
    assert fresh["runner"] == []  # neither the SDK nor pydantic nor PyYAML
    (invocation,) = fresh["result"]["invocations"]
    assert json.loads(invocation["output"])["found"]["sdk"] is False  # the answer, as JSON
    # The same both ways, the tools offered to the model among it (the run's output).
    result = judged(project, "tests/helper.yaml", "offers_its_tools")
    assert result.passed, result.failure_reason
    answer = json.loads(result.invocations[0].output)
    offered = {t["function"]["name"]: t["function"] for t in answer["tools"]}
    assert sorted(offered) == ["find", "forecast"]  # alerts' condition does not hold
    assert offered["forecast"]["parameters"] == {
        "type": "object",
        "properties": {
            "city": {"type": "string", "description": "The city's name."},
            "days": {"type": "integer", "description": "How many days ahead."},
            "units": {"type": "string"},
        },
        "required": ["city"],
    }
    assert offered["find"]["parameters"]["properties"] == {"q": {"type": "string"}}


def test_an_llm_tool_the_light_path_cannot_describe_is_left_to_the_sdk(tmp_path: Path) -> None:
    decorated = """
        import functools
        import sys


        def traced(func):
            @functools.wraps(func)
            def call(*args, **kwargs):
                return func(*args, **kwargs)
            return call


        @traced
        def find(q: str, context: dict) -> dict:
            return {"found": q, "sdk": "con" + "nic" in sys.modules}
    """
    project = write(tmp_path / "p", {**LLM_PROJECT, "tools/lookup.py": decorated})
    assert build_plan(project)["light"] is not None
    fresh = run_fresh(project, "tests/helper.yaml", "offers_its_tools")["result"]
    assert fresh["passed"], fresh["failure_reason"]
    # The SDK's loader ran.
    assert json.loads(fresh["invocations"][0]["output"])["found"]["sdk"] is True
    result = judged(project, "tests/helper.yaml", "offers_its_tools")  # and the same both ways
    assert result.passed, result.failure_reason


def test_a_config_field_the_sdk_types_as_a_dict_stays_one() -> None:
    from connic.core import AgentConfig

    from gate_runner.light import Namespace, model_shapes

    config = AgentConfig(
        version="1.0",
        name="a",
        description="d",
        model="openai/gpt-4o",
        system_prompt="s",
        tools=["m.f", {"m.g": "context.x"}],
        retry_options={"attempts": 2},
        output_schema_dict={"type": "object", "properties": {"a": {"type": "string"}}},
    )
    light = Namespace(json.loads(json.dumps(config.model_dump(mode="json"))), model_shapes(config))
    assert light.output_schema_dict == config.output_schema_dict  # a dict, as the SDK's
    assert light.tools == ["m.f", {"m.g": "context.x"}]
    assert light.retry_options.attempts == 2  # a model, read by attribute


# Tools the light path must leave to the SDK, found by attacking it: each would have it run
# the project's code where the SDK's path does not, or describe the tool otherwise. CALLED
# records any of the project's code that ran while the light path looked at the function.
NOT_PLAIN = {
    "dict_subclass_as_its_dict": """
        class Spy(dict):
            def keys(self):
                CALLED.append("keys")
                return super().keys()

        def f(q: str) -> str:
            return q

        f.__dict__ = Spy()
    """,
    "str_subclass_as_its_module": """
        class Spy(str):
            def __ne__(self, other):
                CALLED.append("!=")
                return False

        def f(q: str) -> str:
            return q

        f.__module__ = Spy("tools.corpus")
    """,
    "a_class_that_says_it_is_typings": """
        class Fake:
            __module__ = "typing"
            def __eq__(self, other):
                CALLED.append("==")
                raise TypeError("no")
            __hash__ = object.__hash__

        def f(q: Fake()) -> str:
            return q
    """,
    "a_class_that_says_it_is_a_builtin": """
        class Box:
            __module__ = "builtins"
            def __class_getitem__(cls, item):
                CALLED.append("[]")
                return int

        def f(n: "Box[int]") -> str:
            return ""
    """,
    "a_generic_of_a_custom_metaclass": """
        import typing

        class Meta(type):
            def __hash__(cls):
                CALLED.append("hash")
                return 1

        T = typing.TypeVar("T")

        class Thing(typing.Generic[T], metaclass=Meta):
            pass

        def f(n: Thing[int]) -> str:
            return ""
    """,
}


@pytest.mark.parametrize("name", sorted(NOT_PLAIN))
def test_a_tool_that_would_run_the_projects_code_is_not_plain(name: str) -> None:
    from gate_runner.light import _plain_function

    called: list[str] = []
    namespace: dict[str, Any] = {"__name__": "tools.corpus", "CALLED": called}
    source = textwrap.dedent(NOT_PLAIN[name])
    exec(compile(source, f"<{name}>", "exec", dont_inherit=True), namespace)
    called.clear()  # what ran while the module ran is the project's either way
    assert not _plain_function(namespace["f"], "tools.corpus")
    assert called == []


@pytest.mark.parametrize(
    ("annotation", "proof"),
    [
        ("int", True),
        ("Union[int, str]", True),  # cached by its arguments in order
        ("Literal['b', 'a']", True),
        ("Optional[int]", True),
        ("List[Optional[int]]", True),
        ("Optional[Literal['b', 'a']]", False),  # equal to Optional[Literal['a', 'b']]
        ("List[Union[Dict[str, str], str]]", False),
        ("Dict[str, int | str]", False),
        ("Literal[0, 2]", False),  # equal to Literal[False, 2]
        ("Literal[True]", False),
    ],
)
def test_a_form_typings_cache_may_hand_back_reordered_is_not_cache_proof(
    annotation: str, proof: bool
) -> None:
    from typing import Dict, List, Literal, Optional, Union  # noqa: F401, UP035

    from gate_runner.light import _cache_proof

    assert _cache_proof(eval(annotation)) is proof


def test_a_module_whose_class_the_project_replaced_is_the_sdks(tmp_path: Path) -> None:
    replaced = """
        import sys
        import types


        def find(q: str, context: dict) -> dict:
            return {"found": "the module's own", "sdk": False}


        def _replacement(q: str, context: dict) -> dict:
            return {"found": q, "sdk": "con" + "nic" in sys.modules}


        class Module(types.ModuleType):
            @property
            def find(self):
                return _replacement


        sys.modules[__name__].__class__ = Module
    """
    project = write(tmp_path / "p", {**LLM_PROJECT, "tools/lookup.py": replaced})
    assert build_plan(project)["light"] is not None
    fresh = run_fresh(project, "tests/helper.yaml", "offers_its_tools")["result"]
    assert fresh["passed"], fresh["failure_reason"]  # the property's function, as the SDK's
    result = judged(project, "tests/helper.yaml", "offers_its_tools")
    assert result.passed, result.failure_reason


def test_a_project_with_forms_typings_cache_shares_imports_the_sdk_first(tmp_path: Path) -> None:
    # connic's ApprovalConfig makes List[Union[str, Dict[str, str]]] first on the SDK's
    # path: the project's equal form, evaluated after it, is handed back in that order.
    tagger = """
        from typing import Dict, List, Union


        def find(q: List[Union[Dict[str, str], str]], context: dict) -> dict:
            return {"found": "umbrellas", "sdk": True}
    """
    project = write(tmp_path / "p", {**LLM_PROJECT, "tools/lookup.py": tagger})
    plan = build_plan(project)
    assert plan["light"] is not None and plan["imports_sdk"] is True
    light = run_fresh(project, "tests/helper.yaml", "offers_its_tools")
    sdk = run_fresh(project, "tests/helper.yaml", "offers_its_tools", light=False)
    assert light["result"]["passed"], light["result"]["failure_reason"]
    offered = [json.loads(r["result"]["invocations"][0]["output"])["tools"] for r in (light, sdk)]
    assert offered[0] == offered[1]
    items = {t["function"]["name"]: t for t in offered[0]}["find"]["function"]["parameters"]
    assert items["properties"]["q"]["items"] == {"type": "string"}  # the SDK's order


def test_a_project_without_such_forms_does_not_import_the_sdk(tmp_path: Path) -> None:
    assert build_plan(write(tmp_path / "p", LLM_PROJECT))["imports_sdk"] is False
    for i, annotation in enumerate(("Literal['a', 'b']", "list[int | str]", "typing.Union[int]")):
        source = (
            f"import typing\nfrom typing import Literal\n\n\ndef f(q: {annotation}):\n    pass\n"
        )
        project = write(tmp_path / f"q{i}", {**LLM_PROJECT, "tools/other.py": source})
        assert build_plan(project)["imports_sdk"] is True, annotation
