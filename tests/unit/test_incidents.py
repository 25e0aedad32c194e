"""What users read of an infrastructure failure: a short summary and a reference id, never
the host's paths, SQL, addresses or Docker socket (those stay in the log)."""

import pytest
import sqlalchemy.exc

from gate_service.incidents import new_reference, public, scrub, summary
from gate_service.sandbox import SandboxError

HOST_DETAILS = (
    "/var/lib/gate",
    "/home/alice",
    "docker.sock",
    "SELECT",
    "10.0.0.5",
    "::1",
    "secret-pw",
    "db.internal",
)


@pytest.mark.parametrize(
    ("message", "kept"),
    [
        (
            "running the case container failed: 500 Server Error for "
            "http+docker://localhost/v1.43/containers/create: Internal Server Error "
            '("mkdir /var/lib/gate/gate-x1/overlay: no space left on device")',
            "running the case container failed: 500 Server Error for <url>",
        ),
        (
            "connecting to the Docker engine failed: Error while fetching server API version: "
            "unix:///var/run/docker.sock is not reachable",
            "connecting to the Docker engine failed",
        ),
        (
            "cannot open /home/alice/.local/share/gate/gate-abc/bundle/a.py",
            "cannot open <path>",
        ),
        (
            "building failed: connection to 10.0.0.5:5432 and [::1]:2375 and ::1 refused",
            "building failed: connection to <address> and <address> and <address> refused",
        ),
        (
            "login failed for gate:secret-pw@db.internal:5432 (host=db.internal)",
            "login failed for <address> (host=<hidden>)",
        ),
        (
            "the step failed\n[SQL: SELECT * FROM gates WHERE id = %(id)s]\n[parameters: {}]",
            "the step failed",
        ),
    ],
)
def test_scrub_keeps_the_words_and_drops_the_host(message: str, kept: str) -> None:
    said = scrub(message)
    assert said.startswith(kept), said
    for detail in HOST_DETAILS:
        assert detail not in said, (detail, said)


def test_scrub_keeps_one_short_printable_line() -> None:
    said = scrub("first\x00 line\x1b[31m\nsecond line /etc/passwd\n" + "x" * 1000)
    assert said == "first line [31m"
    assert len(scrub("word " * 500)) <= 240
    assert scrub("and/or 1/2 of the cases at 12:30:45") == "and/or 1/2 of the cases at 12:30:45"


def test_summary_names_the_kind_of_failure() -> None:
    assert summary(SandboxError("starting the container failed\nbuild log from /var/lib/x")) == (
        "starting the container failed"
    )
    database = sqlalchemy.exc.OperationalError(
        "SELECT 1", {}, Exception('connection to server at "10.0.0.5" failed')
    )
    assert summary(database) == "the database failed (OperationalError)"
    assert summary("(psycopg.errors.UndefinedTable) relation x") == "the database failed"
    disk = FileNotFoundError(2, "No such file or directory", "/var/lib/gate/secret.key")
    assert (
        summary(disk)
        == "an operating-system call failed (FileNotFoundError: No such file or directory)"
    )
    assert summary(RuntimeError("")) == "an internal error (RuntimeError)"


def test_public_quotes_a_reference_the_log_can_be_searched_for() -> None:
    references = {new_reference() for _ in range(50)}
    assert len(references) == 50
    reference = references.pop()
    said = public(
        SandboxError("removing the container failed: unix:///var/run/docker.sock"), reference
    )
    assert said == (
        f"removing the container failed: <url> (reference {reference}; "
        "the full detail is in the worker log)"
    )
