"""Payload delivery (issue 10, rule 6; spec 7.1 and the seed's "Payload" paragraph)."""

from pathlib import Path

import pytest

from gate_runner.runtime import as_payload, stage_input
from tests.fixtures.projects import write
from tests.fixtures.runner import judged


@pytest.mark.parametrize(
    ("payload", "delivered"),
    [
        ('{"a": 1}', {"a": 1}),
        ("42", {"message": "42"}),
        ("[1, 2]", {"message": "[1, 2]"}),
        ('"hi"', {"message": '"hi"'}),
        ("plain words", {"message": "plain words"}),
        ("null", {"message": "null"}),
    ],
)
def test_a_case_payload_that_is_not_a_json_object_arrives_as_message(
    payload: str, delivered: dict[str, object]
) -> None:
    assert as_payload(payload) == delivered


def test_a_chain_stage_still_receives_decoded_values_as_input() -> None:
    # Spec 7.5: inside a sequential chain a JSON-compatible return value keeps its type.
    assert stage_input("[1, 2]") == {"input": [1, 2]}
    assert stage_input([1, 2]) == {"input": [1, 2]}
    assert stage_input("not json") == {"input": "not json"}


def test_the_tool_agent_receives_the_message_end_to_end(tmp_path: Path) -> None:
    project = write(
        tmp_path / "p",
        {
            "agents/echo.yaml": """
                version: "1.0"
                name: echo
                description: Echoes its payload.
                type: tool
                tool_name: echo.back
            """,
            "tools/echo.py": """
                def back(payload: dict) -> dict:
                    return payload
            """,
            "tests/echo.yaml": """
                tests:
                  - name: number
                    payload: '42'
                    expected_result: output.message == "42"
            """,
        },
    )
    result = judged(project, "tests/echo.yaml", "number")
    assert result.passed, result.failure_reason
    assert result.invocations[0].input == {"message": "42"}
