"""A case's container is made before the case takes a CPU slot and removed after it gives
the slot back (worker/handler.py): the engine's create and removal of one case overlap the
runs of others, and only the start, the run and the reading of its output hold a slot.
Worker logic on a real Postgres, with the fake sandbox."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from gate_service.config import Settings
from gate_service.models import Case, Gate
from gate_service.sandbox import RunResult
from tests.fixtures.projects import bundle_of
from tests.fixtures.sandbox import FakeCaseContainer, FakeSandbox, fake_worker
from tests.integration.test_fair_scheduling import cases_project, submit


class OrderSandbox(FakeSandbox):
    """Records each case's create, start and removal, with the CPU slots in use at each;
    the first case's run waits (up to ``WAIT``) for the second case's container to exist."""

    WAIT = 30.0

    def __init__(self) -> None:
        super().__init__()
        self.events: list[tuple[str, str, int]] = []
        self.second_created = threading.Event()
        self.in_use = lambda: -1  # the worker's CPU slots in use, once it exists
        self._lock = threading.Lock()

    def _note(self, what: str, argv: Sequence[str]) -> None:
        case = next(a.split("=", 1)[1] for a in argv if a.startswith("--case="))
        with self._lock:
            self.events.append((what, case, self.in_use()))
        if what == "create" and case == "adds_1":
            self.second_created.set()

    def create(self, image: str, argv: Sequence[str], **kw: Any) -> FakeCaseContainer:
        made = super().create(image, argv, **kw)
        self._note("create", argv)
        remove = made.remove

        def noted_remove() -> None:
            self._note("remove", argv)
            remove()

        made.remove = noted_remove  # type: ignore[method-assign]
        return made

    def run(self, image: str, argv: Sequence[str], **kw: Any) -> RunResult:
        self._note("start", argv)
        if "--case=adds_0" in argv:
            self.second_created.wait(self.WAIT)
        return super().run(image, argv, **kw)


def test_a_cases_container_is_made_before_its_slot_and_removed_after_it(
    client: TestClient, settings: Settings, sessions: sessionmaker[Session], tmp_path: Path
) -> None:
    # One CPU slot, room for three containers: the second case waits for the slot with its
    # container already made.
    settings = settings.model_copy(update={"case_concurrency": 1, "max_case_containers": 3})
    sandbox = OrderSandbox()
    worker = fake_worker(settings, sessions, sandbox)
    sandbox.in_use = lambda: worker.slots.in_use
    gate_id = submit(client, bundle_of(cases_project(tmp_path / "p", 2)))
    assert worker.run_once() is True
    with sessions() as s:
        assert s.get_one(Gate, gate_id).status == "passed"
        statuses = s.scalars(select(Case.status).where(Case.gate_id == gate_id)).all()
        assert sorted(statuses) == ["passed", "passed"]
    events = sandbox.events
    order = [(what, case) for what, case, _ in events]
    # The second case's container was made while the first case ran (its run waited for
    # that, up to WAIT seconds, which a worker that creates under the slot never meets).
    assert order.index(("create", "adds_1")) < order.index(("remove", "adds_0"))
    assert sandbox.second_created.is_set()
    slots = {(what, case): in_use for what, case, in_use in events}
    # Made with no slot of its own (the first case held the only one, or none was held),
    # started holding one, removed after giving it back.
    assert slots[("create", "adds_0")] == 0
    assert slots[("create", "adds_1")] <= 1
    assert slots[("start", "adds_0")] == slots[("start", "adds_1")] == 1
    assert slots[("remove", "adds_1")] == 0
    assert sandbox.containers == []  # nothing left listed
