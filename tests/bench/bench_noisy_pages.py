"""Benchmark: a project's trivial gate while another project's cases make the gateway read
the most expensive pages there are (run: python -m tests.bench.bench_noisy_pages).

Starts `gate serve` (on GATE_TEST_DATABASE_URL, else its embedded Postgres) with its default
settings and the real Docker engine, and a page server on 127.0.0.1 that answers 2 MiB
(MAX_PAGE_BYTES) of each hostile shape in tests/fixtures/hostile_pages.py that costs the
gateway's page reader the most. Project `noisy` has 127.0.0.1 on its egress allowlist; its
gate's cases each read those pages through web_read_page (so through the worker's gateway,
which fetches and converts them) over and over for NOISE_S seconds. Project `quiet` has a
gate of one trivial case.

It times the quiet gate, POST to verdict, REPEATS times on the idle service (the baseline,
in the same run), then REPEATS times while the noisy gate runs (resubmitted if it ends
first), and prints both medians and their ratio against the target: within 2x. It also
prints how many hostile pages the noisy cases read meanwhile. Figures only: nothing is
asserted; they depend on the machine and on what else runs on it.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx

from gate_service.client.api import GateClient
from gate_service.page_reader import NICENESS
from tests.e2e.conftest import start, stop, wait_ready
from tests.fixtures.auth import ADMIN_TOKEN, bearer, project_token
from tests.fixtures.db import create_database, drop_database
from tests.fixtures.hostile_pages import WORST
from tests.fixtures.ports import free_port
from tests.fixtures.projects import bundle_of, write

# The shapes that cost the gateway the most CPU per page (tests/unit/test_page_text.py):
# dense tags for libxml2 and the scan, a tree past libxml2's depth limit (read by the scan
# alone after libxml2 gave up), a tag past the attribute limit, and dense references.
SHAPES = (
    "p_i_nesting",
    "deep_then_links",
    "paragraphs",
    "a_nesting",
    "one_name_many_times",
    "tags_past_the_attribute_limit",
    "entities",
    "lt",
)
NOISY_CASES = 8
NOISE_S = 120
REPEATS = 5
# Under noise the quiet gate runs at least REPEATS times and for at least this long.
NOISY_WINDOW_S = 40
TARGET = 2.0

QUIET = {
    "agents/echo.yaml": """
        version: "1.0"
        name: echo
        description: Answers what it is given.
        type: tool
        tool_name: echo.answer
    """,
    "tools/echo.py": """
        def answer(payload: dict) -> dict:
            return {"said": payload}
    """,
    "tests/echo.yaml": """
        agent: echo
        tests:
          - name: answers
            payload: '{"hello": "world"}'
            expected_result: status == "completed"
    """,
}


def noisy_project(root: Path, urls: list[str], cases: int, seconds: int) -> bytes:
    payload = json.dumps({"urls": urls, "seconds": seconds})
    files = {
        "agents/reader.yaml": """
            version: "1.0"
            name: reader
            description: Reads pages, over and over.
            type: tool
            tool_name: web.read
        """,
        "tools/web.py": """
            import time

            from connic.tools import web_read_page


            async def read(payload: dict) -> dict:
                pages = chars = 0
                until = time.monotonic() + payload["seconds"]
                while time.monotonic() < until:
                    for url in payload["urls"]:
                        page = await web_read_page(url)
                        pages += 1
                        chars += len(page.get("markdown") or "")
                return {"pages": pages, "chars": chars}
        """,
        "tests/reader.yaml": "agent: reader\ntests:\n"
        + "".join(
            f"  - name: reads_{i}\n    payload: '{payload}'\n    timeout_s: {seconds + 120}\n"
            "    expected_result: output.pages > 0\n"
            for i in range(cases)
        ),
    }
    return bundle_of(write(root, files))


class HostilePages:
    """Each shape at /<shape>; counts what it served."""

    def __init__(self) -> None:
        self.pages = {f"/{shape}": WORST[shape].encode() for shape in SHAPES}
        self.served = 0
        self._lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                body = server.pages.get(self.path, b"")
                self.send_response(200 if body else 404)
                self.send_header("Content-Type", "text/html; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
                with server._lock:
                    server.served += bool(body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def reader_cpu_seconds() -> float:
    """CPU-seconds so far of the gateway's page reader processes (spawned by multiprocessing,
    at page_reader.NICENESS) on this machine."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            cmdline = (stat.parent / "cmdline").read_bytes()
        except OSError:
            continue
        if int(fields[16]) == NICENESS and b"multiprocessing" in cmdline:
            total += (int(fields[11]) + int(fields[12])) / tick
    return total


def spread(times: list[float]) -> str:
    return f"{len(times)} runs, {min(times):.2f}-{max(times):.2f} s"


def judge(client: GateClient, bundle: bytes) -> float:
    started = time.monotonic()
    gate = client.submit(bundle)
    done = client.wait(gate["id"], timeout_s=900)
    elapsed = time.monotonic() - started
    if done["status"] != "passed":
        reasons = [c.get("failure_reason") for c in done.get("cases", [])][:3]
        raise RuntimeError(f"the gate did not pass: {done['status']} {reasons}")
    return elapsed


class Noise:
    """The noisy project's gate, resubmitted whenever it ends, until stop()."""

    def __init__(self, client: GateClient, bundle: bytes) -> None:
        self.client, self.bundle = client, bundle
        self.gates: list[dict[str, Any]] = []
        self.current: str | None = None
        self._stopped = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self._stopped.is_set():
            gate = self.client.submit(self.bundle)
            self.current = gate["id"]
            self.gates.append(self.client.wait(gate["id"], timeout_s=NOISE_S + 600))

    def stop(self) -> None:
        self._stopped.set()
        if self.current:
            try:
                self.client.cancel(self.current)
            except Exception as exc:  # it may have ended meanwhile
                print(f"  (cancelling the noisy gate: {exc})", file=sys.stderr)
        self.thread.join(timeout=NOISE_S + 600)


def main() -> None:
    server_url = os.environ.get("GATE_TEST_DATABASE_URL")
    database = create_database(server_url) if server_url else None
    data_dir = Path(tempfile.mkdtemp(prefix="gate-bench-noisy-"))
    src = Path(tempfile.mkdtemp(prefix="gate-bench-noisy-src-"))
    pages = HostilePages()
    urls = [f"{pages.url}/{shape}" for shape in SHAPES]
    port = free_port()
    settings = {"GATE_PORT": str(port)}
    if database:
        settings["GATE_DATABASE_URL"] = database
    proc, log_path = start("serve", data_dir, **settings)
    url = f"http://127.0.0.1:{port}"
    quiet_alone: list[float] = []
    quiet_noisy: list[float] = []
    noise: Noise | None = None
    try:
        wait_ready(url, proc, log_path)
        with httpx.Client(base_url=url, headers=bearer(ADMIN_TOKEN), timeout=60) as admin:
            quiet_token = project_token(admin, "quiet", ["submit", "read"])
            noisy_token = project_token(admin, "noisy", ["submit", "read"])
            allowed = admin.put("/v1/projects/noisy/egress", json={"hosts": ["127.0.0.1"]})
            allowed.raise_for_status()
        quiet = GateClient(url, token=quiet_token)
        noisy = GateClient(url, token=noisy_token)
        quiet_bundle = bundle_of(write(src / "quiet", QUIET))
        try:
            judge(quiet, quiet_bundle)  # builds its test image
            judge(noisy, noisy_project(src / "warm", urls[:1], 1, 1))  # and the noisy one's
            for _ in range(REPEATS):
                quiet_alone.append(judge(quiet, quiet_bundle))
            served = pages.served
            noise = Noise(noisy, noisy_project(src / "noisy", urls, NOISY_CASES, NOISE_S))
            deadline = time.monotonic() + 300
            while pages.served < served + len(SHAPES) and time.monotonic() < deadline:
                time.sleep(0.2)  # the noisy cases are reading pages
            noise_started = time.monotonic()
            served, readers_cpu = pages.served, reader_cpu_seconds()
            while len(quiet_noisy) < REPEATS or time.monotonic() < noise_started + NOISY_WINDOW_S:
                quiet_noisy.append(judge(quiet, quiet_bundle))
            noisy_pages, noisy_s = pages.served - served, time.monotonic() - noise_started
            readers_cpu = reader_cpu_seconds() - readers_cpu
        finally:
            if noise:
                noise.stop()
            quiet.close()
            noisy.close()
    except Exception:
        print(f"gate serve's log, last lines:\n{log_path.read_text()[-4000:]}", file=sys.stderr)
        raise
    finally:
        stop(proc)
        pages.close()
        if server_url and database:
            drop_database(server_url, database)
        shutil.rmtree(src, ignore_errors=True)
        shutil.rmtree(data_dir, ignore_errors=True)
    alone, noisy_s_median = statistics.median(quiet_alone), statistics.median(quiet_noisy)
    ratio = noisy_s_median / alone
    print(
        f"project `noisy`: {NOISY_CASES} cases reading {len(SHAPES)} hostile 2 MiB pages in "
        f"turn through web_read_page ({', '.join(SHAPES)}); `gate serve` defaults, "
        f"{os.cpu_count()} CPUs"
    )
    print(f"  quiet gate alone, POST to verdict: median {alone:.2f} s ({spread(quiet_alone)})")
    print(
        f"  quiet gate while `noisy` reads pages: median {noisy_s_median:.2f} s "
        f"({spread(quiet_noisy)})"
    )
    print(
        f"  ratio {ratio:.2f}x (target <= {TARGET:.0f}x: {'met' if ratio <= TARGET else 'NOT met'})"
    )
    print(
        f"  meanwhile the gateway fetched {noisy_pages} hostile pages in {noisy_s:.0f} s "
        f"({noisy_pages / noisy_s:.1f} a second); its page readers used {readers_cpu:.1f} "
        f"CPU-seconds ({readers_cpu / noisy_s:.0%} of a CPU)"
    )


if __name__ == "__main__":
    main()
