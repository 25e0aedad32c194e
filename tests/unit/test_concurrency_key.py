"""`concurrency: {key, on_conflict}` (issue 19, item 3; SDK ConcurrencyConfig, spec 2.2):
a case's invocations whose key values are equal never overlap; `max_concurrent_runs` still
bounds the rest."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.fixtures.projects import write
from tests.fixtures.runner import judged, overlaps


def keyed(name: str, on_conflict: str, key: str = "tenant") -> str:
    return f"""
        version: "1.0"
        name: {name}
        description: Sleeps, serialised by tenant.
        type: tool
        tool_name: slow.work
        max_concurrent_runs: 3
        concurrency: {{key: "{key}", on_conflict: {on_conflict}}}
    """


def project_files(marks: Path) -> dict[str, str]:
    return {
        "agents/queued.yaml": keyed("queued", "queue"),
        "agents/dropping.yaml": keyed("dropping", "drop"),
        "agents/coalescing.yaml": keyed("coalescing", "coalesce", key="input.tenant"),
        "tools/slow.py": f"""
            import os
            import time


            def work(payload: dict) -> dict:
                start = time.time()
                time.sleep(0.5)
                with open(os.path.join({str(marks)!r}, payload["tag"] + str(os.getpid())), "w") as fh:
                    fh.write(f"{{start}} {{time.time()}}")
                return {{"ok": True}}
        """,
        "tests/builders/tenant.py": """
            def build(context, builder_args, test_name, payload, files):
                return {"tag": "b", "tenant": "t1"}
        """,
        "tests/queued.yaml": """
            tests:
              - name: one_tenant_waits_for_the_other
                payload: '{"tag": "q", "tenant": "t1"}'
                runs: 3
                expected_result: output.ok
              - name: no_key_value_runs_up_to_max_concurrent_runs
                payload: '{"tag": "n"}'
                runs: 3
                expected_result: output.ok
              - name: a_builders_key_is_known_too_late_so_one_at_a_time
                builder: tenant
                runs: 3
                expected_result: output.ok
        """,
        "tests/dropping.yaml": """
            tests:
              - name: a_run_arriving_on_a_held_key_is_dropped
                payload: '{"tag": "d", "tenant": "t1"}'
                runs: 3
                expected_result: output.ok
        """,
        "tests/coalescing.yaml": """
            tests:
              - name: one_waiting_run_per_key_the_newest
                payload: '{"tag": "c", "tenant": "t1"}'
                runs: 3
                success_threshold: 66
                expected_result: output.ok
        """,
    }


@pytest.fixture(scope="module")
def marks(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("marks")


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory, marks: Path) -> Path:
    return write(tmp_path_factory.mktemp("keyed") / "p", project_files(marks))


@pytest.mark.slow
def test_queue_never_overlaps_equal_keys(project: Path, marks: Path) -> None:
    case = judged(project, "tests/queued.yaml", "one_tenant_waits_for_the_other")
    assert case.passed, case.failure_reason
    assert overlaps(marks, "q") == 0


@pytest.mark.slow
def test_max_concurrent_runs_still_bounds_the_rest(project: Path, marks: Path) -> None:
    case = judged(project, "tests/queued.yaml", "no_key_value_runs_up_to_max_concurrent_runs")
    assert case.passed, case.failure_reason
    assert overlaps(marks, "n") >= 1


@pytest.mark.slow
def test_a_builder_case_runs_one_at_a_time(project: Path, marks: Path) -> None:
    case = judged(project, "tests/queued.yaml", "a_builders_key_is_known_too_late_so_one_at_a_time")
    assert case.passed, case.failure_reason
    assert overlaps(marks, "b") == 0


@pytest.mark.slow
def test_drop_cancels_a_run_that_arrives_on_a_held_key(project: Path) -> None:
    case = judged(project, "tests/dropping.yaml", "a_run_arriving_on_a_held_key_is_dropped")
    assert [i.status for i in case.invocations] == ["completed", "cancelled", "cancelled"]
    assert case.invocations[1].failed_assertions == [
        "the run ended with status 'cancelled', expected 'completed' (dropped by the agent's "
        'concurrency rule: key tenant = "t1" was held by invocation 1; on_conflict: drop)'
    ]


@pytest.mark.slow
def test_coalesce_keeps_the_newest_waiting_run(project: Path) -> None:
    case = judged(project, "tests/coalescing.yaml", "one_waiting_run_per_key_the_newest")
    assert case.passed, case.failure_reason
    assert [i.status for i in case.invocations] == ["completed", "cancelled", "completed"]
    assert case.invocations[1].error == (
        "replaced while it waited by invocation 3 (the agent's concurrency rule: key "
        'input.tenant = "t1" was held by invocation 1; on_conflict: coalesce keeps one waiting '
        "run per key, the newest)"
    )
