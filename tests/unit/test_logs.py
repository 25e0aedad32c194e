"""GATE_LOG_FORMAT=json: one JSON object per line, carrying gate_id, case and worker where
known (from the context variables the worker sets), also across threads that copy it."""

from __future__ import annotations

import contextvars
import io
import json
import logging
import threading
from collections.abc import Iterator

import pytest

from gate_service.config import LogFormat, Settings
from gate_service.logs import (
    JsonFormatter,
    bind_log_context,
    current_log_context,
    log_context,
    make_handler,
    uvicorn_log_config,
)


@pytest.fixture
def captured() -> Iterator[tuple[logging.Logger, io.StringIO]]:
    stream = io.StringIO()
    logger = logging.getLogger("tests.unit.test_logs")
    handler = make_handler(LogFormat.json, stream)
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    try:
        yield logger, stream
    finally:
        logger.removeHandler(handler)
        logger.propagate = True


def records(stream: io.StringIO) -> list[dict[str, object]]:
    lines = stream.getvalue().splitlines()
    assert all(line.startswith("{") and line.endswith("}") for line in lines), lines
    return [json.loads(line) for line in lines]


def test_each_record_is_one_json_object_with_the_context_fields(
    captured: tuple[logging.Logger, io.StringIO],
) -> None:
    logger, stream = captured
    logger.info("outside any job")
    with log_context(worker="host:1:abc", gate_id="g-1"):
        logger.warning("judging %s\nsecond line", "g-1")
        with log_context(case_id="c-9", case="calc::adds"):
            logger.info("case done")
        logger.info("back to the gate")
    logger.info("after the job")
    outside, judging, case, gate, after = records(stream)
    assert outside["message"] == "outside any job"
    assert not {"gate_id", "case_id", "case", "worker"} & set(outside)
    assert judging["message"] == "judging g-1\nsecond line"  # one line, newline escaped
    assert judging["level"] == "WARNING" and judging["logger"] == "tests.unit.test_logs"
    assert (judging["gate_id"], judging["worker"]) == ("g-1", "host:1:abc")
    assert "case" not in judging
    assert {k: case[k] for k in ("gate_id", "case_id", "case", "worker")} == {
        "gate_id": "g-1",
        "case_id": "c-9",
        "case": "calc::adds",
        "worker": "host:1:abc",
    }
    assert "case_id" not in gate and gate["gate_id"] == "g-1"
    assert "gate_id" not in after and "worker" not in after
    assert str(outside["time"]).endswith("+00:00")


def test_a_traceback_stays_inside_the_one_object(
    captured: tuple[logging.Logger, io.StringIO],
) -> None:
    logger, stream = captured
    try:
        raise ValueError("boom")
    except ValueError:
        with log_context(gate_id="g-2"):
            logger.exception("job failed")
    (record,) = records(stream)
    assert record["message"] == "job failed" and record["gate_id"] == "g-2"
    assert "ValueError: boom" in str(record["exception"])
    assert "Traceback" in str(record["exception"])


def test_case_threads_carry_the_gate_of_the_thread_that_started_them(
    captured: tuple[logging.Logger, io.StringIO],
) -> None:
    """As handler._run_cases does: each case runs in a copy of the job thread's context and
    binds its own case; no case's fields leak into another's or back into the job's."""
    logger, stream = captured

    def case(name: str) -> None:
        bind_log_context(case_id=name, case=f"suite::{name}")
        logger.info("running %s", name)

    with log_context(worker="w", gate_id="g-3"):
        threads = [
            threading.Thread(target=contextvars.copy_context().run, args=(case, name))
            for name in ("a", "b")
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert current_log_context() == {"worker": "w", "gate_id": "g-3"}
    by_case = {r["case_id"]: r for r in records(stream)}
    assert set(by_case) == {"a", "b"}
    for name, record in by_case.items():
        assert (record["gate_id"], record["worker"], record["case"]) == (
            "g-3",
            "w",
            f"suite::{name}",
        )


def test_extra_given_by_the_caller_wins_and_unknown_fields_are_refused(
    captured: tuple[logging.Logger, io.StringIO],
) -> None:
    logger, stream = captured
    with log_context(gate_id="from-context"):
        logger.info("explicit", extra={"gate_id": "from-extra"})
    assert records(stream)[0]["gate_id"] == "from-extra"
    with pytest.raises(ValueError, match="not a log context field"), log_context(gat_id="x"):
        pass


def test_the_json_formatter_alone_writes_one_line() -> None:
    record = logging.LogRecord("x", logging.ERROR, __file__, 1, "a\nb\r\nc", None, None)
    line = JsonFormatter().format(record)
    assert "\n" not in line and json.loads(line)["message"] == "a\nb\r\nc"


def test_uvicorn_keeps_its_own_config_for_text_and_propagates_for_json() -> None:
    assert uvicorn_log_config(Settings(log_format=LogFormat.text)) is not None
    assert uvicorn_log_config(Settings(log_format=LogFormat.json)) is None
    assert Settings.model_validate({"log_format": "json"}).log_format is LogFormat.json
