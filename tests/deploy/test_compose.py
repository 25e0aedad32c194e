"""`docker compose up` for real: the repository's Dockerfile and docker-compose.yml.

Postgres, the API and a worker start from the compose file as a user would start them (the
registry images are local stand-ins, see standins.py; the service image is built from the
Dockerfile with BuildKit, the machine's CA bundle as its optional `extra_ca` build secret).
A passing project is judged through the published port, the workers scale to two, a
running gate is cancelled, and a live gate finds no key and no way out (tests/fixtures/
escape.py's project, as tests/e2e/test_live_gateway.py submits it to `gate serve`): its
model answers from a fake provider on this host through the worker's gateway, while its
cases reach nothing by TCP or UDP, not the services of the compose network nor the host's
address on it. `down -v` removes everything the project made, pass or fail.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import docker
import httpx
import pytest
from cryptography.fernet import Fernet

from gate_service.client.api import GateClient
from tests.deploy.compose import (
    COMPOSE_FILE,
    HOST_CA_BUNDLE,
    Compose,
    build_service_image,
    buildkit_docker,
    compose_command,
    container_state,
)
from tests.deploy.standins import ensure_standins
from tests.fixtures.auth import bearer, project_token
from tests.fixtures.escape import (
    ESCAPE_CASES,
    CaseNetworks,
    assert_no_network,
    case_statuses,
    container_address,
    escape_project,
    failure_reasons,
    neighbour,
    network_gateway,
    wait_answering,
)
from tests.fixtures.fake_llm import FakeProvider
from tests.fixtures.ports import free_port
from tests.fixtures.projects import bundle_of, calculator_project, write

pytestmark = pytest.mark.docker

SERVICE_IMAGE = "gate-compose-test:latest"
# A cold start builds the runner image inside the worker (its wheels fetched from the index).
READY_SECONDS = 300
VERDICT_SECONDS = 600
WORKER_METRICS_PORT = 9101

SLOW_PROJECT = {
    "agents/sleeper.yaml": """
        version: "1.0"
        name: sleeper
        description: Sleeps as long as it is told.
        type: tool
        tool_name: slow.nap
    """,
    "tools/slow.py": """
        import time


        def nap(payload: dict) -> dict:
            time.sleep(payload["seconds"])
            return {"slept": payload["seconds"]}
    """,
    "tests/sleeper.yaml": """
        agent: sleeper
        tests:
          - name: naps_long
            payload: '{"seconds": 240}'
            timeout_s: 300
            expected_result: output.slept == 240
    """,
}


def unavailable(why: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(f"CI must be able to run the compose test: {why}")
    pytest.skip(why)


class Timings:
    def __init__(self) -> None:
        self.start = self.last = time.monotonic()
        self.steps: list[str] = []

    def mark(self, step: str) -> None:
        now = time.monotonic()
        self.steps.append(f"{step}: {now - self.last:.1f} s")
        self.last = now

    def report(self) -> str:
        total = time.monotonic() - self.start
        return "; ".join([*self.steps, f"total: {total:.1f} s"])


@pytest.fixture
def compose(
    docker_engine: None, tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[tuple[Compose, str, str, Timings]]:
    """The compose project up and ready: (compose, API URL, admin token, timings)."""
    docker = buildkit_docker()
    if docker is None:
        unavailable("no docker CLI with BuildKit (docker buildx, or a classic client < 23)")
    command = compose_command()
    if command is None:
        unavailable("neither `docker compose` nor `docker-compose` is installed")
    assert docker is not None and command is not None
    if os.geteuid() != 0:
        unavailable("the stand-in images need root (debootstrap)")

    timings = Timings()
    ensure_standins()
    timings.mark("stand-ins")
    extra_ca = HOST_CA_BUNDLE if HOST_CA_BUNDLE.exists() else None
    build_service_image(docker, SERVICE_IMAGE, extra_ca=extra_ca)
    timings.mark("service image")

    # What users add: a worker serving its /metrics (a listener on its address, which the
    # live step's cases must not reach), and behind a TLS proxy the CA bundle, since the
    # worker fetches the runner's (and bundles') wheels from the index at run time.
    override = tmp_path / "docker-compose.test.yml"
    lines = [
        "services:",
        "  worker:",
        "    environment:",
        f'      GATE_WORKER_METRICS_PORT: "{WORKER_METRICS_PORT}"',
    ]
    if extra_ca is not None:
        lines += [
            "      PIP_CERT: /etc/gate/ca-bundle.crt",
            "    volumes:",
            f"      - {extra_ca}:/etc/gate/ca-bundle.crt:ro",
        ]
    override.write_text("\n".join(lines) + "\n")
    files = [COMPOSE_FILE, override]

    port = free_port("0.0.0.0")  # docker publishes it on every address
    token = secrets.token_urlsafe(24)
    env = {k: v for k, v in os.environ.items() if not k.startswith("GATE_")}
    env.update(
        {
            "GATE_IMAGE": SERVICE_IMAGE,
            "GATE_PORT": str(port),
            "GATE_DB_PASSWORD": secrets.token_urlsafe(16),
            "GATE_BOOTSTRAP_TOKEN": token,
            "GATE_SECRETS_KEY": Fernet.generate_key().decode(),
        }
    )
    project = Compose(command, f"gatecompose{uuid.uuid4().hex[:10]}", files, env)
    url = f"http://127.0.0.1:{port}"
    failed_before = request.session.testsfailed
    passed = False
    try:
        project.run("up", "-d", "--no-build")
        wait_ready(project, url)
        timings.mark("up and ready")
        yield project, url, token, timings
        # A failing test is not raised in here: its report is counted before teardown.
        passed = request.session.testsfailed == failed_before
    finally:
        if not passed:
            print(f"compose logs of {project.project}:\n{project.logs()}")
        project.run("down", "-v", "--remove-orphans", "--timeout", "20", check=False)
        print(f"compose test timings: {timings.report()}")


def wait_ready(project: Compose, url: str) -> None:
    deadline = time.monotonic() + READY_SECONDS
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/readyz", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        for cid in project.container_ids("api"):
            state = container_state(cid)
            if state["status"] in ("exited", "dead"):
                raise AssertionError(f"the api container exited: {state}")
        time.sleep(1)
    raise AssertionError(f"{url}/readyz not ready within {READY_SECONDS} s")


def wait_phase(client: GateClient, gate_id: str, phase: str, timeout_s: float) -> dict[str, object]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        gate = client.gate(gate_id)
        if gate["phase"] == phase or gate["status"] in ("passed", "failed", "error", "cancelled"):
            return gate
        time.sleep(0.5)
    raise AssertionError(f"gate {gate_id} did not reach {phase} within {timeout_s} s")


def assert_no_case_containers(gate_id: str, timeout_s: float) -> None:
    argv = ["docker", "ps", "-aq", "--filter", f"label=gate.gate_id={gate_id}"]
    deadline = time.monotonic() + timeout_s
    while True:
        left = subprocess.run(argv, capture_output=True, text=True, check=True).stdout.split()
        if not left:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"case containers of cancelled gate {gate_id} remain: {left}")
        time.sleep(1)


def test_compose_up_judges_scales_and_cancels(
    compose: tuple[Compose, str, str, Timings], tmp_path: Path
) -> None:
    project, url, token, timings = compose
    client = GateClient(url, token=token)
    try:
        gate = client.submit(bundle_of(calculator_project(tmp_path / "calc", failing=False)))
        gate = client.wait(gate["id"], timeout_s=VERDICT_SECONDS)
        assert gate["status"] == "passed", gate
        assert gate["total_cases"] == gate["passed_cases"] > 0, gate
        timings.mark("first verdict")

        project.run("up", "-d", "--no-build", "--scale", "worker=2")
        workers = project.container_ids("worker")
        assert len(workers) == 2, workers
        timings.mark("scaled to two workers")

        slow = client.submit(bundle_of(write(tmp_path / "slow", SLOW_PROJECT)))
        running = wait_phase(client, slow["id"], "running_tests", VERDICT_SECONDS)
        assert running["status"] == "running", running
        client.cancel(slow["id"])
        ended = client.wait(slow["id"], timeout_s=120)
        assert ended["status"] == "cancelled", ended
        # The worker stopped its case container on the host's engine, through the socket.
        assert_no_case_containers(slow["id"], timeout_s=60)
        timings.mark("cancelled a running gate")

        live_gate_finds_no_key_and_no_way_out(project, url, token, tmp_path / "live")
        timings.mark("live gate: no key, no way out")

        # Both workers still up, and nothing restarted along the way (a crash would have).
        for service in ("db", "api", "worker"):
            for cid in project.container_ids(service):
                state = container_state(cid)
                assert state["status"] == "running" and state["restarts"] == "0", (service, state)
    finally:
        client.close()


def live_gate_finds_no_key_and_no_way_out(
    project: Compose, url: str, admin_token: str, root: Path
) -> None:
    """A live gate through the compose shape's gateway (issue 20, item 2): the provider, on
    this host, is reached by the worker at the host's address on the compose network; every
    address that answers this host (checked first, so each probe can fail) is one its cases
    must not reach, and neither must a neighbour container on the bridge and the compose
    network, standing in for a case container a misconfiguration left there."""
    api_port = int(url.rsplit(":", 1)[1])
    engine = docker.from_env()
    provider = FakeProvider(host="0.0.0.0")
    try:
        host = network_gateway(engine, project.network)  # the host, seen from the services
        bridge = network_gateway(engine)

        def on_network(service: str, port: int) -> list[tuple[str, int]]:
            return [
                (container_address(engine, cid, project.network), port)
                for cid in project.container_ids(service)
            ]

        answering = [
            (host, api_port),  # the published API
            (host, provider.port),  # the provider
            (bridge, api_port),
            (bridge, provider.port),
            *on_network("api", 8080),
            *on_network("db", 5432),
            *on_network("worker", WORKER_METRICS_PORT),  # each worker's /metrics
        ]
        wait_answering(answering)
        key = f"sk-{secrets.token_hex(16)}"
        secrets_of_live = {
            "OPENAI_API_KEY": key,
            # What the worker's gateway calls: the provider at the host's address there.
            "OPENAI_API_BASE": f"http://{host}:{provider.port}/v1",
        }
        with httpx.Client(base_url=url, headers=bearer(admin_token), timeout=60) as admin:
            token = project_token(admin, "live", ["submit", "read"])
            for name, value in secrets_of_live.items():
                r = admin.put(f"/v1/projects/live/secrets/{name}", json={"value": value})
                assert r.status_code == 201, r.text
        live = GateClient(url, token=token)
        try:
            with neighbour(("bridge", project.network)) as other, CaseNetworks() as networks:
                targets = [
                    ("169.254.169.254", 80),
                    *answering,
                    *other.targets(),
                    ("127.0.0.1", api_port),
                    ("1.1.1.1", 443),
                    ("1.1.1.1", 53),
                ]
                gate = live.submit(escape_project(root, key, targets))
                done = live.wait(gate["id"], timeout_s=VERDICT_SECONDS)
        finally:
            live.close()
    finally:
        provider.close()
        engine.close()
    assert case_statuses(done) == dict.fromkeys(ESCAPE_CASES, "passed"), failure_reasons(done)
    assert done["status"] == "passed", done
    assert_no_network(networks, done)
    # The gate's one model call reached the provider, with the project's key.
    assert [auth for auth, _ in provider.calls] == [f"Bearer {key}"]
    totals = done["model_calls"]
    assert (totals["calls"], totals["tokens_in"], totals["tokens_out"]) == (1, 3, 4), totals
    calls = {case["test_name"]: case["model_calls"]["calls"] for case in done["cases"]}
    assert calls == {**dict.fromkeys(ESCAPE_CASES, 0), "answers": 1}, calls
