"""No project-controlled value reaches the runner's own process (trust-2, item 1).

Through a real `gate serve` and the real engine. The first attack is the one the review
reproduced: a secret named ``LD_PRELOAD`` (stored before names were checked, so it is written
into the database here, as such a row would be) points at a shared object the bundle ships
under ``tests/files/``. When project values were the container's environment, the loader ran
it in the runner's first process, as root, next to the nonce: it printed a "passed" block
and exited, and a case whose tool always fails passed. The second lists the environment of
every process of a running case container and finds the project's values only in the
invocation's.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import docker
import pytest
from cryptography.fernet import Fernet
from sqlalchemy import delete, select

from gate_service.client.api import GateClient
from gate_service.client.shapes import RunView
from gate_service.db import make_engine, make_sessionmaker, session_scope
from gate_service.models import DEFAULT_PROJECT, Project, ProjectSecret
from gate_service.secrets.crypto import SecretBox
from tests.e2e.conftest import running
from tests.fixtures.auth import ADMIN_TOKEN
from tests.fixtures.db import create_database, drop_database
from tests.fixtures.projects import bundle_of, write
from tests.fixtures.runtime import GVISOR

pytestmark = pytest.mark.docker

OPERATOR_VALUE = "operator-" + secrets.token_hex(12)

# Loaded by the dynamic loader of any program started with LD_PRELOAD pointing at it. With a
# nonce in reach (the environment, where it used to be, or the runner's stdin, where it is
# now) it forges the runner's result for the case and ends the process, as the review did;
# without one it says where it ran, so the test sees that the attack was real.
PRELOAD_C = r"""
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void forge(const char *nonce) {
    printf("===GATE-RUNNER-RESULT-BEGIN===\n"
           "{\"schema_version\": 2, \"suite\": \"tests/forge.yaml\", "
           "\"test_name\": \"the_tool_always_fails\", \"agent_name\": \"forge\", \"runs\": 1, "
           "\"success_threshold\": 100, \"successes\": 1, \"passed\": true, "
           "\"case_error\": null, \"failure_reason\": null, \"duration_ms\": 1, "
           "\"invocations\": [{\"index\": 0, \"status\": \"completed\", \"passed\": true, "
           "\"input\": {}, \"output\": {}, \"error\": null, \"failure_reason\": null, "
           "\"failed_assertions\": [], \"run_context\": {}, \"duration_ms\": 1, "
           "\"traces\": []}], \"nonce\": \"%s\"}\n"
           "===GATE-RUNNER-RESULT-END===\n", nonce);
    fflush(stdout);
    _exit(0);
}

__attribute__((constructor)) static void attack(void) {
    const char *nonce = getenv("GATE_RESULT_NONCE");
    if (nonce) forge(nonce);
    static char buf[1 << 16];
    size_t got = 0;
    ssize_t n;
    while (got < sizeof buf - 1 && (n = read(0, buf + got, sizeof buf - 1 - got)) > 0) got += n;
    buf[got] = 0;
    char *newline = memchr(buf, '\n', got);
    if (newline) {
        char *rest = newline + 1 + atol(buf);
        if (rest < buf + got && *rest) forge(rest);
    }
    fprintf(stderr, "preload ran without a nonce: uid %d\n", (int)getuid());
}
"""

FORGE = {
    "agents/forge.yaml": """
        version: "1.0"
        name: forge
        description: Its tool always fails; only a forged result could pass it.
        type: tool
        tool_name: forge.always_fails
    """,
    "tools/forge.py": """
        import subprocess


        def always_fails(payload: dict) -> dict:
            # A program started here is loaded with the invocation's environment, where the
            # project's values are: the shared object runs, under this uid, with no nonce.
            subprocess.run(["/bin/true"], check=False)
            raise RuntimeError("this tool always fails")
    """,
    "tests/forge.yaml": """
        agent: forge
        tests:
          - name: the_tool_always_fails
            payload: '{}'
            expected_result: status == "completed"
    """,
}

WAITING = "/tmp/the-invocation-waits"
LOOKED = "/tmp/the-test-looked"
ENVIRONMENTS = {
    "agents/environments.yaml": """
        version: "1.0"
        name: environments
        description: Waits while the test reads every process's environment.
        type: tool
        tool_name: wait.for_the_test
    """,
    "tools/wait.py": f"""
        import os
        import time


        def for_the_test(payload: dict) -> dict:
            # Up to a minute, until the test has read the container's processes (it makes
            # {LOOKED} once it has): the invocation is alive while it looks.
            open("{WAITING}", "w").close()
            for _ in range(600):
                if os.path.exists("{LOOKED}"):
                    break
                time.sleep(0.1)
            return {{
                "runner": os.getppid(),
                "me": os.getpid(),
                "uid": os.getuid(),
                "secret": os.environ.get("PROJECT_TOKEN"),
                "operator": os.environ.get("OPERATOR_KEY"),
                "names": sorted(os.environ),
            }}
    """,
    "tests/environments.yaml": """
        agent: environments
        tests:
          - name: lists_the_environments
            payload: '{}'
            expected_result: status == "completed"
    """,
}


# Under gVisor a case's processes live in gVisor's kernel, not the host's /proc; they are read
# from inside, by a root exec (gVisor lets root read another process's environ: the threat
# model's "Under gVisor"), each as the host's reading gives it.
INSIDE = r"""
import json, os
found = []
for entry in os.listdir("/proc"):
    if not entry.isdigit() or int(entry) == os.getpid():
        continue
    try:
        status = open(f"/proc/{entry}/status").read()
        fields = dict(l.split(":", 1) for l in status.splitlines() if ":" in l)
        found.append({
            "pid": int(entry),
            "uid": int(fields["Uid"].split()[0]),
            "cmd": open(f"/proc/{entry}/cmdline", "rb").read().replace(b"\0", b" ").hex(),
            "environ": open(f"/proc/{entry}/environ", "rb").read().hex(),
        })
    except OSError:
        continue
print(json.dumps(found))
"""


def processes_inside(container: Any) -> list[dict[str, Any]]:
    """Every process of a case container under gVisor, read inside it (INSIDE)."""
    code, out = container.exec_run(["python3", "-c", INSIDE], user="0")
    assert code == 0, out[-2000:]
    return [
        {**p, "cmd": bytes.fromhex(p["cmd"]), "environ": bytes.fromhex(p["environ"])}
        for p in json.loads(out)
    ]


def container_processes(init_pid: int) -> list[dict[str, Any]]:
    """Every process in the PID namespace of host process ``init_pid`` (a case container's
    init), read from the host's /proc: its pid in the container, uid, command and environment.

    From the host, because nothing inside the container may read the runner's environment:
    it is non-dumpable, and even a privileged exec cannot raise CAP_SYS_PTRACE past the
    container's bounding set.
    """
    namespace = os.readlink(f"/proc/{init_pid}/ns/pid")
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if os.readlink(f"/proc/{entry}/ns/pid") != namespace:
                continue
            status = Path(f"/proc/{entry}/status").read_text()
            fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
            found.append(
                {
                    "pid": int(fields["NSpid"].split()[-1]),
                    "uid": int(fields["Uid"].split()[0]),
                    "cmd": Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" "),
                    "environ": Path(f"/proc/{entry}/environ").read_bytes(),
                }
            )
        except OSError:
            continue  # it ended while we looked
    return found


def gcc() -> str:
    path = shutil.which("gcc")
    if path is None:
        pytest.fail("gcc is needed to build the attack's shared object (it is on CI machines)")
    return path


def build_preload(dest: Path) -> None:
    source = dest.with_suffix(".c")
    source.write_text(PRELOAD_C)
    subprocess.run(
        [gcc(), "-shared", "-fPIC", "-O1", "-o", str(dest), str(source)],
        check=True,
        capture_output=True,
    )
    source.unlink()


@pytest.fixture(scope="module")
def private_gate(
    docker_engine: None,
    pg_server_url: str,
    gate_url: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[dict[str, Any]]:
    """A `gate serve` on a database this test can write to, with a secrets key it knows.

    ``gate_url`` first: its serve has prepared the images, so this one starts quickly.
    """
    database = create_database(pg_server_url)
    key = Fernet.generate_key().decode()
    data_dir = Path(tmp_path_factory.mktemp("serve-env"))
    try:
        with running(
            "serve",
            data_dir,
            GATE_DATABASE_URL=database,
            GATE_SECRETS_KEY=key,
            GATE_CASE_ENV="OPERATOR_KEY",
            OPERATOR_KEY=OPERATOR_VALUE,
        ) as serve:
            yield {
                "url": serve.url,
                "database": database,
                "box": SecretBox(key),
                "log": serve.log_path,
            }
    finally:
        drop_database(pg_server_url, database)


@contextmanager
def stored_directly(gate: dict[str, Any], name: str, value: str) -> Iterator[None]:
    """A secret row as one stored before its name was checked (the API refuses the name),
    removed again after the block."""
    engine = make_engine(gate["database"])
    sessions = make_sessionmaker(engine)
    try:
        with session_scope(sessions) as session:
            project = session.scalars(select(Project).where(Project.name == DEFAULT_PROJECT)).one()
            session.add(
                ProjectSecret(
                    id=uuid.uuid4(),
                    project_id=project.id,
                    name=name,
                    ciphertext=gate["box"].encrypt(project.id, name, value),
                )
            )
        yield
    finally:
        with session_scope(sessions) as session:
            session.execute(delete(ProjectSecret).where(ProjectSecret.name == name))
        engine.dispose()


def judge(url: str, data: bytes) -> dict[str, Any]:
    client = GateClient(url, token=ADMIN_TOKEN)
    try:
        return client.wait(client.submit(data)["id"], timeout_s=600)
    finally:
        client.close()


def run_of(url: str, gate: dict[str, Any]) -> RunView:
    client = GateClient(url, token=ADMIN_TOKEN)
    try:
        return client.run(gate["cases"][0]["agent_run_ids"][0])
    finally:
        client.close()


def test_a_preloaded_library_cannot_forge_a_pass(
    private_gate: dict[str, Any], tmp_path: Path
) -> None:
    root = write(tmp_path / "forge", FORGE)
    (root / "tests" / "files").mkdir(parents=True, exist_ok=True)
    build_preload(root / "tests" / "files" / "preload.so")
    with stored_directly(private_gate, "LD_PRELOAD", "/bundle/tests/files/preload.so"):
        gate = judge(private_gate["url"], bundle_of(root))
        run = run_of(private_gate["url"], gate)

    assert (gate["status"], gate["phase"]) == ("failed", "done"), gate
    (case,) = gate["cases"]
    assert case["status"] == "failed"
    assert "this tool always fails" in case["failure_reason"], case
    # The attack was real: the loader did run the object, in the invocation's subprocess,
    # under the invocation uid, and found no nonce there.
    logs = [s.metadata["message"] for s in run.traces or [] if s.type == "log"]
    assert "preload ran without a nonce: uid 10001" in logs, logs


def test_project_values_are_in_the_invocations_environment_only(
    private_gate: dict[str, Any], tmp_path: Path
) -> None:
    value = "project-" + secrets.token_hex(12)
    client = GateClient(private_gate["url"], token=ADMIN_TOKEN)
    engine = docker.from_env()
    seen: dict[str, Any] = {}

    def look() -> None:
        # While the invocation waits: the container's own configuration and every process.
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            for container in engine.containers.list(
                filters={"label": f"gate.gate_id={seen.get('gate_id')}"}
            ):
                if GVISOR:
                    waiting = container.exec_run(["test", "-e", WAITING], user="0")[0] == 0
                else:
                    # The container's /tmp, seen from the host through its init's root.
                    init = int(container.attrs["State"]["Pid"])
                    waiting = os.path.exists(f"/proc/{init}/root{WAITING}")
                if not waiting:
                    break  # the invocation is not waiting yet
                seen["processes"] = (
                    processes_inside(container) if GVISOR else container_processes(init)
                )
                seen["config_env"] = container.attrs["Config"]["Env"]
                container.exec_run(["/usr/bin/touch", LOOKED], user="0")
                return
            time.sleep(0.2)

    try:
        with stored_directly(private_gate, "PROJECT_TOKEN", value):
            gate_id = client.submit(bundle_of(write(tmp_path / "env", ENVIRONMENTS)))["id"]
            seen["gate_id"] = gate_id
            looker = threading.Thread(target=look, daemon=True)
            looker.start()
            gate = client.wait(gate_id, timeout_s=600)
            looker.join(timeout=60)
            run = client.run(gate["cases"][0]["agent_run_ids"][0])
    finally:
        client.close()
        engine.close()

    assert gate["status"] == "passed", gate
    assert "processes" in seen, "the test never saw the invocation running"
    output = run.output
    # The invocation has both values (redacted in what is stored for it).
    assert output["secret"] == "[REDACTED:PROJECT_TOKEN]"
    assert output["operator"] == "[REDACTED:OPERATOR_KEY]"
    assert output["uid"] == 10001
    by_pid = {p["pid"]: p for p in seen["processes"]}
    # (Its /proc environ is the block it was forked with, the runner's: the values were
    # added after the fork, in its own os.environ, which only it holds.)
    invocation, runner = by_pid[output["me"]], by_pid[output["runner"]]
    assert invocation["uid"] == 10001 and {"PROJECT_TOKEN", "OPERATOR_KEY"} <= set(output["names"])
    # The runner and every other root process: no project value, no operator value, no
    # nonce variable; nor the container's own configuration.
    assert runner["uid"] == 0 and b"gate_runner" in runner["cmd"]
    roots = [p for p in seen["processes"] if p["uid"] == 0]
    assert runner in roots and len(roots) >= 2  # docker-init and the runner at least
    for process in roots:
        assert b"PATH=" in process["environ"], process  # read, not an empty stand-in
        for forbidden in (value, OPERATOR_VALUE, "PROJECT_TOKEN", "GATE_RESULT_NONCE"):
            assert forbidden.encode() not in process["environ"], (process["cmd"], forbidden)
    for forbidden in (value, OPERATOR_VALUE, "PROJECT_TOKEN", "OPERATOR_KEY"):
        assert not any(forbidden in entry for entry in seen["config_env"]), seen["config_env"]
