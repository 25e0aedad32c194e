"""Every stage of a test image's Dockerfile is labelled from its first step, with our text only."""

from __future__ import annotations

from pathlib import Path

import pytest

from gate_service import sandbox as port
from gate_service.sandbox import LABEL
from gate_service.sandbox.docker.recipes import build_labels, bundle_dockerfile

SPEC = port.TestImageSpec(
    tag="gate-test:abc-123", context_dir=Path("/x"), labels={"gate.bundle": "abc"}
)
LINE = (
    'LABEL "gate.build"="b1" "gate.bundle"="abc" "gate.image"="gate-test:abc-123" '
    '"gate.managed"="build"'
)


@pytest.mark.parametrize("requirements", [(), ("numpy==2.0",)])
def test_each_stage_starts_with_the_builds_labels(requirements: tuple[str, ...]) -> None:
    lines = bundle_dockerfile("gate-runner:r", requirements, build_labels(SPEC, "b1")).splitlines()
    starts = [i for i, line in enumerate(lines) if line.startswith("FROM ")]
    assert len(starts) == (2 if requirements else 1)
    assert all(lines[i + 1] == LINE for i in starts)


@pytest.mark.parametrize("value", ['a"b', "a b", "$HOME", "a\nRUN x", ""])
def test_a_label_the_dockerfile_parser_could_misread_is_refused(value: str) -> None:
    with pytest.raises(ValueError, match="a build label must match"):
        bundle_dockerfile("gate-runner:r", (), {LABEL: value})
