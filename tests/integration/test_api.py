"""The REST contract against a real Postgres (no worker: gates stay queued)."""

import hashlib
import io
import os
import threading
import zipfile
from pathlib import Path

from fastapi.testclient import TestClient
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from gate_service.config import Settings
from gate_service.gates import lifecycle
from gate_service.main import create_app
from gate_service.models import BUNDLE_CHUNK_BYTES, Bundle, BundleChunk, Gate, Job
from tests.fixtures.auth import ADMIN_TOKEN, bearer
from tests.fixtures.projects import bundle_of, calculator_project


def counts(sessions: sessionmaker[Session]) -> tuple[int, int, int]:
    with sessions() as s:
        return (
            s.scalar(select(func.count()).select_from(Bundle)) or 0,
            s.scalar(select(func.count()).select_from(Gate)) or 0,
            s.scalar(select(func.count()).select_from(Job)) or 0,
        )


def test_post_queues_gate_and_job_and_answers_location(
    client: TestClient, sessions: sessionmaker[Session], tmp_path: Path
) -> None:
    data = bundle_of(calculator_project(tmp_path / "p", failing=False))
    response = client.post(
        "/v1/gates",
        files={"bundle": ("p.tar.gz", data)},
        data={"labels": '{"commit": "abc123"}', "filter": "adds"},
    )
    assert response.status_code == 202, response.text
    gate = response.json()
    assert response.headers["Location"] == f"/v1/gates/{gate['id']}"
    assert (gate["status"], gate["phase"]) == ("queued", "queued")
    assert gate["labels"] == {"commit": "abc123"}
    assert gate["filter"] == "adds"
    assert gate["bundle"]["size_bytes"] == len(data)
    assert gate["bundle"]["code_bytes"] > 0
    assert counts(sessions) == (1, 1, 1)
    fetched = client.get(response.headers["Location"])
    assert fetched.status_code == 200
    assert fetched.json()["id"] == gate["id"]


def test_same_bundle_is_stored_once(
    client: TestClient, sessions: sessionmaker[Session], tmp_path: Path
) -> None:
    data = bundle_of(calculator_project(tmp_path / "p", failing=False))
    for _ in range(3):
        assert client.post("/v1/gates", files={"bundle": ("p.tgz", data)}).status_code == 202
    assert counts(sessions) == (1, 3, 3)


def test_a_bundle_is_stored_in_chunks_and_read_back_whole(
    client: TestClient, sessions: sessionmaker[Session], tmp_path: Path
) -> None:
    root = calculator_project(tmp_path / "p", failing=False)
    (root / "tests/files").mkdir(parents=True, exist_ok=True)
    # Incompressible, so the archive spans three chunks.
    (root / "tests/files/noise.bin").write_bytes(os.urandom(BUNDLE_CHUNK_BYTES * 2 + 1000))
    data = bundle_of(root)
    assert len(data) > BUNDLE_CHUNK_BYTES * 2
    for _ in range(2):
        assert client.post("/v1/gates", files={"bundle": ("p.tgz", data)}).status_code == 202
    sha = hashlib.sha256(data).hexdigest()
    with sessions() as s:
        sizes = s.execute(
            select(func.length(BundleChunk.data))
            .where(BundleChunk.sha256 == sha)
            .order_by(BundleChunk.seq)
        ).scalars()
        assert list(sizes) == [
            BUNDLE_CHUNK_BYTES,
            BUNDLE_CHUNK_BYTES,
            len(data) % BUNDLE_CHUNK_BYTES,
        ]
        assert b"".join(lifecycle.read_bundle(s, sha)) == data


def test_zip_bundles_are_accepted(client: TestClient, tmp_path: Path) -> None:
    root = calculator_project(tmp_path / "p", failing=False)
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for path in sorted(root.rglob("*")):
            if path.is_file():
                zf.write(path, path.relative_to(root).as_posix())
    response = client.post("/v1/gates", files={"bundle": ("p.zip", buf.getvalue())})
    assert response.status_code == 202, response.text


def test_idempotency_key_returns_the_same_gate(
    client: TestClient, sessions: sessionmaker[Session], tmp_path: Path
) -> None:
    data = bundle_of(calculator_project(tmp_path / "p", failing=False))
    headers = {"Idempotency-Key": "build-42"}
    first = client.post("/v1/gates", files={"bundle": ("p.tgz", data)}, headers=headers)
    again = client.post("/v1/gates", files={"bundle": ("p.tgz", data)}, headers=headers)
    assert (first.status_code, again.status_code) == (202, 200)
    assert first.json()["id"] == again.json()["id"]
    assert counts(sessions) == (1, 1, 1)


def test_missing_bundle_field_is_a_4xx_saying_what_was_expected(
    client: TestClient, sessions: sessionmaker[Session]
) -> None:
    response = client.post("/v1/gates", files={"archive": ("p.tgz", b"x")}, data={"filter": "x"})
    assert response.status_code == 422
    body = response.json()
    assert body["error"] == "RequestInvalid"
    assert "file field named 'bundle'" in body["detail"]
    assert counts(sessions) == (0, 0, 0)


def test_wrong_content_type_is_415(client: TestClient, sessions: sessionmaker[Session]) -> None:
    response = client.post("/v1/gates", data={"filter": "x"})
    assert response.status_code == 415
    assert "multipart/form-data" in response.json()["detail"]
    assert counts(sessions) == (0, 0, 0)


def test_not_an_archive_is_refused_and_nothing_queued(
    client: TestClient, sessions: sessionmaker[Session]
) -> None:
    response = client.post("/v1/gates", files={"bundle": ("p.tar.gz", b"just some text")})
    assert response.status_code == 415
    body = response.json()
    assert body["error"] == "UnsupportedMediaType"
    assert ".tar.gz" in body["detail"] and "zip" in body["detail"]
    assert counts(sessions) == (0, 0, 0)


def test_empty_file_is_refused(client: TestClient, sessions: sessionmaker[Session]) -> None:
    response = client.post("/v1/gates", files={"bundle": ("p.tar.gz", b"")})
    assert response.status_code == 400
    assert "empty" in response.json()["detail"]
    assert counts(sessions) == (0, 0, 0)


def test_zip_slip_is_refused(client: TestClient, sessions: sessionmaker[Session]) -> None:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr("../../etc/evil.py", "x = 1")
    response = client.post("/v1/gates", files={"bundle": ("p.zip", buf.getvalue())})
    assert response.status_code == 422
    assert "'..'" in response.json()["detail"]
    assert counts(sessions) == (0, 0, 0)


def test_unknown_gate_is_404_in_the_error_shape(client: TestClient) -> None:
    response = client.get("/v1/gates/00000000-0000-0000-0000-000000000000")
    assert response.status_code == 404
    assert response.json() == {
        "error": "NotFound",
        "detail": "no gate with id 00000000-0000-0000-0000-000000000000",
        "problems": [],
    }


def test_etag_and_long_poll_answer_304_when_nothing_changed(
    client: TestClient, tmp_path: Path
) -> None:
    data = bundle_of(calculator_project(tmp_path / "p", failing=False))
    gate_id = client.post("/v1/gates", files={"bundle": ("p.tgz", data)}).json()["id"]
    first = client.get(f"/v1/gates/{gate_id}")
    etag = first.headers["ETag"]
    again = client.get(f"/v1/gates/{gate_id}", params={"wait": 1}, headers={"If-None-Match": etag})
    assert again.status_code == 304
    assert again.headers["ETag"] == etag


def test_cancel_a_queued_gate(client: TestClient, tmp_path: Path) -> None:
    data = bundle_of(calculator_project(tmp_path / "p", failing=False))
    gate_id = client.post("/v1/gates", files={"bundle": ("p.tgz", data)}).json()["id"]
    response = client.post(f"/v1/gates/{gate_id}/cancel")
    assert response.status_code == 200
    assert response.json()["status"] == "cancelled"
    assert client.post(f"/v1/gates/{gate_id}/cancel").status_code == 409


def test_list_filters_by_status_and_label(client: TestClient, tmp_path: Path) -> None:
    data = bundle_of(calculator_project(tmp_path / "p", failing=False))
    client.post(
        "/v1/gates", files={"bundle": ("p.tgz", data)}, data={"labels": '{"branch": "main"}'}
    )
    client.post(
        "/v1/gates", files={"bundle": ("p.tgz", data)}, data={"labels": '{"branch": "dev"}'}
    )
    listed = client.get("/v1/gates", params={"label": "branch=main"}).json()
    assert listed["total"] == 1
    assert listed["items"][0]["labels"] == {"branch": "main"}
    assert client.get("/v1/gates", params={"status": "queued"}).json()["total"] == 2
    assert client.get("/v1/gates", params={"status": "passed"}).json()["total"] == 0


def test_declared_oversize_body_is_refused_before_reading(client: TestClient) -> None:
    response = client.post(
        "/v1/gates",
        content=b"x",
        headers={
            "Content-Length": str(200 * 1024 * 1024),
            "Content-Type": "multipart/form-data; boundary=x",
        },
    )
    assert response.status_code == 413
    assert response.json()["error"] == "PayloadTooLarge"


def test_health_and_readiness(client: TestClient) -> None:
    assert client.get("/healthz").json() == {"status": "ok"}
    assert client.get("/readyz").json() == {"status": "ready"}


def test_readiness_waits_for_a_worker_that_can_claim(settings: Settings) -> None:
    """Under `gate serve` (issue 43) ready means a gate submitted now is claimed at once:
    503 while no embedded worker has started, then 200 with how many are up."""
    up = [0]
    with TestClient(create_app(settings, workers_up=lambda: up[0])) as client:
        refused = client.get("/readyz")
        assert refused.status_code == 503
        assert "no worker can claim a gate yet" in refused.json()["detail"]
        assert client.get("/healthz").status_code == 200  # the process is up all the same
        up[0] = 2
        assert client.get("/readyz").json() == {"status": "ready", "workers": 2}


def test_concurrent_requests_with_one_idempotency_key_get_one_gate(
    settings: Settings, sessions: sessionmaker[Session], tmp_path: Path
) -> None:
    data = bundle_of(calculator_project(tmp_path / "p", failing=False))
    answers: list[tuple[int, str]] = []

    def post() -> None:
        with TestClient(create_app(settings), headers=bearer(ADMIN_TOKEN)) as c:
            r = c.post(
                "/v1/gates", files={"bundle": ("p.tgz", data)}, headers={"Idempotency-Key": "race"}
            )
            answers.append((r.status_code, r.json().get("id", r.text)))

    threads = [threading.Thread(target=post) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(code for code, _ in answers) == [200] * 5 + [202]
    assert len({gate_id for _, gate_id in answers}) == 1
    assert counts(sessions) == (1, 1, 1)
