"""The case path's engine wire (sandbox/docker/wire.py) against a scripted engine on a real
unix socket: what each way an engine answers or fails becomes, for our own wire and for
docker-py's session (SdkWire, for transports ours does not speak) alike.

tests/unit/test_engine_faults.py takes it from there (what the sandbox makes of each error),
and tests/e2e/test_engine_restart.py does the same against a real, private dockerd.
"""

from __future__ import annotations

import json
import socket
import socketserver
import struct
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import docker
import pytest

from gate_service.sandbox.docker import wire as wire_module
from gate_service.sandbox.docker.wire import (
    EngineCallError,
    EngineNotFound,
    EngineTimeout,
    EngineWire,
    SdkWire,
    Wire,
    demultiplex,
)

Answer = Callable[["Exchange"], None]


class Exchange:
    """One request the scripted engine read, and the connection to answer it on."""

    def __init__(
        self, sock: socket.socket, reader: Any, method: str, target: str, body: bytes
    ) -> None:
        self.sock, self.reader = sock, reader
        self.method, self.target, self.body = method, target, body
        self.path = target.split("?", 1)[0]
        self.closed = False

    def close(self) -> None:
        """End the connection (the reader holds the socket open until it is closed too)."""
        self.closed = True
        self.reader.close()
        self.sock.close()

    def send(self, status: int, body: bytes = b"", reason: str = "OK") -> None:
        self.sock.sendall(
            f"HTTP/1.1 {status} {reason}\r\nContent-Length: {len(body)}\r\n"
            "Content-Type: application/json\r\n\r\n".encode()
            + body
        )

    def send_json(self, status: int, doc: Any, reason: str = "OK") -> None:
        self.send(status, json.dumps(doc).encode(), reason)

    def send_chunked_head(self) -> None:
        """The head of an answer whose body comes later, as the engine's wait sends it."""
        self.sock.sendall(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n"
        )

    def reset(self) -> None:
        """Close the connection with a reset (SO_LINGER 0), as a killed engine's does."""
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.close()


class ScriptedEngine:
    """An engine's HTTP API on a unix socket, answering each path as scripted."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.answers: dict[tuple[str, str], Answer] = {
            ("GET", "/_ping"): lambda x: x.send(200, b"OK"),
        }
        self.seen: list[tuple[str, str]] = []
        self.connections = 0
        self.stdin = bytearray()
        self.stdin_ended = threading.Event()
        self.release = threading.Event()  # ends every answer that waits
        engine = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                engine.connections += 1
                reader = self.request.makefile("rb")
                while True:
                    line = reader.readline()
                    if not line:
                        return
                    method, target, _ = line.decode().split(" ", 2)
                    length = 0
                    while (header := reader.readline()) not in (b"\r\n", b""):
                        name, _, value = header.decode().partition(":")
                        if name.lower() == "content-length":
                            length = int(value)
                    exchange = Exchange(self.request, reader, method, target, reader.read(length))
                    path = exchange.path
                    if path.startswith("/v1."):  # the API version's prefix
                        path = "/" + path.split("/", 2)[2]
                    engine.seen.append((method, target))
                    answer = engine.answers.get((method, path))
                    if answer is None:
                        exchange.send_json(404, {"message": f"page not found: {path}"}, "Not Found")
                        continue
                    try:
                        answer(exchange)
                    except OSError:
                        return
                    if exchange.closed:
                        return

        class Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
            daemon_threads = True

        self.server = Server(str(path), Handler)
        threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        ).start()

    def close(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[ScriptedEngine]:
    scripted = ScriptedEngine(tmp_path / "engine.sock")
    yield scripted
    scripted.close()


def ours(engine: ScriptedEngine, timeout: float = 10) -> Wire:
    return EngineWire(version="1.41", timeout=timeout, unix_path=str(engine.path))


def sdk(engine: ScriptedEngine, timeout: float = 10) -> Wire:
    api = docker.APIClient(base_url=f"unix://{engine.path}", version="1.41", timeout=timeout)
    return SdkWire(api)


WIRES = pytest.mark.parametrize("make", [ours, sdk], ids=["engine-wire", "sdk-wire"])


@WIRES
def test_a_call_answers_the_engine_s_json(
    engine: ScriptedEngine, make: Callable[..., Wire]
) -> None:
    engine.answers["POST", "/containers/create"] = lambda x: x.send_json(
        201, {"Id": "c0ffee", "got": json.loads(x.body)}, "Created"
    )
    engine.answers["POST", "/containers/c0ffee/start"] = lambda x: x.send(204, reason="No Content")
    wire = make(engine)
    created = wire.call("POST", "/containers/create", body={"Image": "img"})
    assert created == {"Id": "c0ffee", "got": {"Image": "img"}}
    assert wire.call("POST", "/containers/c0ffee/start", params={"a": 1}) is None
    assert ("POST", "/v1.41/containers/c0ffee/start?a=1") in engine.seen


def test_our_wire_keeps_its_connection_between_calls(engine: ScriptedEngine) -> None:
    engine.answers["GET", "/containers/c0ffee/json"] = lambda x: x.send_json(200, {"Id": "c"})
    wire = ours(engine)
    for _ in range(5):
        wire.call("GET", "/containers/c0ffee/json")
    assert engine.connections == 1


def test_a_kept_connection_the_engine_closed_is_not_reused(engine: ScriptedEngine) -> None:
    # An engine that restarted between two calls closed every kept connection: the next
    # call goes out on a new one instead of failing.
    def answer_and_close(x: Exchange) -> None:
        x.send_json(200, {"Id": "c"})
        x.close()

    engine.answers["GET", "/containers/c0ffee/json"] = answer_and_close
    wire = ours(engine)
    wire.call("GET", "/containers/c0ffee/json")
    time.sleep(0.1)  # the close reaches the client's end
    assert wire.call("GET", "/containers/c0ffee/json") == {"Id": "c"}
    assert engine.connections == 2


@WIRES
@pytest.mark.parametrize(
    ("status", "error"), [(404, EngineNotFound), (409, EngineCallError), (500, EngineCallError)]
)
def test_an_error_status_is_raised_with_the_engine_s_message(
    engine: ScriptedEngine, make: Callable[..., Wire], status: int, error: type[Exception]
) -> None:
    engine.answers["DELETE", "/containers/c0ffee"] = lambda x: x.send_json(
        status, {"message": "removal of container c0ffee is already in progress"}, "Nope"
    )
    with pytest.raises(error) as raised:
        make(engine).call("DELETE", "/containers/c0ffee", params={"force": 1})
    assert isinstance(raised.value, EngineCallError) and raised.value.status == status
    assert raised.value.explanation == "removal of container c0ffee is already in progress"
    kind = "Client" if status < 500 else "Server"
    # worded as docker-py words it (incidents.scrub hides its URL from users)
    assert str(raised.value).startswith(f"{status} {kind} Error for "), str(raised.value)


def wait_answer_then(then: Callable[[Exchange], None]) -> Answer:
    def answer(x: Exchange) -> None:
        x.send_chunked_head()
        then(x)

    return answer


@WIRES
def test_a_wait_answered_when_the_container_ends(
    engine: ScriptedEngine, make: Callable[..., Wire]
) -> None:
    def ends(x: Exchange) -> None:
        time.sleep(0.3)
        body = b'{"StatusCode":3}\n'
        x.sock.sendall(b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body))

    engine.answers["POST", "/containers/c0ffee/wait"] = wait_answer_then(ends)
    assert make(engine).call("POST", "/containers/c0ffee/wait", timeout=5) == {"StatusCode": 3}


@pytest.mark.slow
@WIRES
def test_a_wait_with_nothing_for_its_whole_timeout_is_a_timeout(
    engine: ScriptedEngine, make: Callable[..., Wire]
) -> None:
    engine.answers["POST", "/containers/c0ffee/wait"] = wait_answer_then(
        lambda x: engine.release.wait(30)
    )
    engine.answers["GET", "/containers/c0ffee/json"] = lambda x: x.send_json(200, {"Id": "c"})
    wire = make(engine)
    began = time.monotonic()
    with pytest.raises(EngineTimeout):
        wire.call("POST", "/containers/c0ffee/wait", timeout=1)
    assert time.monotonic() - began >= 0.9
    # The timed-out connection is not kept half-read: the next call answers, on a new one.
    assert wire.call("GET", "/containers/c0ffee/json") == {"Id": "c"}
    assert engine.connections == 2


class Closable:
    closed = False

    def close(self) -> None:
        self.closed = True


@pytest.mark.parametrize("reading", [False, True])
def test_only_a_timeout_reading_the_answer_is_an_engine_timeout(reading: bool) -> None:
    # A connect or a send that times out says the engine is unwell, not that a container
    # ran to its wall deadline: that is EngineCallError, which the sandbox retries for.
    conn = Closable()

    def timing_out() -> None:
        with EngineWire._failing(conn, "POST /wait") as phase:  # type: ignore[arg-type]
            phase.reading = reading
            raise TimeoutError("timed out")

    with pytest.raises(EngineCallError) as raised:
        timing_out()
    assert isinstance(raised.value, EngineTimeout) is reading
    assert conn.closed


@WIRES
def test_an_answer_that_is_not_json_is_an_engine_call_error(
    engine: ScriptedEngine, make: Callable[..., Wire]
) -> None:
    engine.answers["GET", "/containers/c0ffee/json"] = lambda x: x.send(200, b"<html>proxy</html>")
    with pytest.raises(EngineCallError, match="not JSON"):
        make(engine).call("GET", "/containers/c0ffee/json")


def test_a_tcp_engine_behind_a_proxy_keeps_docker_py_s_session(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("HTTP_PROXY", "http://proxy.internal:3128")
    monkeypatch.setenv("NO_PROXY", "localhost")
    api = docker.APIClient(base_url="tcp://engine.internal:2375", version="1.41")
    assert type(wire_module.of(api)) is SdkWire
    near = docker.APIClient(base_url="tcp://localhost:2375", version="1.41")
    assert type(wire_module.of(near)) is EngineWire


@WIRES
@pytest.mark.parametrize("how", ["closed-after-head", "closed-mid-answer", "closed-before-answer"])
def test_an_engine_lost_mid_wait_is_no_timeout(
    engine: ScriptedEngine, make: Callable[..., Wire], how: str
) -> None:
    def lose(x: Exchange) -> None:
        if how == "closed-after-head":
            x.send_chunked_head()
            x.reset()  # (on a unix socket a plain end of stream: SO_LINGER is TCP's)
        elif how == "closed-mid-answer":
            x.send_chunked_head()
            x.sock.sendall(b'10\r\n{"Stat')
            x.close()
        else:
            x.close()

    engine.answers["POST", "/containers/c0ffee/wait"] = lose
    with pytest.raises(EngineCallError) as raised:
        make(engine).call("POST", "/containers/c0ffee/wait", timeout=10)
    assert not isinstance(raised.value, EngineTimeout)
    assert raised.value.status is None


@WIRES
def test_an_engine_that_is_not_there_is_an_engine_call_error(
    tmp_path: Path, make: Callable[..., Wire]
) -> None:
    class Nowhere:
        path = tmp_path / "no-engine.sock"

    with pytest.raises(EngineCallError):
        make(Nowhere).call("GET", "/containers/c0ffee/json")


@WIRES
def test_an_attach_hands_over_its_connection_as_the_container_s_stdin(
    engine: ScriptedEngine, make: Callable[..., Wire]
) -> None:
    def attach(x: Exchange) -> None:
        x.sock.sendall(
            b"HTTP/1.1 101 UPGRADED\r\nContent-Type: application/vnd.docker.raw-stream\r\n"
            b"Connection: Upgrade\r\nUpgrade: tcp\r\n\r\n"
        )
        while chunk := x.sock.recv(65536):
            engine.stdin.extend(chunk)
        engine.stdin_ended.set()
        x.close()

    engine.answers["POST", "/containers/c0ffee/attach"] = attach
    attached = make(engine).hijack("/containers/c0ffee/attach", params={"stdin": 1, "stream": 1})
    raw: socket.socket = getattr(attached, "_sock", attached)
    raw.sendall(b"x" * 200_000)
    raw.shutdown(socket.SHUT_WR)
    assert engine.stdin_ended.wait(10)
    raw.close()
    assert bytes(engine.stdin) == b"x" * 200_000
    assert ("POST", "/v1.41/containers/c0ffee/attach?stdin=1&stream=1") in engine.seen


@WIRES
def test_an_attach_refused_raises_the_engine_s_error(
    engine: ScriptedEngine, make: Callable[..., Wire]
) -> None:
    with pytest.raises(EngineNotFound):  # no answer scripted: the engine's 404
        make(engine).hijack("/containers/c0ffee/attach", params={"stdin": 1, "stream": 1})


def frame(stream: int, data: bytes) -> bytes:
    return bytes([stream, 0, 0, 0]) + len(data).to_bytes(4, "big") + data


@WIRES
def test_a_log_read_is_the_raw_body_and_demultiplexes_as_docker_py_does(
    engine: ScriptedEngine, make: Callable[..., Wire]
) -> None:
    frames = frame(1, b"first line\n") + frame(1, b"") + frame(1, b"\x00\xffsecond\n" * 5000)
    engine.answers["GET", "/containers/c0ffee/logs"] = lambda x: x.send(200, frames)
    body = make(engine).read("/containers/c0ffee/logs", params={"stdout": 1})
    assert body == frames
    assert demultiplex(body) == b"first line\n" + b"\x00\xffsecond\n" * 5000
    assert demultiplex(b"") == b"" and demultiplex(frame(2, b"err")[:5]) == b""


@pytest.mark.parametrize(
    ("base_url", "kind"),
    [
        ("unix:///var/run/docker.sock", EngineWire),
        ("tcp://127.0.0.1:2375", EngineWire),
        ("https://engine.internal:2376", SdkWire),
    ],
)
def test_the_wire_is_ours_for_a_socket_or_plain_tcp_and_docker_py_s_else(
    base_url: str, kind: type
) -> None:
    api = docker.APIClient(base_url=base_url, version="1.41")
    made = wire_module.of(api)
    assert type(made) is kind
    if isinstance(made, EngineWire):
        assert made.prefix == "/v1.41"
        assert made.where == base_url
