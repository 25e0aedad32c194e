"""Every stage of a test image's Dockerfile is labelled from its first step, and a committed
one-stage image with its own labels, with our text only."""

from __future__ import annotations

from pathlib import Path

import pytest

from gate_service import sandbox as port
from gate_service.sandbox import LABEL
from gate_service.sandbox.docker.recipes import build_labels, commit_changes, deps_dockerfile

SPEC = port.TestImageSpec(
    tag="gate-test:abc-123", context_dir=Path("/x"), labels={"gate.bundle": "abc"}
)
LINE = (
    'LABEL "gate.build"="b1" "gate.bundle"="abc" "gate.image"="gate-test:abc-123" '
    '"gate.managed"="build"'
)


def test_each_stage_starts_with_the_builds_labels() -> None:
    lines = deps_dockerfile("gate-runner:r", ("numpy==2.0",), build_labels(SPEC, "b1")).splitlines()
    starts = [i for i, line in enumerate(lines) if line.startswith("FROM ")]
    assert len(starts) == 2
    assert all(lines[i + 1] == LINE for i in starts)


def test_a_bundle_without_requirements_has_no_dockerfile() -> None:
    with pytest.raises(ValueError, match="not built from a Dockerfile"):
        deps_dockerfile("gate-runner:r", (), build_labels(SPEC, "b1"))


def test_a_committed_image_gets_the_runners_user_and_entrypoint_and_its_labels() -> None:
    changes = commit_changes(["/py", "-m", "gate_runner"], {LABEL: "test", "gate.bundle": "abc"})
    assert changes == [
        "USER 10001:10001",
        'ENTRYPOINT ["/py", "-m", "gate_runner"]',
        'LABEL "gate.bundle"="abc" "gate.managed"="test"',
    ]


@pytest.mark.parametrize("value", ['a"b', "a b", "$HOME", "a\nRUN x", ""])
def test_a_label_the_dockerfile_parser_could_misread_is_refused(value: str) -> None:
    with pytest.raises(ValueError, match="a build label must match"):
        deps_dockerfile("gate-runner:r", ("x==1",), {LABEL: value})
    with pytest.raises(ValueError, match="a build label must match"):
        commit_changes(["/py"], {LABEL: value})
