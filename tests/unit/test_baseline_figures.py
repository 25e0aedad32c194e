"""What a case answers beside its verdict (baselines issue, item 3): its Wilson interval over
the invocations it ran, `narrow` when its threshold lies strictly inside, `regression`; the
JSON the worker stores on a case read back in CaseRead's shapes; Connic's case unchanged;
and only the admin API's module writes quarantines."""

from __future__ import annotations

import ast
import typing
import uuid
from pathlib import Path

import pytest

from gate_service.baselines import judging
from gate_service.baselines.figures import case_figures, interval_of
from gate_service.baselines.schemas import QuarantinePut
from gate_service.baselines.stats import wilson
from gate_service.config import Settings
from gate_service.connic_api.schemas import ConnicCase
from gate_service.gates.schemas import BASELINE_FIELDS, CaseRead, GateRead, ModelCallTotals
from gate_service.models import Case
from gate_service.results import carried

ROOT = Path(__file__).resolve().parents[2]


def case(**fields: object) -> Case:
    values: dict[str, object] = {
        "id": uuid.uuid4(),
        "gate_id": uuid.uuid4(),
        "position": 0,
        "suite": "tests/bot.yaml",
        "agent_name": "bot",
        "test_name": "greets",
        "status": "passed",
        "passed": True,
        "successes": 5,
        "runs": 5,
        "success_threshold": 80,
        "timeout_s": 60,
        "stopped_early": False,
        "invocations_run": None,
        "regression_level": None,
    }
    return Case(**(values | fields))


def answered(row: Case) -> CaseRead:
    """The case as views.read_case_views builds it."""
    return CaseRead(
        **carried(row, CaseRead)
        | {"agent_run_ids": [], "agent_run_passed": [], "model_calls": ModelCallTotals()}
        | case_figures(row).answered()
    )


def test_a_case_with_several_runs_carries_its_wilson_interval() -> None:
    figures = case_figures(case(successes=5, runs=5))
    assert figures.interval == wilson(5, 5)
    assert figures.interval is not None
    assert (figures.interval.low, figures.interval.high) == (56.5518, 100.0)
    # 5/5 at 80%: 80 lies inside 56.6-100, so five runs cannot tell.
    assert figures.narrow is True
    assert figures.regression is False
    assert case_figures(case(successes=5, runs=5, success_threshold=50)).narrow is False


def test_the_interval_is_over_the_invocations_that_ran_not_those_planned() -> None:
    stopped = case(successes=3, runs=10, invocations_run=3, stopped_early=True)
    assert case_figures(stopped).interval == wilson(3, 3)


@pytest.mark.parametrize(
    "fields",
    [
        {"runs": 1, "successes": 1},  # one run is a verdict, not a rate
        {"runs": 5, "successes": 1, "invocations_run": 1},  # stopped after one
        {"status": "queued", "passed": None, "successes": 0},  # no verdict yet
        {"status": "running", "passed": None, "successes": 2},
        {"status": "error", "passed": False, "successes": 0},
        {"status": "cancelled", "passed": None, "successes": 0},
    ],
)
def test_no_interval_without_a_verdict_or_below_two_invocations(fields: dict[str, object]) -> None:
    figures = case_figures(case(**fields))
    assert figures.interval is None
    assert figures.narrow is False
    assert figures.answered()["interval"] is None


def test_narrow_is_strictly_inside_the_interval() -> None:
    # 0/3: the interval is 0-56.15; a threshold of 0 is its edge, not inside it.
    interval = wilson(0, 3)
    assert interval.low == 0.0
    assert interval.high == 56.1497

    def narrow(threshold: int) -> bool:
        failed = case(status="failed", passed=False, successes=0, runs=3)
        failed.success_threshold = threshold
        return case_figures(failed).narrow

    assert [narrow(t) for t in (0, 1, 50, 56, 57, 80, 100)] == [
        False, True, True, True, False, False, False,
    ]  # fmt: skip


def test_counts_no_rate_has_give_no_interval_rather_than_an_error() -> None:
    assert interval_of(6, 5) is None
    assert interval_of(-1, 5) is None
    assert interval_of(0, 0) is None
    assert interval_of(1, 1) == wilson(1, 1)
    assert interval_of(1, 1, least_runs=2) is None
    assert case_figures(case(successes=7, runs=5)).interval is None


def test_regression_is_the_worker_s_regression_level() -> None:
    assert case_figures(case(regression_level="regression")).regression is True
    assert case_figures(case(regression_level="likely")).regression is False
    assert case_figures(case(regression_level="none")).regression is False


def test_what_the_worker_stores_on_a_case_reads_back_in_case_read_s_shapes() -> None:
    settings = Settings(database_url="postgresql://nobody@127.0.0.1:9/none")
    base = case(successes=10, runs=10, definition_hash="d" * 64)
    now = case(status="failed", passed=False, successes=2, runs=10, definition_hash="d" * 64)
    gate_id = uuid.uuid4()
    compared = judging.compare(now, base, gate_id, settings)
    assert compared.level == "regression"
    flaky = judging.flakiness(
        [judging.Verdict(True, 5, 5), judging.Verdict(False, 2, 5), judging.Verdict(True, 5, 5)],
        5,
    )
    assert flaky is not None
    row = case(
        status="failed",
        passed=False,
        successes=2,
        runs=10,
        case_key="k" * 64,
        closure_hash="c" * 64,
        definition_hash="d" * 64,
        baseline=compared.stored,
        regression_level=compared.level,
        flaky=flaky,
        quarantine={
            "owner": "ana",
            "reason": "vendor outage",
            "expires_at": "2026-12-20T00:00:00+00:00",
        },
        reused_from=None,
    )
    view = answered(row)
    assert view.baseline is not None and view.baseline.gate_id == gate_id
    assert view.baseline.comparable is True and view.baseline.p_value is not None
    assert view.flaky is not None and (view.flaky.gates, view.flaky.passed_gates) == (3, 2)
    assert view.quarantine is not None and view.quarantine.owner == "ana"
    assert view.regression is True
    assert view.interval is not None and view.interval.high == wilson(2, 10).high
    # Not comparable: the same shape with its nulls.
    missing = judging.compare(now, None, gate_id, settings)
    view = answered(case(baseline=missing.stored))
    assert view.baseline is not None and view.baseline.comparable is False
    assert view.baseline.case_id is None and view.baseline.why


def test_connic_s_case_keeps_the_platform_s_shape() -> None:
    assert not BASELINE_FIELDS & set(ConnicCase.model_fields)
    assert set(ConnicCase.model_fields) == {
        "agent_name",
        "test_name",
        "passed",
        "successes",
        "runs",
        "success_threshold",
        "failure_reason",
        "agent_run_ids",
        "agent_run_passed",
    }
    assert BASELINE_FIELDS <= set(CaseRead.model_fields)
    assert {"baseline", "baseline_gate_id", "changed_only"} <= set(GateRead.model_fields)


def test_a_quarantine_s_end_without_an_offset_is_utc() -> None:
    body = QuarantinePut.model_validate(
        {
            "case": {"suite": "tests/a.yaml", "agent_name": "a", "test_name": "t"},
            "owner": "ana",
            "reason": "r",
            "expires_at": "2030-01-01T00:00:00",
        }
    )
    assert body.expires_at.utcoffset() is not None
    assert body.expires_at.isoformat() == "2030-01-01T00:00:00+00:00"


def _imports_quarantine(path: Path, node: ast.ImportFrom) -> bool:
    names = {alias.name for alias in node.names}
    module = node.module or ""
    if module.endswith("baselines.quarantine"):
        return True
    if module.endswith("baselines") and "quarantine" in names:
        return True
    if path.parent.name == "baselines" and node.level == 1:
        return module == "quarantine" or (module == "" and "quarantine" in names)
    return False


def test_only_the_admin_api_s_module_writes_quarantines() -> None:
    # A quarantine can never be set from inside a bundle: no module but
    # baselines/quarantine.py creates or changes a CaseQuarantine (the worker only reads
    # them), and only the admin routes import that module.
    writers, importers = set(), set()
    for path in sorted((ROOT / "gate_service").rglob("*.py")):
        where = path.relative_to(ROOT).as_posix()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call):
                name = ast.unparse(node.func).split(".")[-1]
                args = [ast.unparse(a) for a in node.args]
                if name == "CaseQuarantine" or (
                    name in {"insert", "update"} and "CaseQuarantine" in args
                ):
                    writers.add(where)
            elif isinstance(node, ast.ImportFrom) and _imports_quarantine(path, node):
                importers.add(where)
    assert writers == {"gate_service/baselines/quarantine.py"}
    assert importers == {"gate_service/baselines/routes.py"}


def test_the_described_columns_keep_their_column_s_type() -> None:
    # CaseRead answers the baselines columns with descriptions (and JSON ones with their
    # shapes): a scalar column's type stays the one its Mapped[...] says.
    hints = typing.get_type_hints(Case)
    json_columns = {"baseline", "flaky", "quarantine"}
    for name in BASELINE_FIELDS & {c.key for c in Case.__table__.columns}:
        field = CaseRead.model_fields[name]
        assert field.description, name
        if name not in json_columns:
            assert field.annotation == typing.get_args(hints[name])[0], name
