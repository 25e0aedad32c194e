"""The connic-compatible routes (design: REST contract; connic-spec §9.2) on a real Postgres.

A test run is a gate: created by the same code as POST /v1/gates, judged by the (fake-sandbox)
worker, read back under Connic's names. Where it matters, the CLI's own functions
(`_kickoff_test_run`, `_poll_test_run`, `_fetch_failed_run_details`) talk to the app, so the
shapes are checked by the code that reads them, not by a copy of it.
"""

from __future__ import annotations

import base64
import io
import json
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from connic import cli as connic_cli
from fastapi.testclient import TestClient
from httpx import Response

from gate_service.config import Settings
from gate_service.connic_api.routes import bounds_its_own_body
from gate_service.main import create_app
from gate_service.worker.loop import Worker
from tests.fixtures.auth import ADMIN_TOKEN, as_token, bearer, project_token
from tests.fixtures.live import stream_upload
from tests.fixtures.projects import bundle_of, calculator_project, unknown_agent_project

PID = "default"  # the bootstrap admin token's project
CASE_KEYS = {
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


def body(data: bytes, **extra: Any) -> dict[str, Any]:
    return {"files_data": base64.b64encode(data).decode(), "environment_id": "default", **extra}


def start(c: TestClient, data: bytes, pid: str = PID, **extra: Any) -> Response:
    return c.post(f"/v1/projects/{pid}/test-runs", json=body(data, **extra))


def started(c: TestClient, data: bytes, **extra: Any) -> str:
    response = start(c, data, **extra)
    assert response.status_code == 202, response.text
    return str(response.json()["id"])


def error_of(response: Response, status: int) -> dict[str, Any]:
    assert response.status_code == status, response.text
    answer = response.json()
    assert set(answer) == {"error", "detail", "problems"}, answer
    return dict(answer)


@pytest.fixture
def cli_client(client: TestClient) -> Iterator[TestClient]:
    """An httpx client as `connic test` builds it: base URL <gate>/v1, the bearer token."""
    with TestClient(client.app, base_url="http://testserver/v1", headers=bearer(ADMIN_TOKEN)) as c:
        yield c


@pytest.fixture
def passing(tmp_path: Path) -> bytes:
    return bundle_of(calculator_project(tmp_path / "pass", failing=False))


@pytest.fixture
def failing(tmp_path: Path) -> bytes:
    return bundle_of(calculator_project(tmp_path / "fail", failing=True))


def test_environments_answer_one_default_the_cli_resolves(client: TestClient) -> None:
    response = client.get(f"/v1/projects/{PID}/environments")
    assert response.status_code == 200, response.text
    envs = response.json()
    assert envs == [
        {
            "id": "default",
            "name": "default",
            "env_type": "standard",
            "is_default": True,
            "test_environment_id": None,
        }
    ]
    # The CLI's own resolution (cli.py `test`): the standard default env, its test env or itself.
    standard = [e for e in envs if e.get("env_type") != "test"]
    chosen = next(e for e in standard if e.get("is_default"))
    assert (chosen.get("test_environment_id") or chosen["id"]) == "default"


def test_a_passing_run_is_running_until_judged_then_passed(
    client: TestClient, worker: Worker, passing: bytes
) -> None:
    response = start(client, passing)
    assert response.status_code == 202, response.text
    run_id = response.json()["id"]
    assert response.headers["Location"] == f"/v1/projects/{PID}/test-runs/{run_id}"
    # Queued: a status the CLI keeps polling, never one it stops at.
    queued = client.get(f"/v1/projects/{PID}/test-runs/{run_id}").json()
    assert (queued["status"], queued["phase"], queued["cases"]) == ("running", "queued", [])
    assert worker.run_once() is True
    run = client.get(f"/v1/projects/{PID}/test-runs/{run_id}").json()
    assert (run["status"], run["phase"], run["total_cases"]) == ("passed", "done", 4)
    assert (run["error"], run["deployment_id"]) == (None, run["id"])
    assert all(set(c) == CASE_KEYS and c["passed"] is True for c in run["cases"])
    adds = next(c for c in run["cases"] if c["test_name"] == "adds_two_numbers")
    assert (adds["agent_name"], adds["successes"], adds["runs"]) == ("calc", 2, 2)
    assert (adds["success_threshold"], adds["agent_run_passed"]) == (100, [True, True])
    # The same gate under its own route, with the same cases.
    gate = client.get(f"/v1/gates/{run_id}").json()
    assert gate["status"] == "passed"
    assert [c["test_name"] for c in gate["cases"]] == [c["test_name"] for c in run["cases"]]
    assert [str(r) for c in gate["cases"] for r in c["agent_run_ids"]] == [
        r for c in run["cases"] for r in c["agent_run_ids"]
    ]


def test_a_failing_run_through_the_clis_own_kickoff_poll_and_drill_down(
    cli_client: TestClient, worker: Worker, failing: bytes
) -> None:
    run_id = connic_cli._kickoff_test_run(cli_client, PID, "default", failing)
    assert worker.run_once() is True
    result = connic_cli._poll_test_run(
        cli_client, f"/projects/{PID}/test-runs/{run_id}", quiet=True
    )
    assert result["status"] == "failed"
    by_name = {c["test_name"]: c for c in result["cases"]}
    wrong = by_name["expects_the_wrong_sum"]
    assert (wrong["passed"], wrong["successes"], wrong["runs"]) == (False, 0, 2)
    assert "output.sum = 4" in wrong["failure_reason"]
    assert wrong["agent_run_passed"] == [False]  # early stop: the first failure decided it
    details = connic_cli._fetch_failed_run_details(cli_client, PID, wrong)
    assert details["total_failed"] == 1 and len(details["shown"]) == 1
    shown = details["shown"][0]
    assert "fetch_error" not in shown, shown
    assert shown["run_id"] == wrong["agent_run_ids"][0]
    # Our JSON values arrive as JSON text, which the CLI's renderer slices.
    assert json.loads(shown["output"]) == {"sum": 4}
    assert json.loads(shown["input"]) == {"a": 2, "b": 2}
    assert shown["traces"], shown
    tool = next(t for t in shown["traces"] if t["name"] and "add" in t["metadata_json"])
    assert isinstance(json.loads(tool["metadata_json"]), dict)
    # The CLI drops log spans itself, by their type: ours carry one.
    raw = cli_client.get(f"/projects/{PID}/runs/{wrong['agent_run_ids'][0]}").json()
    assert "log" in {t["type"] for t in raw["traces"]}
    assert len(shown["traces"]) == len([t for t in raw["traces"] if t["type"] != "log"])
    # A flaky case that failed one of three: only that run is a failed one to fetch.
    flaky = by_name["two_of_three_at_67_percent"]
    assert connic_cli._fetch_failed_run_details(cli_client, PID, flaky)["total_failed"] == 1


def test_a_gate_that_could_not_judge_is_error_with_its_reason(
    client: TestClient, worker: Worker, tmp_path: Path
) -> None:
    run_id = started(client, bundle_of(unknown_agent_project(tmp_path / "p")))
    worker.run_once()
    run = client.get(f"/v1/projects/{PID}/test-runs/{run_id}").json()
    assert (run["status"], run["phase"]) == ("error", "validating")
    assert "tests/ghost.yaml" in run["error"] and "'ghost'" in run["error"]


def test_a_cancelled_gate_is_a_cancelled_run(client: TestClient, passing: bytes) -> None:
    run_id = started(client, passing)
    assert client.post(f"/v1/gates/{run_id}/cancel").status_code == 200
    run = client.get(f"/v1/projects/{PID}/test-runs/{run_id}").json()
    assert (run["status"], run["phase"]) == ("cancelled", "done")


def test_the_filter_is_honoured(client: TestClient, worker: Worker, failing: bytes) -> None:
    run_id = started(client, failing, test_filter="adds")
    worker.run_once()
    run = client.get(f"/v1/projects/{PID}/test-runs/{run_id}").json()
    assert run["status"] == "passed"  # the failing cases were not selected
    assert sorted(c["test_name"] for c in run["cases"]) == ["adds_then_doubles", "adds_two_numbers"]
    assert client.get(f"/v1/gates/{run_id}").json()["filter"] == "adds"


def test_a_submission_is_audited_and_idempotent_like_a_gate(
    client: TestClient, passing: bytes
) -> None:
    headers = {"Idempotency-Key": "release-7"}
    url = f"/v1/projects/{PID}/test-runs"
    first = client.post(url, json=body(passing), headers=headers)
    again = client.post(url, json=body(passing), headers=headers)
    assert (first.status_code, again.status_code) == (202, 200)
    assert first.json()["id"] == again.json()["id"]
    audit = client.get("/v1/audit", params={"action": "gate.submitted"}).json()["items"]
    assert [e["detail"]["gate"] for e in audit] == [first.json()["id"]]
    error_of(client.post(url, json=body(passing), headers={"Idempotency-Key": " "}), 400)


def test_other_project_names_and_other_projects_ids_are_404(
    client: TestClient, worker: Worker, failing: bytes
) -> None:
    beta = as_token(client, project_token(client, "beta", ["submit", "read"]))
    run_id = started(client, failing)
    worker.run_once()
    case = client.get(f"/v1/projects/{PID}/test-runs/{run_id}").json()["cases"][0]
    agent_run = case["agent_run_ids"][0]
    # Beta under its own name: default's ids are not found, as on /v1/gates.
    for path in (f"/v1/projects/beta/test-runs/{run_id}", f"/v1/projects/beta/runs/{agent_run}"):
        assert "no " in error_of(beta.get(path), 404)["detail"]
    assert error_of(beta.get(f"/v1/gates/{run_id}"), 404)["error"] == "NotFound"
    # Beta naming another project, existing or not: one and the same answer.
    answers = [
        error_of(beta.request(method, f"/v1/projects/{pid}{tail}"), 404)
        for pid in ("default", "nobody")
        for method, tail in (
            ("GET", "/environments"),
            ("GET", f"/test-runs/{run_id}"),
            ("GET", f"/runs/{agent_run}"),
            ("POST", "/test-runs"),
        )
    ]
    assert {a["detail"].replace("nobody", "default") for a in answers} == {
        "no project named 'default'"
    }
    # Default sees its own.
    assert client.get(f"/v1/projects/{PID}/runs/{agent_run}").status_code == 200


def test_tokens_and_scopes(client: TestClient, passing: bytes) -> None:
    anonymous = as_token(client, None)
    for method, tail in (("GET", "/environments"), ("POST", "/test-runs")):
        assert error_of(anonymous.request(method, f"/v1/projects/{PID}{tail}"), 401)
    reader = as_token(client, project_token(client, "gamma", ["read"]))
    submitter = as_token(client, project_token(client, "gamma", ["submit"]))
    assert "submit scope" in error_of(start(reader, passing, pid="gamma"), 403)["detail"]
    response = start(submitter, passing, pid="gamma")
    assert response.status_code == 202, response.text
    run_id = response.json()["id"]
    assert error_of(submitter.get(f"/v1/projects/gamma/test-runs/{run_id}"), 403)
    assert error_of(submitter.get("/v1/projects/gamma/environments"), 403)
    assert reader.get(f"/v1/projects/gamma/test-runs/{run_id}").json()["status"] == "running"


@pytest.mark.parametrize(
    ("raw", "said"),
    [
        (b'{"files_data": "not base64!", "environment_id": "default"}', "not valid base64"),
        (b'{"files_data": "QUJD=A==", "environment_id": "default"}', "not valid base64"),
        (b'{"files_data": "\xc3\xa9t\xc3\xa9", "environment_id": "default"}', "base64"),
        (b'["files_data"]', "Input should be an object"),
        (b'{"environment_id": "default"}', "body.files_data: Field required"),
        (b'{"files_data": ""}', "body.files_data"),
        (b'{"files_data": 12}', "body.files_data"),
        (b'{"files_data": "QUJD", ', "Invalid JSON"),
        (b'{"files_data": "QUJD", "environment_id": "prod"}', "unknown environment 'prod'"),
        (b'{"files_data": "QUJD", "test_filter": "a\\u0000b"}', "NUL"),
        (b'{"files_data": "QUJD", "test_filter": "\\ud800"}', "body"),
        (b"[" * 5000, "Invalid JSON"),
    ],
)
def test_a_malformed_body_is_400_which_the_cli_reports(
    cli_client: TestClient, raw: bytes, said: str
) -> None:
    url = f"/projects/{PID}/test-runs"
    answer = error_of(
        cli_client.post(url, content=raw, headers={"Content-Type": "application/json"}), 400
    )
    assert said in answer["detail"], answer
    assert "'input'" not in json.dumps(answer["problems"])  # no echo of the body


def test_the_cli_prints_a_400s_detail(cli_client: TestClient) -> None:
    with pytest.raises(connic_cli._TestRunSubmissionError) as refused:
        connic_cli._kickoff_test_run(cli_client, PID, "staging", b"x")
    assert str(refused.value).startswith("Test request rejected: unknown environment 'staging'")
    assert refused.value.exit_code == 1


def test_not_json_is_415(client: TestClient, passing: bytes) -> None:
    response = client.post(f"/v1/projects/{PID}/test-runs", files={"bundle": ("p.tgz", passing)})
    assert "application/json" in error_of(response, 415)["detail"]


def evil_archive() -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name in ("agents/a.yaml", "../escape.py"):
            info = tarfile.TarInfo(name)
            info.size = 2
            tar.addfile(info, io.BytesIO(b"x\n"))
    return buf.getvalue()


def test_the_archive_gets_the_gates_checks(client: TestClient) -> None:
    unsafe = error_of(start(client, evil_archive()), 422)
    assert unsafe["error"] == "UnsafeArchive" and ".." in unsafe["detail"]
    assert error_of(start(client, b"just some text"), 415)["error"] == "UnsupportedMediaType"
    assert client.get("/v1/gates").json()["total"] == 0


def small_limit_client(settings: Settings, limit: int) -> TestClient:
    app = create_app(settings.model_copy(update={"upload_limit_bytes": limit}))
    return TestClient(app, headers=bearer(ADMIN_TOKEN))


def test_a_bundle_over_the_upload_limit_is_413(settings: Settings, passing: bytes) -> None:
    limit = len(passing) - 1
    with small_limit_client(settings, limit) as c:
        # Within the body bound (its base64 is a third larger), but the archive is over.
        answer = error_of(start(c, passing), 413)
        assert f"upload limit is {limit} bytes" in answer["detail"]
        assert answer["problems"] == [{"limit_bytes": limit, "received_bytes": len(passing)}]
        with small_limit_client(settings, len(passing)) as fits:
            assert start(fits, passing).status_code == 202
            # Base64 is a third larger than the archive: a body past the multipart limit
            # (the upload limit + 64 KiB) but within this route's own bound is read.
            raw = json.dumps(body(passing)).encode()[:-1] + b" " * (70 * 1024) + b"}"
            assert len(raw) > len(passing) + 64 * 1024
            response = fits.post(
                f"/v1/projects/{PID}/test-runs",
                content=raw,
                headers={"Content-Type": "application/json"},
            )
            assert response.status_code == 202, response.text


def test_a_body_declared_over_the_bound_is_413_unread(settings: Settings) -> None:
    limit = 3000  # the bound: 4 * 1000 + the 128 KiB JSON envelope
    with small_limit_client(settings, limit) as c:
        raw = json.dumps(body(b"\x00" * (200 * 1024))).encode()
        answer = error_of(
            c.post(
                f"/v1/projects/{PID}/test-runs",
                content=raw,
                headers={"Content-Type": "application/json"},
            ),
            413,
        )
        assert f"declares {len(raw)} bytes" in answer["detail"]
        assert f"at most {4 * 1000 + 128 * 1024} bytes" in answer["detail"]


def test_a_chunked_body_over_the_bound_is_refused_while_streaming(
    live_server: tuple[str, int],
) -> None:
    """Real HTTP, no Content-Length: refused a little past base64 of 25 MiB, not at 200 MiB."""
    host, port = live_server
    mib = 1024 * 1024
    bound = 4 * (25 * mib // 3 + 1) + 128 * 1024
    sent, status, body = stream_upload(
        host,
        port,
        total_bytes=200 * mib,
        path=f"/v1/projects/{PID}/test-runs",
        content_type="application/json",
        first=b'{"files_data": "',
        fill=b"A",
    )
    assert status == 413, body[:300]
    assert bound <= sent < bound + 8 * mib, sent
    assert b"refused after" in body and b"PayloadTooLarge" in body


def test_only_the_submission_route_is_spared_the_multipart_size_check() -> None:
    assert bounds_its_own_body("POST", f"/v1/projects/{PID}/test-runs")
    assert bounds_its_own_body("POST", f"/behind/a/proxy/v1/projects/{PID}/test-runs")
    for method, path in (
        ("GET", f"/v1/projects/{PID}/test-runs"),
        ("POST", f"/v1/projects/{PID}/test-runs/x"),
        ("POST", "/v1/gates"),
        ("POST", f"/v1/projects/{PID}/tokens"),
    ):
        assert not bounds_its_own_body(method, path), (method, path)
