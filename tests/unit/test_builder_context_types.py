"""Assertions see the builder context as build() left it (issue 10, rule 5)."""

from decimal import Decimal
from pathlib import Path

import pytest

from gate_runner import typed_json
from gate_runner.expr import compile_expression
from tests.fixtures.projects import write
from tests.fixtures.runner import judged


@pytest.mark.parametrize(
    "value",
    [
        {"amount": Decimal("42.5"), "pair": (1, 2), "by_id": {1: "a", 2: ("b",)}},
        {"$decimal": "not a tag here", "nested": [{"$tuple": 1}]},
        [Decimal("0.1"), (), {(1, 2): "tuple key"}],
    ],
)
def test_the_context_crosses_with_its_types(value: object) -> None:
    import json

    assert typed_json.decode(json.loads(json.dumps(typed_json.encode(value)))) == value


@pytest.mark.parametrize(
    "source",
    [
        "context.amount == 42.5",
        "context.tiny == 0.1",
        "context.amount > 42",
        "context.pair == [1, 2]",
        "context.by_id[1] == 'a'",
    ],
)
def test_numbers_compare_as_numbers_and_sequences_as_sequences(source: str) -> None:
    context = {
        "amount": Decimal("42.5"),
        "tiny": Decimal("0.1"),
        "pair": (1, 2),
        "by_id": {1: "a"},
    }
    assert compile_expression(source, ("context",)).holds({"context": context})


def test_a_builders_decimal_tuple_and_int_keys_reach_the_assertions(tmp_path: Path) -> None:
    project = write(
        tmp_path / "p",
        {
            "agents/echo.yaml": """
                version: "1.0"
                name: echo
                description: Echoes.
                type: tool
                tool_name: echo.back
            """,
            "tools/echo.py": "def back(payload: dict) -> dict:\n    return payload\n",
            "tests/builders/typed.py": """
                from decimal import Decimal


                def build(context, builder_args, test_name, payload, files):
                    context["amount"] = Decimal("42.5")
                    context["pair"] = (1, 2)
                    context["by_id"] = {7: "seven"}
                    return {"ok": True}
            """,
            "tests/echo.yaml": """
                tests:
                  - name: typed
                    builder: typed
                    expected_result: >-
                      output.ok and context.amount == 42.5 and context.pair == [1, 2]
                      and context.by_id[7] == "seven"
            """,
        },
    )
    result = judged(project, "tests/echo.yaml", "typed")
    assert result.passed, result.failure_reason
