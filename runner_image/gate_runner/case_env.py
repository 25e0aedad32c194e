"""What the worker hands the runner, and the names a case's environment may not use.

The runner's own process must not see any value a project controls: the dynamic loader and
libc act on variables such as ``LD_PRELOAD`` before Python starts (``python -I`` ignores only
``PYTHON*``), so a project value in the container's environment would run in the runner,
as root, next to the result nonce. So the container starts with the image's fixed
environment only, and the worker writes the case's environment (project secrets, the
operator's ``GATE_CASE_ENV`` values) and the nonce to the runner's standard input:

    b"<length of the JSON>\\n" + JSON + nonce, then end of file.

The JSON is the environment as an object ``{name: value}`` when the case has no model
gateway (the format before there was one, byte for byte). A case with a gateway channel
(gate_runner/gateway_wire.py) gets ``{"env": {name: value}, "gateway": {"token": ...}}``
instead: "env" can never be a variable of the first shape (names are upper case, values
strings), so both decode, and the token never sits among the variables that invocations
put in their environment.

The runner reads the header and the JSON at once (``read_environment``) and hands those
values only to invocation processes, after they drop to the invocation uid. The nonce stays
in the pipe, where no process of the case can reach it (the runner is non-dumpable, and its
children replace their standard input before any user code runs), until the last invocation
has ended (``read_nonce``): it is never in the memory that invocations inherit.

Both sides import this module: the framing and the name rules are written once.
"""

from __future__ import annotations

import functools
import io
import json
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

# The environment is read at once, so it is bounded: a project's secrets are capped at 1 MiB
# encrypted (gate_service.secrets), and GATE_CASE_ENV names a handful of variables.
MAX_ENV_BYTES = 4 * 1024 * 1024
MAX_HEADER_BYTES = 16  # the decimal length and its newline
MAX_NONCE_BYTES = 4096

# The gate's own prefix: the runner and the service read GATE_ variables, a case never sets one.
RESERVED_PREFIX = "GATE_"
# Names the dynamic loader, libc, the Python interpreter or the runner act on, refused for
# project secrets (when stored) and GATE_CASE_ENV (at start-up). The runner no longer gives
# them to its own process, so this is a second line: a value stored under one of these names
# would change how every invocation's subprocesses load, allocate, resolve or convert.
# Prefixes first, then glibc's secure-execution list (sysdeps/generic/unsecvars.h: what
# glibc itself drops for setuid programs) and the loader's other variables.
REFUSED_PREFIXES: dict[str, str] = {
    "LD_": "the dynamic loader's variables (LD_PRELOAD, LD_LIBRARY_PATH, LD_AUDIT, ...)",
    "MALLOC_": "glibc's allocator variables (MALLOC_CHECK_, MALLOC_TRACE, ...)",
    "PYTHON": "the Python interpreter's variables (PYTHONPATH, PYTHONSTARTUP, ...)",
    RESERVED_PREFIX: "the gate's own prefix",
}
GLIBC_SECURE_EXECUTION = frozenset(
    {
        "GCONV_PATH",
        "GETCONF_DIR",
        "GLIBC_TUNABLES",
        "HOSTALIASES",
        "LOCALDOMAIN",
        "LOCPATH",
        "NIS_PATH",
        "NLSPATH",
        "RESOLV_HOST_CONF",
        "RES_OPTIONS",
        "TMPDIR",
        "TZDIR",
    }
)
ENV_NAME = re.compile(r"[A-Z_][A-Z0-9_]{0,127}")


def refusal(name: str) -> str | None:
    """Why ``name`` may not be a variable of a case's environment; None when it may be."""
    if not ENV_NAME.fullmatch(name):
        return (
            "it must be an environment-variable name: 1 to 128 characters of A-Z, 0-9 and "
            "'_', not starting with a digit"
        )
    for prefix, what in REFUSED_PREFIXES.items():
        if name.startswith(prefix):
            return f"names starting with {prefix} are refused: {what}"
    if name in GLIBC_SECURE_EXECUTION:
        return (
            f"{name} is refused: glibc acts on it, and drops it for setuid programs (its "
            "secure-execution list)"
        )
    return None


@dataclass(frozen=True)
class Handoff:
    """What the runner reads before its invocations start: the case's environment, and the
    token of its model gateway channel when it has one (None: no gateway)."""

    env: dict[str, str] = field(default_factory=dict)
    # Never in a repr: it would be a credential in a traceback.
    gateway_token: str | None = field(default=None, repr=False)
    # The project's api: tools, as the SDK loader's registry takes them
    # ({prefix: {tool: {description, method, path, parameters}}}); empty: none.
    api_tools: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)


def encode(
    env: Mapping[str, str],
    nonce: str,
    *,
    gateway_token: str | None = None,
    api_tools: Mapping[str, Any] | None = None,
) -> bytes:
    """The runner's standard input for one case; ``gateway_token`` when it has a gateway,
    ``api_tools`` when its project has API specs."""
    shaped: dict[str, object] = dict(env)
    if gateway_token is not None or api_tools:
        shaped = {"env": dict(env)}
        if gateway_token is not None:
            if not gateway_token:
                raise ValueError("a gateway token cannot be empty")
            shaped["gateway"] = {"token": gateway_token}
        if api_tools:
            shaped["api_tools"] = dict(api_tools)
    body = json.dumps(shaped, ensure_ascii=False).encode()
    if len(body) > MAX_ENV_BYTES:
        raise ValueError(
            f"the case's environment takes {len(body)} bytes; the runner reads {MAX_ENV_BYTES}"
        )
    return f"{len(body)}\n".encode() + body + nonce.encode()


def decode(data: bytes) -> tuple[dict[str, str], str]:
    """(environment, nonce) of a whole handoff: what ``encode`` made (for fakes and tests)."""
    handoff, nonce = decode_handoff(data)
    return handoff.env, nonce


def decode_handoff(data: bytes) -> tuple[Handoff, str]:
    """(handoff, nonce) of a whole handoff, the gateway token included."""
    stream = io.BytesIO(data)
    handoff = _handoff(stream.read)
    return handoff, _nonce(stream.read)


def read_environment(fd: int = 0) -> dict[str, str]:
    """The case's environment: the header and the JSON after it, leaving the nonce unread."""
    return read_handoff(fd).env


def read_handoff(fd: int = 0) -> Handoff:
    """The environment and the gateway token, leaving the nonce unread."""
    return _handoff(functools.partial(os.read, fd))


def read_nonce(fd: int = 0) -> str:
    """What follows the environment, to the end of the stream; then ``fd`` is closed."""
    try:
        return _nonce(functools.partial(os.read, fd))
    finally:
        os.close(fd)


def _read_exactly(read: Callable[[int], bytes], size: int) -> bytes:
    """``size`` bytes and not one more: what follows must stay in the pipe."""
    chunks: list[bytes] = []
    left = size
    while left:
        chunk = read(left)  # at most ``left``: os.read never returns more than it is asked
        if not chunk:
            raise ValueError(f"the handoff ended {left} bytes early")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def _handoff(read: Callable[[int], bytes]) -> Handoff:
    header = bytearray()
    while not header.endswith(b"\n"):
        byte = read(1)  # one at a time: a larger read could take the nonce too
        if not byte or len(header) >= MAX_HEADER_BYTES:
            raise ValueError("the handoff has no length header")
        header += byte
    text = header.decode("ascii", "replace").strip()
    if not text.isdigit() or int(text) > MAX_ENV_BYTES:
        raise ValueError(f"the handoff's length header {text[:20]!r} is not a length")
    body = json.loads(_read_exactly(read, int(text)))
    token: str | None = None
    api_tools: dict[str, Any] = {}
    if isinstance(body, dict) and isinstance(body.get("env"), dict):
        api_tools = body.get("api_tools") or {}
        if not isinstance(api_tools, dict) or not all(
            isinstance(tools, dict) and all(isinstance(t, dict) for t in tools.values())
            for tools in api_tools.values()
        ):
            raise ValueError("the handoff's api_tools is not an object of tool objects")
        gateway = body.get("gateway")
        if gateway is not None:
            token = gateway.get("token") if isinstance(gateway, dict) else None
            if not isinstance(token, str) or not token:
                raise ValueError("the handoff's gateway has no token")
        body = body["env"]
    if not isinstance(body, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in body.items()
    ):
        raise ValueError("the handoff's environment is not an object of strings")
    return Handoff(env=body, gateway_token=token, api_tools=api_tools)


def _nonce(read: Callable[[int], bytes]) -> str:
    data = bytearray()
    while len(data) <= MAX_NONCE_BYTES:
        chunk = read(MAX_NONCE_BYTES + 1 - len(data))
        if not chunk:
            break
        data += chunk
    return bytes(data[:MAX_NONCE_BYTES]).decode("ascii", "replace")
