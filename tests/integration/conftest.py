from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session, sessionmaker

from gate_service.config import Settings
from gate_service.main import create_app
from gate_service.worker.loop import Worker
from tests.fixtures.auth import ADMIN_TOKEN, bearer
from tests.fixtures.sandbox import FakeSandbox, fake_wheels, fake_worker


@pytest.fixture
def settings(database_url: str, tmp_path: Path) -> Settings:
    return Settings(
        database_url=database_url,
        data_dir=tmp_path / "data",
        job_max_attempts=2,
        case_concurrency=2,
        bootstrap_token=ADMIN_TOKEN,
        # TestClient sends `Host: testserver`; the embedded default lists only loopback names.
        trusted_hosts="testserver",
    )


@pytest.fixture
def client(settings: Settings) -> Iterator[TestClient]:
    """A client holding the bootstrap admin token of project `default`."""
    with TestClient(create_app(settings), headers=bearer(ADMIN_TOKEN)) as c:
        yield c


@pytest.fixture
def sandbox() -> FakeSandbox:
    """A fake engine that runs the real runner in-process (for worker logic)."""
    return FakeSandbox()


@pytest.fixture
def worker(
    settings: Settings,
    sessions: sessionmaker[Session],
    sandbox: FakeSandbox,
    monkeypatch: pytest.MonkeyPatch,
) -> Worker:
    fake_wheels(monkeypatch, sandbox)
    return fake_worker(settings, sessions, sandbox)
