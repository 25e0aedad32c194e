"""Garbage collection against the real engine, in a namespace of this test's own.

Tiny images (FROM scratch, one file) are tagged under repositories named for this run only
(``gate-test-gc-<random>``, ``gate-runner-gc-<random>``), and the GC's policy names those,
so nothing another test, helper or CI run keeps on the shared engine is ever looked at.
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker
import pytest
from sqlalchemy.orm import Session, sessionmaker

from gate_service import sandbox as port
from gate_service.config import Settings
from gate_service.models import GateStatus
from gate_service.sandbox import BUILD_ID_LABEL, BUILD_IMAGE_LABEL, BUILD_STAGE, LABEL
from gate_service.sandbox.docker import DockerSandbox
from gate_service.worker.gc import GcPolicy, collect_images
from tests.fixtures.docker import reuse_a_runner
from tests.fixtures.gates import add_gate
from tests.fixtures.projects import make_wheel

pytestmark = pytest.mark.docker

FILE_BYTES = 64 * 1024


class Namespace:
    """Builds tiny images under this run's own repository names; removes them all after."""

    def __init__(self, tmp_path: Path) -> None:
        run = uuid.uuid4().hex[:10]
        self.tests = f"gate-test-gc-{run}"
        self.runners = f"gate-runner-gc-{run}"
        self.client = docker.from_env(timeout=120)
        self.tmp_path = tmp_path
        self.containers: list[str] = []

    def build(self, tag: str | None, labels: dict[str, str]) -> str:
        """A tiny image (untagged with ``tag`` None); its id."""
        ctx = self.tmp_path / uuid.uuid4().hex
        ctx.mkdir()
        (ctx / "payload").write_bytes(uuid.uuid4().bytes * (FILE_BYTES // 16))
        (ctx / "Dockerfile").write_text("FROM scratch\nCOPY payload /payload\n")
        image, _ = self.client.images.build(
            path=str(ctx), tag=tag, labels=labels, rm=True, pull=False, network_mode="none"
        )
        return str(image.id)

    def test_image(self, sha: str) -> str:
        tag = f"{self.tests}:{sha}-current"
        self.build(tag, {LABEL: "test", "gate.bundle": sha})
        return tag

    def container_of(self, tag: str) -> None:
        """A created (never started) container: it holds the image as a running one does."""
        container = self.client.containers.create(tag, command=["/payload"])
        self.containers.append(str(container.id))

    def ours(self) -> set[str]:
        return {
            t
            for image in self.client.images.list()
            for t in image.tags
            if t.startswith((f"{self.tests}:", f"{self.runners}:"))
        }

    def built_for_us(self) -> list[dict[str, Any]]:
        """Every image (intermediate ones too) a build for one of our test tags made."""
        return [
            image
            for image in self.client.api.images(all=True, filters={"label": BUILD_IMAGE_LABEL})
            if (image.get("Labels") or {})[BUILD_IMAGE_LABEL].startswith(f"{self.tests}:")
        ]

    def clean(self) -> None:
        for cid in self.containers:
            try:
                self.client.containers.get(cid).remove(force=True)
            except docker.errors.NotFound:
                pass
        for ref in [*self.ours(), *(str(i["Id"]) for i in self.built_for_us())]:
            try:
                self.client.images.remove(ref, force=True)
            except docker.errors.NotFound:
                pass  # pruned with a child removed before it
            except docker.errors.APIError as exc:
                if exc.status_code != 409:  # a parent of one not removed yet: pruned with it
                    raise
        self.client.close()


@pytest.fixture
def ns(docker_engine: None, tmp_path: Path) -> Iterator[Namespace]:
    space = Namespace(tmp_path)
    try:
        yield space
    finally:
        space.clean()


def test_eviction_removes_the_least_recently_used_and_keeps_those_in_use(
    ns: Namespace, sessions: sessionmaker[Session], tmp_path: Path
) -> None:
    sandbox = DockerSandbox(Settings(data_dir=tmp_path / "data"))
    shas = {name: uuid.uuid4().hex * 2 for name in ("queued", "lru", "recent", "contained")}
    add_gate(sessions, shas["queued"], status=GateStatus.queued, days_ago=5)  # the oldest
    add_gate(sessions, shas["lru"], status=GateStatus.passed, days_ago=3)
    add_gate(sessions, shas["recent"], status=GateStatus.passed, days_ago=1)
    # An image's last use is the later of its gates' times and its build time, which the
    # engine gives in whole seconds, and every image here is built after its gates: so the
    # LRU image is built first and the others in a later second, or they would tie.
    tags = {"lru": ns.test_image(shas["lru"])}
    tick = int(time.time())
    while int(time.time()) == tick:
        time.sleep(0.05)
    tags.update({name: ns.test_image(shas[name]) for name in ("queued", "recent", "contained")})
    ns.container_of(tags["contained"])
    ns.build(f"{ns.runners}:old", {LABEL: "runner"})
    ns.build(f"{ns.runners}:current", {LABEL: "runner"})
    policy = GcPolicy(
        budget_bytes=0, grace_seconds=0, test_repository=ns.tests, runner_repository=ns.runners
    )
    sizes = {t: i.unique_bytes for i in sandbox.list_images() for t in i.tags if t in tags.values()}
    assert sorted(sizes) == sorted(tags.values())
    assert all(FILE_BYTES <= size < 2 * FILE_BYTES for size in sizes.values())
    current = f"{ns.runners}:current"

    # Room for three of the four: the least recently used one that may go, goes.
    room = sum(sizes.values()) - sizes[tags["lru"]]
    first = collect_images(
        sandbox, sessions, dataclasses.replace(policy, budget_bytes=room), current
    )

    assert first.removed_test_images == [tags["lru"]]
    assert first.removed_runner_images == [f"{ns.runners}:old"]
    assert ns.ours() == {tags["queued"], tags["recent"], tags["contained"], current}

    # No room at all: what a queued gate needs and what a container uses still stay.
    second = collect_images(sandbox, sessions, policy, current)

    assert second.removed_test_images == [tags["recent"]]
    assert second.over_budget
    assert ns.ours() == {tags["queued"], tags["contained"], current}
    # The engine itself refuses an image a container uses (remove_image never forces).
    assert sandbox.remove_image(tags["contained"]) is False
    assert tags["contained"] in ns.ours()
    sandbox.close()


def test_builds_with_requirements_leave_nothing_beyond_the_budget(
    ns: Namespace,
    sessions: sessionmaker[Session],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Three real builds with a dependency stage, then one garbage collection pass.

    Each build removes its own dependency stage as it ends (before, its untagged image stayed
    for good: 879 MB for numpy); what a build killed half-way left is labelled as the
    bundle's build and collected; past the budget the test images themselves go.
    """
    sandbox = DockerSandbox(Settings(data_dir=tmp_path / "data"))
    reuse_a_runner(sandbox, monkeypatch)
    tags = []
    for n in range(3):
        ctx = tmp_path / f"build{n}"
        (ctx / "bundle").mkdir(parents=True)
        (ctx / "bundle" / "marker.txt").write_text(uuid.uuid4().hex)  # three distinct bundles
        make_wheel(ctx / "wheels")
        sha = uuid.uuid4().hex * 2
        add_gate(sessions, sha, status=GateStatus.passed, days_ago=3 - n)  # the first is LRU
        spec = port.TestImageSpec(
            tag=f"{ns.tests}:{sha}-current",
            context_dir=ctx,
            requirements=("gate-e2e-demo==1.0",),
            labels={"gate.bundle": sha},
        )
        tags.append(sandbox.build_test_image(spec))
        # All that is left of the build: the test image and the steps it is made of.
        image = sandbox.client.images.get(spec.tag)
        chain, parent = {image.id}, image.attrs["Parent"]
        while parent:
            chain.add(parent)
            parent = sandbox.client.images.get(parent).attrs["Parent"]
        made = {i["Id"] for i in ns.built_for_us() if i["Labels"][BUILD_IMAGE_LABEL] == spec.tag}
        assert made, "the build's images carry no build labels"
        assert not made - chain, f"{len(made - chain)} image(s) left beside {spec.tag}"
        assert image.labels[LABEL] == "test" and image.labels["gate.bundle"] == sha
    # What a worker killed during a build would leave: an untagged image of the build.
    crashed = ns.build(
        None,
        {
            LABEL: BUILD_STAGE,
            BUILD_ID_LABEL: uuid.uuid4().hex,
            BUILD_IMAGE_LABEL: f"{ns.tests}:{uuid.uuid4().hex * 2}-current",
        },
    )
    sizes = {t: i.unique_bytes for i in sandbox.list_images() for t in i.tags if t in tags}
    budget = sizes[tags[-1]]  # room for the newest test image only
    policy = GcPolicy(
        budget_bytes=budget, grace_seconds=0, test_repository=ns.tests, runner_repository=ns.runners
    )

    report = collect_images(sandbox, sessions, policy, f"{ns.runners}:current")

    assert report.removed_build_images == [crashed]
    assert report.removed_test_images == tags[:2]
    assert ns.ours() == {tags[-1]}
    # Nothing else of ours on the engine, intermediate images included, and what stays fits.
    kept = sandbox.client.images.get(tags[-1])
    assert {i["Labels"][BUILD_IMAGE_LABEL] for i in ns.built_for_us()} == {tags[-1]}
    assert sum(i.unique_bytes for i in sandbox.list_images() if kept.id == i.id) <= budget
    sandbox.close()
