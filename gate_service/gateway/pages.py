"""A fetched page as web_read_page answers it, read outside the worker's own process.

The gateway reads every page a case fetches, up to MAX_PAGE_BYTES of a server's choosing,
and the worker that serves it runs every other project's cases too (docs/threat-model.md).
Reading a page is linear in its size (gate_service/page_reader.py: libxml2
behind a linear scan), but a 2 MiB hostile page still costs up to about a second of CPU,
and in a gateway thread each page held the worker's GIL for much of it: while one project's
cases read such pages, another project's one-case gate took 25 times its time (31 times
with the regular expression this replaced, even cut to linear time), as
tests/bench/bench_noisy_pages.py measures. So pages are read in READERS processes of their
own, at a lower priority (page_reader.NICENESS), and a gateway thread only waits for the
text: the same gate then takes 1.1 to 1.5 times its time.
"""

from __future__ import annotations

import multiprocessing
import os
import threading
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures import TimeoutError as WaitedTooLong
from concurrent.futures.process import BrokenProcessPool

from gate_service import page_reader

from .failure import Failure

# One reader process for every two CPUs: what all projects' pages may take of the machine.
READERS = max(1, (os.cpu_count() or 1) // 2)
# The longest a page may wait and be read (a 2 MiB hostile page takes about a second).
WAIT_S = 60.0

_lock = threading.Lock()
_pool: ProcessPoolExecutor | None = None


def _readers() -> ProcessPoolExecutor:
    global _pool
    with _lock:
        if _pool is None:
            _pool = ProcessPoolExecutor(
                max_workers=READERS,
                # A fresh interpreter: the worker has threads, which a fork would not copy.
                mp_context=multiprocessing.get_context("spawn"),
                initializer=page_reader.start,
            )
        return _pool


def _broken(pool: ProcessPoolExecutor) -> None:
    """Forget a pool whose process died (the next page starts a new one)."""
    global _pool
    with _lock:
        if _pool is pool:
            _pool = None
    pool.shutdown(wait=False, cancel_futures=True)


def page_text(page: str | bytes) -> str:
    """The text web_read_page answers for a fetched page (bytes read as UTF-8, an invalid
    sequence as U+FFFD), read by a reader process."""
    if isinstance(page, bytes):
        page = page.decode("utf-8", errors="replace")
    data = page.encode("utf-8", errors="replace")
    for _ in range(2):  # once more if a reader process died under it
        pool = _readers()
        try:
            read = pool.submit(page_reader.read, data)
        except (BrokenProcessPool, RuntimeError):  # broken, or shut down by another page
            _broken(pool)
            continue
        try:
            return read.result(timeout=WAIT_S)
        except BrokenProcessPool:
            _broken(pool)
        except WaitedTooLong:
            raise Failure("provider", f"reading the page took over {WAIT_S:.0f} s") from None
    raise Failure("provider", "the gateway's page reader stopped while it read the page")
