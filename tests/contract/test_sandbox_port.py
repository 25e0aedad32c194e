"""The sandbox port's contract: what every backend must do, run against each of them.

Each test runs once per backend: every entry of the factory's registry
(gate_service.sandbox.BACKENDS), opened through the factory as a worker opens it, and the fake
(tests/fixtures/sandbox.py, the real runner in-process) where the test makes sense for it. A
new backend is under contract as soon as it has its factory entry. Its engine's fixture and
tier mark go in ENGINES when the engine may be missing on a developer machine: the fixture
skips there and fails in CI (tests/fixtures/docker.py for Docker); an entry without one runs
wherever the tests run, and so fails where its engine is missing, never skips.

Only the port is used, never a backend's own means: a container is seen through ``reap``
with a ``keep`` that spares everything (the port's one way to list them), and a case run's
output is read by the worker's own reader (runner_contract), with the worker's own argv.
"""

from __future__ import annotations

import json
import secrets
import socket
import textwrap
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from gate_runner import case_env, gateway_wire
from gate_service import sandbox as port
from gate_service.config import Settings
from gate_service.runner_contract import UntrustedResult, parse_runner_output, result_blocks
from gate_service.sandbox import (
    BACKENDS,
    LABEL,
    CaseRunner,
    Halted,
    ImageBuilder,
    ModelChannel,
    RunLimits,
    RunResult,
    Sandbox,
    SandboxError,
    open_sandbox,
)
from gate_service.worker.handler import runner_argv
from tests.fixtures.escape import PROBES, bridge_gateway
from tests.fixtures.projects import write
from tests.fixtures.sandbox import FakeSandbox

SUITE = "tests/contract.yaml"
REACH_SUITE = "tests/reach.yaml"
REACH_VARIABLE = "REACH_TARGETS"
REPORTS = "reports_its_environment"
NAPS = "naps"  # long enough to be reaped, halted or cut off while it runs
PROBE_VARIABLE = "CONTRACT_PROBE"
PROJECT = {
    "agents/probe.yaml": """
        version: "1.0"
        name: probe
        description: Reports what its invocation was handed, after a nap when asked.
        type: tool
        tool_name: probe.look
    """,
    "tools/probe.py": f"""
        import os
        import time


        def look(payload: dict) -> dict:
            time.sleep(payload.get("sleep", 0))
            return {{"seen": os.environ.get({PROBE_VARIABLE!r})}}
    """,
    "agents/reach.yaml": """
        version: "1.0"
        name: reach
        description: Tries every way out of its case container it is told of.
        type: tool
        tool_name: reach.out
    """,
    # The probes of tests/fixtures/escape.py, which the live gates' escape project uses too.
    "tools/reach.py": "import json\nimport os\nimport socket\n\n"
    + PROBES
    + textwrap.dedent(f"""


        def out(payload: dict) -> dict:
            found = {{}}
            try:
                with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as unix:
                    unix.settimeout(5)
                    unix.connect({gateway_wire.SOCKET_PATH!r})
                    unix.sendall(b"ping")
                    found["channel"] = unix.recv(16).decode()
            except OSError as exc:
                found["channel"] = type(exc).__name__
            try:
                open({gateway_wire.SOCKET_DIR!r} + "/left-behind", "w").close()
                found["write"] = "written"
            except OSError as exc:
                found["write"] = type(exc).__name__
            for host, port in json.loads(os.environ.get({REACH_VARIABLE!r}, "[]")):
                found[f"tcp {{host}}:{{port}}"] = _tcp(host, port)
                found[f"udp {{host}}:{{port}}"] = _udp(host, port)
            return found
    """),
    SUITE: f"""
        agent: probe
        tests:
          - name: {REPORTS}
            payload: '{{}}'
            expected_result: output.seen != None
          - name: {NAPS}
            payload: '{{"sleep": 20}}'
            timeout_s: 30
    """,
    REACH_SUITE: """
        agent: reach
        tests:
          - name: reaches_out
            payload: '{}'
            timeout_s: 60
    """,
}
SETTLE_SECONDS = 60  # longest wait for a container to appear or a run to end on a busy engine
FAKE = "fake"  # tests/fixtures/sandbox.py, no entry of the factory


@dataclass(frozen=True)
class Engine:
    """What the suite needs of a registered backend's engine on this machine."""

    # The fixture that skips a test when the engine is absent outside CI (and fails it in CI).
    fixture: str
    mark: pytest.MarkDecorator  # the test tier that needs the engine
    # Addresses of this host that a case container could try (where a listener of the test
    # waits), besides loopback: what the engine puts between its containers and the host.
    host_addresses: Callable[[], list[str]] = list


ENGINES = {
    "docker": Engine("docker_engine", pytest.mark.docker, lambda: [bridge_gateway()]),
}


def registered(name: str) -> object:
    """A registered backend as a test parameter, with its engine's mark."""
    engine = ENGINES.get(name)
    return pytest.param(name, marks=engine.mark) if engine else name


# Every registered backend, and the fake; REGISTERED_NAMES where a test needs what only an
# engine of its own gives (a mount namespace, a network namespace).
REGISTERED_NAMES = [registered(name) for name in sorted(BACKENDS)]
BACKEND_NAMES = [FAKE, *REGISTERED_NAMES]


@dataclass
class Backend:
    """One backend under test, with the contract project's test image built on it."""

    name: str
    sandbox: Sandbox
    settings: Settings
    workdir: Path
    image: str = ""
    built: list[str] = field(default_factory=list)
    pool: ThreadPoolExecutor = field(default_factory=lambda: ThreadPoolExecutor(8))

    def spec(self, **labels: str) -> port.TestImageSpec:
        """A build of the contract project under a tag no other test (or run) uses."""
        context = self.workdir / uuid.uuid4().hex
        write(context / "bundle", PROJECT)
        tag = f"gate-contract:{uuid.uuid4().hex[:16]}"
        self.built.append(tag)
        return port.TestImageSpec(tag=tag, context_dir=context, labels=labels)

    def run(
        self,
        case: str,
        *,
        labels: Mapping[str, str] | None = None,
        env: Mapping[str, str] | None = None,
        nonce: str = "",
        wall_seconds: float = SETTLE_SECONDS,
        halt: threading.Event | None = None,
        suite: str = SUITE,
        model_channel: ModelChannel | None = None,
    ) -> RunResult:
        """One case of the contract project, as the worker starts it."""
        return self.sandbox.run(
            self.image,
            runner_argv(self.settings, suite, case),
            stdin=case_env.encode(env or {}, nonce or secrets.token_hex(32)),
            limits=self.limits(wall_seconds),
            labels=labels or contract_labels(),
            halt=halt,
            model_channel=model_channel,
        )

    def limits(self, wall_seconds: float = 0) -> RunLimits:
        """A case container's limits where the contract does not test them (a create does
        not read the wall deadline: the start takes it), with its tasks sized as the worker
        sizes them for the backend's runtime: under gVisor a container held to the pids of
        runc cannot start gVisor's own threads, and its kernel dies mid-case (exit 2, no
        result)."""
        runtime = self.sandbox.runtime
        return RunLimits(
            memory_mb=256,
            cpus=1,
            pids=self.settings.case_host_pids(runtime),
            guest_tasks=self.settings.case_guest_tasks(runtime),
            wall_seconds=wall_seconds,
            tmpfs_mb=16,
            output_limit_bytes=1_000_000,
        )

    def start(self, case: str, **kwargs: object) -> Future[RunResult]:
        """``run`` in the background, for what must happen while a case runs."""
        return self.pool.submit(self.run, case, **kwargs)  # type: ignore[arg-type]


def contract_labels(**more: str) -> dict[str, str]:
    # A gate id no database holds: other installations' reapers on a shared engine keep it.
    return {"gate.contract": uuid.uuid4().hex, "gate.gate_id": str(uuid.uuid4()), **more}


def present(sandbox: CaseRunner, labels: Mapping[str, str]) -> list[dict[str, str]]:
    """The labels of the containers carrying ``labels``: seen by ``keep``, removed by none."""
    seen: list[dict[str, str]] = []

    def spare(found: Mapping[str, str]) -> bool:
        seen.append(dict(found))
        return True

    assert sandbox.reap(labels, keep=spare) == 0
    return seen


def wait_until(condition: Callable[[], object], what: str) -> None:
    deadline = time.monotonic() + SETTLE_SECONDS
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"not within {SETTLE_SECONDS} s: {what}")
        time.sleep(0.1)


@pytest.fixture(scope="module", params=BACKEND_NAMES)
def backend(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Backend]:
    name = request.param
    workdir = tmp_path_factory.mktemp(f"contract-{name}")
    settings = Settings(data_dir=workdir / "data", sandbox_backend=name)
    sandbox: Sandbox
    if name == FAKE:
        fake = FakeSandbox()
        fake.apply_env = True  # as the real runner gives each invocation the case's environment
        sandbox = fake
    else:
        if name in ENGINES:
            request.getfixturevalue(ENGINES[name].fixture)
        sandbox = open_sandbox(settings)  # the factory's entry, as a worker opens it
    backend = Backend(request.param, sandbox, settings, workdir)
    try:
        backend.image = sandbox.build_test_image(backend.spec(**{"gate.bundle": "contract"}))
        yield backend
    finally:
        backend.pool.shutdown(wait=True, cancel_futures=True)
        for tag in backend.built:
            with suppress(SandboxError):
                sandbox.remove_image(tag)
        sandbox.close()


# -- the port itself ----------------------------------------------------------------------


def test_the_backend_has_every_method_of_the_port(backend: Backend) -> None:
    names = {
        name
        for protocol in (ImageBuilder, CaseRunner, Sandbox)
        for name, member in vars(protocol).items()
        if not name.startswith("_") and not isinstance(member, property)
    }
    assert names >= {"runner_image", "build_test_image", "create", "run", "reap", "close"}
    assert {name for name in names if not callable(getattr(backend.sandbox, name, None))} == set()
    # What the gate's JSON reports as running its cases (runc, runsc, ...).
    assert isinstance(backend.sandbox.runtime, str) and backend.sandbox.runtime


# -- ImageBuilder -------------------------------------------------------------------------


def test_the_runner_image_exists(backend: Backend) -> None:
    tag = backend.sandbox.runner_image()
    assert tag and backend.sandbox.image_exists(tag)


def test_a_built_test_image_exists_and_is_listed_with_its_labels(backend: Backend) -> None:
    spec = backend.spec(**{"gate.bundle": "listed"})
    assert not backend.sandbox.image_exists(spec.tag)
    assert backend.sandbox.build_test_image(spec) == spec.tag
    assert backend.sandbox.image_exists(spec.tag)
    (info,) = [i for i in backend.sandbox.list_images() if spec.tag in i.tags]
    assert (info.labels[LABEL], info.labels["gate.bundle"]) == ("test", "listed")
    assert info.containers == 0 and info.unique_bytes >= 0


def test_a_halt_before_a_build_raises_halted_and_builds_nothing(backend: Backend) -> None:
    halt = threading.Event()
    halt.set()
    spec = backend.spec()
    with pytest.raises(Halted):
        backend.sandbox.build_test_image(spec, halt=halt)
    assert not backend.sandbox.image_exists(spec.tag)


def test_remove_image_removes_an_unused_image_once(backend: Backend) -> None:
    tag = backend.sandbox.build_test_image(backend.spec())
    assert backend.sandbox.remove_image(tag) is True
    assert not backend.sandbox.image_exists(tag)
    assert backend.sandbox.remove_image(tag) is False  # gone already


def test_remove_image_refuses_an_image_a_container_uses(backend: Backend) -> None:
    labels, halt = contract_labels(), threading.Event()
    running = backend.start(NAPS, labels=labels, halt=halt)
    try:
        wait_until(lambda: present(backend.sandbox, labels), "the case container exists")
        assert backend.sandbox.remove_image(backend.image) is False
        assert backend.sandbox.image_exists(backend.image)
    finally:
        halt.set()
        with suppress(Halted):
            running.result(timeout=SETTLE_SECONDS)


# -- CaseRunner ---------------------------------------------------------------------------


def test_a_run_returns_the_runners_stdout_with_one_result_block(backend: Backend) -> None:
    nonce = secrets.token_hex(32)
    result = backend.run(REPORTS, env={PROBE_VARIABLE: "handed-in"}, nonce=nonce)
    assert (result.exit_code, result.timed_out, result.oom_killed) == (0, False, False)
    assert not result.output_truncated and result_blocks(result.stdout) == 1
    parsed = parse_runner_output(result.stdout, nonce=nonce, suite=SUITE, test_name=REPORTS)
    assert parsed.passed and len(parsed.invocations) == 1


def test_the_stdin_handoff_reaches_the_runner_and_its_invocations(backend: Backend) -> None:
    # Two runs, two handoffs: each result carries its own nonce back, and each invocation saw
    # its own environment, so nothing is cached or shared between runs.
    handed = {value: secrets.token_hex(32) for value in ("first", "second")}
    stdout = {
        value: backend.run(REPORTS, env={PROBE_VARIABLE: value}, nonce=nonce).stdout
        for value, nonce in handed.items()
    }
    for value, nonce in handed.items():
        parsed = parse_runner_output(stdout[value], nonce=nonce)
        assert parsed.nonce == nonce
        assert [invocation.output for invocation in parsed.invocations] == [{"seen": value}]
    with pytest.raises(UntrustedResult, match="nonce"):
        parse_runner_output(stdout["first"], nonce=handed["second"])


def test_a_halt_before_a_run_raises_halted_and_leaves_no_container(backend: Backend) -> None:
    labels, halt = contract_labels(), threading.Event()
    halt.set()
    started = time.monotonic()
    with pytest.raises(Halted):
        backend.run(NAPS, labels=labels, halt=halt)
    assert time.monotonic() - started < 5
    assert present(backend.sandbox, labels) == []


def test_a_halt_while_a_case_runs_removes_it_and_raises_halted(backend: Backend) -> None:
    labels, halt = contract_labels(), threading.Event()
    running = backend.start(NAPS, labels=labels, halt=halt)
    wait_until(lambda: present(backend.sandbox, labels), "the case container exists")
    halt.set()
    halted_at = time.monotonic()
    with pytest.raises(Halted):
        running.result(timeout=SETTLE_SECONDS)
    assert time.monotonic() - halted_at < 10  # at the halt, not at the end of the nap
    wait_until(lambda: not present(backend.sandbox, labels), "the halted container is gone")


def create(backend: Backend, case: str, labels: Mapping[str, str]) -> port.CaseContainer:
    """A case container of the contract project created as the worker creates one, unstarted."""
    return backend.sandbox.create(
        backend.image,
        runner_argv(backend.settings, SUITE, case),
        limits=backend.limits(),
        labels=labels,
    )


def test_a_created_case_container_is_listed_runs_once_and_is_removed(backend: Backend) -> None:
    labels, nonce = contract_labels(), secrets.token_hex(32)
    container = create(backend, REPORTS, labels)
    # Created and not started: on the engine (so the reaper finds one a dead worker left).
    assert len(present(backend.sandbox, labels)) == 1
    result = container.run(
        case_env.encode({PROBE_VARIABLE: "created"}, nonce), wall_seconds=SETTLE_SECONDS
    )
    parsed = parse_runner_output(result.stdout, nonce=nonce, suite=SUITE, test_name=REPORTS)
    assert result.exit_code == 0 and parsed.passed
    assert [invocation.output for invocation in parsed.invocations] == [{"seen": "created"}]
    with pytest.raises(SandboxError):  # a container runs once
        container.run(case_env.encode({}, nonce), wall_seconds=SETTLE_SECONDS)
    container.remove()
    container.remove()  # twice is harmless
    assert present(backend.sandbox, labels) == []


def test_a_created_container_removed_or_halted_before_its_start_never_runs(
    backend: Backend,
) -> None:
    labels, halt = contract_labels(), threading.Event()
    removed = create(backend, NAPS, labels)
    removed.remove()
    assert present(backend.sandbox, labels) == []
    with pytest.raises(SandboxError):
        removed.run(case_env.encode({}, secrets.token_hex(32)), wall_seconds=SETTLE_SECONDS)
    halted = create(backend, NAPS, labels)
    halt.set()
    started = time.monotonic()
    with pytest.raises(Halted):
        halted.run(case_env.encode({}, secrets.token_hex(32)), wall_seconds=60, halt=halt)
    assert time.monotonic() - started < 5  # not started: the nap takes 20 s
    halted.remove()
    assert present(backend.sandbox, labels) == []
    with pytest.raises(Halted):  # and none is created once the job is halted
        backend.sandbox.create(
            backend.image, ["run-case"], limits=backend.limits(), labels=labels, halt=halt
        )
    assert present(backend.sandbox, labels) == []


def test_a_created_container_that_is_reaped_before_its_start_fails_it(backend: Backend) -> None:
    labels = contract_labels()
    container = create(backend, NAPS, labels)
    assert backend.sandbox.reap(labels) == 1
    with pytest.raises(SandboxError) as failed:
        container.run(case_env.encode({}, secrets.token_hex(32)), wall_seconds=SETTLE_SECONDS)
    assert not isinstance(failed.value, Halted)  # removed from outside, not halted
    container.remove()
    assert present(backend.sandbox, labels) == []


@contextmanager
def model_channel(root: Path) -> Iterator[ModelChannel]:
    """A model channel whose socket answers each connection "pong", laid out as the model
    gateway lays one out (a folder of its own the invocation uid can enter, a socket in it
    that uid may connect to)."""
    folder = root / uuid.uuid4().hex[:12]
    folder.mkdir(mode=0o755)
    folder.chmod(0o755)
    channel = ModelChannel.in_folder(folder)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(channel.socket))
    channel.socket.chmod(0o666)
    server.listen()
    server.settimeout(0.2)
    done = threading.Event()

    def answer() -> None:
        while not done.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            with conn:
                conn.recv(16)
                conn.sendall(b"pong")

    thread = threading.Thread(target=answer, daemon=True)
    thread.start()
    try:
        yield channel
    finally:
        done.set()
        thread.join()
        server.close()


@pytest.mark.parametrize("backend", REGISTERED_NAMES, indirect=True)
def test_a_case_reaches_its_model_channel_and_nothing_else(
    backend: Backend, tmp_path: Path
) -> None:
    """Every registered backend (not the fake, which runs cases in this process, with no
    namespace of their own to deliver a channel into or keep a network out of).

    With no network (the default policy), the case connects to its channel's socket at
    gateway_wire.SOCKET_PATH, however the backend delivers it there; it cannot write beside
    it (nothing reaches the gateway's folder), and no TCP or UDP address answers it: cloud
    metadata, this host as the engine's containers see it (where a listener of this host
    waits), loopback and an outside address.
    """
    listener = socket.create_server(("0.0.0.0", 0))
    listener.settimeout(0.2)
    port_number = listener.getsockname()[1]
    engine = ENGINES.get(backend.name)
    host_addresses = engine.host_addresses() if engine else []
    targets = [
        ("169.254.169.254", 80),
        *((address, port_number) for address in host_addresses),
        ("127.0.0.1", port_number),
        ("1.1.1.1", 443),
        ("1.1.1.1", 53),
    ]
    nonce = secrets.token_hex(32)
    try:
        with model_channel(tmp_path) as channel:
            result = backend.run(
                "reaches_out",
                suite=REACH_SUITE,
                env={REACH_VARIABLE: json.dumps(targets)},
                nonce=nonce,
                model_channel=channel,
            )
            left = sorted(p.name for p in channel.folder.iterdir())
        with pytest.raises(TimeoutError):
            listener.accept()  # nothing from the case ever connected to this host
    finally:
        listener.close()
    assert result.exit_code == 0, (result, result.stderr[-2000:])
    parsed = parse_runner_output(result.stdout, nonce=nonce)
    (found,) = [invocation.output for invocation in parsed.invocations]
    assert found.pop("channel") == "pong"
    assert found.pop("write") != "written" and left == [gateway_wire.SOCKET_NAME]
    assert len(found) == 2 * len(targets)
    assert {k: v for k, v in found.items() if v in ("connected", "answered")} == {}


@pytest.mark.slow
def test_the_wall_deadline_ends_a_case_timed_out(backend: Backend) -> None:
    labels = contract_labels()
    started = time.monotonic()
    result = backend.run(NAPS, labels=labels, wall_seconds=3)
    assert (result.timed_out, result.exit_code) == (True, None)
    assert result_blocks(result.stdout) == 0
    assert time.monotonic() - started < 3 + 15  # the nap takes 20 s
    assert present(backend.sandbox, labels) == []


def test_reap_removes_containers_by_label_and_spares_what_keep_keeps(backend: Backend) -> None:
    run_id, gate, other_gate = uuid.uuid4().hex, str(uuid.uuid4()), str(uuid.uuid4())
    ours = {"gate.contract": run_id}
    running = {
        case_id: backend.start(
            NAPS, labels={**ours, "gate.gate_id": gate_id, "gate.case_id": case_id}
        )
        for case_id, gate_id in (("a", gate), ("b", gate), ("c", other_gate))
    }

    def case_ids() -> set[str]:
        return {found["gate.case_id"] for found in present(backend.sandbox, ours)}

    wait_until(lambda: case_ids() == {"a", "b", "c"}, "the three case containers exist")
    kept: list[str] = []

    def keep_b(found: Mapping[str, str]) -> bool:
        kept.append(found["gate.case_id"])
        return found["gate.case_id"] == "b"

    # Both labels must match (c is of another gate), and keep spares b.
    assert backend.sandbox.reap({**ours, "gate.gate_id": gate}, keep=keep_b) == 1
    assert sorted(kept) == ["a", "b"]
    with pytest.raises(SandboxError) as removed:
        running["a"].result(timeout=SETTLE_SECONDS)
    assert not isinstance(removed.value, Halted)  # removed from outside, not halted
    assert case_ids() == {"b", "c"}
    assert backend.sandbox.reap(ours) == 2
    for case_id in ("b", "c"):
        with pytest.raises(SandboxError):
            running[case_id].result(timeout=SETTLE_SECONDS)
    assert case_ids() == set()
