from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session, sessionmaker

from gate_service.config import Settings
from gate_service.db import make_engine, make_sessionmaker
from gate_service.main import create_app


@pytest.fixture
def settings(database_url: str, tmp_path: Path) -> Settings:
    return Settings(
        database_url=database_url,
        data_dir=tmp_path / "data",
        job_max_attempts=2,
        case_concurrency=2,
    )


@pytest.fixture
def client(settings: Settings) -> Iterator[TestClient]:
    with TestClient(create_app(settings)) as c:
        yield c


@pytest.fixture
def sessions(database_url: str) -> Iterator[sessionmaker[Session]]:
    engine = make_engine(database_url)
    try:
        yield make_sessionmaker(engine)
    finally:
        engine.dispose()
