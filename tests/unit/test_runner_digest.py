"""The runner digest ends every test image's tag, so it must change with every build recipe."""

from __future__ import annotations

import pytest

from gate_service.resources import runner_image_dir
from gate_service.sandbox.docker import recipes


def test_the_digest_changes_with_the_base_and_with_each_test_image_recipe(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    src = runner_image_dir()
    digest = recipes.runner_digest(src, "python:3.11-slim")
    assert recipes.runner_digest(src, "python:3.11-slim") == digest
    assert recipes.runner_digest(src, "other:1") != digest
    with monkeypatch.context() as m:
        m.setattr(recipes, "TEST_DOCKERFILE_DEPS", recipes.TEST_DOCKERFILE_DEPS + "# changed\n")
        assert recipes.runner_digest(src, "python:3.11-slim") != digest
    committed = recipes.commit_changes
    with monkeypatch.context() as m:
        m.setattr(recipes, "commit_changes", lambda *a: [*committed(*a), "CMD []"])
        assert recipes.runner_digest(src, "python:3.11-slim") != digest
