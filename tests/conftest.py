"""The tiers: each test is marked by what it needs, from the fixtures it uses.

- ``docker``: a real Docker engine (the ``docker_engine`` fixture, a module marked so, or the
  deploy tier under tests/deploy: the wheel in a fresh venv, `docker compose up`);
- ``postgres``: a real PostgreSQL server (any of the database fixtures);
- neither: the fast inner loop,
  ``python -m pytest -m "not docker and not postgres" -n 4 --dist worksteal``.
"""

from __future__ import annotations

import os
import sys

import pytest

# Every test process rewrites the asserts of some 400 modules; with PYTHONDONTWRITEBYTECODE
# set (as on this machine) it does so from source each time, about 5 s of CPU per xdist
# worker, a sixth of the fast loop. The rewritten bytecode goes to the __pycache__ folders
# git ignores, and only this test process is affected.
sys.dont_write_bytecode = False

# The deploy tier builds a stand-in `python:3.11-slim` (tests/deploy/standins.py) for compose.
# Under GATE_BASE_IMAGE_SOURCE=auto every later runner build here, in this run or the next,
# would find it and build FROM it instead of the debootstrap base: other runner digests, every
# test image built again, and tests whose base depends on whether the deploy tier ran before.
# The tests' own builds (and those of the `gate` processes they start) stay on one base;
# .ci/run builds its images the same way. A test about the source setting sets its own.
os.environ.setdefault("GATE_BASE_IMAGE_SOURCE", "debootstrap")

pytest_plugins = [
    "tests.fixtures.db",
    "tests.fixtures.docker",
    "tests.fixtures.fake_gateway",
    "tests.fixtures.fake_llm",
    "tests.fixtures.gateway",
    "tests.fixtures.live",
    "tests.fixtures.mcp_server",
]

POSTGRES_FIXTURES = {"pg_server_url", "empty_database_url", "database_url", "sessions"}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        fixtures = set(getattr(item, "fixturenames", ()))
        deploy = item.path.parent.name == "deploy"
        if ("docker_engine" in fixtures or deploy) and not item.get_closest_marker("docker"):
            item.add_marker(pytest.mark.docker)
        if fixtures & POSTGRES_FIXTURES and not item.get_closest_marker("postgres"):
            item.add_marker(pytest.mark.postgres)
