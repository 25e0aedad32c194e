"""Project secrets: stored encrypted, listed by name only, passed to cases, redacted after.

The routes run against a real Postgres; the worker tests run the real runner in-process with
the container's environment applied (FakeSandbox.apply_env), so a tool that returns
`dict(os.environ)` really holds the secret.
"""

from __future__ import annotations

import stat
import threading
import uuid
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from cryptography.fernet import Fernet
from fastapi.testclient import TestClient
from pydantic import SecretStr
from sqlalchemy import select, text, update
from sqlalchemy.orm import Session, sessionmaker

from gate_service.config import Settings
from gate_service.db import session_scope
from gate_service.errors import SecretUnreadable
from gate_service.models import DEFAULT_PROJECT, Project, ProjectSecret
from gate_service.sandbox import RunResult
from gate_service.secrets.crypto import KEY_FILE, SecretBox, SecretsKeyInvalid
from gate_service.secrets.service import (
    MAX_PROJECT_CIPHERTEXT_BYTES,
    MAX_SECRETS_PER_PROJECT,
    project_secrets,
)
from gate_service.worker.handler import WorkerContext
from gate_service.worker.loop import Worker
from tests.fixtures.auth import as_token, project_token
from tests.fixtures.leaky import leaky_project
from tests.fixtures.projects import bundle_of
from tests.fixtures.sandbox import FakeSandbox

SECRET = "sk-project-secret-5f2b9c0e7a41"
WORKER_KEY = "sk-from-the-worker-env-93d1c7"
BASE = f"/v1/projects/{DEFAULT_PROJECT}/secrets"
ONE = uuid.UUID(int=1)


def test_put_replace_list_and_delete(client: TestClient) -> None:
    created = client.put(f"{BASE}/API_KEY", json={"value": SECRET})
    assert created.status_code == 201, created.text
    assert created.json()["name"] == "API_KEY" and created.json()["created"] is True
    replaced = client.put(f"{BASE}/API_KEY", json={"value": SECRET + "-2"})
    assert replaced.status_code == 200 and replaced.json()["created"] is False
    assert client.put(f"{BASE}/OTHER_ONE", json={"value": "x"}).status_code == 201
    listed = client.get(BASE)
    assert listed.status_code == 200
    assert [s["name"] for s in listed.json()["items"]] == ["API_KEY", "OTHER_ONE"]
    assert set(listed.json()["items"][0]) == {"name", "updated_at"}
    for answer in (created, replaced, listed):
        assert SECRET not in answer.text
    assert client.delete(f"{BASE}/API_KEY").status_code == 204
    assert [s["name"] for s in client.get(BASE).json()["items"]] == ["OTHER_ONE"]
    again = client.delete(f"{BASE}/API_KEY")
    assert again.status_code == 404 and again.json()["error"] == "NotFound"


def test_another_projects_secrets_are_404_and_scopes_hold(client: TestClient) -> None:
    alpha = as_token(client, project_token(client, "alpha", ["admin"]))
    project_token(client, "beta", ["admin"])
    reader = as_token(client, project_token(client, "alpha", ["submit", "read"]))
    assert alpha.put("/v1/projects/alpha/secrets/K_1", json={"value": SECRET}).status_code == 201
    # The default project's admin administers every project; it put this one in beta.
    assert client.put("/v1/projects/beta/secrets/K_1", json={"value": SECRET}).status_code == 201
    for method, path in [
        ("PUT", "/v1/projects/beta/secrets/K_1"),
        ("GET", "/v1/projects/beta/secrets"),
        ("DELETE", "/v1/projects/beta/secrets/K_1"),
        ("GET", "/v1/projects/nowhere/secrets"),
        ("GET", f"/v1/projects/{DEFAULT_PROJECT}/secrets"),
    ]:
        r = alpha.request(method, path, json={"value": "v"} if method == "PUT" else None)
        assert r.status_code == 404, (method, path, r.text)
    assert reader.get("/v1/projects/alpha/secrets").status_code == 403
    assert reader.put("/v1/projects/alpha/secrets/K_2", json={"value": "v"}).status_code == 403
    assert as_token(client, None).get("/v1/projects/alpha/secrets").status_code == 401
    # beta's secret is still there, untouched by alpha's attempts.
    assert [s["name"] for s in client.get("/v1/projects/beta/secrets").json()["items"]] == ["K_1"]


@pytest.mark.parametrize(
    "name", ["lower", "1ABC", "A-B", "A" * 129, "GATE_TOKEN", "GATE_", "ÄPFEL", "A%20B"]
)
def test_a_name_that_is_not_an_environment_variable_or_is_the_gates_is_refused(
    client: TestClient, name: str
) -> None:
    r = client.put(f"{BASE}/{name}", json={"value": SECRET})
    assert r.status_code == 400, r.text
    assert r.json()["error"] == "BadRequest"
    assert SECRET not in r.text
    assert client.delete(f"{BASE}/{name}").status_code == 400
    assert client.get(BASE).json()["items"] == []


@pytest.mark.parametrize(
    ("name", "rule"),
    [
        ("LD_PRELOAD", "names starting with LD_ are refused: the dynamic loader's variables"),
        ("LD_LIBRARY_PATH", "names starting with LD_ are refused"),
        ("MALLOC_CHECK_", "names starting with MALLOC_ are refused: glibc's allocator"),
        ("PYTHONPATH", "names starting with PYTHON are refused: the Python interpreter's"),
        ("GCONV_PATH", "GCONV_PATH is refused: glibc acts on it"),
        ("GLIBC_TUNABLES", "GLIBC_TUNABLES is refused: glibc acts on it"),
        ("HOSTALIASES", "secure-execution list"),
        ("LOCPATH", "secure-execution list"),
        ("NLSPATH", "secure-execution list"),
        ("TZDIR", "secure-execution list"),
        ("RES_OPTIONS", "secure-execution list"),
    ],
)
def test_a_name_the_loader_libc_or_python_act_on_is_refused_naming_the_rule(
    client: TestClient, name: str, rule: str
) -> None:
    r = client.put(f"{BASE}/{name}", json={"value": "/bundle/tests/files/preload.so"})
    assert r.status_code == 400, r.text
    assert r.json()["error"] == "BadRequest"
    assert f"secret name {name!r} is refused: " in r.json()["detail"]
    assert rule in r.json()["detail"]
    assert client.get(BASE).json()["items"] == []


def test_a_row_stored_under_a_name_refused_since_can_still_be_deleted(
    client: TestClient, sessions: sessionmaker[Session]
) -> None:
    with session_scope(sessions) as session:
        project = session.scalars(select(Project).where(Project.name == DEFAULT_PROJECT)).one()
        session.add(
            ProjectSecret(
                id=uuid.uuid4(), project_id=project.id, name="LD_PRELOAD", ciphertext=b"old"
            )
        )
    assert [s["name"] for s in client.get(BASE).json()["items"]] == ["LD_PRELOAD"]
    assert client.delete(f"{BASE}/LD_PRELOAD").status_code == 204
    assert client.get(BASE).json()["items"] == []


@pytest.mark.parametrize(
    "body",
    [
        '{"value": "abc\\u0000def"}',
        '{"value": "\\ud800 lone surrogate"}',
        '{"value": "' + "a" * (64 * 1024 + 1) + '"}',
        '{"value": 12345}',
        "{}",
        '{"value": "v", "extra": 1}',
        "not json",
    ],
)
def test_a_value_that_cannot_be_an_environment_variable_is_a_422(
    client: TestClient, body: str
) -> None:
    r = client.put(
        f"{BASE}/API_KEY", content=body.encode(), headers={"Content-Type": "application/json"}
    )
    assert r.status_code == 422, r.text
    assert r.json()["error"] == "RequestInvalid"
    assert "abc\\u0000def" not in r.text and "a" * 100 not in r.text


def test_a_project_may_not_hold_more_than_its_environment_can_take(client: TestClient) -> None:
    value = "v" * (60 * 1024)
    stored = 0
    while True:
        r = client.put(f"{BASE}/K_{stored}", json={"value": value})
        if r.status_code != 201:
            break
        stored += 1
    assert r.status_code == 409, r.text
    assert str(MAX_PROJECT_CIPHERTEXT_BYTES) in r.json()["detail"]
    assert 10 <= stored < 20
    # Replacing one within the limit still works.
    assert client.put(f"{BASE}/K_0", json={"value": "short"}).status_code == 200


def test_a_project_holds_at_most_the_cap_of_secrets_at_once(client: TestClient) -> None:
    def put_many(names: list[str]) -> list[int]:
        with ThreadPoolExecutor(max_workers=8) as pool:
            return list(
                pool.map(
                    lambda n: client.put(f"{BASE}/{n}", json={"value": "v"}).status_code, names
                )
            )

    # Two rounds racing for the last places: the cap is exact (the project row is locked).
    codes = put_many([f"K_{i}" for i in range(MAX_SECRETS_PER_PROJECT + 10)])
    assert codes.count(201) == MAX_SECRETS_PER_PROJECT and codes.count(409) == 10
    refused = client.put(f"{BASE}/ONE_MORE", json={"value": "v"})
    assert refused.status_code == 409
    assert f"the limit is {MAX_SECRETS_PER_PROJECT} per project" in refused.json()["detail"]
    assert len(client.get(BASE).json()["items"]) == MAX_SECRETS_PER_PROJECT
    # Replacing one is not a new one; after a delete there is room again.
    assert client.put(f"{BASE}/K_0", json={"value": "w"}).status_code == 200
    assert client.delete(f"{BASE}/K_1").status_code == 204
    assert client.put(f"{BASE}/ONE_MORE", json={"value": "v"}).status_code == 201


def test_changes_are_audited_by_name_never_by_value(client: TestClient) -> None:
    client.put(f"{BASE}/API_KEY", json={"value": SECRET})
    client.put(f"{BASE}/API_KEY", json={"value": SECRET})
    client.delete(f"{BASE}/API_KEY")
    audit = client.get("/v1/audit")
    assert SECRET not in audit.text
    events = [e for e in audit.json()["items"] if e["action"].startswith("secret.")]
    assert [(e["action"], e["detail"]) for e in reversed(events)] == [
        ("secret.put", {"project": "default", "name": "API_KEY", "created": True}),
        ("secret.put", {"project": "default", "name": "API_KEY", "created": False}),
        ("secret.deleted", {"project": "default", "name": "API_KEY"}),
    ]
    assert all(e["token_id"] for e in events)


def test_the_stored_ciphertext_is_fernet_under_the_settings_key(
    client: TestClient, settings: Settings, sessions: sessionmaker[Session]
) -> None:
    assert client.put(f"{BASE}/API_KEY", json={"value": SECRET}).status_code == 201
    key_file = settings.data_dir / KEY_FILE
    # No GATE_SECRETS_KEY in these settings: the first start made one, readable by us only.
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    with sessions() as s:
        raw = s.execute(text("SELECT ciphertext FROM project_secrets")).scalar_one()
        project = s.scalars(select(Project).where(Project.name == DEFAULT_PROJECT)).one()
        assert SECRET.encode() not in raw
        assert SECRET in Fernet(key_file.read_bytes().strip()).decrypt(raw).decode()
        box = SecretBox.from_settings(settings)
        assert project_secrets(s, box, project.id) == {"API_KEY": SECRET}
        other = SecretBox(Fernet.generate_key())
        with pytest.raises(SecretUnreadable) as caught:
            project_secrets(s, other, project.id)
    assert str(caught.value) == (
        "cannot decrypt secret API_KEY of project default: GATE_SECRETS_KEY differs from the "
        "one it was stored with"
    )


def test_a_ciphertext_moved_to_another_project_does_not_decrypt_there(
    client: TestClient, settings: Settings, sessions: sessionmaker[Session]
) -> None:
    project_token(client, "alpha", ["admin"])
    client.put(f"{BASE}/API_KEY", json={"value": SECRET})
    client.put("/v1/projects/alpha/secrets/API_KEY", json={"value": "alpha's own value"})
    with session_scope(sessions) as s:
        alpha = s.scalars(select(Project).where(Project.name == "alpha")).one()
        stolen = s.scalars(
            select(ProjectSecret.ciphertext).where(ProjectSecret.project_id != alpha.id)
        ).one()
        s.execute(
            update(ProjectSecret)
            .where(ProjectSecret.project_id == alpha.id)
            .values(ciphertext=stolen)
        )
    with sessions() as s, pytest.raises(SecretUnreadable, match="stored for another project"):
        project_secrets(s, SecretBox.from_settings(settings), alpha.id)


def test_the_key_comes_from_the_setting_when_set(tmp_path: Path) -> None:
    key = Fernet.generate_key().decode()
    settings = Settings(data_dir=tmp_path, secrets_key=key)
    box = SecretBox.from_settings(settings)
    assert not (tmp_path / KEY_FILE).exists()
    token = box.encrypt(ONE, "K", "value")
    assert Fernet(key).decrypt(token)
    with pytest.raises(SecretsKeyInvalid, match="GATE_SECRETS_KEY does not hold a Fernet key"):
        SecretBox.from_settings(Settings(data_dir=tmp_path, secrets_key="not-a-key"))
    # Made once, then reused: a second process with the same data dir gets the same key.
    first = SecretBox.from_settings(Settings(data_dir=tmp_path / "d"))
    second = SecretBox.from_settings(Settings(data_dir=tmp_path / "d"))
    sealed = first.encrypt(ONE, "K", "value")
    assert second.decrypt(ONE, "p", "K", sealed) == "value"


def leaky_worker(
    settings: Settings, sessions: sessionmaker[Session], sandbox: FakeSandbox, **update: object
) -> Worker:
    sandbox.apply_env = True
    ctx = WorkerContext(
        settings=settings.model_copy(update=update), sessions=sessions, sandbox=sandbox,
        stop=threading.Event(),
    )  # fmt: skip
    return Worker(ctx, name="leaky-worker")


def test_a_secret_reaches_the_case_and_no_answer_or_row_holds_it(
    client: TestClient,
    settings: Settings,
    sessions: sessionmaker[Session],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", WORKER_KEY)
    assert client.put(f"{BASE}/API_KEY", json={"value": SECRET}).status_code == 201
    sandbox = FakeSandbox()
    worker = leaky_worker(settings, sessions, sandbox, case_env="OPENAI_API_KEY")
    r = client.post("/v1/gates", files={"bundle": ("b.tgz", bundle_of(leaky_project(tmp_path)))})
    assert r.status_code == 202, r.text
    assert worker.run_once()
    # The secret did reach every case container, by name, beside GATE_CASE_ENV's variable.
    assert sandbox.envs and all(
        e["API_KEY"] == SECRET and e["OPENAI_API_KEY"] == WORKER_KEY for e in sandbox.envs
    )

    gate = client.get(f"/v1/gates/{r.json()['id']}")
    answers = [gate, client.get("/v1/gates"), client.get("/v1/audit"), client.get(BASE)]
    runs = [
        client.get(f"/v1/runs/{run_id}")
        for case in gate.json()["cases"]
        for run_id in case["agent_run_ids"]
    ]
    assert len(runs) == 3 and all(run.status_code == 200 for run in runs)
    for answer in answers + runs:
        assert SECRET not in answer.text and WORKER_KEY not in answer.text, answer.url

    by_name = {c["test_name"]: c for c in gate.json()["cases"]}
    assert by_name["returns_the_environment"]["status"] == "passed"
    assert by_name["compares_against_the_secret"]["status"] == "failed"
    assert "[REDACTED:API_KEY]" in by_name["compares_against_the_secret"]["failure_reason"]
    assert "[REDACTED:API_KEY]" in by_name["raises_with_the_secret"]["failure_reason"]
    returned = next(
        run.json() for run in runs if run.json()["output"] and "HOME" in run.json()["output"]
    )
    assert returned["output"]["API_KEY"] == "[REDACTED:API_KEY]"
    assert returned["output"]["OPENAI_API_KEY"] == "[REDACTED:OPENAI_API_KEY]"
    logs = [s for s in returned["traces"] if "[REDACTED:API_KEY]" in str(s["metadata"])]
    assert logs, returned["traces"]  # the printed secret, as a log span, redacted
    crashed = next(run.json() for run in runs if run.json()["error"])
    assert "the secret is [REDACTED:API_KEY]" in crashed["error"]

    # Nothing stored for the gate holds it either.
    with sessions() as s:
        for table in ("gates", "cases", "runs", "jobs", "audit_events"):
            dump = s.execute(text(f"SELECT coalesce(json_agg(t)::text, '') FROM {table} t"))
            stored = dump.scalar_one()
            assert SECRET not in stored and WORKER_KEY not in stored, table


def test_a_worker_with_another_key_ends_the_gate_error_saying_why(
    client: TestClient, settings: Settings, sessions: sessionmaker[Session], tmp_path: Path
) -> None:
    assert client.put(f"{BASE}/API_KEY", json={"value": SECRET}).status_code == 201
    sandbox = FakeSandbox()
    worker = leaky_worker(
        settings, sessions, sandbox, secrets_key=SecretStr(Fernet.generate_key().decode())
    )
    r = client.post("/v1/gates", files={"bundle": ("b.tgz", bundle_of(leaky_project(tmp_path)))})
    for _ in range(settings.job_max_attempts):
        assert worker.run_once()
    gate = client.get(f"/v1/gates/{r.json()['id']}")
    assert gate.status_code == 200
    assert gate.json()["status"] == "error"
    # (Infrastructure reasons may end with a reference to the worker log.)
    assert gate.json()["failure_reason"].startswith(
        f"infrastructure error after {settings.job_max_attempts} attempt(s): cannot decrypt "
        "secret API_KEY of project default: GATE_SECRETS_KEY differs from the one it was "
        "stored with"
    )
    assert sandbox.envs == []  # no case container started without its secrets
    # None ran, and none is left queued or running in a gate that has ended.
    assert all(c["status"] == "cancelled" for c in gate.json()["cases"])
    assert all(
        c["failure_reason"].startswith("not judged: infrastructure error after")
        for c in gate.json()["cases"]
    )


class ChangingSecretSandbox(FakeSandbox):
    """Replaces the project's API_KEY through the API while the gate's first case runs."""

    def __init__(self, client: TestClient) -> None:
        super().__init__()
        self.client = client
        self.changed = False

    def run(self, image: str, argv: Sequence[str], **kw: Any) -> RunResult:
        if not self.changed:
            self.changed = True
            put = self.client.put(f"{BASE}/API_KEY", json={"value": SECRET + "-rotated"})
            assert put.status_code == 200, put.text
        return super().run(image, argv, **kw)


def test_a_gate_sees_one_state_of_its_projects_secrets_and_the_next_gate_the_new_one(
    client: TestClient, settings: Settings, sessions: sessionmaker[Session], tmp_path: Path
) -> None:
    """Read once as a gate's cases begin (worker/handler.py, _CaseInputs): a secret replaced
    while the gate runs reaches none of its cases, and every case of the next gate."""
    assert client.put(f"{BASE}/API_KEY", json={"value": SECRET}).status_code == 201
    sandbox = ChangingSecretSandbox(client)
    worker = leaky_worker(settings, sessions, sandbox, case_concurrency=1)
    bundle = bundle_of(leaky_project(tmp_path))
    assert client.post("/v1/gates", files={"bundle": ("b.tgz", bundle)}).status_code == 202
    assert worker.run_once()
    assert sandbox.changed and len(sandbox.envs) == 3
    assert [e["API_KEY"] for e in sandbox.envs] == [SECRET] * 3
    assert client.post("/v1/gates", files={"bundle": ("b.tgz", bundle)}).status_code == 202
    assert worker.run_once()
    assert [e["API_KEY"] for e in sandbox.envs[3:]] == [SECRET + "-rotated"] * 3
