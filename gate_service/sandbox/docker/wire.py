"""The case path's engine calls over kept HTTP/1.1 connections of our own.

A case makes seven engine calls (create, attach, start, wait, inspect, log read, remove).
Through docker-py each cost the worker about 0.6 ms of CPU, nearly all of it requests' and
urllib3's machinery around one small HTTP exchange; ``http.client`` on a kept connection does
the same exchange for about 0.15 ms (measured on this machine: an inspect, 0.64 against 0.16
ms). At two cases at a time on two cores that is CPU the cases' containers wait for.

``EngineWire`` speaks to the engines docker-py reaches through a local socket or plain TCP:
``unix://`` (the default) and ``tcp://`` without TLS. Anything else it does not speak (TLS,
ssh, named pipes) goes through ``SdkWire``: the same calls, on docker-py's own session.
Reaping (reaping.py) lists and removes over whichever of the two the backend has. The rest
of the backend (builds, images) stays on docker-py, where a call's cost does not matter.

Both raise ``EngineCallError`` for every failure of a call (a status of 400 or more, a lost
or refused connection) and its subclasses ``EngineNotFound`` (404) and ``EngineTimeout``
(a read that waited its whole timeout): ``engine.docker_errors`` makes each a SandboxError.
"""

from __future__ import annotations

import http.client
import json
import select
import socket
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any, Protocol
from urllib.parse import quote, urlencode, urlsplit
from urllib.request import getproxies, proxy_bypass

import requests.exceptions
import urllib3.exceptions

Params = Mapping[str, str | int]

# The engine's answers to an attach that takes the connection over: 101 to one that asks to
# upgrade it, as ours does; 200 from engines that ignore the request to.
_HIJACKED = (101, 200)
_HEAD_LIMIT = 64 * 1024  # the most of an attach reply's head we read before giving up
_IDLE_KEPT = 8  # idle connections kept for reuse; more at once are closed after their call


class EngineCallError(Exception):
    """An engine call failed: ``status`` is the engine's answer, or None when the connection
    failed (refused, lost, or ended mid-answer)."""

    def __init__(self, message: str, *, status: int | None = None, explanation: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.explanation = explanation


class EngineNotFound(EngineCallError):
    """The engine has no such object (404): a container removed meanwhile."""


class EngineTimeout(EngineCallError):
    """A read waited its whole timeout with nothing from the engine."""


class Wire(Protocol):
    """The engine calls the case path makes; ``path`` is unversioned (``/containers/…``)."""

    def call(
        self,
        method: str,
        path: str,
        *,
        params: Params | None = None,
        body: Any = None,
        timeout: float | None = None,
    ) -> Any:
        """The engine's JSON answer (None when it sent no body); raises EngineCallError."""
        ...

    def read(self, path: str, *, params: Params | None = None) -> bytes:
        """A GET's raw body; raises EngineCallError."""
        ...

    def hijack(self, path: str, *, params: Params | None = None) -> socket.socket:
        """POST ``path`` (an attach) and hand over its connection once the engine has switched
        it to a raw stream; raises EngineCallError."""
        ...

    def close(self) -> None: ...


def read_timed_out(exc: BaseException) -> bool:
    """Whether a failed docker-py read is its own read timeout, in either shape requests
    gives it.

    ReadTimeout when the engine sent nothing at all; but the engine answers a wait with its
    headers at once and the body only when the container ends, so a wait cut at the wall
    deadline times out reading the body, which requests raises as a ConnectionError around
    urllib3's ReadTimeoutError (docker 7.1, requests 2.34).
    """
    if isinstance(exc, requests.exceptions.ReadTimeout):
        return True
    return isinstance(exc, requests.exceptions.ConnectionError) and any(
        isinstance(arg, urllib3.exceptions.ReadTimeoutError) for arg in exc.args
    )


def path_of(template: str, *args: str) -> str:
    """An engine path with its ids quoted as docker-py quotes them (``_url``)."""
    return template.format(*(quote(arg, safe="/:") for arg in args))


def demultiplex(data: bytes) -> bytes:
    """The payloads of a non-TTY container's multiplexed output (8-byte frame headers: the
    stream, three zero bytes, the size), joined, as docker-py's log read returns them."""
    parts = []
    at, end = 0, len(data)
    while at + 8 <= end:
        size = int.from_bytes(data[at + 4 : at + 8], "big")
        parts.append(data[at + 8 : at + 8 + size])
        at += 8 + size
    return b"".join(parts)


def of(api: Any) -> Wire:
    """The wire for docker-py's low-level client ``api``: ours when it reaches its engine
    through a unix socket or plain TCP, else docker-py's own session (TLS, ssh, pipes)."""
    base = str(getattr(api, "base_url", ""))
    version = str(getattr(api, "api_version", ""))
    timeout = float(getattr(api, "timeout", 60))
    socket_path = getattr(getattr(api, "_custom_adapter", None), "socket_path", None)
    if base.startswith("http+docker://") and isinstance(socket_path, str):
        return EngineWire(version=version, timeout=timeout, unix_path=socket_path)
    if base.startswith("http://"):
        parts = urlsplit(base)
        # An engine the environment says to reach through a proxy keeps requests' session,
        # which honours it, as docker-py always did.
        proxied = bool(getproxies().get("http")) and not proxy_bypass(parts.hostname or "")
        if parts.hostname and not parts.path.strip("/") and not proxied:
            address = (parts.hostname, parts.port or 80)
            return EngineWire(version=version, timeout=timeout, tcp_address=address)
    return SdkWire(api)


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self.socket_path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(self.timeout)
            sock.connect(self.socket_path)
        except BaseException:
            sock.close()
            raise
        self.sock = sock


class EngineWire:
    """HTTP/1.1 to the engine over kept connections, one call per connection at a time (any
    thread: idle connections wait in a list under a lock)."""

    def __init__(
        self,
        *,
        version: str,
        timeout: float,
        unix_path: str | None = None,
        tcp_address: tuple[str, int] | None = None,
    ) -> None:
        if (unix_path is None) == (tcp_address is None):
            raise ValueError("an engine wire needs a unix socket path or a TCP address")
        self.prefix = f"/v{version}" if version else ""
        self.timeout = timeout
        self.unix_path, self.tcp_address = unix_path, tcp_address
        if tcp_address is None:
            self.where = f"unix://{unix_path}"
        else:
            self.where = f"tcp://{tcp_address[0]}:{tcp_address[1]}"
        self._idle: list[http.client.HTTPConnection] = []
        self._lock = threading.Lock()

    def _new(self, timeout: float) -> http.client.HTTPConnection:
        if self.unix_path is not None:
            return _UnixConnection(self.unix_path, timeout)
        assert self.tcp_address is not None
        host, port = self.tcp_address
        return http.client.HTTPConnection(host, port, timeout=timeout)

    def _take(self, timeout: float) -> http.client.HTTPConnection:
        with self._lock:
            conn = self._idle.pop() if self._idle else None
        # A kept connection the engine closed meanwhile (a restart) reads as ready: its end
        # of file. It is dropped before a request is written to it, as urllib3 does.
        if conn is not None and conn.sock is not None and _dropped(conn.sock):
            conn.close()
            conn = None
        if conn is None:
            return self._new(timeout)
        conn.timeout = timeout
        if conn.sock is not None:
            conn.sock.settimeout(timeout)
        return conn

    def _give_back(self, conn: http.client.HTTPConnection) -> None:
        with self._lock:
            if len(self._idle) < _IDLE_KEPT:
                self._idle.append(conn)
                return
        conn.close()

    @staticmethod
    @contextmanager
    def _failing(conn: http.client.HTTPConnection, what: str) -> Iterator[_Phase]:
        """Any failure of the block closes ``conn`` (never kept half-read) and is raised as
        EngineTimeout (a read of the answer that waited its whole timeout, once the block
        set ``reading``) or EngineCallError (everything else: a connect or a send that timed
        out says the engine is unwell, not that a container ran long)."""
        phase = _Phase()
        try:
            yield phase
        except TimeoutError as exc:
            conn.close()
            if not phase.reading:
                raise EngineCallError(
                    f"{what}: the engine took no request within the timeout"
                ) from exc
            raise EngineTimeout(f"{what}: read timed out") from exc
        except (OSError, http.client.HTTPException) as exc:
            conn.close()
            raise EngineCallError(
                f"{what}: the connection to the engine failed ({type(exc).__name__}: {exc})"
            ) from exc
        except BaseException:
            conn.close()
            raise

    def _exchange(
        self,
        method: str,
        path: str,
        params: Params | None,
        body: Any,
        timeout: float | None,
    ) -> tuple[int, str, bytes, str]:
        """(status, reason, body, url) of one request; the connection is kept when the
        answer was read whole."""
        url = self.prefix + path + ("?" + urlencode(params) if params else "")
        data, headers = None, {}
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        conn = self._take(self.timeout if timeout is None else timeout)
        with self._failing(conn, f"{method} {self.where}{url}") as phase:
            conn.request(method, url, body=data, headers=headers)
            phase.reading = True
            response = conn.getresponse()
            content = response.read()
        self._give_back(conn)
        return response.status, response.reason, content, url

    def call(
        self,
        method: str,
        path: str,
        *,
        params: Params | None = None,
        body: Any = None,
        timeout: float | None = None,
    ) -> Any:
        status, reason, content, url = self._exchange(method, path, params, body, timeout)
        if status >= 400:
            raise _status_error(status, reason, f"{self.where}{url}", content)
        return _json_of(content, f"{method} {self.where}{url}")

    def read(self, path: str, *, params: Params | None = None) -> bytes:
        status, reason, content, url = self._exchange("GET", path, params, None, None)
        if status >= 400:
            raise _status_error(status, reason, f"{self.where}{url}", content)
        return content

    def hijack(self, path: str, *, params: Params | None = None) -> socket.socket:
        # A connection of its own, never kept: once the engine switches it, it is the
        # container's stream until closed.
        url = self.prefix + path + ("?" + urlencode(params) if params else "")
        conn = self._new(self.timeout)
        with self._failing(conn, f"POST {self.where}{url}") as phase:
            conn.connect()
            sock = conn.sock
            assert sock is not None
            sock.sendall(
                f"POST {url} HTTP/1.1\r\nHost: docker\r\nContent-Length: 0\r\n"
                "Connection: Upgrade\r\nUpgrade: tcp\r\n\r\n".encode()
            )
            phase.reading = True
            status, reason, rest = _read_head(sock)
        if status not in _HIJACKED:
            conn.close()
            raise _status_error(status, reason, f"{self.where}{url}", rest)
        conn.sock = None  # the socket is the caller's now; the connection object lets go
        return sock

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()


class _Phase:
    """How far a call got: ``reading`` once its request is sent and its answer awaited."""

    reading = False


def _json_of(content: bytes, what: str) -> Any:
    """The JSON of an answer's body (None when it has none); EngineCallError when it is not
    JSON (a broken engine, or something else on its socket)."""
    if not content.strip():
        return None
    try:
        return json.loads(content)
    except ValueError as exc:
        raise EngineCallError(f"{what}: the engine's answer is not JSON ({exc})") from exc


def _dropped(sock: socket.socket) -> bool:
    """Whether a kept connection can be read from: an idle one can only when it has ended.
    (poll, not select: select fails on descriptors past 1023.)"""
    try:
        poller = select.poll()
        poller.register(sock, select.POLLIN)
        return bool(poller.poll(0))
    except (OSError, ValueError):
        return True


def _read_head(sock: socket.socket) -> tuple[int, str, bytes]:
    """The status, reason and whatever followed the head of an attach's answer."""
    got = b""
    while b"\r\n\r\n" not in got:
        chunk = sock.recv(4096)
        if not chunk:
            raise http.client.RemoteDisconnected("the engine closed the attach before answering")
        got += chunk
        if len(got) > _HEAD_LIMIT:
            raise http.client.HTTPException("the engine's answer to an attach has no end")
    head, _, rest = got.partition(b"\r\n\r\n")
    status_line = head.split(b"\r\n", 1)[0].decode("latin-1")
    parts = status_line.split(" ", 2)
    if len(parts) < 2 or not parts[1].isdigit():
        raise http.client.BadStatusLine(status_line)
    return int(parts[1]), parts[2] if len(parts) > 2 else "", rest


def _status_error(status: int, reason: str, url: str, content: bytes) -> EngineCallError:
    """The error for an answer of ``status``, worded as docker-py words its APIError."""
    try:
        said = json.loads(content)
        explanation = str(said.get("message", "")) if isinstance(said, dict) else ""
    except ValueError:
        explanation = content.decode("utf-8", "replace").strip()[:1000]
    kind = "Client" if status < 500 else "Server"
    message = f"{status} {kind} Error for {url}: {reason}"
    if explanation:
        message += f' ("{explanation}")'
    error = EngineNotFound if status == 404 else EngineCallError
    return error(message, status=status, explanation=explanation)


class SdkWire:
    """The same calls on docker-py's own session, for the transports ``EngineWire`` does not
    speak (TLS, ssh, named pipes)."""

    def __init__(self, api: Any) -> None:
        self.api = api

    def _send(
        self, method: str, path: str, params: Params | None, body: Any, timeout: float | None
    ) -> Any:
        api = self.api
        url = f"{api.base_url}/v{api.api_version}{path}"
        kwargs: dict[str, Any] = {"params": dict(params or {})}
        if body is not None:
            kwargs["data"] = json.dumps(body)
            kwargs["headers"] = {"Content-Type": "application/json"}
        kwargs["timeout"] = api.timeout if timeout is None else timeout
        try:
            # The client is docker-py's requests session (APIClient is one).
            response = api.request(method, url, **kwargs)
        except requests.exceptions.RequestException as exc:
            error = EngineTimeout if read_timed_out(exc) else EngineCallError
            raise error(f"{method} {url}: {exc}") from exc
        if response.status_code >= 400:
            raise _status_error(response.status_code, response.reason, url, response.content)
        return response

    def call(
        self,
        method: str,
        path: str,
        *,
        params: Params | None = None,
        body: Any = None,
        timeout: float | None = None,
    ) -> Any:
        response = self._send(method, path, params, body, timeout)
        return _json_of(response.content, f"{method} {response.url}")

    def read(self, path: str, *, params: Params | None = None) -> bytes:
        return bytes(self._send("GET", path, params, None, None).content)

    def hijack(self, path: str, *, params: Params | None = None) -> socket.socket:
        api = self.api
        url = f"{api.base_url}/v{api.api_version}{path}"
        try:
            response = api._post(
                url,
                params=dict(params or {}),
                headers={"Connection": "Upgrade", "Upgrade": "tcp"},
                stream=True,
            )
            if response.status_code >= 400:
                raise _status_error(response.status_code, response.reason, url, response.content)
            raw = api._get_raw_response_socket(response)
        except requests.exceptions.RequestException as exc:
            raise EngineCallError(f"POST {url}: {exc}") from exc
        return raw  # type: ignore[no-any-return]

    def close(self) -> None:
        pass  # the session is the client's, closed with it
