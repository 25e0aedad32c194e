"""Garbage collection: which images go (LRU past the budget, old digests) and which stay
(needed by a queued or running gate, in use, recent), and crashed builds' scratch
directories. The fake sandbox plays the engine; the decisions read the real Postgres."""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session, sessionmaker

from gate_service.config import Settings
from gate_service.models import GateStatus
from gate_service.sandbox import BUILD_ID_LABEL, BUILD_IMAGE_LABEL, BUILD_STAGE, LABEL, ImageInfo
from gate_service.scratch import clean_scratch, scratch_dir, scratch_root
from gate_service.worker import gc
from gate_service.worker.gc import GcClock, GcPolicy, collect_garbage, collect_images
from gate_service.worker.handler import WorkerContext
from gate_service.worker.loop import Worker
from tests.fixtures.gates import add_gate
from tests.fixtures.sandbox import FakeSandbox
from tests.integration.test_retention import judge, project_bundle

DAY = 24 * 3600.0
CURRENT = "gate-runner:fake"  # what FakeSandbox.runner_image() answers


def policy(budget: int, grace: float = 0) -> GcPolicy:
    return GcPolicy(budget_bytes=budget, grace_seconds=grace)


def sha(n: int) -> str:
    return f"{n:064x}"


def make_test_image(
    sandbox: FakeSandbox, bundle: str, *, size: int, digest: str = "fake", **kw: object
) -> str:
    tag = f"gate-test:{bundle}-{digest}"
    sandbox.image_info[tag] = ImageInfo(
        id=f"sha256:{uuid.uuid4().hex}",
        tags=(tag,),
        labels={LABEL: "test", "gate.bundle": bundle},
        created=time.time() - 30 * DAY,  # built long ago: the database says when it was used
        unique_bytes=size,
        **kw,  # type: ignore[arg-type]
    )
    return tag


def make_runner(sandbox: FakeSandbox, tag: str, **kw: object) -> ImageInfo:
    info = ImageInfo(
        id=f"sha256:{uuid.uuid4().hex}",
        tags=(tag,),
        labels={LABEL: "runner"},
        created=time.time() - 30 * DAY,
        unique_bytes=700,
        **kw,  # type: ignore[arg-type]
    )
    sandbox.image_info[tag] = info
    return info


def test_past_the_budget_the_least_recently_used_go_first(
    sessions: sessionmaker[Session], sandbox: FakeSandbox
) -> None:
    tags = {}
    for n, days in ((1, 3), (2, 2), (3, 1)):  # bundle 1 used longest ago
        add_gate(sessions, sha(n), status=GateStatus.passed, days_ago=days)
        tags[n] = make_test_image(sandbox, sha(n), size=100)

    report = collect_images(sandbox, sessions, policy(budget=250), CURRENT)

    assert report.removed_test_images == [tags[1]]
    assert set(sandbox.image_info) == {tags[2], tags[3]}
    assert report.test_image_bytes == 200 and not report.over_budget


def test_within_the_budget_nothing_goes(
    sessions: sessionmaker[Session], sandbox: FakeSandbox
) -> None:
    for n in (1, 2):
        add_gate(sessions, sha(n), status=GateStatus.passed, days_ago=5)
        make_test_image(sandbox, sha(n), size=100)

    report = collect_images(sandbox, sessions, policy(budget=200), CURRENT)

    assert report.removed_test_images == [] and len(sandbox.image_info) == 2


def test_last_use_is_the_latest_gate_of_the_bundle(
    sessions: sessionmaker[Session], sandbox: FakeSandbox
) -> None:
    # Bundle 1's first gate is the oldest of all, but another of its gates ran yesterday.
    add_gate(sessions, sha(1), status=GateStatus.passed, days_ago=9)
    add_gate(sessions, sha(1), status=GateStatus.failed, days_ago=1)
    add_gate(sessions, sha(2), status=GateStatus.passed, days_ago=4)
    make_test_image(sandbox, sha(1), size=100)
    older = make_test_image(sandbox, sha(2), size=100)

    report = collect_images(sandbox, sessions, policy(budget=100), CURRENT)

    assert report.removed_test_images == [older]


def test_an_image_a_queued_or_running_gate_needs_is_never_removed(
    sessions: sessionmaker[Session], sandbox: FakeSandbox
) -> None:
    add_gate(sessions, sha(1), status=GateStatus.passed, days_ago=9)
    add_gate(sessions, sha(1), status=GateStatus.queued, days_ago=8)  # waiting since then
    add_gate(sessions, sha(2), status=GateStatus.running, days_ago=7)
    add_gate(sessions, sha(3), status=GateStatus.passed, days_ago=1)
    queued = make_test_image(sandbox, sha(1), size=100)
    running = make_test_image(sandbox, sha(2), size=100)
    idle = make_test_image(sandbox, sha(3), size=100)

    report = collect_images(sandbox, sessions, policy(budget=0), CURRENT)

    assert report.removed_test_images == [idle]
    assert set(sandbox.image_info) == {queued, running}
    assert report.over_budget and report.test_image_bytes == 200


def test_the_database_is_asked_again_right_before_an_image_goes(
    sessions: sessionmaker[Session], sandbox: FakeSandbox
) -> None:
    """A gate queued after the pass read the database still keeps its image."""
    add_gate(sessions, sha(1), status=GateStatus.passed, days_ago=9)
    tag = make_test_image(sandbox, sha(1), size=100)
    real_usage = gc._usage

    def usage_then_upload(session: Session, shas: list[str]) -> dict[str, tuple[float, bool]]:
        found = real_usage(session, shas)
        add_gate(sessions, sha(1), status=GateStatus.queued, days_ago=0)  # meanwhile
        return found

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(gc, "_usage", usage_then_upload)
        report = collect_images(sandbox, sessions, policy(budget=0), CURRENT)

    assert report.removed_test_images == [] and tag in sandbox.image_info


def test_images_used_within_the_grace_period_stay(
    sessions: sessionmaker[Session], sandbox: FakeSandbox
) -> None:
    add_gate(sessions, sha(1), status=GateStatus.passed, days_ago=0.01)  # 15 minutes ago
    add_gate(sessions, sha(2), status=GateStatus.passed, days_ago=2)
    recent = make_test_image(sandbox, sha(1), size=100)
    # Unknown to this database (another installation's?), but built a minute ago.
    fresh = make_test_image(sandbox, sha(9), size=100)
    sandbox.image_info[fresh] = dataclasses.replace(
        sandbox.image_info[fresh], created=time.time() - 60
    )
    old = make_test_image(sandbox, sha(2), size=100)

    report = collect_images(sandbox, sessions, policy(budget=0, grace=3600), CURRENT)

    assert report.removed_test_images == [old]
    assert set(sandbox.image_info) == {recent, fresh}


def test_an_image_a_container_uses_stays(
    sessions: sessionmaker[Session], sandbox: FakeSandbox
) -> None:
    add_gate(sessions, sha(1), status=GateStatus.passed, days_ago=9)
    used = make_test_image(sandbox, sha(1), size=100, containers=1)

    report = collect_images(sandbox, sessions, policy(budget=0), CURRENT)

    assert report.removed_test_images == [] and used in sandbox.image_info


def test_old_runner_digests_go_with_their_test_images_unless_in_use(
    sessions: sessionmaker[Session], sandbox: FakeSandbox
) -> None:
    current = make_runner(sandbox, CURRENT)
    # Digest `old`: one idle test image on it; both go, whatever the budget.
    add_gate(sessions, sha(1), status=GateStatus.passed, days_ago=2)
    old_test = make_test_image(sandbox, sha(1), size=100, digest="old")
    make_runner(sandbox, "gate-runner:old")
    # Digest `busy`: a container runs the runner itself.
    make_runner(sandbox, "gate-runner:busy", containers=1)
    # Digest `held`: its test image belongs to a queued gate, so it and its runner stay.
    add_gate(sessions, sha(2), status=GateStatus.queued, days_ago=2)
    held_test = make_test_image(sandbox, sha(2), size=100, digest="held")
    make_runner(sandbox, "gate-runner:held")
    # Digest `child`: an image built on it (found through its parent chain) has a container.
    child_runner = make_runner(sandbox, "gate-runner:child")
    sandbox.image_info["<none>"] = ImageInfo(
        id="sha256:untagged", tags=(), labels={}, created=0, unique_bytes=1,
        parent_id=child_runner.id, containers=1,
    )  # fmt: skip
    # Digest `young`: built ten minutes ago.
    young = make_runner(sandbox, "gate-runner:young")
    sandbox.image_info["gate-runner:young"] = dataclasses.replace(young, created=time.time() - 600)
    # Another repository's image is never looked at.
    sandbox.image_info["other:1"] = dataclasses.replace(current, id="sha256:o", tags=("other:1",))

    report = collect_images(sandbox, sessions, policy(budget=10**9, grace=3600), CURRENT)

    assert report.removed_test_images == [old_test]
    assert report.removed_runner_images == ["gate-runner:old"]
    assert sandbox.removed_images == [old_test, "gate-runner:old"]  # children first
    assert held_test in sandbox.image_info and CURRENT in sandbox.image_info
    assert report.freed_bytes == 100 + 700


def test_unlabelled_runner_images_of_old_digests_go_when_their_tag_is_a_digest_of_ours(
    sessions: sessionmaker[Session], sandbox: FakeSandbox
) -> None:
    """Runner images built before the gate.managed label: a tag shaped like our digest (12
    hex digits) marks them ours; any other unlabelled runner tag is someone else's."""
    make_runner(sandbox, CURRENT)
    old = make_runner(sandbox, "gate-runner:0123456789ab")
    sandbox.image_info["gate-runner:0123456789ab"] = dataclasses.replace(old, labels={})
    theirs = make_runner(sandbox, "gate-runner:latest")
    sandbox.image_info["gate-runner:latest"] = dataclasses.replace(theirs, labels={})
    busy = make_runner(sandbox, "gate-runner:ba9876543210", containers=1)
    sandbox.image_info["gate-runner:ba9876543210"] = dataclasses.replace(busy, labels={})

    report = collect_images(sandbox, sessions, policy(budget=10**9), CURRENT)

    assert report.removed_runner_images == ["gate-runner:0123456789ab"]
    assert {"gate-runner:latest", "gate-runner:ba9876543210", CURRENT} <= set(sandbox.image_info)


def test_each_pass_is_counted_on_metrics(
    settings: Settings, sessions: sessionmaker[Session], sandbox: FakeSandbox
) -> None:
    from gate_service.metrics import Metrics

    metrics = Metrics(process=False)
    ctx = WorkerContext(
        settings.model_copy(update={"test_image_budget_bytes": 150, "gc_interval_seconds": 0}),
        sessions,
        sandbox,
        threading.Event(),
        metrics=metrics,
    )
    make_runner(sandbox, CURRENT)
    make_runner(sandbox, "gate-runner:old")
    for n in range(3):
        add_gate(sessions, sha(n), status=GateStatus.passed, days_ago=10 - n)
        make_test_image(sandbox, sha(n), size=100)
    clock = GcClock()

    def sample(name: str, **labels: str) -> float | None:
        return metrics.registry.get_sample_value(name, labels)

    assert gc.collect_if_due(ctx, clock) is not None  # the start: scratch only
    assert sample("gate_gc_passes_total", result="ok") == 1
    assert sample("gate_test_image_bytes") == 0  # no image pass yet
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ctx.settings, "gc_interval_seconds", 0.01)
        time.sleep(0.02)
        report = gc.collect_if_due(ctx, clock)
    assert report is not None and len(report.removed_test_images) == 2
    assert sample("gate_gc_passes_total", result="ok") == 2
    assert sample("gate_gc_removed_total", kind="test_image") == 2
    assert sample("gate_gc_removed_total", kind="runner_image") == 1
    assert sample("gate_gc_freed_bytes_total") == 2 * 100 + 700
    assert sample("gate_test_image_bytes") == 100

    def broken() -> str:
        raise RuntimeError("the engine went away")

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ctx.settings, "gc_interval_seconds", 0.01)
        mp.setattr(sandbox, "runner_image", broken)
        time.sleep(0.02)
        assert gc.collect_if_due(ctx, clock) is None
    assert sample("gate_gc_passes_total", result="failed") == 1


def make_leftover(
    sandbox: FakeSandbox, *, for_tag: str, age: float, kind: str = BUILD_STAGE, **kw: object
) -> str:
    """An untagged image a test-image build left (the engine's dangling image)."""
    info = ImageInfo(
        id=f"sha256:{uuid.uuid4().hex}",
        tags=(),
        labels={LABEL: kind, BUILD_ID_LABEL: uuid.uuid4().hex, BUILD_IMAGE_LABEL: for_tag},
        created=time.time() - age,
        unique_bytes=900,
        **kw,  # type: ignore[arg-type]
    )
    sandbox.image_info[info.id] = info
    return info.id


def test_build_leftovers_go_whatever_the_budget_once_no_build_can_be_using_them(
    sessions: sessionmaker[Session], sandbox: FakeSandbox
) -> None:
    ours = f"gate-test:{sha(1)}-fake"
    old = make_leftover(sandbox, for_tag=ours, age=2 * 3600)
    # A test image whose tag a concurrent build of the same bundle took over.
    untagged = make_leftover(sandbox, for_tag=ours, age=2 * 3600, kind="test")
    # Younger than a build may run: perhaps a stage a running build still copies from.
    building = make_leftover(sandbox, for_tag=ours, age=300)
    used = make_leftover(sandbox, for_tag=ours, age=2 * 3600, containers=1)
    # Another repository's build (another installation, a test's namespace): not ours.
    other = make_leftover(sandbox, for_tag=f"gate-test-other:{sha(1)}-fake", age=2 * 3600)
    pol = dataclasses.replace(policy(budget=10**12, grace=60), build_seconds=600)

    report = collect_images(sandbox, sessions, pol, CURRENT)

    assert report.removed_build_images == [old, untagged]
    assert set(sandbox.image_info) == {building, used, other}
    assert report.freed_bytes == 2 * 900
    assert "2 build leftover(s)" in report.describe()


def test_the_settings_give_build_leftovers_the_build_timeout_at_least(settings: Settings) -> None:
    pol = GcPolicy.from_settings(
        settings.model_copy(update={"gc_grace_seconds": 0, "build_timeout_seconds": 42})
    )
    assert (pol.grace_seconds, pol.build_seconds) == (0, 42)


def test_images_the_worker_built_are_collected_by_their_tag_and_label(
    client: TestClient,
    settings: Settings,
    sessions: sessionmaker[Session],
    tmp_path: Path,
) -> None:
    """End to end through the handler: its tag and label are what the GC reads."""
    built = FakeSandbox()
    quiet = settings.model_copy(
        update={"test_image_budget_bytes": 0, "gc_grace_seconds": 0, "gc_interval_seconds": 0}
    )
    ctx = WorkerContext(quiet, sessions, built, threading.Event())
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("tests.integration.test_retention.FakeSandbox", lambda: built)
        judge(client, project_bundle(tmp_path, "one"), settings, sessions)
    (tag,) = built.image_info
    assert tag.startswith("gate-test:") and tag.endswith("-fake")

    report = collect_garbage(ctx)

    assert report.removed_test_images == [tag] and built.image_info == {}


# -- scratch directories -------------------------------------------------------------------


def backdate(path: Path, seconds: float = 3600) -> None:
    then = time.time() - seconds
    os.utime(path, (then, then))


def test_scratch_of_a_killed_worker_goes_and_a_live_ones_stays(settings: Settings) -> None:
    # A worker process that dies (SIGKILL) in the middle of a build.
    code = (
        "import sys, time\n"
        "from gate_service.config import Settings\n"
        "from gate_service.scratch import scratch_dir\n"
        f"with scratch_dir(Settings(data_dir={str(settings.data_dir)!r}), 'build-') as d:\n"
        "    (d / 'bundle').mkdir()\n"
        "    print(d, flush=True)\n"
        "    time.sleep(60)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    dead = Path(proc.stdout.readline().strip())
    assert dead.is_dir()
    backdate(dead)
    assert clean_scratch(settings) == 0  # its process still holds it
    proc.send_signal(signal.SIGKILL)
    proc.wait()

    with scratch_dir(settings, "build-") as live:
        backdate(live)
        assert clean_scratch(settings) == 1

        assert not dead.exists() and not Path(f"{dead}.lock").exists()
        assert live.is_dir()
    assert list(scratch_root(settings).iterdir()) == []


def test_a_fresh_unlocked_directory_waits_a_minute(settings: Settings) -> None:
    """A directory is made a moment before its lock is taken: young ones are left."""
    fresh = scratch_root(settings) / "build-fresh"
    fresh.mkdir()
    assert clean_scratch(settings) == 0 and fresh.exists()
    backdate(fresh)
    assert clean_scratch(settings) == 1 and not fresh.exists()


def test_the_worker_cleans_scratch_at_its_start(
    settings: Settings, sessions: sessionmaker[Session], sandbox: FakeSandbox
) -> None:
    left = scratch_root(settings) / "build-crashed"
    (left / "bundle").mkdir(parents=True)
    backdate(left)
    ctx = WorkerContext(settings, sessions, sandbox, threading.Event())
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(gc, "PROCESS_CLOCK", GcClock())
        Worker(ctx, name="w").run_once()
    assert not left.exists()
    assert sandbox.removed_images == []  # images wait for the first interval


def test_the_clock_does_scratch_first_then_a_full_pass_per_interval() -> None:
    clock = GcClock()
    assert clock.due(0.2) is False  # the start: scratch only
    assert clock.due(0.2) is None
    time.sleep(0.25)
    assert clock.due(0.2) is True
    assert clock.due(0.2) is None
    off = GcClock()
    assert off.due(0) is False
    time.sleep(0.01)
    assert off.due(0) is None
