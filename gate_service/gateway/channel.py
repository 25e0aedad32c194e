"""One case's channel: a Unix socket in a host folder of its own, and a token only it accepts.

The folder is what the sandbox delivers to the case's container at gateway_wire.SOCKET_DIR
(sandbox/port.py ModelChannel; the Docker backend bind-mounts it read-only); nothing else of
the host is visible through it. The socket is world-writable (0666) so that
the runner's uid inside the container can connect: the token, handed to the runner alone, is
the credential, and the folder path is known to the worker alone. ``close()`` ends the
channel: the socket is gone, so connecting fails, and a call still in flight is cut.

Every byte a case sends is hostile, so the channel is bounded in connections, time and log
volume (docs/threat-model.md). One thread per channel, its front, accepts
connections and reads all their heads at once (selectors, h11), each whole head within
HEAD_TIMEOUT_S of its accept however slowly it trickles; nothing else is spent on a
connection before its head shows the token. A channel holds at most MAX_CHANNEL_CONNECTIONS
connections, and the worker process MAX_PROCESS_CONNECTIONS across its channels. At a cap a
new connection takes the place of the oldest one whose head is not in yet (the runner sends
its whole request as it connects, so silent connections cannot starve it), never of an
authenticated call; when every place is a call in flight, new connections wait in the listen
backlog. Only a request with the token gets a thread of its own, which reads its body, serves
it and answers, so calls waiting on slow models overlap. What a channel refuses is counted and
logged on one line per LOG_INTERVAL_S at most; a client's error is never a traceback.

A Unix socket's connect with a timeout (the runner's) fails at once while the listen backlog
is full: a case that connects faster than its front accepts fails its own calls, no other's.
"""

from __future__ import annotations

import hmac
import json
import logging
import math
import os
import secrets
import selectors
import shutil
import socket
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import fields
from http import HTTPStatus
from pathlib import Path
from typing import Any

import h11

from gate_runner.gateway_wire import (
    API_PATH,
    COMPLETE_PATH,
    ERROR_STATUS,
    FETCH_PATH,
    MAX_REQUEST_BYTES,
    MAX_RESPONSE_FORMAT_BYTES,
    MCP_OPS,
    MCP_PATH,
    MODERATE_PATH,
    OPTION_KEYS,
    REASONING_EFFORTS,
    SOCKET_NAME,
    ApiRequest,
    CompletionRequest,
    FetchRequest,
    McpRequest,
    ModerationRequest,
)

from .budget import Budget
from .failure import Failure
from .keys import ModelRoute
from .records import CallRecord, Totals, export_recordings, safe_agent, totals

log = logging.getLogger(__name__)

# The longest path a Unix socket may be bound at (sun_path, with its terminating NUL).
MAX_SOCKET_PATH = 107
MAX_ATTEMPTS = 10  # a request asking for more tries gets this many

# A case's channel is bounded in connections, time and log volume (docs/threat-model.md);
# the module's doc says how. Each is read when used, so a test may lower it.
# Connections one channel holds at once, its calls in flight among them: a case's
# invocations may call at once, but no case needs more.
MAX_CHANNEL_CONNECTIONS = 16
# The same across every channel of this worker process: each is a descriptor (and, once
# authenticated, a thread), and the process has one descriptor table for all its cases, its
# provider connections and its database among them.
MAX_PROCESS_CONNECTIONS = 256
# The whole head of a request (its token in it) must be in this long after its connection
# is accepted, however it trickles; so must a refused request's body after its head.
HEAD_TIMEOUT_S = 5.0
# A longer head is not HTTP to the gateway (h11 refuses it): the runner's is a few hundred
# bytes.
MAX_HEAD_BYTES = 16 * 1024
# An authenticated request's body (up to MAX_REQUEST_BYTES, which the runner sends at once)
# must be in this long after its head, and its answer taken within as long.
BODY_TIMEOUT_S = 30.0
ANSWER_TIMEOUT_S = 30.0
# A channel logs what it refused (counted) on one line per this many seconds at most.
LOG_INTERVAL_S = 10.0
# Connections the kernel queues for the front to accept: while a channel has no free place,
# new ones wait here. The runner connects with a timeout, which on a Unix socket fails at
# once when this queue is full, so it is longer than a case's calls at once could fill.
LISTEN_BACKLOG = 256
ACCEPT_BATCH = 64  # connections accepted on one wake at most, between reads of heads
RECV_BYTES = 64 * 1024
MAX_WAIT_S = 1.0  # the front's longest sleep: close() wakes it anyway, this is a backstop
PAUSED_POLL_S = 0.05  # how soon a front with no free place looks again for one

# A completion, a moderation or a page: the gateway's one entry, which tells them apart.
Complete = Callable[["Channel", "Request"], CallRecord]


def _object(body: bytes, shape: type[Request]) -> dict[str, Any]:
    """The request's JSON object, with no field ``shape`` does not have; else ``bad_request``."""
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        raise Failure("bad_request", "the request is not JSON") from None
    if not isinstance(data, dict):
        raise Failure("bad_request", "the request must be a JSON object")
    known = {f.name for f in fields(shape)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise Failure("bad_request", f"unknown field(s) in the request: {', '.join(unknown)}")
    return data


def _wrong(name: str, what: str) -> Failure:
    return Failure("bad_request", f"the request's {name} must be {what}")


def _model(data: dict[str, Any]) -> str:
    model = data.get("model")
    if not isinstance(model, str) or not model or len(model) > 256:
        raise _wrong("model", "a model name of 1 to 256 characters")
    return model


def _how(data: dict[str, Any]) -> tuple[str, int, float]:
    """The fields every request has: its agent, the tries it allows, one try's timeout."""
    agent = data.get("agent", "")
    if not isinstance(agent, str) or (agent and not safe_agent(agent)):
        raise _wrong("agent", "an agent's name (letters, digits, '_', '.', '-')")
    attempts = data.get("attempts", 1)
    if isinstance(attempts, bool) or not isinstance(attempts, int) or attempts < 1:
        raise _wrong("attempts", "a whole number of at least 1")
    timeout_s = data.get("timeout_s", 60.0)
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, int | float) or timeout_s <= 0:
        raise _wrong("timeout_s", "a positive number of seconds")
    return agent, min(attempts, MAX_ATTEMPTS), float(timeout_s)


def parse_request(body: bytes) -> CompletionRequest:
    """A CompletionRequest from its JSON, checked field by field; else ``bad_request``."""
    data = _object(body, CompletionRequest)
    model = _model(data)
    messages = data.get("messages")
    if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
        raise _wrong("messages", "a list of objects")
    tools = data.get("tools", [])
    if not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools):
        raise _wrong("tools", "a list of objects")
    temperature = data.get("temperature", 0.0)
    if isinstance(temperature, bool) or not isinstance(temperature, int | float):
        raise _wrong("temperature", "a number")
    options = data.get("options", {})
    if not isinstance(options, dict) or not set(options) <= set(OPTION_KEYS):
        raise _wrong("options", f"an object of {', '.join(OPTION_KEYS)}")
    effort = options.get("reasoning_effort")
    if effort is not None and effort not in REASONING_EFFORTS:
        raise _wrong("options.reasoning_effort", f"one of {', '.join(REASONING_EFFORTS)}")
    budget = options.get("reasoning_budget")
    if budget is not None and (
        isinstance(budget, bool) or not isinstance(budget, int) or budget < 1
    ):
        raise _wrong("options.reasoning_budget", "a whole number of tokens, at least 1")
    response_format = _response_format(data)
    agent, attempts, timeout_s = _how(data)
    return CompletionRequest(
        options=options,
        response_format=response_format,
        model=model,
        messages=messages,
        tools=tools,
        # An int stays an int: the replay key hashes the value as the runner sent it.
        temperature=temperature,
        agent=agent,
        attempts=attempts,
        timeout_s=timeout_s,
    )


def _response_format(data: dict[str, Any]) -> dict[str, Any] | None:
    """The agent's output_schema as OpenAI's response_format, or None: an object with a
    ``type``, and for ``json_schema`` a ``json_schema`` object whose ``schema`` is an object,
    in MAX_RESPONSE_FORMAT_BYTES of JSON at most."""
    value = data.get("response_format")
    if value is None:
        return None
    what = f"an object of at most {MAX_RESPONSE_FORMAT_BYTES} bytes of JSON"
    if not isinstance(value, dict) or not isinstance(value.get("type"), str):
        raise _wrong("response_format", f"{what} with a string type")
    if len(json.dumps(value).encode()) > MAX_RESPONSE_FORMAT_BYTES:
        raise _wrong("response_format", what)
    if value["type"] == "json_schema":
        spec = value.get("json_schema")
        if (
            not isinstance(spec, dict)
            or not isinstance(spec.get("name"), str)
            or not isinstance(spec.get("schema"), dict)
        ):
            raise _wrong("response_format.json_schema", "an object with a name and a schema")
    return value


def parse_moderation(body: bytes) -> ModerationRequest:
    """A ModerationRequest from its JSON, checked field by field; else ``bad_request``."""
    data = _object(body, ModerationRequest)
    model = _model(data)
    text = data.get("input")
    if not isinstance(text, str):
        raise _wrong("input", "a string")
    agent, attempts, timeout_s = _how(data)
    return ModerationRequest(
        model=model, input=text, agent=agent, attempts=attempts, timeout_s=timeout_s
    )


def parse_fetch(body: bytes) -> FetchRequest:
    """A FetchRequest from its JSON, checked field by field; else ``bad_request``."""
    data = _object(body, FetchRequest)
    url = data.get("url")
    if not isinstance(url, str) or not url or len(url) > 8192:
        raise _wrong("url", "a URL of 1 to 8192 characters")
    follow = data.get("follow_redirects", True)
    if not isinstance(follow, bool):
        raise _wrong("follow_redirects", "true or false")
    agent, attempts, timeout_s = _how(data)
    return FetchRequest(
        url=url, follow_redirects=follow, agent=agent, attempts=attempts, timeout_s=timeout_s
    )


def _strings(data: dict[str, Any], name: str) -> dict[str, str]:
    value = data.get(name, {})
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, str) and len(k) <= 256 and len(v) <= 8192
        for k, v in value.items()
    ):
        raise _wrong(name, "an object of strings (names to 256, values to 8192 characters)")
    return value


def parse_mcp(body: bytes) -> McpRequest:
    """An McpRequest from its JSON, checked field by field; else ``bad_request``."""
    data = _object(body, McpRequest)
    server = data.get("server")
    if not isinstance(server, str) or not server or len(server) > 256:
        raise _wrong("server", "an MCP server's name of 1 to 256 characters")
    url = data.get("url")
    if not isinstance(url, str) or not url or len(url) > 8192:
        raise _wrong("url", "a URL of 1 to 8192 characters")
    op = data.get("op", "list")
    if op not in MCP_OPS:
        raise _wrong("op", f"one of {', '.join(MCP_OPS)}")
    tool = data.get("tool", "")
    if not isinstance(tool, str) or len(tool) > 256 or (op == "call" and not tool):
        raise _wrong("tool", "the name of the tool to call (1 to 256 characters)")
    arguments = data.get("arguments", {})
    if not isinstance(arguments, dict):
        raise _wrong("arguments", "an object")
    agent, attempts, timeout_s = _how(data)
    return McpRequest(
        server=server,
        url=url,
        op=op,
        tool=tool,
        arguments=arguments,
        headers=_strings(data, "headers"),
        context_values=_strings(data, "context_values"),
        agent=agent,
        attempts=attempts,
        timeout_s=timeout_s,
    )


def parse_api(body: bytes) -> ApiRequest:
    """An ApiRequest from its JSON, checked field by field; else ``bad_request``."""
    data = _object(body, ApiRequest)
    api, tool = data.get("api"), data.get("tool")
    if not isinstance(api, str) or not api or len(api) > 64:
        raise _wrong("api", "the prefix of one of the project's API specs")
    if not isinstance(tool, str) or not tool or len(tool) > 256:
        raise _wrong("tool", "the name of one of the spec's tools")
    arguments = data.get("arguments", {})
    if not isinstance(arguments, dict):
        raise _wrong("arguments", "an object")
    agent, attempts, timeout_s = _how(data)
    return ApiRequest(
        api=api, tool=tool, arguments=arguments, agent=agent, attempts=attempts,
        timeout_s=timeout_s,
    )  # fmt: skip


Request = CompletionRequest | ModerationRequest | FetchRequest | McpRequest | ApiRequest
PARSERS: dict[str, Callable[[bytes], Request]] = {
    COMPLETE_PATH: parse_request,
    MODERATE_PATH: parse_moderation,
    FETCH_PATH: parse_fetch,
    MCP_PATH: parse_mcp,
    API_PATH: parse_api,
}


class _Tally:
    """A channel's log under abuse: what it refused or dropped is counted, and said on one
    line per LOG_INTERVAL_S at most; its own faults likewise, those with their traceback.
    A client's error is never a traceback: it is the client's, and a case can make them by
    the thousand."""

    def __init__(self, case_id: str) -> None:
        self.case_id = case_id
        self._lock = threading.Lock()
        self._counts: dict[str, int] = {}
        self._said = -math.inf  # time.monotonic() of the last line of refusals
        self._faults = 0
        self._faulted = -math.inf

    def note(self, what: str) -> None:
        """Count one refusal; say what was counted when the last line is old enough."""
        with self._lock:
            self._counts[what] = self._counts.get(what, 0) + 1
            now = time.monotonic()
            if now - self._said < LOG_INTERVAL_S:
                return
            self._said = now
            line = self._take()
        log.warning("model gateway: case %s: refused or dropped %s", self.case_id, line)

    def flush(self) -> None:
        """Say what was counted since the last lines, if anything (the channel is closing)."""
        with self._lock:
            line = self._take()
            faults, self._faults = self._faults, 0
        if line:
            log.warning("model gateway: case %s: refused or dropped %s", self.case_id, line)
        if faults:
            log.error(
                "model gateway: case %s: %d more fault(s) of the gateway since the last "
                "traceback logged for it",
                self.case_id, faults,
            )  # fmt: skip

    def _take(self) -> str:
        counts, self._counts = self._counts, {}
        return ", ".join(f"{count} {what}" for what, count in counts.items())

    def fault(self, what: str) -> None:
        """In an ``except`` block: a fault of the gateway's own, logged with its traceback
        unless one was logged less than LOG_INTERVAL_S ago (then only counted)."""
        with self._lock:
            self._faults += 1
            now = time.monotonic()
            if now - self._faulted < LOG_INTERVAL_S:
                return
            self._faulted = now
            count, self._faults = self._faults, 0
        log.exception(
            "model gateway: case %s: %s (%d time(s) since the last such line)",
            self.case_id, what, count,
        )  # fmt: skip


class _Connection:
    """One accepted connection, from accept to close. Its channel's front reads its head;
    once authenticated it belongs to its call's thread. ``_SLOTS`` counts it all along."""

    __slots__ = ("authenticated", "channel", "deadline", "evicted", "parser", "refusal", "sock")

    def __init__(self, sock: socket.socket, channel: Channel, deadline: float) -> None:
        self.sock = sock
        self.channel = channel
        self.deadline = deadline  # time.monotonic() by which its head must be in
        self.parser = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD_BYTES)
        self.authenticated = False  # its head carried the token: never evicted
        self.evicted = False  # its place was given to a newer connection
        # The answer to a refused request, sent once its body is drained (or at the deadline).
        self.refusal: bytes | None = None


def _shut(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass  # already gone


class _Slots:
    """The connections of every channel in this worker process, oldest first: at most
    MAX_CHANNEL_CONNECTIONS of one channel and MAX_PROCESS_CONNECTIONS in all.

    A connection's owner releases it here before it closes it, and evicting shuts a
    connection down only while it is held here, so no socket is shut down after its close
    (its descriptor could be another's by then)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: dict[_Connection, None] = {}  # in the order they were accepted

    def room(self, channel: Channel) -> bool:
        """Whether a new connection of ``channel`` would be admitted now."""
        with self._lock:
            return self._victims(channel) is not None

    def _victims(self, channel: Channel) -> list[_Connection] | None:
        """What a new connection of ``channel`` must evict to fit, or None when nothing may
        be (every connection it would have to replace is a call in flight)."""
        mine = [c for c in self._held if c.channel is channel]
        waiting = (c for c in mine if not c.authenticated)
        victims: list[_Connection] = []
        while len(mine) - len(victims) >= MAX_CHANNEL_CONNECTIONS:
            victim = next(waiting, None)
            if victim is None:
                return None
            victims.append(victim)
        anywhere = (c for c in self._held if not c.authenticated and c not in victims)
        while len(self._held) - len(victims) >= MAX_PROCESS_CONNECTIONS:
            victim = next(anywhere, None)
            if victim is None:
                return None
            victims.append(victim)
        return victims

    def admit(self, connection: _Connection) -> list[_Connection] | None:
        """Hold ``connection``, evicting (shutting down) the oldest connections still
        waiting for their head where a cap is reached: these its owner closes. None: no
        place, the caller closes it."""
        with self._lock:
            victims = self._victims(connection.channel)
            if victims is None:
                return None
            for victim in victims:
                del self._held[victim]
                victim.evicted = True
                _shut(victim.sock)  # wakes its owner, on another channel's thread maybe
            self._held[connection] = None
            return victims

    def authenticate(self, connection: _Connection) -> bool:
        """Mark ``connection`` a call, never to be evicted; False if it was evicted."""
        with self._lock:
            if connection not in self._held:
                return False
            connection.authenticated = True
            return True

    def release(self, connection: _Connection) -> None:
        with self._lock:
            self._held.pop(connection, None)

    def cut(self, channel: Channel) -> None:
        """Shut down every connection ``channel`` holds: its calls in flight are cut."""
        with self._lock:
            for connection in self._held:
                if connection.channel is channel:
                    _shut(connection.sock)


_SLOTS = _Slots()


def _answer(status: int, body: bytes) -> bytes:
    """A whole answer, as the gateway has always sent it: HTTP/1.0, JSON, then close."""
    head = (
        f"HTTP/1.0 {status} {HTTPStatus(status).phrase}\r\n"
        "Content-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n"
        "Connection: close\r\n\r\n"
    )
    return head.encode("ascii") + body


def _failed(failure: Failure) -> bytes:
    return _answer(failure.status, failure.error.to_json())


NOT_HTTP = _failed(Failure("bad_request", "the request is not an HTTP/1.1 request"))


class _Front:
    """A channel's one thread: it accepts connections while a place is free (the others
    wait in the listen backlog), reads every head at once within its deadline, answers a
    refused one itself, and gives an authenticated one a thread of its own."""

    def __init__(self, channel: Channel, listener: socket.socket) -> None:
        self.channel = channel
        self.listener = listener
        self.selector = selectors.DefaultSelector()
        # The channel's connections not yet handed to a call, which this thread owns.
        self.waiting: dict[_Connection, None] = {}
        self.listening = False

    def run(self) -> None:
        try:
            while not self.channel.closed:
                self._turn()
        except Exception:
            # Each connection's faults are caught in _turn: this is the loop's own, and the
            # channel stops answering rather than spin on it.
            self.channel._tally.fault("the channel stopped serving")
        finally:
            for connection in list(self.waiting):
                self._drop(connection)
            self.selector.close()
            self.listener.close()

    def _turn(self) -> None:
        if not self.listening:
            self._listen(_SLOTS.room(self.channel))
        now = time.monotonic()
        wake = min((c.deadline for c in self.waiting), default=now + MAX_WAIT_S)
        # Paused, no event says when a place frees (a call's thread ends): look again soon.
        longest = MAX_WAIT_S if self.listening else PAUSED_POLL_S
        events = self.selector.select(min(max(wake - now, 0.0), longest))
        accept = False
        for key, _ in events:
            if key.data is None:
                accept = True
            else:
                self._safely(self._read, key.data)
        if accept and not self.channel.closed:
            self._accept()
        now = time.monotonic()
        for connection in [c for c in self.waiting if c.deadline <= now]:
            if connection.refusal is not None:
                self._safely(self._refuse, connection)  # its body never came: answer anyway
            else:
                self._drop(connection, f"connections with no head within {HEAD_TIMEOUT_S:g} s")

    def _listen(self, on: bool) -> None:
        if on and not self.listening:
            self.selector.register(self.listener, selectors.EVENT_READ, None)
        elif self.listening and not on:
            self.selector.unregister(self.listener)
        self.listening = on

    def _safely(self, step: Callable[[_Connection], None], connection: _Connection) -> None:
        try:
            step(connection)
        except Exception:
            self.channel._tally.fault("a connection failed in the gateway's channel")
            self._drop(connection)

    def _accept(self) -> None:
        # A batch at most: the heads already accepted are read between batches.
        for _ in range(ACCEPT_BATCH):
            if not _SLOTS.room(self.channel):
                self._listen(False)  # the next ones wait in the backlog for a free place
                return
            try:
                sock, _ = self.listener.accept()
            except BlockingIOError:
                return
            except OSError as exc:
                if self.channel.closed:
                    return
                # Out of descriptors, say: the channel must outlast it, not spin on it.
                self.channel._tally.note(f"connections: accept failed ({exc.strerror})")
                self.channel.wait(0.1)
                return
            self._admit(sock)

    def _admit(self, sock: socket.socket) -> None:
        sock.setblocking(False)
        connection = _Connection(sock, self.channel, time.monotonic() + HEAD_TIMEOUT_S)
        victims = _SLOTS.admit(connection)
        if victims is None:  # a place taken by another channel since room() said yes
            sock.close()
            self.channel._tally.note("connections at the worker's cap")
            return
        for victim in victims:
            victim.channel._tally.note("connections evicted before their head was in")
            if victim in self.waiting:
                self._drop(victim)  # this channel's own: closed now, not at its next event
        self.waiting[connection] = None
        self.selector.register(sock, selectors.EVENT_READ, connection)
        # The runner sends its whole request as it connects: its head is often in already.
        self._safely(self._read, connection)

    def _read(self, connection: _Connection) -> None:
        if connection.evicted:
            self._drop(connection)  # counted when evicted
            return
        try:
            data = connection.sock.recv(RECV_BYTES)
        except BlockingIOError:
            return
        except OSError:
            self._drop(connection, "connections cut short")
            return
        connection.parser.receive_data(data)  # b"": the end of what it sends
        while True:
            try:
                event = connection.parser.next_event()
            except h11.RemoteProtocolError:
                if connection.refusal is not None:
                    self._refuse(connection)  # a refused request's body was cut short
                else:
                    # Not HTTP, a head over MAX_HEAD_BYTES, or a head cut short.
                    self._send(connection, NOT_HTTP)
                    self._drop(connection, "malformed or cut-short requests")
                return
            if event is h11.NEED_DATA:
                return
            if isinstance(event, h11.Request):
                self._head(connection, event)
                if connection not in self.waiting:
                    return  # answered, or handed to its call's thread
            elif isinstance(event, h11.EndOfMessage):
                self._refuse(connection)  # a refused request, read in full: now its answer
                return
            elif isinstance(event, h11.ConnectionClosed):
                self._drop(connection, "connections that sent nothing")
                return
            # else h11.Data: a refused request's body, drained unkept

    def _head(self, connection: _Connection, request: h11.Request) -> None:
        """Refuse a request without the token (or one the gateway does not answer), or
        hand it to a thread of its own to read its body and serve it."""
        headers: dict[bytes, bytes] = {}
        for name, value in request.headers:
            headers.setdefault(name, value)  # the first of a repeated header, as before
        length = headers.get(b"content-length")
        size = int(length) if length is not None else None  # h11 checked: 1 to 20 digits
        authorization = headers.get(b"authorization")
        try:
            self.channel.check_token(
                None if authorization is None else authorization.decode("latin-1")
            )
            parse = PARSERS.get(request.target.decode("latin-1"))
            if parse is None or request.method != b"POST":
                raise Failure("bad_request", f"the gateway answers POST {', '.join(PARSERS)} only")
            if size is None or b"transfer-encoding" in headers:
                raise Failure(
                    "bad_request", "the request needs a Content-Length, and no Transfer-Encoding"
                )
            if size > MAX_REQUEST_BYTES:
                raise Failure(
                    "bad_request",
                    f"the request has {size} bytes; the gateway reads at most {MAX_REQUEST_BYTES}",
                )
        except Failure as failure:
            self.channel._tally.note(
                "requests without the channel's token"
                if failure.error.kind == "refused"
                else "requests the gateway does not answer"
            )
            connection.refusal = _failed(failure)
            if (
                size is not None
                and size <= MAX_REQUEST_BYTES
                and b"transfer-encoding" not in headers
            ):
                # Its body is read (and dropped) before the answer: answering and closing
                # while the runner still sends would cut its request with a broken pipe.
                connection.deadline = time.monotonic() + HEAD_TIMEOUT_S
            else:
                self._refuse(connection)
            return
        if not _SLOTS.authenticate(connection):
            self._drop(connection)  # evicted meanwhile, by another channel's thread
            return
        del self.waiting[connection]
        self.selector.unregister(connection.sock)
        threading.Thread(
            target=_call,
            args=(connection, parse),
            name=f"gateway-{self.channel.case_id}-call",
            daemon=True,  # a call blocked on a provider must not hold the worker's exit
        ).start()

    def _refuse(self, connection: _Connection) -> None:
        assert connection.refusal is not None
        self._send(connection, connection.refusal)
        self._drop(connection)

    def _send(self, connection: _Connection, answer: bytes) -> None:
        # An error answer is small and the socket's buffer empty: one send takes it whole.
        try:
            connection.sock.send(answer)
        except OSError:
            pass  # the client went away: its loss

    def _drop(self, connection: _Connection, why: str | None = None) -> None:
        if why is not None and not connection.evicted:
            self.channel._tally.note(why)
        self.waiting.pop(connection, None)
        try:
            self.selector.unregister(connection.sock)
        except (KeyError, ValueError):
            pass  # not registered (yet, or any more)
        _SLOTS.release(connection)
        connection.sock.close()


def _call(connection: _Connection, parse: Callable[[bytes], Request]) -> None:
    """An authenticated request, on a thread of its own: its body, its call, its answer."""
    channel = connection.channel
    try:
        try:
            body = _body(connection)
        except (OSError, h11.RemoteProtocolError):
            # The runner went away, the channel was closed, or its body was too slow.
            channel._tally.note("calls whose body was cut short")
            return
        answer = _outcome(channel, parse, body)
        try:
            connection.sock.settimeout(ANSWER_TIMEOUT_S)
            connection.sock.sendall(answer)
        except OSError:
            pass  # the channel was closed under this call, or the runner went away
    except Exception:
        channel._tally.fault("a call failed in the gateway's channel")
    finally:
        _SLOTS.release(connection)
        connection.sock.close()


def _body(connection: _Connection) -> bytes:
    """The body of an authenticated request, in within BODY_TIMEOUT_S of its head."""
    deadline = time.monotonic() + BODY_TIMEOUT_S
    body = bytearray()
    while True:
        event = connection.parser.next_event()
        if isinstance(event, h11.Data):
            body += event.data
        elif isinstance(event, h11.EndOfMessage):
            return bytes(body)
        elif event is h11.NEED_DATA:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("the request's body was not in within its deadline")
            connection.sock.settimeout(left)
            connection.parser.receive_data(connection.sock.recv(RECV_BYTES))
        else:  # h11 frames the body by its Content-Length: nothing else comes before its end
            raise h11.RemoteProtocolError(f"unexpected in a request's body: {event!r}")


def _outcome(channel: Channel, parse: Callable[[bytes], Request], body: bytes) -> bytes:
    """The answer to one authenticated request."""
    try:
        if channel.closed:
            raise Failure("refused", "the channel's case is over")
        record = channel.serve(parse(body))
        if channel.closed:
            # The case ended while its call was in flight: its answer goes nowhere.
            raise Failure("refused", "the channel's case is over")
        if record.error is not None:
            return _answer(ERROR_STATUS[record.error.kind], record.error.to_json())
        if record.reply is not None:
            return _answer(200, record.reply.to_json())
        raise AssertionError(f"call record with neither reply nor error: {record}")
    except Failure as failure:
        return _failed(failure)
    except Exception:
        # A fault of the gateway itself: the agent gets a model error, the operator the
        # traceback. The wire has no kind of its own for it; "provider" is the nearest.
        channel._tally.fault("a call failed in the gateway")
        return _failed(Failure("provider", "the model gateway failed on this call (see its log)"))


def _listener(path: Path) -> socket.socket:
    """The channel's listening socket at ``path``, world-writable (see the module's doc)."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        listener.bind(str(path))
        os.chmod(path, 0o666)
        listener.listen(LISTEN_BACKLOG)
        listener.setblocking(False)
    except BaseException:
        listener.close()
        raise
    return listener


def channel_folder(root: Path) -> Path:
    """A new folder under ``root`` for one case's socket: 0755, so the container's runner uid
    can reach the socket and nobody may add to it. ValueError when a socket in it would have
    a longer path than a Unix socket may."""
    root.mkdir(parents=True, exist_ok=True)
    folder = Path(tempfile.mkdtemp(prefix="gate-model-", dir=root))
    socket_path = folder / SOCKET_NAME
    if len(os.fsencode(socket_path)) > MAX_SOCKET_PATH:
        shutil.rmtree(folder, ignore_errors=True)
        raise ValueError(
            f"the gateway's socket path {socket_path} is longer than a Unix socket may be "
            f"({MAX_SOCKET_PATH} bytes); set GATE_GATEWAY_SOCKET_ROOT to a shorter folder"
        )
    os.chmod(folder, 0o755)
    return folder


class Channel:
    """One case's door to the gateway. Built by ``ModelGateway.open_channel``."""

    def __init__(
        self,
        *,
        root: Path,
        gate_id: str,
        case_id: str,
        project_id: str,
        secrets_: Mapping[str, str],
        routes: Sequence[ModelRoute],
        egress: Sequence[str] = (),
        api_specs: Mapping[str, Any] | None = None,
        budgets: Sequence[Budget],
        deadline: float,
        complete: Complete,
        waiting: Callable[[], AbstractContextManager[None]] | None = None,
        folder: Path | None = None,
    ) -> None:
        self.gate_id = gate_id
        self.case_id = case_id
        self.project_id = project_id
        self.secrets: Mapping[str, str] = dict(secrets_)
        self.routes = tuple(routes)
        # Hosts the case's web_read_page may reach through the gateway (the project's egress
        # allowlist; empty: none).
        self.egress = tuple(egress)
        # The project's API specs (prefix -> {base_url, headers, tools}, api_specs/): what its
        # api: tools call, built by the gateway, never by the case.
        self.api_specs: Mapping[str, Any] = dict(api_specs or {})
        self.budgets = tuple(budgets)
        self.deadline = deadline  # time.monotonic() of the gate's deadline
        self.token = secrets.token_urlsafe(32)
        self.records: list[CallRecord] = []
        self._complete = complete
        self._waiting = waiting
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._tally = _Tally(case_id)

        # A folder the caller made (channel_folder: the worker mounts it into the case's
        # container before the case starts) stays the caller's to remove; else our own.
        self._own_folder = folder is None
        self.folder = channel_folder(root) if folder is None else folder
        self.socket_path = self.folder / SOCKET_NAME
        listener: socket.socket | None = None
        try:
            listener = _listener(self.socket_path)
            front = _Front(self, listener)
        except BaseException:
            if listener is not None:
                listener.close()
            self._remove_files()
            raise
        self._listener = listener
        self._thread = threading.Thread(target=front.run, name=f"gateway-{case_id}", daemon=True)
        self._thread.start()

    @property
    def closed(self) -> bool:
        return self._closed.is_set()

    def check_token(self, authorization: str | None) -> None:
        """Refuse a request without this channel's own token, or one after close()."""
        if self.closed:
            raise Failure("refused", "the channel's case is over")
        scheme, _, token = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(
            token.strip().encode(), self.token.encode()
        ):
            raise Failure("refused", "this channel's token is required")

    def serve(self, request: Request) -> CallRecord:
        """Forward one call through the gateway and keep its record.

        Inside ``waiting`` (the worker's: the case lends its CPU slot meanwhile, and the
        answer goes back once it holds one again)."""
        with self._waiting() if self._waiting is not None else nullcontext():
            record = self._complete(self, request)
        with self._lock:
            self.records.append(record)
        return record

    def wait(self, seconds: float) -> bool:
        """Sleep up to ``seconds`` (a retry's wait); True if the channel closed meanwhile."""
        return self._closed.wait(seconds)

    def totals(self) -> Totals:
        with self._lock:
            return totals(list(self.records))

    def export_recordings(self, directory: Path) -> list[Path]:
        """The answered calls as replay recordings under ``directory/<agent>/``."""
        with self._lock:
            records = list(self.records)
        return export_recordings(records, directory)

    def close(self) -> None:
        """Stop serving: no new connection, in-flight calls cut, socket and folder gone.
        Idempotent."""
        with self._lock:
            if self._closed.is_set():
                return
            self._closed.set()
        # Wakes the front's select at once; it closes what still waits for its head.
        _shut(self._listener)
        self._thread.join(timeout=5)
        _SLOTS.cut(self)  # the calls in flight, on threads of their own
        self._remove_files()
        self._tally.flush()

    def _remove_files(self) -> None:
        """The socket, and the folder when it is the channel's own."""
        if self._own_folder:
            shutil.rmtree(self.folder, ignore_errors=True)
        else:
            self.socket_path.unlink(missing_ok=True)

    def __enter__(self) -> Channel:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
