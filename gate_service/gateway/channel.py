"""One case's channel: a Unix socket in a host folder of its own, and a token only it accepts.

The folder is what the case's container bind-mounts read-only at gateway_wire.SOCKET_DIR;
nothing else of the host is visible through it. The socket is world-writable (0666) so that
the runner's uid inside the container can connect: the token, handed to the runner alone, is
the credential, and the folder path is known to the worker alone. Each request is served on a
thread of its own, so cases waiting on slow models overlap. ``close()`` ends the channel:
the socket is gone, so connecting fails, and a call still in flight is cut.
"""

from __future__ import annotations

import hmac
import json
import logging
import os
import secrets
import shutil
import socket
import socketserver
import tempfile
import threading
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import fields
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

from gate_runner.gateway_wire import (
    API_PATH,
    COMPLETE_PATH,
    ERROR_STATUS,
    FETCH_PATH,
    MAX_REQUEST_BYTES,
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
# A connection that sends nothing for this long is dropped: it must not hold a thread.
IDLE_TIMEOUT_S = 30.0

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
    agent, attempts, timeout_s = _how(data)
    return CompletionRequest(
        options=options,
        model=model,
        messages=messages,
        tools=tools,
        # An int stays an int: the replay key hashes the value as the runner sent it.
        temperature=temperature,
        agent=agent,
        attempts=attempts,
        timeout_s=timeout_s,
    )


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


class _Server(socketserver.ThreadingUnixStreamServer):
    daemon_threads = True
    # close() must not wait for a handler blocked on a provider: it cuts it instead.
    block_on_close = False
    # Connections waiting to be accepted: a case's invocations may call at once.
    request_queue_size = 64
    channel: Channel

    def handle_error(self, request: Any, client_address: Any) -> None:
        log.exception("model gateway: case %s: a connection failed", self.channel.case_id)


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    timeout = IDLE_TIMEOUT_S

    def log_message(self, format: str, *args: Any) -> None:
        pass  # no access log: a request line carries nothing worth one, and the peer is ''

    def setup(self) -> None:
        super().setup()
        self.server.channel._track(self.connection, add=True)

    def finish(self) -> None:
        try:
            super().finish()
        finally:
            self.server.channel._track(self.connection, add=False)

    def do_POST(self) -> None:
        self._answer()

    def do_GET(self) -> None:
        self._answer()

    def _answer(self) -> None:
        channel = self.server.channel
        try:
            # The body is read before any answer, a refusal too: answering and closing while
            # the runner still sends would cut its request with a broken pipe instead.
            length = self.headers.get("Content-Length", "")
            size = int(length) if length.isdigit() else None
            body = b""
            if size is not None and size <= MAX_REQUEST_BYTES:
                try:
                    body = self.rfile.read(size)
                except OSError:
                    return  # the runner went away, or sent nothing for IDLE_TIMEOUT_S
            channel.check_token(self.headers.get("Authorization"))
            parse = PARSERS.get(self.path)
            if parse is None or self.command != "POST":
                raise Failure(
                    "bad_request",
                    f"the gateway answers POST {', '.join(PARSERS)} only",
                )
            if size is None:
                raise Failure("bad_request", "the request needs a Content-Length")
            if size > MAX_REQUEST_BYTES:
                raise Failure(
                    "bad_request",
                    f"the request has {size} bytes; the gateway reads at most {MAX_REQUEST_BYTES}",
                )
            record = channel.serve(parse(body))
        except Failure as failure:
            self._send(failure.status, failure.error.to_json())
            return
        except Exception:
            # A fault of the gateway itself: the agent gets a model error, the operator the
            # traceback. The wire has no kind of its own for it; "provider" is the nearest.
            log.exception("model gateway: a call of case %s failed in the gateway", channel.case_id)
            fault = Failure("provider", "the model gateway failed on this call (see its log)")
            self._send(fault.status, fault.error.to_json())
            return
        if channel.closed:
            # The case ended while its call was in flight: its answer goes nowhere.
            over = Failure("refused", "the channel's case is over")
            self._send(over.status, over.error.to_json())
        elif record.error is not None:
            self._send(ERROR_STATUS[record.error.kind], record.error.to_json())
        elif record.reply is not None:
            self._send(200, record.reply.to_json())
        else:  # a record is either answered or failed
            raise AssertionError(f"call record with neither reply nor error: {record}")

    def _send(self, status: int, body: bytes) -> None:
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(body)
        except OSError:
            pass  # the channel was closed under this call, or the runner went away


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
        self._connections: set[socket.socket] = set()
        self._closed = threading.Event()

        # A folder the caller made (channel_folder: the worker mounts it into the case's
        # container before the case starts) stays the caller's to remove; else our own.
        self._own_folder = folder is None
        self.folder = channel_folder(root) if folder is None else folder
        self.socket_path = self.folder / SOCKET_NAME
        try:
            self._server = _Server(str(self.socket_path), _Handler)
            os.chmod(self.socket_path, 0o666)
        except BaseException:
            self._remove_files()
            raise
        self._server.channel = self
        self._thread = threading.Thread(target=self._serve, name=f"gateway-{case_id}", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        # An accept loop of its own rather than serve_forever(), whose shutdown() waits for
        # its next poll: close() shuts the listener down, which wakes accept() at once.
        listener = self._server.socket
        while not self._closed.is_set():
            try:
                connection, address = listener.accept()
            except OSError:
                if self._closed.is_set():
                    return
                # Out of file descriptors, say: the channel must outlast it, not go quiet.
                log.exception("model gateway: case %s: accept failed", self.case_id)
                self._closed.wait(0.1)
                continue
            if self._closed.is_set():
                connection.close()
                return
            self._server.process_request(connection, address)  # on a thread of its own

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

    def _track(self, connection: socket.socket, *, add: bool) -> None:
        with self._lock:
            if add:
                self._connections.add(connection)
            else:
                self._connections.discard(connection)

    def close(self) -> None:
        """Stop serving: no new connection, in-flight calls cut, socket and folder gone.
        Idempotent."""
        with self._lock:
            if self._closed.is_set():
                return
            self._closed.set()
            connections = list(self._connections)
        try:
            self._server.socket.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass  # not listening any more
        self._server.server_close()
        self._thread.join(timeout=5)
        for connection in connections:
            try:
                connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass  # already gone
        self._remove_files()

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
