"""The OCI runtime cases run under (issue 42): GATE_CASE_RUNTIME, checked at start-up, named in
the gate's JSON, and really the kernel a case sees.

CI runs this module twice (.ci/run): on the machine's engine (runc) and on a second engine
with runsc registered, under GATE_CASE_RUNTIME=runsc (.ci/runsc-engine), where a case's
kernel is gVisor's (its release reads 4.4.0), not the host's.
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

from gate_service.client.api import GateClient
from tests.fixtures.auth import ADMIN_TOKEN
from tests.fixtures.projects import bundle_of, write
from tests.fixtures.runtime import RUNTIME

pytestmark = pytest.mark.docker

# The release gVisor's Sentry reports to the code it runs, whatever the host's kernel.
GVISOR_RELEASE = "4.4.0"

KERNEL_PROJECT = {
    "agents/kernel.yaml": """
        version: "1.0"
        name: kernel
        description: Says which kernel answers its system calls.
        type: tool
        tool_name: probe.kernel
    """,
    "tools/probe.py": """
        import platform


        def kernel(payload: dict) -> dict:
            return {"release": platform.release()}
    """,
    "tests/kernel.yaml": """
        tests:
          - name: names_its_kernel
            payload: '{}'
            expected_result: output.release != ""
    """,
}


def test_a_runtime_the_engine_lacks_stops_the_start_naming_it(
    docker_engine: None, tmp_path: Path
) -> None:
    env = {
        **os.environ,
        "GATE_CASE_RUNTIME": "no-such-runtime",
        "GATE_DATA_DIR": str(tmp_path),
    }
    done = subprocess.run(
        [sys.executable, "-m", "gate_service.cli", "images"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 2, done.stderr[-2000:]
    assert "GATE_CASE_RUNTIME is 'no-such-runtime'" in done.stderr
    assert "daemon.json" in done.stderr and "Traceback" not in done.stderr


def test_the_gate_names_its_runtime_and_the_case_sees_that_kernel(
    gate_url: str, tmp_path: Path
) -> None:
    client = GateClient(gate_url, token=ADMIN_TOKEN)
    try:
        queued = client.submit(bundle_of(write(tmp_path / "kernel", KERNEL_PROJECT)))
        gate = client.wait(str(queued["id"]), timeout_s=600)
        assert gate["status"] == "passed", gate.get("failure_reason")
        info = client.gate(str(gate["id"]))
        (case,) = info["cases"]
        (run_id,) = case["agent_run_ids"]
        ran = client.run(str(run_id))
        release = ran.output["release"]
    finally:
        client.close()
    assert info["sandbox"]["backend"] == "docker"
    assert (ran.model_extra or {})["sandbox"] == info["sandbox"]  # the run's trace says it too
    if RUNTIME == "runsc":
        assert info["sandbox"]["runtime"] == "runsc"
        assert release == GVISOR_RELEASE  # gVisor's kernel, not the host's
    else:
        assert info["sandbox"]["runtime"] == (RUNTIME or "runc")
        assert release == platform.release()  # the host's kernel: runc shares it
