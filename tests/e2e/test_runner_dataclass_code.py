"""The runner image carries its dataclass code compiled at build (gate_runner/dataclass_code.py),
and every dataclass text of the runner's run-case path is found in it, in the image's own
Python: a case container compiles none of them."""

from __future__ import annotations

import subprocess

import pytest

from gate_service.config import Settings
from gate_service.sandbox import open_sandbox
from tests.fixtures.dataclass_probe import parse, probe
from tests.fixtures.docker import docker_engine

__all__ = ["docker_engine"]  # the fixture, used by name below
pytestmark = pytest.mark.docker


def test_the_runner_image_compiles_none_of_its_dataclasses_per_case(
    docker_engine: None, tmp_path_factory: pytest.TempPathFactory
) -> None:
    sandbox = open_sandbox(Settings(data_dir=tmp_path_factory.mktemp("dataclass-code")))
    try:
        image = sandbox.runner_image()
    finally:
        sandbox.close()
    done = subprocess.run(
        ["docker", "run", "--rm", "--network", "none", "--entrypoint", "/opt/gate-runner/bin/python",
         image, "-I", "-c", probe()],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    stored, missed = parse(done.stdout)
    assert stored > 50 and missed == 0
