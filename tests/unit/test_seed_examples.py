"""The seed documents' examples, run in-process by the runner, with their expected verdicts."""

from pathlib import Path

import pytest
import yaml

from tests.fixtures.runner import judged
from tests.fixtures.seed_bundle import EXPECTED, seed_bundle


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return seed_bundle(tmp_path_factory.mktemp("seed") / "p")


def cases(project: Path) -> dict[str, str]:
    found = {}
    for suite in sorted((project / "tests").glob("*.yaml")):
        for case in yaml.safe_load(suite.read_text())["tests"]:
            found[case["name"]] = suite.relative_to(project).as_posix()
    return found


def test_every_example_is_covered(project: Path) -> None:
    assert set(cases(project)) == set(EXPECTED)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_seed_example_verdict(project: Path, name: str) -> None:
    result = judged(project, cases(project)[name], name)
    passes, fragment = EXPECTED[name]
    assert result.passed is passes, result.failure_reason
    if fragment:
        assert fragment in (result.failure_reason or "")
