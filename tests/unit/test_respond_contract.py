"""docs/runtime.md's respond() example runs as documented (issue 10, rule 10)."""

import re
import textwrap
from pathlib import Path

from tests.fixtures.projects import write
from tests.fixtures.runner import judged

RUNTIME_PAGE = (Path(__file__).resolve().parents[2] / "docs" / "runtime.md").read_text()


def readme_example() -> str:
    match = re.search(r"<!-- respond-example -->\n```python\n(.*?)```", RUNTIME_PAGE, re.S)
    assert match, "docs/runtime.md lost its respond() example"
    return match.group(1)


def test_the_documented_example_is_a_tool_call_then_an_answer(tmp_path: Path) -> None:
    project = write(
        tmp_path / "p",
        {
            "agents/adder.yaml": """
                version: "1.0"
                name: adder
                description: Adds with a tool.
                model: openai/gpt-4o
                system_prompt: Add.
                tools: [calc.add]
            """,
            "tools/calc.py": "def add(a: int, b: int) -> int:\n    return a + b\n",
            "tests/adder.yaml": """
                tests:
                  - name: adds
                    payload: two plus three
                    expected_result: output == "the sum is 5"
                    expected_tool_calls: [{add: params.a == 2 and params.b == 3}]
            """,
        },
    )
    (project / "tests/models").mkdir(parents=True)
    (project / "tests/models/adder.py").write_text(textwrap.dedent(readme_example()))
    result = judged(project, "tests/adder.yaml", "adds")
    assert result.passed, result.failure_reason
    turns = [s for s in result.invocations[0].traces if s.type == "model_call"]
    assert len(turns) == 2
