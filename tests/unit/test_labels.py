"""The labels form field: bounded before it is parsed, storable once it is."""

import pytest

from gate_service.errors import BadRequest
from gate_service.gates.labels import MAX_LABELS_DEPTH, parse_label_filter, parse_labels


def test_brackets_inside_strings_do_not_count_as_nesting() -> None:
    raw = '{"a": "' + "[{" * 50 + '", "b": "\\"[[[[[[[[[[", "c": [[["x"]]]}'
    assert parse_labels(raw)["c"] == [[["x"]]]


def test_nesting_is_bounded_before_parsing() -> None:
    at_limit = '{"a": ' + "[" * (MAX_LABELS_DEPTH - 1) + "]" * (MAX_LABELS_DEPTH - 1) + "}"
    assert parse_labels(at_limit)
    for raw in (at_limit.replace('{"a": ', '{"a": ['), "[" * 10_000):
        with pytest.raises(BadRequest, match="nest more than"):
            parse_labels(raw)


@pytest.mark.parametrize(
    "raw",
    ['{"a": "\\ud800"}', '{"\\udc00": 1}', '{"a": "\\u0000"}', '{"a": -Infinity}', '{"a": -1e999}'],
)
def test_what_postgres_cannot_store_is_refused(raw: str) -> None:
    with pytest.raises(BadRequest):
        parse_labels(raw)


def test_big_labels_are_refused_and_ordinary_ones_kept() -> None:
    with pytest.raises(BadRequest, match="at most"):
        parse_labels('{"a": "' + "x" * 20_000 + '"}')
    assert parse_labels('{"commit": "abc", "n": 1.5, "ok": true}') == {
        "commit": "abc",
        "n": 1.5,
        "ok": True,
    }
    assert parse_labels(None) == parse_labels("") == {}


def test_label_filters() -> None:
    assert parse_label_filter(["a=b", "c=d=e", "f="]) == {"a": "b", "c": "d=e", "f": ""}
    for items in (["a\x00=b"], ["nokey"], ["a=b"] * 21, ["a=" + "x" * 2000]):
        with pytest.raises(BadRequest):
            parse_label_filter(items)
