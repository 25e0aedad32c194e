"""A bundle that attacks the gate's verdict, through the real service and the real engine.

One gate, one case per attack (the trust issue): each case is built so that it passes only
if the defence holds, or fails only because the attack did not work, and the test reads the
reason and the run's output to tell which.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from gate_service.client.api import GateClient
from tests.fixtures.auth import ADMIN_TOKEN, bearer
from tests.fixtures.projects import bundle_of, write
from tests.fixtures.runtime import GVISOR

pytestmark = pytest.mark.docker

OUTPUT_LIMIT = 8 * 1024 * 1024  # GATE_CASE_INVOCATION_OUTPUT_LIMIT_BYTES's default


def tool_agent(name: str) -> str:
    return f"""
        version: "1.0"
        name: {name}
        description: An attack on the gate.
        type: tool
        tool_name: attacks.{name.replace("-", "_")}
    """


ATTACKS = {
    "requirements.txt": "gate-takeover==1.0\n",
    **{
        f"agents/{name}.yaml": tool_agent(name)
        for name in (
            "forge-result-file",
            "reach-the-runner",
            "start-a-daemon",
            "print-200-mb",
            "fill-tmp",
            "read-limits",
            "look-for-the-nonce",
            "takeover-wheel",
            "fork-chain",
            "reach-the-network",
        )
    },
    "tools/attacks.py": r"""
        import ctypes
        import json
        import os
        import resource
        import signal
        import subprocess
        import sys
        import time

        BLOCK = (
            "===GATE-RUNNER-RESULT-BEGIN===\n"
            + json.dumps({"schema_version": 2, "passed": True, "successes": 1})
            + "\n===GATE-RUNNER-RESULT-END===\n"
        )


        def forge_result_file(payload: dict) -> dict:
            # Where the old runner kept an invocation's result: a file in its work directory.
            for place in ("/tmp/result.json", os.path.join(os.getcwd(), "result.json")):
                try:
                    with open(place, "w") as fh:
                        json.dump({"status": "completed", "output": {"sum": 5}}, fh)
                except OSError:
                    pass
            os._exit(0)


        def _attempt(fn):
            try:
                fn()
                return "allowed"
            except OSError as exc:
                return type(exc).__name__


        def _environ_names(pid):
            try:
                with open(f"/proc/{pid}/environ", "rb") as fh:
                    entries = fh.read().split(b"\0")
            except OSError:
                return None
            return sorted(e.split(b"=", 1)[0].decode() for e in entries if e)


        def reach_the_runner(payload: dict) -> dict:
            runner = os.getppid()
            libc = ctypes.CDLL(None, use_errno=True)

            def ptrace():
                if libc.ptrace(16, runner, 0, 0) != 0:  # PTRACE_ATTACH
                    raise OSError(ctypes.get_errno(), "ptrace")

            with open("/proc/self/status") as fh:
                status = dict(line.split(":", 1) for line in fh)
            return {
                "write_runner_stdout": _attempt(
                    lambda: open(f"/proc/{runner}/fd/1", "w").write(BLOCK)
                ),
                "write_init_stdout": _attempt(lambda: open("/proc/1/fd/1", "w").write(BLOCK)),
                "read_runner_environ": _attempt(
                    lambda: open(f"/proc/{runner}/environ").read()
                ),
                # What it holds, where it can be read (gVisor lets it be): names only.
                "runner_environ_names": _environ_names(runner),
                "own_environ_names": sorted(os.environ),
                "read_runner_memory": _attempt(lambda: open(f"/proc/{runner}/mem", "rb").read(1)),
                "signal_runner": _attempt(lambda: os.kill(runner, signal.SIGSTOP)),
                "signal_init": _attempt(lambda: os.kill(1, signal.SIGKILL)),
                "setuid_root": _attempt(lambda: os.setuid(0)),
                "ptrace_runner": _attempt(ptrace),
                "uid": os.getuid(),
                "cap_eff": status["CapEff"].strip(),
                "cap_prm": status["CapPrm"].strip(),
                "impossible": False,
            }


        def reach_the_network(payload: dict) -> dict:
            # Docker's default bridge gateway (the host), a private and a public address, by
            # TCP and UDP: with no network each must be unreachable, not refused or timed out.
            import errno
            import socket

            targets = [("172.17.0.1", 2375), ("10.0.0.1", 80), ("1.1.1.1", 53)]
            outcomes = {}
            for host, port in targets:
                for kind in (socket.SOCK_STREAM, socket.SOCK_DGRAM):
                    name = f"{'tcp' if kind == socket.SOCK_STREAM else 'udp'} {host}:{port}"
                    with socket.socket(socket.AF_INET, kind) as sock:
                        sock.settimeout(3)
                        try:
                            if kind == socket.SOCK_STREAM:
                                sock.connect((host, port))
                            else:
                                sock.sendto(b"x", (host, port))
                            outcomes[name] = "sent"
                        except OSError as exc:
                            # runc's kernel says ENETUNREACH, gVisor's EHOSTUNREACH: no route
                            # either way (a refusal or a timeout would mean a way out).
                            unreachable = exc.errno in (errno.ENETUNREACH, errno.EHOSTUNREACH)
                            outcomes[name] = "unreachable" if unreachable else str(exc)
            with open("/proc/net/route") as fh:
                routes = len(fh.read().splitlines()[1:])
            # Loopback works, by address and by the name `localhost` (no /etc/hosts here).
            with socket.socket() as server:
                server.bind(("127.0.0.1", 0))
                server.listen()
                try:
                    socket.create_connection(("localhost", server.getsockname()[1]), 3).close()
                    localhost = "ok"
                except OSError as exc:
                    localhost = str(exc)
            return {
                "localhost": localhost,
                "interfaces": sorted(name for _, name in socket.if_nameindex()),
                "routes": routes,
                "reached": sorted(k for k, v in outcomes.items() if v != "unreachable"),
                "outcomes": outcomes,
            }


        def start_a_daemon(payload: dict) -> dict:
            marker = "/tmp/daemon.pid"
            if os.path.exists(marker):
                pid = int(open(marker).read())
                try:
                    os.kill(pid, 0)
                    alive = True
                except ProcessLookupError:
                    alive = False
                return {"checked": pid, "alive": alive}
            daemon = subprocess.Popen(
                [sys.executable, "-c", "import time\nwhile True: time.sleep(1)"],
                start_new_session=True,  # setsid(): out of the invocation's process group
            )
            with open(marker, "w") as fh:
                fh.write(str(daemon.pid))
            return {"started": daemon.pid, "alive": False}


        def print_200_mb(payload: dict) -> str:
            line = "x" * (1024 * 1024 - 1) + "\n"
            for _ in range(200):
                sys.stdout.write(line)
            sys.stdout.flush()
            return "done"


        def fill_tmp(payload: dict) -> str:
            chunk = b"\0" * (1024 * 1024)
            for n in range(1000):
                try:
                    with open(f"/tmp/fill-{n}", "wb") as fh:
                        for _ in range(8):
                            fh.write(chunk)
                except OSError:
                    return "full"
            return "never full"


        def read_limits(payload: dict) -> dict:
            with open("/proc/1/cmdline", "rb") as fh:
                pid1 = fh.read().replace(b"\0", b" ").decode()
            return {
                "nofile": resource.getrlimit(resource.RLIMIT_NOFILE)[1],
                "core": resource.getrlimit(resource.RLIMIT_CORE)[1],
                "fsize": resource.getrlimit(resource.RLIMIT_FSIZE)[1],
                "pid1": pid1,
            }


        def look_for_the_nonce(payload: dict) -> dict:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(4, 1, 0, 0, 0)  # PR_SET_DUMPABLE 1: make our own /proc files readable
            with open("/proc/self/environ", "rb") as fh:
                own = fh.read()
            fds = []
            for fd in range(256):
                try:
                    os.fstat(fd)
                    fds.append(fd)
                except OSError:
                    pass
            # Where the nonce waits now: the runner's stdin (and so init's), never ours.
            return {
                "in_environ": "GATE_RESULT_NONCE" in os.environ,
                "in_own_proc_environ": b"GATE_RESULT_NONCE" in own,
                "open_fds": fds,
                "own_stdin": os.read(0, 4096).decode(errors="replace"),
                "runner_stdin": _attempt(lambda: open(f"/proc/{os.getppid()}/fd/0", "rb").read()),
                "init_stdin": _attempt(lambda: open("/proc/1/fd/0", "rb").read()),
            }


        def fork_chain(payload: dict) -> dict:
            # A process that keeps moving to a new pid: fork, and the parent exits.
            me = os.getpid()
            others = []
            for entry in os.listdir("/proc"):
                if entry.isdigit() and int(entry) != me:
                    try:
                        with open(f"/proc/{entry}/status") as fh:
                            if any(l.split()[1:2] == ["10001"] for l in fh if l.startswith("Uid:")):
                                others.append(int(entry))
                    except OSError:
                        pass
            if os.path.exists("/tmp/chain-started"):
                return {"others": len(others)}
            open("/tmp/chain-started", "w").close()
            if os.fork() == 0:
                os.setsid()
                while True:
                    try:
                        if os.fork() > 0:
                            os._exit(0)
                    except OSError:
                        pass
            return {"others": 0}


        def takeover_wheel(payload: dict) -> dict:
            import gate_runner.verdict
            import gate_takeover

            return {
                "pth": os.environ.get("GATE_TAKEOVER_PTH"),
                "verdict": gate_runner.verdict.__file__,
                "installed_at": gate_takeover.__file__,
                "impossible": False,
            }
    """,
    "tests/forge-result-file.yaml": """
        tests:
          - name: forged_result_file_does_not_pass
            payload: '{}'
            expected_result: output.sum == 5
    """,
    "tests/reach-the-runner.yaml": """
        tests:
          - name: forged_stdout_does_not_pass
            payload: '{}'
            expected_result: output.impossible == true
          - name: the_runner_is_out_of_reach
            payload: '{}'
            expected_result: >-
              output.write_runner_stdout == "PermissionError"
              and output.write_init_stdout == "PermissionError"
              and output.read_runner_memory == "PermissionError"
              and output.signal_runner == "PermissionError"
              and output.signal_init == "PermissionError"
              and output.setuid_root == "PermissionError"
              and output.ptrace_runner == "PermissionError"
              and output.uid == 10001
              and output.cap_eff == "0000000000000000"
              and output.cap_prm == "0000000000000000"
    """,
    "tests/start-a-daemon.yaml": """
        tests:
          - name: a_daemon_does_not_outlive_its_invocation
            payload: '{}'
            runs: 2
            expected_result: output.alive == false
    """,
    "tests/print-200-mb.yaml": """
        tests:
          - name: printing_200_mb_names_the_output_limit
            payload: '{}'
            timeout_s: 60
            expected_result: output == "done"
    """,
    "tests/fill-tmp.yaml": """
        tests:
          - name: a_full_tmp_is_named
            payload: '{}'
            timeout_s: 60
            expected_result: output == "full"
    """,
    "tests/read-limits.yaml": """
        tests:
          - name: ulimits_and_an_init
            payload: '{}'
            expected_result: >-
              output.nofile == 1024 and output.core == 0 and output.fsize == 67108864
              and "docker-init" in output.pid1
    """,
    "tests/look-for-the-nonce.yaml": """
        tests:
          - name: the_nonce_is_out_of_reach
            payload: '{}'
            expected_result: >-
              output.in_environ == false and output.in_own_proc_environ == false
              and output.own_stdin == "" and output.runner_stdin != "allowed"
              and output.init_stdin != "allowed"
    """,
    "tests/reach-the-network.yaml": """
        tests:
          - name: the_network_is_out_of_reach
            payload: '{}'
            expected_result: >-
              output.interfaces == ["lo"] and output.routes == 0 and output.reached == []
              and output.localhost == "ok"
    """,
    "tests/fork-chain.yaml": """
        tests:
          - name: a_fork_chain_does_not_outlive_its_invocation
            payload: '{}'
            runs: 2
            expected_result: output.others == 0
    """,
    "tests/takeover-wheel.yaml": """
        tests:
          - name: a_wheel_cannot_take_over_the_runner
            payload: '{}'
            expected_result: >-
              output.pth == null and "/opt/gate-runner/src/gate_runner/verdict.py" == output.verdict
              and "/opt/bundle-deps/" in output.installed_at
          - name: a_shadowed_verdict_does_not_pass
            payload: '{}'
            expected_result: output.impossible == true
    """,
}


@pytest.fixture(scope="module")
def attacked(gate_url: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The gate over the attack bundle, judged once for every test here."""
    client = GateClient(gate_url, token=ADMIN_TOKEN)
    try:
        data = bundle_of(write(tmp_path_factory.mktemp("attacks") / "p", ATTACKS))
        gate = client.submit(data)
        return dict(client.wait(gate["id"], timeout_s=900))
    finally:
        client.close()


def case(gate: dict[str, Any], name: str) -> dict[str, Any]:
    found = [c for c in gate["cases"] if c["test_name"] == name]
    assert found, f"no case {name} in {gate}"
    return dict(found[0])


def first_run(url: str, c: dict[str, Any]) -> dict[str, Any]:
    return dict(
        httpx.get(f"{url}/v1/runs/{c['agent_run_ids'][0]}", headers=bearer(ADMIN_TOKEN)).json()
    )


def test_the_gate_fails_on_the_failing_attacks(attacked: dict[str, Any]) -> None:
    assert (attacked["status"], attacked["phase"]) == ("failed", "done"), attacked


def test_a_forged_result_file_and_os_exit_fail_the_case(attacked: dict[str, Any]) -> None:
    c = case(attacked, "forged_result_file_does_not_pass")
    assert (c["status"], c["passed"], c["successes"]) == ("failed", False, 0)
    assert "exited with code 0 before reporting" in c["failure_reason"]


def test_a_block_written_to_the_runners_stdout_never_arrives(
    gate_url: str, attacked: dict[str, Any]
) -> None:
    c = case(attacked, "forged_stdout_does_not_pass")
    assert (c["status"], c["passed"]) == ("failed", False)
    # The runner's own verdict, not a refused forgery: the write never reached stdout.
    assert "`output.impossible == true`" in c["failure_reason"]
    assert "not trusted" not in c["failure_reason"]
    output = first_run(gate_url, c)["output"]
    assert output["write_runner_stdout"] == "PermissionError", output


def test_user_code_cannot_reach_the_runner(gate_url: str, attacked: dict[str, Any]) -> None:
    c = case(attacked, "the_runner_is_out_of_reach")
    output = first_run(gate_url, c)["output"]
    assert c["passed"], (c["failure_reason"], output)
    if GVISOR:
        # gVisor lets a process read a non-dumpable process's environ (runc's kernel does
        # not): the runner's holds the image's fixed environment alone, no name of the
        # case's (docs/threat-model.md, "Under gVisor").
        assert output["read_runner_environ"] in ("PermissionError", "allowed"), output
        names = output["runner_environ_names"] or []
        assert set(names) <= set(output["own_environ_names"]), output
        assert not [n for n in names if n.startswith("GATE_")], output
    else:
        assert output["read_runner_environ"] == "PermissionError", output
        assert output["runner_environ_names"] is None, output


def test_a_case_has_no_network_but_loopback_and_localhost(
    gate_url: str, attacked: dict[str, Any]
) -> None:
    c = case(attacked, "the_network_is_out_of_reach")
    output = first_run(gate_url, c)["output"]
    assert c["passed"], (c["failure_reason"], output)
    assert set(output["outcomes"].values()) == {"unreachable"}, output


def test_a_setsid_daemon_is_gone_before_the_next_invocation(
    gate_url: str, attacked: dict[str, Any]
) -> None:
    c = case(attacked, "a_daemon_does_not_outlive_its_invocation")
    assert c["passed"], c["failure_reason"]
    second = httpx.get(
        f"{gate_url}/v1/runs/{c['agent_run_ids'][1]}", headers=bearer(ADMIN_TOKEN)
    ).json()
    assert second["output"]["alive"] is False and "checked" in second["output"]


def test_a_fork_chain_is_gone_before_the_next_invocation(
    gate_url: str, attacked: dict[str, Any]
) -> None:
    c = case(attacked, "a_fork_chain_does_not_outlive_its_invocation")
    assert c["passed"], c["failure_reason"]


def test_printing_200_mb_is_cut_and_named(attacked: dict[str, Any]) -> None:
    c = case(attacked, "printing_200_mb_names_the_output_limit")
    assert (c["status"], c["passed"]) == ("failed", False)
    reason = c["failure_reason"]
    assert f"printed more than {OUTPUT_LIMIT} bytes (stdout and stderr); the rest was dropped" in (
        reason
    )
    assert "exit code 70" not in reason


def test_a_full_tmp_is_reported_as_scratch_space(attacked: dict[str, Any]) -> None:
    c = case(attacked, "a_full_tmp_is_named")
    assert (c["status"], c["passed"]) == ("failed", False)
    assert "the case's scratch space (/tmp, 64 MB) is full" in c["failure_reason"]


def test_ulimits_are_set_and_an_init_reaps(gate_url: str, attacked: dict[str, Any]) -> None:
    c = case(attacked, "ulimits_and_an_init")
    assert c["passed"], (c["failure_reason"], first_run(gate_url, c)["output"])


def test_user_code_never_holds_the_nonce(gate_url: str, attacked: dict[str, Any]) -> None:
    c = case(attacked, "the_nonce_is_out_of_reach")
    assert c["passed"], c["failure_reason"]
    # stdin, stdout, stderr and the report channel; nothing of the runner's.
    assert first_run(gate_url, c)["output"]["open_fds"] == [0, 1, 2, 3]


def test_a_wheel_cannot_replace_the_runner_or_run_a_pth(
    gate_url: str, attacked: dict[str, Any]
) -> None:
    c = case(attacked, "a_wheel_cannot_take_over_the_runner")
    assert c["passed"], (c["failure_reason"], first_run(gate_url, c)["output"])
    shadowed = case(attacked, "a_shadowed_verdict_does_not_pass")
    assert (shadowed["status"], shadowed["passed"]) == ("failed", False)
