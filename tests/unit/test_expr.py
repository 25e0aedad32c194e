"""The expression language: what it accepts, what it refuses, and how it evaluates."""

import pytest

from gate_runner.expr import (
    MAX_EXPRESSION_CHARS,
    EvaluationError,
    ExpressionError,
    accessor_values,
    compile_expression,
)

RESULT = ("output", "error", "status", "context")


def holds(source: str, **bindings: object) -> bool:
    return compile_expression(source, RESULT).holds(bindings)


@pytest.mark.parametrize(
    ("source", "bindings", "expected"),
    [
        ("output.total == 42", {"output": {"total": 42}}, True),
        ("output.total == 42", {"output": {"total": 41}}, False),
        ('output["total"] > 40', {"output": {"total": 42}}, True),
        ("output.items[1] == 'b'", {"output": {"items": ["a", "b"]}}, True),
        ('"hi" in output', {"output": "oh hi there"}, True),
        ('"x" not in output', {"output": ["y"]}, True),
        (
            "status == 'failed' and 'timed out' in error",
            {"status": "failed", "error": "timed out after 2 s"},
            True,
        ),
        ("not output.ok or status == 'completed'", {"output": {"ok": False}, "status": "x"}, True),
        ("1 < output.n <= 3", {"output": {"n": 3}}, True),
        ("1 < output.n <= 3", {"output": {"n": 4}}, False),
        ("output.n == -1", {"output": {"n": -1}}, True),
        ("error is null", {"error": None}, True),
        ("error is not None", {"error": "boom"}, True),
        ("output.flag == True", {"output": {"flag": True}}, True),
        ("output.flag == true", {"output": {"flag": True}}, True),
        ("output.tags == ['a', 'b']", {"output": {"tags": ["a", "b"]}}, True),
        ("output.kind in ('a', 'b')", {"output": {"kind": "b"}}, True),
        ("output.d == {'k': 1}", {"output": {"d": {"k": 1}}}, True),
        ("output", {"output": ""}, False),
        ("context.id == output.id", {"context": {"id": 7}, "output": {"id": 7}}, True),
    ],
)
def test_evaluates_allowed_grammar(
    source: str, bindings: dict[str, object], expected: bool
) -> None:
    assert holds(source, **bindings) is expected


def test_x_in_null_is_false_not_an_error() -> None:
    assert holds('"x" in error', error=None) is False


@pytest.mark.parametrize(
    ("source", "fragment"),
    [
        ("len(output) == 1", "function and method calls"),
        ("output.lower() == 'a'", "function and method calls"),
        ("output.n + 1 == 2", "arithmetic"),
        ("output.n * 2", "arithmetic"),
        ("lambda: 1", "lambda"),
        ("[x for x in output]", "comprehensions"),
        ("output.__class__", "names starting with _"),
        ("output._private", "names starting with _"),
        ("_secret == 1", "names starting with _"),
        ("params.x == 1", "unknown name 'params'"),
        ("output[1:2]", "slicing"),
        ("output.n = 1", "syntax error"),
        ("(yield 1)", "Yield"),
        ("f'{output}'", "JoinedStr"),
    ],
)
def test_refuses_constructs_outside_the_grammar(source: str, fragment: str) -> None:
    with pytest.raises(ExpressionError) as info:
        compile_expression(source, RESULT)
    assert fragment in str(info.value)


def test_refusal_names_the_position() -> None:
    with pytest.raises(ExpressionError) as info:
        compile_expression("output.ok and len(output) > 1", RESULT)
    assert info.value.position == 15
    assert "column 15" in str(info.value)


def test_length_cap() -> None:
    ok = "output == '" + "a" * (MAX_EXPRESSION_CHARS - 12) + "'"
    assert len(ok) == MAX_EXPRESSION_CHARS
    compile_expression(ok, RESULT)
    with pytest.raises(ExpressionError, match="2001 characters; the limit is 2000"):
        compile_expression(ok + " ", RESULT)


@pytest.mark.parametrize(
    ("source", "bindings", "fragment"),
    [
        ("output.missing == 1", {"output": {"present": 1}}, "no key missing"),
        ("output.n > 0", {"output": {"n": None}}, "cannot compare"),
        ("output.items[5] == 1", {"output": {"items": [1]}}, "out of range"),
        ("output.name.first == 'a'", {"output": {"name": "ada"}}, "cannot look up .first"),
        ("output[context] == 1", {"output": {"a": 1}, "context": {}}, "unhashable"),
        ("output[[1]] == 1", {"output": {"a": 1}}, "unhashable"),
    ],
)
def test_runtime_errors_are_reported_not_swallowed(
    source: str, bindings: dict[str, object], fragment: str
) -> None:
    with pytest.raises(EvaluationError, match=fragment):
        compile_expression(source, RESULT).evaluate(bindings)


def test_names_records_the_roots_used() -> None:
    expr = compile_expression("status == 'failed' and 'x' in error", RESULT)
    assert expr.names == {"status", "error"}


def test_accessor_values_show_what_was_seen() -> None:
    expr = compile_expression("output.total == 42 and output.currency == 'EUR'", RESULT)
    seen = dict(accessor_values(expr, {"output": {"total": 41, "currency": "EUR"}}))
    assert seen == {"output.total": "41", "output.currency": '"EUR"'}
