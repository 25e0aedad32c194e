"""What is stored for a run: storable values, each large value once, and the byte cap
(gate_service.stored_runs), held to the shapes the API answers with."""

from __future__ import annotations

import json
import math
import uuid
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gate_service.gates.schemas import RunRead
from gate_service.stored_runs import (
    MARK,
    MAX_STORED_DEPTH,
    MIN_STORED_RUN_BYTES,
    REF,
    RunCap,
    json_bytes,
    pack_run,
    storable,
    unpack,
)

CAP = RunCap.setting(1024 * 1024, "GATE_MAX_STORED_RUN_BYTES")
REF_TEXT = json.dumps(REF)


def span(order: int, metadata: dict[str, Any], type_: str = "tool_call") -> dict[str, Any]:
    return {
        "span_id": f"s{order}",
        "parent_span_id": None,
        "span_order": order,
        "type": type_,
        "name": "tool",
        "status": "ok",
        "duration_ms": 1,
        "metadata": metadata,
    }


def tool_run(output: Any, payload: Any = None) -> dict[str, Any]:
    """A tool agent's run: the tool's result is the output, and the outbound span's too."""
    payload = {"a": 1} if payload is None else payload
    return {
        "input": payload,
        "output": output,
        "error": None,
        "failure_reason": None,
        "failed_assertions": [],
        "run_context": {"run_id": "r1"},
        "traces": [
            span(1, {"params": payload, "result": json.loads(json.dumps(output))}),
            span(2, {"output": json.loads(json.dumps(output)), "delivered": False}, "outbound"),
        ],
    }


def stored_text(packed: Any) -> str:
    return json.dumps({**packed.fields, "shared_values": packed.shared}, ensure_ascii=False)


def answer(packed: Any) -> RunRead:
    """The run as GET /v1/runs/{id} would answer it (the shape is checked by RunRead)."""
    fields = {k: unpack(v, packed.shared) for k, v in packed.fields.items()}
    return RunRead.model_validate(
        {
            **fields,
            "id": uuid.uuid4(),
            "case_id": uuid.uuid4(),
            "index": 0,
            "status": "completed",
            "passed": True,
            "duration_ms": 1,
        }
    )


def test_values_postgres_cannot_store_are_stored_in_their_documented_form() -> None:
    value = {
        "nan": float("nan"),
        "inf": math.inf,
        "-inf": -math.inf,
        "lone": "a\ud800b",
        "low": "\udc80",
        "nul\x00key": "x\x00y",
        "pair": "\U0001f600",  # a real character outside the BMP is kept
        "list": [float("nan"), "\udfff", 1.5, True, None],
    }
    assert storable(value) == {
        "nan": "NaN",
        "inf": "Infinity",
        "-inf": "-Infinity",
        "lone": "a\ufffdb",
        "low": "\ufffd",
        "nul\ufffdkey": "x\ufffdy",
        "pair": "\U0001f600",
        "list": ["NaN", "\ufffd", 1.5, True, None],
    }
    # What Postgres refuses is gone: strict JSON, valid UTF-8, no NUL.
    text = json.dumps(storable(value), allow_nan=False, ensure_ascii=False)
    assert "\x00" not in text and "\\u0000" not in text
    text.encode("utf-8")


def test_a_small_run_is_stored_as_it_is() -> None:
    run = tool_run({"sum": 4})
    packed = pack_run(run, CAP)
    assert packed.shared == {} and packed.cut_places == 0
    assert packed.fields["failure_reason"] is None
    assert answer(packed).model_dump(include=set(run)) == run
    assert packed.stored_bytes == json_bytes({**packed.fields, "shared_values": {}})


def test_a_value_in_three_places_is_stored_once_and_answered_in_all_three() -> None:
    output = {"rows": [f"row {i} " * 20 for i in range(50)]}
    packed = pack_run(tool_run(output), CAP)
    text = stored_text(packed)
    assert text.count("row 49 ") == 20  # once: in the shared value, not three times
    assert len(packed.shared) == 1 and text.count(REF_TEXT) == 3
    got = answer(packed)
    assert got.output == output
    assert got.traces[0].metadata["result"] == output
    assert got.traces[1].metadata["output"] == output
    assert packed.stored_bytes < 1.3 * json_bytes(output)


def test_a_ten_megabyte_output_is_stored_once_cut_to_the_cap_and_says_so() -> None:
    packed = pack_run(tool_run("x" * 10_000_000), CAP)
    assert packed.stored_bytes <= CAP.limit
    assert packed.stored_bytes == json_bytes({**packed.fields, "shared_values": packed.shared})
    text = stored_text(packed)
    assert text.count("x" * 1000) < 1100  # about 1 MB of x's, once: not thrice
    got = answer(packed)
    found = MARK.search(got.output)
    assert found and got.output.startswith("x" * 1000)
    assert len(got.output) - len(found.group()) + int(found.group(1)) == 10_000_000
    assert got.traces[0].metadata["result"] == got.output == got.traces[1].metadata["output"]
    assert got.failure_reason is not None
    assert f"{found.group(1)} bytes in 1 place(s)" in got.failure_reason
    assert "GATE_MAX_STORED_RUN_BYTES" in got.failure_reason


def test_the_longest_strings_are_cut_first_and_to_one_length() -> None:
    run = tool_run("o" * 3_000_000, payload={"big": "i" * 3_000_000, "small": "kept"})
    got = answer(pack_run(run, CAP))
    assert got.input["small"] == "kept"
    kept_in, kept_out = got.input["big"].index("…"), got.output.index("…")
    # The input and the output keep the same head: neither is starved for the other.
    assert kept_in == kept_out and kept_in > 200_000


def test_keys_count_and_a_huge_key_is_cut() -> None:
    packed = pack_run(tool_run({"k" * 5_000_000: 1, "small": 2}), CAP)
    assert packed.stored_bytes <= CAP.limit
    got = answer(packed)
    (key,) = (k for k in got.output if k != "small")
    assert MARK.search(key) and got.output["small"] == 2


@pytest.mark.slow
@pytest.mark.parametrize(
    "output",
    [
        pytest.param(list(range(200_000)), id="two hundred thousand numbers"),
        pytest.param([[i] for i in range(40_000)], id="forty thousand lists"),
        pytest.param({f"k{i}": i for i in range(20_000)}, id="twenty thousand keys"),
    ],
)
def test_a_structure_too_large_for_the_cap_keeps_its_head_and_its_shape(output: Any) -> None:
    # A cap of 128 KiB: each structure is several times larger, at a fraction of the work.
    cap = RunCap.setting(128 * 1024, "GATE_MAX_STORED_RUN_BYTES")
    packed = pack_run(tool_run(output), cap)
    assert packed.stored_bytes <= cap.limit
    got = answer(packed)
    assert type(got.output) is type(output)
    last = got.output[-1] if isinstance(got.output, list) else got.output["…"]
    assert MARK.search(last)
    assert len(got.output) > 1000  # most of the cap went to the output, not to marks
    assert got.traces[0].metadata["result"] == got.output  # still one value, shared


@pytest.mark.slow
def test_thirty_thousand_spans_end_in_one_span_that_counts_the_rest() -> None:
    run = tool_run({"sum": 4})
    run["traces"] += [
        span(i, {"level": "info", "message": f"line {i}"}, "log") for i in range(3, 30_000)
    ]
    packed = pack_run(run, CAP)
    assert packed.stored_bytes <= CAP.limit
    traces = answer(packed).traces
    assert 1000 < len(traces) < 30_000
    assert traces[0].type == "tool_call" and traces[-1].type == "cut"
    assert MARK.search(traces[-1].name)
    assert traces[-1].metadata["spans_cut"] == 30_000 - len(traces)


def test_an_object_that_looks_like_a_reference_is_answered_as_it_was() -> None:
    lookalikes = [
        {REF: "0" * 32},
        {"$gate.escaped": {REF: "x"}},
        {REF: "y" * 300, "other": 1},
    ]
    packed = pack_run(tool_run(lookalikes), CAP)
    assert answer(packed).output == lookalikes


def test_what_nests_too_deeply_is_cut_below_the_limit() -> None:
    deep: Any = 1
    for _ in range(MAX_STORED_DEPTH + 50):
        deep = [deep]
    got = answer(pack_run(tool_run(deep), CAP))
    node = got.output
    depth = 0
    while isinstance(node, list):
        node, depth = node[0], depth + 1
    assert MARK.search(node) and depth == MAX_STORED_DEPTH


def test_the_project_quota_cap_stores_a_run_at_the_floor() -> None:
    cap = RunCap(MIN_STORED_RUN_BYTES, "the project's runs already store too much")
    packed = pack_run(tool_run("z" * 100_000), cap)
    assert packed.stored_bytes <= MIN_STORED_RUN_BYTES
    assert "the project's runs already store too much" in (answer(packed).failure_reason or "")


# -- any run --------------------------------------------------------------------------------

TEXT = st.text(st.characters(codec=None, exclude_categories=()), max_size=40) | st.sampled_from(
    ["\x00", "\ud800", "\udfff x", REF, "$gate.escaped", "…[3 bytes cut]", "x" * 600]
)
LEAVES = st.none() | st.booleans() | st.integers() | st.floats() | TEXT
VALUES = st.recursive(
    LEAVES,
    lambda inner: st.lists(inner, max_size=6) | st.dictionaries(TEXT, inner, max_size=6),
    max_leaves=60,
)


@st.composite
def runs(draw: st.DrawFn) -> dict[str, Any]:
    shared = draw(VALUES)  # a value some places repeat, as tools and spans do
    pick = st.sampled_from([shared, None]) | VALUES
    return {
        "input": draw(pick),
        "output": draw(pick),
        "error": draw(st.none() | TEXT),
        "failure_reason": draw(st.none() | TEXT),
        "failed_assertions": draw(st.lists(TEXT, max_size=3)),
        "run_context": draw(st.dictionaries(TEXT, pick, max_size=4)),
        "traces": [
            span(i, draw(st.dictionaries(TEXT, pick, max_size=4)))
            for i in range(draw(st.integers(0, 5)))
        ],
    }


@pytest.mark.slow
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(run=runs(), limit=st.integers(MIN_STORED_RUN_BYTES, 20_000))
def test_any_run_is_stored_within_its_cap_and_answered_in_its_shape(
    run: dict[str, Any], limit: int
) -> None:
    packed = pack_run(run, RunCap.setting(limit, "GATE_MAX_STORED_RUN_BYTES"))
    stored = {**packed.fields, "shared_values": packed.shared}
    assert packed.stored_bytes == json_bytes(stored) <= limit
    # Postgres takes it: strict JSON, UTF-8, no NUL.
    text = json.dumps(stored, allow_nan=False, ensure_ascii=False)
    text.encode("utf-8")
    assert "\x00" not in text
    got = answer(packed)  # the API's shape, whatever was cut
    if packed.cut_places == 0:
        expected = {k: storable(v) for k, v in run.items()}
        assert got.model_dump(include=set(run)) == expected
