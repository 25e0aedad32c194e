"""Garbage collection on a worker's Docker engine and data directory.

One pass (``collect_garbage``), every GATE_GC_INTERVAL_SECONDS per worker process:

- **Test images** (``gate-test:<bundle sha256>-<runner digest>``). When the bytes of their
  own layers add up to more than GATE_TEST_IMAGE_BUDGET_BYTES, the least recently used go
  first until the rest fit. Docker records no last-use time, so the last use of an image is
  the last time a gate of its bundle was created, started or finished (the ``gates`` table,
  shared by every worker), or the image's build time when that is later. Test images of a
  runner digest other than the current one are never used by this version again and go
  without waiting for the budget.
- **Runner images of old digests** (``gate-runner:<digest>`` other than the current one) go
  once no container and no remaining image uses them. Versions before the ``gate.managed``
  label built them without it; a runner tag that is a digest of ours (12 hex digits) marks
  those as ours too, so they are not kept forever.
- **Build leftovers**: untagged images that a test-image build for a tag under the test
  repository made (``gate.image``): its dependency stage or half-done steps, which the build
  removes itself as it ends, so these are what a worker killed mid-build left; or a test
  image whose tag a concurrent build of the same bundle took over. Nothing names them, so
  they are never used again and go whatever the budget, once no container uses them and
  they are older than the grace and than GATE_BUILD_TIMEOUT_SECONDS (younger, they may
  belong to a build still running).
- **Scratch directories** of builds whose worker process is gone (see ``gate_service.scratch``):
  at the worker's start and on every pass.

Never removed: an image a queued or running gate needs (checked again in the database, under
a lock on the bundle's row that an upload of the same bundle waits for, immediately before
the image goes), an image a container (running or not) uses, and anything built or used in
the last GATE_GC_GRACE_SECONDS (the engine may be shared with another installation, whose
gates this database cannot see). Images are removed without force, so the engine refuses
one that a container started in the meantime. Only images under the configured repository
names and carrying the ``gate.managed`` label are considered; ``GcPolicy`` names them, so a
test can work in a namespace of its own. (The one exception: unlabelled runner images of
old digests, above.)

Each pass is counted on /metrics (``Metrics.gc_pass``): passes by result, images removed by
kind, bytes freed, and what the test images hold after it.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from sqlalchemy import text
from sqlalchemy.orm import Session, sessionmaker

from ..config import Settings
from ..db import session_scope
from ..models import GateStatus
from ..sandbox import BUILD_IMAGE_LABEL, LABEL, ImageBuilder, ImageInfo
from ..scratch import clean_scratch

if TYPE_CHECKING:
    from .handler import WorkerContext

log = logging.getLogger(__name__)

ACTIVE = sorted(s.value for s in GateStatus if not s.terminal)
TEST_REPOSITORY = "gate-test"
RUNNER_REPOSITORY = "gate-runner"
# What recipes.runner_digest makes: a runner tag of this shape is ours, label or not.
RUNNER_DIGEST = re.compile(r"[0-9a-f]{12}")


@dataclass(frozen=True)
class GcPolicy:
    budget_bytes: int
    grace_seconds: float
    test_repository: str = TEST_REPOSITORY
    runner_repository: str = RUNNER_REPOSITORY
    # How long a build may run: a build leftover younger than this may be a stage that a
    # build in progress (here or on another worker of the engine) still copies from.
    build_seconds: float = 0.0

    @classmethod
    def from_settings(cls, settings: Settings) -> GcPolicy:
        return cls(
            budget_bytes=settings.test_image_budget_bytes,
            grace_seconds=settings.gc_grace_seconds,
            build_seconds=settings.build_timeout_seconds,
        )


@dataclass
class GcReport:
    removed_test_images: list[str] = field(default_factory=list)
    removed_runner_images: list[str] = field(default_factory=list)
    removed_build_images: list[str] = field(default_factory=list)  # ids: they have no tag
    freed_bytes: int = 0
    test_image_bytes: int = 0  # what the test images that stay hold
    over_budget: bool = False  # the images that must stay hold more than the budget
    scratch_dirs: int = 0

    def removed(self) -> dict[str, int]:
        """What went, counted by kind, as /metrics counts it (Metrics.gc_pass)."""
        return {
            "test_image": len(self.removed_test_images),
            "runner_image": len(self.removed_runner_images),
            "build_leftover": len(self.removed_build_images),
            "scratch_dir": self.scratch_dirs,
        }

    def describe(self) -> str:
        return (
            f"{len(self.removed_test_images)} test image(s) and "
            f"{len(self.removed_runner_images)} runner image(s) and "
            f"{len(self.removed_build_images)} build leftover(s) removed "
            f"({self.freed_bytes} bytes freed; test images now hold {self.test_image_bytes} "
            f"bytes), {self.scratch_dirs} scratch director(ies) removed"
        )


@dataclass
class _TestImage:
    image: ImageInfo
    tags: list[str]
    sha256: str
    digest: str
    last_used: float = 0.0
    needed: bool = False  # a queued or running gate's bundle


def _tag_name(tag: str) -> str:
    return tag.rsplit(":", 1)[-1]


def _test_images(images: list[ImageInfo], policy: GcPolicy) -> list[_TestImage]:
    prefix = f"{policy.test_repository}:"
    found = []
    for image in images:
        tags = [t for t in image.tags if t.startswith(prefix)]
        if not tags or LABEL not in image.labels:
            continue
        name = _tag_name(tags[0])
        sha, _, digest = name.rpartition("-")
        found.append(
            _TestImage(
                image=image,
                tags=tags,
                sha256=image.labels.get("gate.bundle") or sha,
                digest=digest,
                last_used=image.created,
            )
        )
    return found


def _usage(session: Session, shas: list[str]) -> dict[str, tuple[float, bool]]:
    """Per bundle: the last time a gate of it was created, started or finished, and whether
    a queued or running gate needs it."""
    if not shas:
        return {}
    rows = session.execute(
        text(
            """
            SELECT bundle_sha256 AS sha,
                   max(greatest(created_at, started_at, finished_at)) AS last_used,
                   bool_or(status = ANY(:active)) AS needed
              FROM gates
             WHERE bundle_sha256 = ANY(:shas)
             GROUP BY bundle_sha256
            """
        ),
        {"shas": shas, "active": ACTIVE},
    ).all()
    return {r.sha: (r.last_used.timestamp(), bool(r.needed)) for r in rows}


def _remove_test_image(
    sandbox: ImageBuilder, sessions: sessionmaker[Session], candidate: _TestImage
) -> bool:
    """Remove one test image unless a queued or running gate needs it now.

    The bundle's row is locked (FOR UPDATE) first: an upload of the same bundle holds it
    FOR KEY SHARE until its gate commits, so a gate either committed before this check (and
    is seen) or commits after the image is gone (and its worker builds it again).
    """
    with session_scope(sessions) as session:
        session.execute(
            text("SELECT 1 FROM bundles WHERE sha256 = :sha FOR UPDATE"),
            {"sha": candidate.sha256},
        )
        needed = session.scalar(
            text(
                "SELECT EXISTS (SELECT 1 FROM gates WHERE bundle_sha256 = :sha "
                "AND status = ANY(:active))"
            ),
            {"sha": candidate.sha256, "active": ACTIVE},
        )
        if needed:
            return False
        removed = False
        for tag in candidate.tags:
            removed = sandbox.remove_image(tag) or removed
        return removed


def _descendants_in_use(
    runner: ImageInfo, images: list[ImageInfo], removed: set[str], policy: GcPolicy
) -> bool:
    """Whether a container or a remaining tagged image stands on ``runner``."""
    by_id = {i.id: i for i in images}
    digest_suffixes = tuple(f"-{_tag_name(t)}" for t in runner.tags)
    test_prefix = f"{policy.test_repository}:"
    for image in images:
        if image.id == runner.id or image.id in removed:
            continue
        # Test images name their runner's digest in their tag (even when built elsewhere).
        if any(t.startswith(test_prefix) and t.endswith(digest_suffixes) for t in image.tags):
            return True
        parent, seen = image.parent_id, set()
        while parent and parent not in seen:
            if parent == runner.id:
                if image.tags or image.containers:
                    return True
                break
            seen.add(parent)
            parent = by_id[parent].parent_id if parent in by_id else ""
    return False


def _collect_build_leftovers(
    sandbox: ImageBuilder, images: list[ImageInfo], policy: GcPolicy, now: float, report: GcReport
) -> None:
    """Remove what test-image builds left (see the module's docstring); each goes with its
    untagged parents, which the engine prunes with it."""
    prefix = f"{policy.test_repository}:"
    young = max(policy.grace_seconds, policy.build_seconds)
    for image in images:
        if image.tags or LABEL not in image.labels:
            continue
        if not image.labels.get(BUILD_IMAGE_LABEL, "").startswith(prefix):
            continue
        if image.containers or now - image.created < young:
            continue
        if sandbox.remove_image(image.id):
            report.removed_build_images.append(image.id)
            report.freed_bytes += image.unique_bytes


def collect_images(
    sandbox: ImageBuilder,
    sessions: sessionmaker[Session],
    policy: GcPolicy,
    current_runner: str,
    *,
    now: float | None = None,
) -> GcReport:
    """One pass over the engine's test and runner images (see the module's docstring)."""
    now = time.time() if now is None else now
    report = GcReport()
    images = sandbox.list_images()
    _collect_build_leftovers(sandbox, images, policy, now, report)
    current_digest = _tag_name(current_runner)
    tests = _test_images(images, policy)
    with session_scope(sessions) as session:
        usage = _usage(session, sorted({t.sha256 for t in tests}))
    for t in tests:
        last_used, t.needed = usage.get(t.sha256, (0.0, False))
        t.last_used = max(t.last_used, last_used)

    def protected(t: _TestImage) -> bool:
        return t.needed or t.image.containers > 0 or now - t.last_used < policy.grace_seconds

    removed: set[str] = set()

    def remove(t: _TestImage) -> None:
        if _remove_test_image(sandbox, sessions, t):
            removed.add(t.image.id)
            report.removed_test_images.extend(t.tags)
            report.freed_bytes += t.image.unique_bytes

    # Test images of another runner digest: this version never uses them again.
    for t in tests:
        if t.digest != current_digest and not protected(t):
            remove(t)
    # The rest: least recently used first, until what stays fits the budget.
    kept = [t for t in tests if t.image.id not in removed]
    total = sum(t.image.unique_bytes for t in kept)
    for t in sorted(kept, key=lambda t: (t.last_used, t.image.created)):
        if total <= policy.budget_bytes:
            break
        if protected(t):
            continue
        remove(t)
        if t.image.id in removed:
            total -= t.image.unique_bytes
    report.test_image_bytes = total
    if total > policy.budget_bytes:
        report.over_budget = True
        log.warning(
            "test images hold %s bytes, over GATE_TEST_IMAGE_BUDGET_BYTES (%s): the rest are "
            "needed by queued or running gates, in use, or used in the last %g s",
            total,
            policy.budget_bytes,
            policy.grace_seconds,
        )
    # Runner images of old digests that nothing stands on any more.
    runner_prefix = f"{policy.runner_repository}:"
    for image in images:
        tags = [t for t in image.tags if t.startswith(runner_prefix) and t != current_runner]
        if not tags or current_runner in image.tags:
            continue
        if LABEL not in image.labels and not all(
            RUNNER_DIGEST.fullmatch(_tag_name(t)) for t in tags
        ):
            continue
        if image.containers or now - image.created < policy.grace_seconds:
            continue
        if _descendants_in_use(image, images, removed, policy):
            continue
        gone = [tag for tag in tags if sandbox.remove_image(tag)]
        if gone:
            report.removed_runner_images.extend(gone)
            report.freed_bytes += image.unique_bytes
    return report


def collect_garbage(
    ctx: WorkerContext, policy: GcPolicy | None = None, *, images: bool = True
) -> GcReport:
    """Scratch directories, then (with ``images``) the engine's test and runner images."""
    report = GcReport()
    report.scratch_dirs = clean_scratch(ctx.settings)
    if images:
        found = collect_images(
            ctx.sandbox,
            ctx.sessions,
            policy or GcPolicy.from_settings(ctx.settings),
            ctx.sandbox.runner_image(),
        )
        found.scratch_dirs = report.scratch_dirs
        report = found
    if (
        report.removed_test_images
        or report.removed_runner_images
        or report.removed_build_images
        or report.scratch_dirs
    ):
        log.info("garbage collection: %s", report.describe())
    return report


class GcClock:
    """Per process: scratch directories at the first call (the worker's start), then a full
    pass once every interval (the first one interval after the start)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._last: float | None = None

    def due(self, interval_s: float) -> bool | None:
        """None: nothing to do; False: scratch only (the start); True: a full pass."""
        now = time.monotonic()
        with self._lock:
            if self._last is None:
                self._last = now
                return False
            if interval_s <= 0 or now - self._last < interval_s:
                return None
            self._last = now
            return True


PROCESS_CLOCK = GcClock()


def collect_if_due(ctx: WorkerContext, clock: GcClock | None = None) -> GcReport | None:
    """What the worker loop calls every round; a failure is logged and tried next time."""
    due = (clock or PROCESS_CLOCK).due(ctx.settings.gc_interval_seconds)
    if due is None:
        return None
    try:
        report = collect_garbage(ctx, images=due)
    except Exception:
        log.exception("garbage collection failed; trying again at the next pass")
        ctx.metrics.gc_pass(None)
        return None
    held = report.test_image_bytes if due else None  # a scratch-only pass saw no image
    ctx.metrics.gc_pass(report.removed(), report.freed_bytes, held)
    return report
