"""Receiving a bundle upload: streamed, hashed and capped while it arrives.

Starlette's form parsing reads the whole body before the handler runs, so a 10 GB upload
would be spooled to disk first. Here the multipart stream is parsed incrementally: the file
part goes to a spooled temporary file (memory stays flat), and the request is refused with
413 the moment it crosses the limit, without reading the rest, or with 408 once the body
arrives slower than the minimum rate (``paced_body``).
"""

from __future__ import annotations

import hashlib
import tempfile
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import IO, TYPE_CHECKING

import anyio
from fastapi import Request
from python_multipart.exceptions import MultipartParseError
from python_multipart.multipart import MultipartParser, parse_options_header
from starlette.requests import ClientDisconnect

if TYPE_CHECKING:  # the library defines its callback type for type checkers only
    from python_multipart.multipart import MultipartCallbacks

from ..config import Settings
from ..errors import (
    BadRequest,
    PayloadTooLarge,
    RequestInvalid,
    RequestTimeout,
    UnsupportedMediaType,
)
from .submission import MAX_TEXT_FIELD_BYTES, SPOOL_MEMORY_BYTES, TEXT_FIELDS, Upload

FILE_FIELD = "bundle"
# Room for part headers, boundaries and the small text fields around the file.
ENVELOPE_BYTES = 64 * 1024
EXPECTED = (
    "expected multipart/form-data with a file field named 'bundle' holding the project as "
    ".tar.gz/.tgz or .zip (optional text fields: filter, labels, model_mode)"
)


@dataclass(frozen=True)
class MinimumRate:
    """The slowest a request body may arrive: on average ``bytes_per_second`` over each
    stretch of ``window_seconds`` from its start, the first one (the grace period) included.

    Measured per stretch, not over the whole body: a client that sends most of its body at
    once and then trickles the rest is cut one stretch later, not once its average falls.
    """

    bytes_per_second: int
    window_seconds: float

    @classmethod
    def of(cls, settings: Settings) -> MinimumRate:
        return cls(settings.upload_min_bytes_per_second, settings.upload_rate_grace_seconds)

    @property
    def window_bytes(self) -> float:
        return self.bytes_per_second * self.window_seconds


async def _next_body(request: Request) -> tuple[bytes, bool]:
    """The next chunk of the body from the server, and whether more follow.

    ASGI ``receive`` itself, not ``request.stream()``: a wait for it may be cancelled and
    started again (uvicorn hands a message over only once the wait returns), whereas a
    cancelled ``stream()`` generator is finished for good.
    """
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            raise ClientDisconnect()
        if message["type"] == "http.request":
            return message.get("body", b""), bool(message.get("more_body", False))


async def paced_body(request: Request, rate: MinimumRate) -> AsyncIterator[bytes]:
    """The request body's chunks as they arrive; RequestTimeout (408) once a stretch of
    ``rate.window_seconds`` brought fewer than ``rate.window_bytes``, even if no chunk comes.

    An upload holds a slot of its project's until its body is read; without this, a client
    sending a byte every few seconds held one for as long as it liked.
    """
    more = True
    if rate.bytes_per_second <= 0:
        while more:
            chunk, more = await _next_body(request)
            yield chunk
        return
    started = time.monotonic()
    window_end = started + rate.window_seconds
    in_window = total = 0
    while more:
        left = window_end - time.monotonic()
        if left <= 0:
            if in_window < rate.window_bytes:
                raise RequestTimeout(
                    f"the upload arrived slower than the minimum of {rate.bytes_per_second} "
                    f"bytes/s (GATE_UPLOAD_MIN_BYTES_PER_SECOND): {in_window} bytes in the "
                    f"last {rate.window_seconds:g} s (GATE_UPLOAD_RATE_GRACE_SECONDS) where "
                    f"{rate.window_bytes:.0f} were needed; cut after {total} bytes in "
                    f"{time.monotonic() - started:.0f} s. Send the body at once, on a faster link",
                    problems=[
                        {
                            "min_bytes_per_second": rate.bytes_per_second,
                            "window_seconds": rate.window_seconds,
                            "bytes_in_window": in_window,
                            "received_bytes": total,
                        }
                    ],
                )
            window_end += rate.window_seconds
            in_window = 0
            continue
        received: tuple[bytes, bool] | None = None
        with anyio.move_on_after(left):
            received = await _next_body(request)
        if received is None:  # the stretch ended with no chunk: judged at the top
            continue
        chunk, more = received
        in_window += len(chunk)
        total += len(chunk)
        yield chunk


class _Collector:
    """multipart callbacks: keeps the bundle part in a spooled file, small fields in memory."""

    def __init__(self, limit_bytes: int) -> None:
        self.limit = limit_bytes
        self.file: IO[bytes] = tempfile.SpooledTemporaryFile(max_size=SPOOL_MEMORY_BYTES)
        self.hash = hashlib.sha256()
        self.size = 0
        self.filename: str | None = None
        self.seen_file = False
        self.fields: dict[str, bytearray] = {}
        self._header_field = bytearray()
        self._header_value = bytearray()
        self._headers: dict[str, bytes] = {}
        self._part: str | None = None
        self._is_file = False

    def callbacks(self) -> MultipartCallbacks:
        return {
            "on_part_begin": self._part_begin,
            "on_header_field": lambda d, s, e: self._header_field.extend(d[s:e]),
            "on_header_value": lambda d, s, e: self._header_value.extend(d[s:e]),
            "on_header_end": self._header_end,
            "on_headers_finished": self._headers_finished,
            "on_part_data": self._part_data,
        }

    def _part_begin(self) -> None:
        self._headers = {}
        self._part = None

    def _header_end(self) -> None:
        self._headers[bytes(self._header_field).decode("latin-1").lower()] = bytes(
            self._header_value
        )
        self._header_field.clear()
        self._header_value.clear()

    def _headers_finished(self) -> None:
        disposition = self._headers.get("content-disposition", b"")
        _, params = parse_options_header(disposition)
        name = params.get(b"name", b"").decode("utf-8", "replace")
        self._part = name
        self._is_file = name == FILE_FIELD
        if self._is_file:
            if self.seen_file:
                raise BadRequest("the request has more than one 'bundle' field; send exactly one")
            self.seen_file = True
            raw = params.get(b"filename")
            self.filename = raw.decode("utf-8", "replace") if raw is not None else None
        elif name in TEXT_FIELDS:
            self.fields[name] = bytearray()

    def _part_data(self, data: bytes, start: int, end: int) -> None:
        chunk = data[start:end]
        if self._is_file:
            self.size += len(chunk)
            if self.size > self.limit:
                raise PayloadTooLarge(
                    f"the bundle is larger than the upload limit of {self.limit} bytes "
                    f"(25 MiB); refused after {self.size} bytes, without reading the rest",
                    problems=[{"limit_bytes": self.limit, "received_bytes": self.size}],
                )
            self.hash.update(chunk)
            self.file.write(chunk)
        elif self._part in self.fields:
            buf = self.fields[self._part]
            if len(buf) + len(chunk) > MAX_TEXT_FIELD_BYTES:
                raise BadRequest(
                    f"form field {self._part!r} is longer than {MAX_TEXT_FIELD_BYTES} bytes"
                )
            buf.extend(chunk)


def _text_fields(raw: dict[str, bytearray]) -> dict[str, str]:
    fields = {}
    for name, value in raw.items():
        text = value.decode("utf-8", "replace")
        if "\x00" in text:
            raise BadRequest(f"form field {name!r} contains a NUL character")
        fields[name] = text
    return fields


async def receive_upload(request: Request, *, limit_bytes: int, rate: MinimumRate) -> Upload:
    """Parse the multipart body as it streams in; raise before reading past the limit, or
    once it arrives slower than ``rate``."""
    content_type, params = parse_options_header(request.headers.get("content-type", ""))
    if content_type != b"multipart/form-data":
        shown = content_type.decode("latin-1")
        raise UnsupportedMediaType(f"{EXPECTED}; got Content-Type {shown!r}")
    boundary = params.get(b"boundary")
    if not boundary:
        raise BadRequest(f"the multipart Content-Type has no boundary; {EXPECTED}")
    collector = _Collector(limit_bytes)
    parser = MultipartParser(boundary, collector.callbacks())
    received = 0
    try:
        async for chunk in paced_body(request, rate):
            received += len(chunk)
            if received > limit_bytes + ENVELOPE_BYTES:
                raise PayloadTooLarge(
                    f"the request body is larger than the upload limit of {limit_bytes} bytes "
                    f"(25 MiB); refused after {received} bytes, without reading the rest",
                    problems=[{"limit_bytes": limit_bytes, "received_bytes": received}],
                )
            parser.write(chunk)
        parser.finalize()
    except MultipartParseError as exc:
        collector.file.close()
        raise BadRequest(f"the multipart body is malformed ({exc}); {EXPECTED}") from None
    except BaseException:
        collector.file.close()
        raise
    if not collector.seen_file:
        collector.file.close()
        raise RequestInvalid(
            f"no 'bundle' field in the request; {EXPECTED}",
            problems=[{"location": "body.bundle", "message": "Field required"}],
        )
    if collector.size == 0:
        collector.file.close()
        raise BadRequest(f"the bundle file is empty; {EXPECTED}")
    return Upload(
        file=collector.file,
        size=collector.size,
        sha256=collector.hash.hexdigest(),
        filename=collector.filename,
        fields=_text_fields(collector.fields),
    )
