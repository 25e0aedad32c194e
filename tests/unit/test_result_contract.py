"""The runner's result contract (gate_runner/contract.py), held on both sides.

The real runner (in-process, forked invocations, no Docker) prints a document that the
service's parser reads back whole, field for field; the v2 document is frozen here as old
services read it, so a field added to (or dropped from) the contract without a new schema
version fails; and every place the service keeps a result's fields (the stored run, the API's
run, the runner's own report check) holds the contract's fields, so one that falls behind
fails too.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import typing
import uuid
from dataclasses import fields
from pathlib import Path
from typing import Any

import pytest

from gate_runner.__main__ import main as runner_main
from gate_runner.contract import (
    END_MARKER,
    SCHEMA_VERSION,
    CaseResult,
    Invocation,
    Span,
    cut_mark,
    framed,
)
from gate_runner.report_models import SpanReport
from gate_service.gates.lifecycle import _run_row
from gate_service.gates.schemas import RunRead
from gate_service.models import Run
from gate_service.runner_contract import RunnerOutputError, parse_runner_output
from gate_service.stored_runs import MARK, RunCap, pack_run, unpack
from tests.fixtures.projects import calculator_project

NONE = type(None)
# Schema v2 as the runner printed it before the contract moved into the runner package, and
# as every service of v2 reads it: each key in order, with the JSON types its value may have.
# A new field, a dropped one or a new type is schema v3: bump SCHEMA_VERSION, and write v3
# here beside it.
CASE_V2: dict[str, tuple[type, ...]] = {
    "schema_version": (int,),
    "suite": (str,),
    "test_name": (str,),
    "agent_name": (str, NONE),
    "runs": (int,),
    "success_threshold": (int,),
    "successes": (int,),
    "passed": (bool,),
    "case_error": (str, NONE),
    "failure_reason": (str, NONE),
    "duration_ms": (int,),
    "invocations": (list,),
    "nonce": (str, NONE),
}
JSON_VALUE = (dict, list, str, int, float, bool, NONE)
INVOCATION_V2: dict[str, tuple[type, ...]] = {
    "index": (int,),
    "status": (str,),
    "passed": (bool,),
    "input": JSON_VALUE,
    "output": JSON_VALUE,
    "error": (str, NONE),
    "failure_reason": (str, NONE),
    "failed_assertions": (list,),
    "run_context": (dict,),
    "duration_ms": (int,),
    "traces": (list,),
}
SPAN_V2: dict[str, tuple[type, ...]] = {
    "span_id": (str,),
    "parent_span_id": (str, NONE),
    "span_order": (int,),
    "type": (str,),
    "name": (str,),
    "status": (str,),
    "duration_ms": (int,),
    "metadata": (dict,),
}
RUNNER_SOURCE = Path(__file__).resolve().parents[2] / "runner_image"


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return calculator_project(tmp_path_factory.mktemp("contract") / "proj", failing=True)


def printed(project: Path, case: str, capsys: pytest.CaptureFixture[str]) -> str:
    """The real runner's stdout for one case, as a container would print it."""
    argv = ["run-case", "--project", str(project), "--suite", "tests/calc.yaml"]
    assert runner_main([*argv, "--case", case]) == 0
    return capsys.readouterr().out


def document(out: str) -> str:
    """The one line between the markers (parse_runner_output checks there is one)."""
    lines = out.splitlines()
    assert lines[-1] == END_MARKER
    return lines[-2]


def shape_problems(value: dict[str, Any], shape: dict[str, tuple[type, ...]]) -> list[str]:
    problems = [] if list(value) == list(shape) else [f"keys {list(value)}"]
    problems += [
        f"{key} = {value[key]!r}"
        for key in shape
        if key in value and type(value[key]) not in shape[key]  # bool is not an int here
    ]
    return problems


@pytest.mark.parametrize(
    "case",
    [
        "adds_two_numbers",  # judged: invocations with tool-call and log spans
        "no_such_case",  # not judged: a case error, no invocations
    ],
)
def test_the_runner_prints_the_v2_document_and_the_service_reads_all_of_it(
    project: Path, case: str, capsys: pytest.CaptureFixture[str]
) -> None:
    out = printed(project, case, capsys)
    line = document(out)
    doc = json.loads(line)
    assert SCHEMA_VERSION == 2, "a new schema version: write its document here"
    problems = shape_problems(doc, CASE_V2)
    for inv in doc["invocations"]:
        problems += shape_problems(inv, INVOCATION_V2)
        for span in inv["traces"]:
            problems += shape_problems(span, SPAN_V2)
    assert problems == []
    assert doc["invocations"] or doc["case_error"]
    if doc["invocations"]:
        assert {s["type"] for s in doc["invocations"][0]["traces"]} >= {"tool_call", "log"}
    # What the service reads is the document itself: nothing dropped, coerced or added.
    result = parse_runner_output(out.encode())
    assert isinstance(result, CaseResult)
    assert result.as_dict() == doc
    assert result.to_json() == line


def test_the_contract_classes_declare_the_v2_fields() -> None:
    assert [f.name for f in fields(CaseResult)] == list(CASE_V2)
    assert [f.name for f in fields(Invocation)] == list(INVOCATION_V2)
    assert [f.name for f in fields(Span)] == list(SPAN_V2)


def valid_document() -> dict[str, Any]:
    span = dict.fromkeys(SPAN_V2) | {
        "span_id": "s1",
        "span_order": 1,
        "type": "log",
        "name": "stdout",
        "status": "ok",
        "duration_ms": 0,
        "metadata": {"message": "hi"},
    }
    invocation = dict.fromkeys(INVOCATION_V2) | {
        "index": 0,
        "status": "completed",
        "passed": True,
        "failed_assertions": [],
        "run_context": {},
        "duration_ms": 3,
        "traces": [span],
    }
    return dict.fromkeys(CASE_V2) | {
        "schema_version": 2,
        "suite": "tests/calc.yaml",
        "test_name": "t",
        "agent_name": "calc",
        "runs": 1,
        "success_threshold": 100,
        "successes": 1,
        "passed": True,
        "duration_ms": 3,
        "invocations": [invocation],
    }


def block(doc: dict[str, Any]) -> bytes:
    return framed(json.dumps(doc)).encode()


def test_a_valid_document_is_read() -> None:
    result = parse_runner_output(block(valid_document()))
    assert result.invocations[0].traces[0] == Span(
        span_id="s1",
        parent_span_id=None,
        span_order=1,
        type="log",
        name="stdout",
        status="ok",
        duration_ms=0,
        metadata={"message": "hi"},
    )


def at_case(doc: dict[str, Any]) -> dict[str, Any]:
    return doc


def at_invocation(doc: dict[str, Any]) -> dict[str, Any]:
    inv: dict[str, Any] = doc["invocations"][0]
    return inv


def at_span(doc: dict[str, Any]) -> dict[str, Any]:
    span: dict[str, Any] = doc["invocations"][0]["traces"][0]
    return span


@pytest.mark.parametrize("where", [at_case, at_invocation, at_span])
def test_an_unknown_field_is_refused_at_every_level(where: Any) -> None:
    doc = valid_document()
    where(doc)["verdict_override"] = "passed"
    with pytest.raises(RunnerOutputError, match=r"(?s)contract v2.*verdict_override"):
        parse_runner_output(block(doc))


@pytest.mark.parametrize(
    ("where", "key", "value"),
    [
        (at_case, "schema_version", 1),
        (at_case, "schema_version", 3),
        (at_case, "passed", [True]),
        (at_case, "invocations", {}),
        (at_invocation, "duration_ms", "soon"),
        (at_invocation, "failed_assertions", "none"),
        (at_span, "metadata", ["level", "INFO"]),
        (at_span, "span_order", None),
    ],
)
def test_a_wrong_version_or_type_is_refused(where: Any, key: str, value: Any) -> None:
    doc = valid_document()
    where(doc)[key] = value
    with pytest.raises(RunnerOutputError, match=f"(?s)contract v2.*{key}"):
        parse_runner_output(block(doc))


@pytest.mark.parametrize("where", [at_case, at_invocation, at_span])
def test_a_missing_field_is_refused(where: Any) -> None:
    doc = valid_document()
    key = next(k for k in where(doc) if k != "nonce")
    del where(doc)[key]
    with pytest.raises(RunnerOutputError, match=f"(?s)contract v2.*{key}"):
        parse_runner_output(block(doc))


def hints(cls: Any, names: list[str]) -> dict[str, Any]:
    found = typing.get_type_hints(cls)
    return {name: found[name] for name in names}


def test_the_api_answers_a_run_with_every_field_of_an_invocation_and_its_ids() -> None:
    names = [f.name for f in fields(Invocation)]
    assert set(RunRead.model_fields) == {"id", "case_id", "sandbox", *names}
    answered = {name: RunRead.model_fields[name].annotation for name in names}
    assert answered == hints(Invocation, names)


def test_every_field_of_an_invocation_is_stored() -> None:
    inv = Invocation(
        index=2,
        status="completed",
        passed=False,
        input={"a": 1},
        output={"sum": 3},
        error="boom",
        failure_reason="`output.sum == 4`",
        failed_assertions=["`output.sum == 4`"],
        run_context={"k": "v"},
        duration_ms=7,
        traces=[Span(**valid_document()["invocations"][0]["traces"][0])],
    )
    assert {c.name for c in Run.__table__.columns} >= {f.name for f in fields(inv)}
    packed = pack_run(inv.as_dict(), RunCap.setting(1024 * 1024, "test"))
    row = _run_row(uuid.uuid4(), inv, packed)
    assert set(row) <= {c.name for c in Run.__table__.columns}  # an insert's parameters
    stored = {f.name: unpack(row[f.name], packed.shared) for f in fields(inv)}
    assert stored == inv.as_dict()


def test_the_runners_report_check_has_the_contracts_span() -> None:
    # The invocation process reports spans that become contract Spans as they are.
    names = [f.name for f in fields(Span)]
    assert list(SpanReport.model_fields) == names
    checked = {name: SpanReport.model_fields[name].annotation for name in names}
    assert checked == hints(Span, names)


def test_the_cut_mark_is_the_one_the_service_counts() -> None:
    found = MARK.search(f"head{cut_mark(12345)}")
    assert found is not None and found.group(1) == "12345"


def test_the_contract_loads_without_pydantic_or_the_sdk() -> None:
    # The runner loads the contract on every case; it must be able to drop pydantic and the
    # connic SDK there (engine-2), so the contract may not bring them.
    code = (
        "import sys, gate_runner.contract; "
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'pydantic', 'connic', 'yaml'}))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, "PYTHONPATH": str(RUNNER_SOURCE)},
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert out.strip() == "[]"


def test_every_shape_of_a_run_span_and_case_takes_its_fields_from_one_declaration() -> None:
    # The REST, Connic and client shapes and the stored run are built from the contract (or,
    # for a case, the cases table): a field added there reaches each without a line here.
    from gate_service.client.shapes import CaseView, GateView, RunView, SpanView
    from gate_service.connic_api.schemas import ConnicCase, ConnicRun, ConnicSpan
    from gate_service.gates.lifecycle import FROM_RESULT
    from gate_service.gates.schemas import CaseRead, GateRead
    from gate_service.models import Case
    from gate_service.stored_runs import JSON_FIELDS, SCALAR_FIELDS, TEXT_FIELDS

    invocation = [f.name for f in fields(Invocation)]
    span = [f.name for f in fields(Span)]
    assert sorted((*SCALAR_FIELDS, *TEXT_FIELDS, *JSON_FIELDS)) == sorted(invocation)
    assert list(RunView.model_fields) == ["id", *invocation]
    assert list(ConnicRun.model_fields) == [
        "id",
        *(n for n in invocation if n not in {"index", "failed_assertions"}),
    ]
    assert list(SpanView.model_fields) == span
    assert list(ConnicSpan.model_fields) == [*span[:-1], "metadata_json"]
    columns = [
        c.key for c in Case.__table__.columns if c.key not in {"gate_id", "position", "timeout_s"}
    ]
    assert list(CaseRead.model_fields)[: len(columns)] == columns
    assert set(ConnicCase.model_fields) < set(CaseRead.model_fields)
    # The client reads every field of a case (a kept field of the contract's CaseResult) and
    # a gate's fields under the names GateRead answers.
    assert set(CaseRead.model_fields) <= set(CaseView.model_fields)
    assert set(GateView.model_fields) <= set(GateRead.model_fields)
    assert FROM_RESULT == ("duration_ms",)
