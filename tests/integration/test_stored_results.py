"""Stored results are bounded, and what Postgres cannot store never makes a case an
infrastructure error (issue 17, items 3 and 4). Real Postgres; the runner in-process (the
fake sandbox), so the worker's storing is what is under test."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session, sessionmaker

from gate_service.config import Settings
from gate_service.db import refused_write, session_scope
from gate_service.main import create_app
from gate_service.models import utcnow
from gate_service.stored_runs import MARK, MIN_STORED_RUN_BYTES
from gate_service.worker.retention import run_retention
from tests.fixtures.auth import ADMIN_TOKEN, as_token, bearer, project_token
from tests.fixtures.outputs import (
    BIG_ITEMS,
    TEN_MB,
    UNSTORABLE_OUTPUT,
    big_output_project,
    unstorable_output_project,
)
from tests.fixtures.projects import AGENTS, bundle_of, calculator_project, write
from tests.fixtures.sandbox import FakeSandbox, fake_worker

RUN_CAP = 256 * 1024  # small, so that the tests move little data; the same code as 1 MiB


def submit(client: TestClient, data: bytes) -> str:
    response = client.post("/v1/gates", files={"bundle": ("b.tgz", data)})
    assert response.status_code == 202, response.text
    return str(response.json()["id"])


def judge(client: TestClient, settings: Settings, sessions: Any, data: bytes) -> dict[str, Any]:
    gate_id = submit(client, data)
    assert fake_worker(settings, sessions, FakeSandbox()).run_once()
    return dict(client.get(f"/v1/gates/{gate_id}").json())


def stored_runs(sessions: sessionmaker[Session], gate_id: str) -> list[dict[str, Any]]:
    """Each run's row as Postgres holds it: its stored text, its stored_bytes, its case."""
    with session_scope(sessions) as s:
        rows = s.execute(
            text(
                "SELECT c.test_name, r.stored_bytes, row_to_json(r)::text AS row, "
                "r.shared_values FROM runs r JOIN cases c ON c.id = r.case_id "
                "WHERE c.gate_id = :g"
            ),
            {"g": uuid.UUID(gate_id)},
        ).all()
    return [dict(r._mapping) for r in rows]


def attempts(sessions: sessionmaker[Session], gate_id: str) -> int:
    with session_scope(sessions) as s:
        return int(
            s.execute(
                text("SELECT attempts FROM jobs WHERE gate_id = :g"), {"g": uuid.UUID(gate_id)}
            ).scalar_one()
        )


@pytest.fixture
def capped(settings: Settings) -> Settings:
    return settings.model_copy(update={"max_stored_run_bytes": RUN_CAP})


@pytest.fixture
def capped_client(capped: Settings) -> Iterator[TestClient]:
    with TestClient(create_app(capped), headers=bearer(ADMIN_TOKEN)) as c:
        yield c


# -- item 3: bounded -------------------------------------------------------------------------


def test_a_ten_megabyte_output_is_stored_once_within_the_cap_and_says_it_was_cut(
    capped_client: TestClient,
    capped: Settings,
    sessions: sessionmaker[Session],
    tmp_path: Path,
) -> None:
    gate = judge(capped_client, capped, sessions, bundle_of(big_output_project(tmp_path / "p")))
    assert gate["status"] == "passed", gate
    rows = {r["test_name"]: r for r in stored_runs(sessions, gate["id"])}
    assert set(rows) == {"returns_ten_megabytes", "returns_eight_megabytes_of_items"}
    for row in rows.values():
        # The cap holds for all the row stores, keys and spans included.
        assert row["stored_bytes"] <= RUN_CAP
        assert len(row["row"].encode()) < RUN_CAP * 1.1  # Postgres' own JSON spacing aside

    # The list: the tool's result, the output and the outbound span's output are one value,
    # stored once; every item keeps a head and ends in its mark.
    items = rows["returns_eight_megabytes_of_items"]
    assert items["row"].count("item-0007-") == 1
    assert len(items["shared_values"]) == 1
    run_id = next(
        c["agent_run_ids"][0]
        for c in gate["cases"]
        if c["test_name"] == "returns_eight_megabytes_of_items"
    )
    run = capped_client.get(f"/v1/runs/{run_id}").json()
    assert len(run["output"]) == BIG_ITEMS
    assert all(item.startswith(f"item-{i:04d}-") for i, item in enumerate(run["output"]))
    assert all(MARK.search(item) for item in run["output"])
    tool = next(s for s in run["traces"] if s["type"] == "tool_call")
    outbound = next(s for s in run["traces"] if s["type"] == "outbound")
    assert tool["metadata"]["result"] == run["output"] == outbound["metadata"]["output"]
    assert "the stored result was cut" in run["failure_reason"]
    assert (
        f"a run stores at most {RUN_CAP} bytes (GATE_MAX_STORED_RUN_BYTES)"
        in (run["failure_reason"])
    )
    # The format CLI's route answers the same run whole.
    connic = capped_client.get(f"/v1/projects/default/runs/{run_id}").json()
    assert json.loads(connic["output"]) == run["output"]
    tool_meta = next(
        json.loads(s["metadata_json"]) for s in connic["traces"] if s["type"] == "tool_call"
    )
    assert tool_meta["result"] == run["output"]

    # The string: the runner keeps its first KiB in the container; stored once, marked.
    string = rows["returns_ten_megabytes"]
    assert string["row"].count("x" * 1000) == 1
    run_id = next(
        c["agent_run_ids"][0] for c in gate["cases"] if c["test_name"] == "returns_ten_megabytes"
    )
    run = capped_client.get(f"/v1/runs/{run_id}").json()
    assert run["output"] == "x" * 1024 + f"…[{TEN_MB - 1024} bytes cut]"
    assert f"{TEN_MB - 1024} bytes in 1 place(s)" in run["failure_reason"]

    # The gate's stored bytes are its runs', which the project's quota adds up.
    with session_scope(sessions) as s:
        result_bytes = s.execute(
            text("SELECT result_bytes FROM gates WHERE id = :g"), {"g": uuid.UUID(gate["id"])}
        ).scalar_one()
    assert result_bytes == sum(r["stored_bytes"] for r in rows.values())


def medium_project(root: Path) -> Path:
    """One case whose run stores about 20 KB."""
    return write(
        root,
        {
            "agents/medium.yaml": """
                version: "1.0"
                name: medium
                description: Returns ten strings of 1000 characters.
                type: tool
                tool_name: medium.strings
            """,
            "tools/medium.py": """
                def strings(payload: dict) -> list:
                    return [f"{i}" * 1000 for i in range(10)]
            """,
            "tests/medium.yaml": """
                tests:
                  - name: returns_ten_kilobytes
                    payload: '{}'
                    expected_result: status == "completed"
            """,
        },
    )


def test_a_project_over_its_result_quota_gets_429_until_retention_frees_it(
    settings: Settings, sessions: sessionmaker[Session], tmp_path: Path
) -> None:
    quota = 1000  # less than one run of the project stores
    # One gate of a project at a time, so the second is judged after the first is stored.
    capped = settings.model_copy(
        update={"max_result_bytes_per_project": quota, "max_running_gates_per_project": 1}
    )
    data = bundle_of(medium_project(tmp_path / "m"))
    other = bundle_of(calculator_project(tmp_path / "c", failing=False))
    with TestClient(create_app(capped), headers=bearer(ADMIN_TOKEN)) as admin:
        alpha = as_token(admin, project_token(admin, "alpha", ["submit", "read"]))
        beta = as_token(admin, project_token(admin, "beta", ["submit", "read"]))
        worker = fake_worker(capped, sessions, FakeSandbox())
        # Two gates admitted while the project stored nothing; the second is judged after
        # the first took the project past its quota.
        first, second = submit(alpha, data), submit(alpha, data)
        assert worker.run_once() and worker.run_once()
        (row,) = stored_runs(sessions, first)
        assert row["stored_bytes"] > quota
        # The gate admitted before the quota was reached still ends judged, each of its runs
        # at the floor, saying why.
        gate = alpha.get(f"/v1/gates/{second}").json()
        assert gate["status"] == "passed"
        (late,) = stored_runs(sessions, second)
        assert late["stored_bytes"] <= MIN_STORED_RUN_BYTES
        run = alpha.get(f"/v1/runs/{gate['cases'][0]['agent_run_ids'][0]}").json()
        assert "GATE_MAX_RESULT_BYTES_PER_PROJECT" in run["failure_reason"]

        used = row["stored_bytes"] + late["stored_bytes"]
        refused = alpha.post("/v1/gates", files={"bundle": ("b.tgz", other)})
        assert refused.status_code == 429, refused.text
        detail = refused.json()["detail"]
        assert f"project 'alpha' stores {used} bytes of run results" in detail
        assert f"the limit is {quota} bytes (GATE_MAX_RESULT_BYTES_PER_PROJECT)" in detail
        assert "Retention frees space" in detail
        # Per project: beta has stored nothing.
        assert beta.post("/v1/gates", files={"bundle": ("b.tgz", other)}).status_code == 202

        report = run_retention(sessions, capped, now=utcnow() + timedelta(days=31))
        assert report.projects["alpha"].result_bytes == used
        assert submit(alpha, other)


# -- item 4: what Postgres cannot store ------------------------------------------------------


def test_nan_infinity_a_lone_surrogate_and_nul_are_stored_and_the_case_judged(
    client: TestClient, settings: Settings, sessions: sessionmaker[Session], tmp_path: Path
) -> None:
    gate = judge(client, settings, sessions, bundle_of(unstorable_output_project(tmp_path)))
    # Judged on its assertions: one passes, one fails; nothing is an error, nothing retried.
    assert (gate["status"], gate["phase"]) == ("failed", "done"), gate
    by_name = {c["test_name"]: c for c in gate["cases"]}
    assert by_name["is_judged_on_its_assertion"]["status"] == "passed"
    failing = by_name["fails_on_its_assertion"]
    assert failing["status"] == "failed" and "output.ok == false" in failing["failure_reason"]
    assert attempts(sessions, gate["id"]) == 1
    run = client.get(f"/v1/runs/{failing['agent_run_ids'][0]}").json()
    assert run["output"] == UNSTORABLE_OUTPUT
    tool = next(s for s in run["traces"] if s["type"] == "tool_call")
    assert tool["metadata"]["result"] == UNSTORABLE_OUTPUT


def nul_suite_project(root: Path) -> Path:
    """A case whose name holds NUL, and another whose payload does (YAML's \\0 escape)."""
    project = calculator_project(root, failing=False)
    write(
        project,
        {
            "tests/nul.yaml": """
                agent: calc
                tests:
                  - name: "nul\\0name"
                    payload: '{"a": 1, "b": 1}'
                  - name: nul_in_payload
                    payload: "{\\"a\\": 1, \\"b\\": \\"\\0\\"}"
            """
        },
    )
    return project


def test_a_suite_string_holding_nul_is_refused_in_validating_naming_the_suite(
    client: TestClient, worker: Any, sessions: sessionmaker[Session], tmp_path: Path
) -> None:
    gate_id = submit(client, bundle_of(nul_suite_project(tmp_path / "p")))
    assert worker.run_once()
    gate = client.get(f"/v1/gates/{gate_id}").json()
    assert (gate["status"], gate["phase"]) == ("error", "validating"), gate
    assert gate["failure_reason"].startswith("2 problem(s) in the bundle's suites; first: ")
    assert (
        "tests/nul.yaml case 'nul\\\\u0000name': tests[0].name holds a NUL"
        in (gate["failure_reason"])
    )
    problems = [(p["file"], p["case"], p["message"]) for p in gate["problems"]]
    assert problems == [
        (
            "tests/nul.yaml",
            "nul\\u0000name",
            "tests[0].name holds a NUL character (\\x00), which cannot be stored; remove it",
        ),
        (
            "tests/nul.yaml",
            "nul_in_payload",
            "tests[1].payload holds a NUL character (\\x00), which cannot be stored; remove it",
        ),
    ]
    assert attempts(sessions, gate_id) == 1 and gate["cases"] == []


# -- item 4: a refusal that would repeat is not retried ---------------------------------------

REFUSING = """
    CREATE FUNCTION refuse_poison() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        IF {column} LIKE '%refuse-me%' THEN
            RAISE EXCEPTION 'this row is refused' USING ERRCODE = '22023';
        END IF;
        RETURN NEW;
    END $$;
    CREATE TRIGGER refuse_poison BEFORE INSERT ON {table}
        FOR EACH ROW EXECUTE FUNCTION refuse_poison();
"""


def refuse(sessions: sessionmaker[Session], table: str, column: str) -> None:
    """Make Postgres refuse some rows of ``table`` as a constraint would: every time."""
    with session_scope(sessions) as s:
        s.execute(text(REFUSING.format(table=table, column=column)))


def poison_project(root: Path) -> Path:
    project = write(root, AGENTS)
    write(
        project,
        {
            "agents/poison.yaml": """
                version: "1.0"
                name: poison
                description: Returns what this database refuses.
                type: tool
                tool_name: poison.value
            """,
            "tools/poison.py": """
                def value(payload: dict) -> dict:
                    return {"value": "refuse-me"}
            """,
            "tests/poison.yaml": """
                tests:
                  - name: returns_a_refused_value
                    payload: '{}'
            """,
            "tests/calc.yaml": """
                agent: calc
                tests:
                  - name: adds_two_numbers
                    payload: '{"a": 2, "b": 3}'
                    expected_result: output.sum == 5
            """,
        },
    )
    return project


def test_a_result_postgres_refuses_ends_its_case_error_at_once_not_retried(
    client: TestClient, worker: Any, sessions: sessionmaker[Session], tmp_path: Path
) -> None:
    refuse(sessions, "runs", "NEW.output::text")
    gate_id = submit(client, bundle_of(poison_project(tmp_path / "p")))
    assert worker.run_once()
    assert worker.run_once() is False  # nothing handed back for another attempt
    gate = client.get(f"/v1/gates/{gate_id}").json()
    by_name = {c["test_name"]: c for c in gate["cases"]}
    assert by_name["adds_two_numbers"]["status"] == "passed"
    refused = by_name["returns_a_refused_value"]
    assert refused["status"] == "error"
    assert refused["failure_reason"].startswith(
        "the case's result could not be stored: Postgres refused the data: this row is "
        "refused (InvalidParameterValue, SQLSTATE 22023) (reference "
    )
    assert refused["failure_reason"].endswith(
        "not retried, since the same result would be refused again"
    )
    assert (gate["status"], gate["phase"]) == ("error", "done")
    assert "tests/poison.yaml::returns_a_refused_value" in gate["failure_reason"]
    assert attempts(sessions, gate_id) == 1


def test_a_gate_whose_cases_postgres_refuses_ends_error_at_once_not_retried(
    client: TestClient, worker: Any, sessions: sessionmaker[Session], tmp_path: Path
) -> None:
    refuse(sessions, "cases", "NEW.test_name")
    project = calculator_project(tmp_path / "p", failing=False)
    write(
        project,
        {
            "tests/refused.yaml": 'agent: calc\ntests:\n  - name: refuse-me\n    payload: \'{"a": 1, "b": 1}\'\n'
        },
    )
    gate_id = submit(client, bundle_of(project))
    assert worker.run_once()
    assert worker.run_once() is False
    gate = client.get(f"/v1/gates/{gate_id}").json()
    assert gate["status"] == "error"
    assert gate["failure_reason"].startswith(
        "the gate's data could not be stored: Postgres refused the data: this row is refused"
    )
    assert "not retried" in gate["failure_reason"]
    assert attempts(sessions, gate_id) == 1


def test_only_a_refusal_of_the_data_counts_as_one_that_will_repeat(
    sessions: sessionmaker[Session],
) -> None:
    """Real errors from a real server: refused data is told apart from a lost connection."""
    with sessions() as s:
        with pytest.raises(DBAPIError) as nan:
            s.execute(text("SELECT CAST(:v AS jsonb)"), {"v": json.dumps(float("nan"))})
        s.rollback()
        s.execute(text("CREATE TEMP TABLE short (v varchar(3))"))
        with pytest.raises(DBAPIError) as too_long:
            s.execute(text("INSERT INTO short VALUES ('four')"))
        s.rollback()
        with pytest.raises(UnicodeEncodeError) as surrogate:
            s.execute(text("SELECT :v"), {"v": "\ud800"})
        s.rollback()
        pid = s.execute(text("SELECT pg_backend_pid()")).scalar_one()
        url = s.get_bind().engine.url.set(drivername="postgresql")
        with psycopg.connect(url.render_as_string(hide_password=False)) as killer:
            killer.execute("SELECT pg_terminate_backend(%s)", [pid])
        with pytest.raises(DBAPIError) as lost:
            s.execute(text("SELECT 1"))
    assert 'Token "NaN" is invalid' not in (refused_write(nan.value) or "")  # the first line
    assert (refused_write(nan.value) or "").startswith(
        "Postgres refused the data: invalid input syntax for type json"
    )
    assert "SQLSTATE 22001" in (refused_write(too_long.value) or "")
    assert refused_write(surrogate.value) is not None
    assert refused_write(lost.value) is None
