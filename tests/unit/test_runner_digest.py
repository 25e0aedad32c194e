"""The runner digest ends every test image's tag, so it must change with every build recipe."""

from __future__ import annotations

import pytest

from gate_service.resources import runner_image_dir
from gate_service.sandbox import docker_engine


def test_the_digest_changes_with_the_base_and_with_each_test_image_recipe(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    src = runner_image_dir()
    digest = docker_engine.runner_digest(src, "python:3.11-slim")
    assert docker_engine.runner_digest(src, "python:3.11-slim") == digest
    assert docker_engine.runner_digest(src, "other:1") != digest
    for recipe in ("TEST_DOCKERFILE", "TEST_DOCKERFILE_DEPS"):
        with monkeypatch.context() as m:
            m.setattr(docker_engine, recipe, getattr(docker_engine, recipe) + "# changed\n")
            assert docker_engine.runner_digest(src, "python:3.11-slim") != digest
