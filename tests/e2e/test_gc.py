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

import docker
import pytest
from sqlalchemy.orm import Session, sessionmaker

from gate_service.config import Settings
from gate_service.models import GateStatus
from gate_service.sandbox import LABEL
from gate_service.sandbox.docker_engine import DockerSandbox
from gate_service.worker.gc import GcPolicy, collect_images
from tests.fixtures.gates import add_gate

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

    def build(self, tag: str, labels: dict[str, str]) -> None:
        ctx = self.tmp_path / uuid.uuid4().hex
        ctx.mkdir()
        (ctx / "payload").write_bytes(uuid.uuid4().bytes * (FILE_BYTES // 16))
        (ctx / "Dockerfile").write_text("FROM scratch\nCOPY payload /payload\n")
        self.client.images.build(
            path=str(ctx), tag=tag, labels=labels, rm=True, pull=False, network_mode="none"
        )

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

    def clean(self) -> None:
        for cid in self.containers:
            try:
                self.client.containers.get(cid).remove(force=True)
            except docker.errors.NotFound:
                pass
        for tag in self.ours():
            try:
                self.client.images.remove(tag, force=True)
            except docker.errors.NotFound:
                pass
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
