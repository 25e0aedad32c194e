"""Routes are built when the app is made, not by the first requests racing each other.

FastAPI builds a route's parameter models on first use inside `warnings.catch_warnings()`,
which swaps a process-wide list and is not thread-safe; concurrent first requests then fail
in pydantic's schema build. create_app builds every route up front, under one lock.
"""

import warnings
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from fastapi.testclient import TestClient

from gate_service.config import Settings
from gate_service.main import create_app


def test_no_route_is_built_on_a_request(monkeypatch: pytest.MonkeyPatch) -> None:
    app = create_app(
        Settings(database_url="postgresql://nobody@127.0.0.1:9/none", trusted_hosts="testserver")
    )
    built_late: list[str] = []

    @contextmanager
    def refusing(*args: object, **kwargs: object) -> Iterator[None]:
        built_late.append("catch_warnings entered during a request")
        yield

    monkeypatch.setattr(warnings, "catch_warnings", refusing)
    client = TestClient(app, raise_server_exceptions=False)  # no lifespan: no database needed
    assert client.get("/healthz").status_code == 200
    assert client.get("/v1/no-such-route").status_code == 404
    assert built_late == []
