"""Benchmark: the API's memory while receiving uploads (run: python -m tests.bench.bench_upload).

Starts `gate api` in a subprocess (on GATE_TEST_DATABASE_URL, else an embedded Postgres),
samples its resident memory while uploads stream in, and prints the peak growth of each
upload as a ratio to a 1 MiB baseline measured in the same run. A flat receiver shows about
the same growth for a refused 200 MiB stream as for the baseline.
"""

from __future__ import annotations

import base64
import io
import os
import shutil
import tarfile
import tempfile
import threading
import time
from pathlib import Path

import httpx

from tests.e2e.conftest import start, stop, wait_ready
from tests.fixtures.auth import ADMIN_TOKEN
from tests.fixtures.db import create_database, drop_database
from tests.fixtures.live import stream_upload
from tests.fixtures.ports import free_port

MIB = 1024 * 1024


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


class PeakSampler:
    def __init__(self, pid: int) -> None:
        self.pid, self.peak, self._stop = pid, 0, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, rss_bytes(self.pid))
            time.sleep(0.005)

    def __enter__(self) -> PeakSampler:
        self.start = rss_bytes(self.pid)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    @property
    def growth(self) -> int:
        return max(0, self.peak - self.start)


def bundle(fixture_bytes: int) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz", compresslevel=1) as tar:
        for name, data in (
            ("agents/a.yaml", b"name: a\n"),
            ("tests/files/blob.bin", os.urandom(fixture_bytes)),
        ):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def main() -> None:
    server_url = os.environ.get("GATE_TEST_DATABASE_URL")
    embedded = None
    if not server_url:
        from gate_service.pg import EmbeddedPostgres

        embedded = EmbeddedPostgres(Path(tempfile.mkdtemp()) / "pg")
        server_url = embedded.url
    database = create_database(server_url)
    port = free_port()
    data_dir = Path(tempfile.mkdtemp(prefix="gate-bench-upload-"))
    proc, log_path = start("api", data_dir, GATE_DATABASE_URL=database, GATE_PORT=str(port))
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url, proc, log_path)
        rows = []
        auth = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
        # Not reported: the first upload pays for imports and pools the rest reuse.
        httpx.post(f"{url}/v1/gates", files={"bundle": ("b.tgz", bundle(MIB))}, headers=auth)
        for label, size in (("baseline: accepted 1 MiB", 1 * MIB), ("accepted 24 MiB", 24 * MIB)):
            data = bundle(size)
            with PeakSampler(proc.pid) as sampler:
                status = httpx.post(
                    f"{url}/v1/gates",
                    files={"bundle": ("b.tgz", data)},
                    headers=auth,
                    timeout=120,
                ).status_code
            rows.append((label, len(data), status, sampler.growth))
        # The connic CLI's route: the same 24 MiB as base64 in JSON (about 33 MB), sent in
        # 64 KiB pieces as a client streams it.
        data = bundle(24 * MIB)
        body = b'{"files_data": "' + base64.b64encode(data) + b'", "environment_id": "default"}'
        del data
        with PeakSampler(proc.pid) as sampler:
            status = httpx.post(
                f"{url}/v1/projects/default/test-runs",
                content=(body[at : at + 65536] for at in range(0, len(body), 65536)),
                headers={**auth, "Content-Type": "application/json"},
                timeout=120,
            ).status_code
        rows.append(("connic test-runs, 24 MiB as base64", len(body), status, sampler.growth))
        del body
        with PeakSampler(proc.pid) as sampler:
            sent, status, _ = stream_upload("127.0.0.1", port, total_bytes=200 * MIB)
        rows.append(("refused 200 MiB chunked stream", sent, status, sampler.growth))
    finally:
        stop(proc)
        drop_database(server_url, database)
        if embedded is not None:
            embedded.stop()
        shutil.rmtree(data_dir, ignore_errors=True)
    base = max(rows[0][3], 1)
    print(
        f"{'upload':36} {'bytes sent':>12} {'status':>6} {'peak RSS growth':>16} {'vs baseline':>12}"
    )
    for label, sent_bytes, status, growth in rows:
        print(
            f"{label:36} {sent_bytes:>12} {status:>6} {growth / MIB:>13.1f} MiB {growth / base:>11.2f}x"
        )


if __name__ == "__main__":
    main()
