"""A case's gateway channel is bounded (docs/threat-model.md): in connections (per
channel and per worker process, the oldest still waiting for its head evicted first, an
authenticated call never), in time (the head within an absolute deadline, however slowly it
trickles) and in log volume (refusals counted on one line per interval, no client's error
ever a traceback).

Real parts: a channel's Unix socket, raw sockets and the runner's own client; the flood comes
from another process, as a case's would, so that this process's descriptors and threads are
the gateway's alone. The channel's ``complete`` is a stand-in that answers a canned record.
No assertion here is on wall-clock time; waits are bounded.
"""

from __future__ import annotations

import logging
import os
import select
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from gate_runner import gateway_wire as wire
from gate_runner.models import GatewayChannel, GatewayModel
from gate_service.gateway import CallRecord
from gate_service.gateway import channel as channel_module
from gate_service.gateway.channel import Channel

CANNED = "a canned answer"


def canned(channel: Channel, request: Any) -> CallRecord:
    """The gateway's entry, stood in for: every call is answered at once."""
    reply = wire.CompletionReply(
        content=CANNED, tool_calls=[], usage={}, cost_usd=0.0, latency_ms=0,
        request_hash="h", attempts=1,
    )  # fmt: skip
    return CallRecord(
        request_hash="h", request={}, agent="bot", status="ok", reply=reply, error=None
    )


Open = Callable[..., Channel]


@pytest.fixture
def open_channel() -> Iterator[Open]:
    # A short root of its own: a Unix socket's path must stay under 108 bytes.
    root = Path(tempfile.mkdtemp(prefix="gw-"))
    opened: list[Channel] = []

    def make(case: str = "c1", complete: Callable[..., CallRecord] = canned) -> Channel:
        channel = Channel(
            root=root, gate_id="g1", case_id=case, project_id="p1", secrets_={}, routes=(),
            budgets=(), deadline=time.monotonic() + 120, complete=complete,
        )  # fmt: skip
        opened.append(channel)
        return channel

    try:
        yield make
    finally:
        for channel in opened:
            channel.close()
        shutil.rmtree(root, ignore_errors=True)


def runner_call(channel: Channel, text: str = "hi") -> str | None:
    """A completion as the case's runner asks for it (its own client, its own wire)."""
    model = GatewayModel(
        GatewayChannel(channel.token, socket_path=str(channel.socket_path)),
        agent="bot", attempts=1, timeout_s=5.0,
    )  # fmt: skip
    reply = model.complete(
        model="openai/gpt-4o", messages=[{"role": "user", "content": text}], tools=[],
        temperature=0.0, context={},
    )  # fmt: skip
    return reply.content


def connect(channel: Channel, send: bytes = b"") -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    # Blocking while the listen backlog is full (one with a timeout would fail at once).
    sock.connect(str(channel.socket_path))
    sock.settimeout(10)
    if send:
        sock.sendall(send)
    return sock


def backlog_drained(channel: Channel, within_s: float = 10.0) -> None:
    """Wait until a connect that would not wait goes through: until then the channel's
    listen backlog is full of what this test sent, and the runner's connect, which has a
    timeout and so does not wait, would fail at once."""
    end = time.monotonic() + within_s
    while time.monotonic() < end:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.setblocking(False)
            try:
                sock.connect(str(channel.socket_path))
                return
            except BlockingIOError:
                pass
        time.sleep(0.005)
    raise AssertionError(f"the backlog was still full after {within_s} s")


def hung_up(sock: socket.socket) -> bool:
    """Whether the gateway has closed (or shut down) its end: the socket reads its end."""
    readable, _, _ = select.select([sock], [], [], 0)
    if not readable:
        return False
    try:
        return sock.recv(1, socket.MSG_PEEK) == b""
    except OSError:
        return True


def settle(sockets: list[socket.socket], gone: int, within_s: float = 10.0) -> list[bool]:
    """Which of ``sockets`` the gateway closed, once at least ``gone`` of them are (or the
    bounded wait is over), plus a moment for any that should not have been."""
    end = time.monotonic() + within_s
    while sum(hung_up(s) for s in sockets) < gone and time.monotonic() < end:
        time.sleep(0.02)
    time.sleep(0.3)
    return [hung_up(s) for s in sockets]


# A case's flood: connections that each send a request line's first byte and no more, held
# open. Its connects block while the listen backlog is full, so every one of them is
# accepted in the end (the runner's, which time out, would fail at once then: a case that
# floods its own channel's backlog only fails its own calls).
FLOOD = textwrap.dedent(
    """
    import socket, sys
    path, count = sys.argv[1], int(sys.argv[2])
    held = []
    for half in (1, 2):
        for _ in range(count // 2):
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.connect(path)
            try:
                sock.send(b"P")
            except OSError:
                pass  # evicted already
            held.append(sock)
        print(len(held), flush=True)
        if half == 1:
            sys.stdin.readline()  # the second half once the test has called mid-flood
    sys.stdin.read()  # every connection stays open until the test is done
    """
)


def test_a_flood_of_connections_holds_few_descriptors_and_threads_and_the_runner_gets_through(
    open_channel: Open,
) -> None:
    channel = open_channel()
    assert runner_call(channel) == CANNED
    fds = len(os.listdir("/proc/self/fd"))
    threads = threading.active_count()
    peak = {"fds": fds, "threads": threads}
    sampling = threading.Event()

    def sample() -> None:
        while not sampling.is_set():
            peak["fds"] = max(peak["fds"], len(os.listdir("/proc/self/fd")))
            peak["threads"] = max(peak["threads"], threading.active_count())
            time.sleep(0.005)

    sampler = threading.Thread(target=sample)
    sampler.start()
    flood = subprocess.Popen(
        [sys.executable, "-c", FLOOD, str(channel.socket_path), "2000"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    answers: list[str | None] = []
    try:
        assert flood.stdin is not None and flood.stdout is not None
        first = int(flood.stdout.readline())
        # The flood holds 1,000 connections, and the channel's places are all the flood's;
        # the backlog may be full too, and the runner's connect tries again until it is not.
        answers.append(runner_call(channel, "mid-flood"))
        flood.stdin.write("more\n")
        flood.stdin.flush()
        held = int(flood.stdout.readline())
        backlog_drained(channel)
        answers.append(runner_call(channel, "after"))
    finally:
        assert flood.stdin is not None
        flood.stdin.close()
        flood.wait(timeout=30)
        sampling.set()
        sampler.join()
    assert (first, held) == (1000, 2000)
    assert answers == [CANNED, CANNED]
    assert peak["fds"] - fds < 100, peak
    assert peak["threads"] - threads < 100, peak


def test_a_channel_holds_at_most_its_cap_and_evicts_the_oldest_still_waiting(
    open_channel: Open, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(channel_module, "HEAD_TIMEOUT_S", 60.0)  # no deadline passes here
    channel = open_channel()
    cap = channel_module.MAX_CHANNEL_CONNECTIONS
    sockets = [connect(channel) for _ in range(cap + 24)]
    try:
        closed = settle(sockets, 24)
        # The oldest went first, and the runner, which connects last, still gets through.
        assert closed == [True] * 24 + [False] * cap
        assert runner_call(channel) == CANNED
    finally:
        for sock in sockets:
            sock.close()


def test_the_worker_cap_holds_across_channels_and_never_evicts_an_authenticated_call(
    open_channel: Open, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(channel_module, "HEAD_TIMEOUT_S", 60.0)
    monkeypatch.setattr(channel_module, "MAX_PROCESS_CONNECTIONS", 20)
    release = threading.Event()
    started = threading.Semaphore(0)

    def slow(channel: Channel, request: Any) -> CallRecord:
        started.release()
        assert release.wait(30)
        return canned(channel, request)

    a, b = open_channel("a", complete=slow), open_channel("b")
    answers: list[str | None] = []
    calls = [
        threading.Thread(target=lambda: answers.append(runner_call(a, "in flight")))
        for _ in range(2)
    ]
    for call in calls:
        call.start()
    assert started.acquire(timeout=10) and started.acquire(timeout=10)
    sockets: list[socket.socket] = []
    try:
        # a: 2 calls in flight and 14 silent connections, its 16; the worker's cap is 20.
        sockets += [connect(a) for _ in range(14)]
        assert settle(sockets, 0, within_s=0) == [False] * 14
        # b's 16 take the places of a's oldest silent ones, never of a's calls in flight.
        sockets += [connect(b) for _ in range(16)]
        closed = settle(sockets, 12)
        assert closed == [True] * 12 + [False] * 18
        assert runner_call(b) == CANNED  # in place of b's oldest silent one
        assert answers == []
        release.set()
        for call in calls:
            call.join(timeout=30)
        assert answers == [CANNED, CANNED]
    finally:
        release.set()
        for sock in sockets:
            sock.close()


def test_the_runner_s_call_waits_out_a_full_listen_backlog(
    open_channel: Open, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Every place of the channel is a call in flight, so its front accepts nothing and new
    # connections queue in the listen backlog until it is full: a connect with a timeout (the
    # runner's) then fails at once. The runner tries again (nothing was sent yet) until a
    # place frees, and its call is answered.
    monkeypatch.setattr(channel_module, "MAX_CHANNEL_CONNECTIONS", 2)
    monkeypatch.setattr(channel_module, "LISTEN_BACKLOG", 4)
    release = threading.Event()
    started = threading.Semaphore(0)

    def slow(channel: Channel, request: Any) -> CallRecord:
        started.release()
        assert release.wait(30)
        return canned(channel, request)

    channel = open_channel(complete=slow)
    answers: list[str | None] = []
    calls = [
        threading.Thread(target=lambda: answers.append(runner_call(channel, "held")))
        for _ in range(2)
    ]
    for call in calls:
        call.start()
    assert started.acquire(timeout=10) and started.acquire(timeout=10)
    queued: list[socket.socket] = []
    try:
        while True:  # fill the backlog: a connect that would wait fails instead
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.setblocking(False)
            try:
                sock.connect(str(channel.socket_path))
            except BlockingIOError:
                sock.close()
                break
            queued.append(sock)
            assert len(queued) < 1000, "the backlog never filled"
        late = threading.Thread(target=lambda: answers.append(runner_call(channel, "late")))
        late.start()
        time.sleep(0.5)  # the late call is retrying its connect meanwhile
        for sock in queued:
            sock.close()
        release.set()
        for thread in [*calls, late]:
            thread.join(timeout=30)
        assert answers == [CANNED, CANNED, CANNED]
    finally:
        release.set()
        for sock in queued:
            sock.close()


@pytest.mark.slow
def test_a_head_trickled_a_byte_a_second_is_cut_at_its_deadline(
    open_channel: Open, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(channel_module, "HEAD_TIMEOUT_S", 2.0)
    channel = open_channel()
    head = f"POST {wire.COMPLETE_PATH} HTTP/1.1\r\nHost: gateway\r\n".encode()
    sent = 0
    with connect(channel) as sock:
        end = time.monotonic() + 10.0
        cut = False
        while time.monotonic() < end and sent < len(head):
            try:
                sock.send(head[sent : sent + 1])
            except OSError:
                cut = True
                break
            sent += 1
            readable, _, _ = select.select([sock], [], [], 1.0)
            if readable:
                cut = hung_up(sock)
                if cut:
                    break
        assert cut, f"still open after trickling {sent} bytes"
    # It was cut while still trickling (after about two bytes), not when it ran out of head.
    assert sent < len(head)
    assert runner_call(channel) == CANNED


class Volume(logging.Handler):
    """What reaches the log: its bytes as the default format writes them, and tracebacks."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
        self.bytes = 0
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.bytes += len(self.format(record).encode())
        self.records.append(record)


@pytest.fixture
def volume() -> Iterator[Volume]:
    handler = Volume()
    root = logging.getLogger()
    level = root.level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    try:
        yield handler
    finally:
        root.removeHandler(handler)
        root.setLevel(level)


@pytest.mark.slow
def test_ten_thousand_malformed_or_refused_requests_log_a_few_lines_and_no_traceback(
    open_channel: Open, volume: Volume
) -> None:
    channel = open_channel()
    body = wire.CompletionRequest(model="openai/gpt-4o", messages=[]).to_json()
    wrong = (
        f"POST {wire.COMPLETE_PATH} HTTP/1.1\r\nHost: gateway\r\nAuthorization: Bearer nope\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode() + body
    abuse = [
        b"GARBAGE\r\n\r\n",  # not a request line, then a hang-up
        b"GET /" + b"x" * 70_000 + b" HTTP/1.1\r\n",  # a head over any size a head may be
        b"POST /v1/complete HTTP/1.1\r\nHost: gateway\r\nContent-Len",  # cut short
        wrong,  # a wrong token, the answer never read
        b"",  # a connection that says nothing, then a hang-up
    ]
    for i in range(10_000):
        with connect(channel) as sock:
            try:
                sock.sendall(abuse[i % len(abuse)])
            except OSError:
                pass  # the gateway refused it before it was all sent
    backlog_drained(channel)
    assert runner_call(channel) == CANNED  # and the channel still serves its runner
    channel.close()  # what it counted since its last line is logged as it closes
    assert volume.bytes < 100_000, (volume.bytes, len(volume.records))
    assert [r for r in volume.records if r.exc_info] == []
    # Not silence: the refusals are there, counted.
    lines = [r.getMessage() for r in volume.records if r.name == channel_module.__name__]
    assert lines and all("c1" in line for line in lines), lines
