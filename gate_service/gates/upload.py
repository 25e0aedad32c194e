"""Receiving a bundle upload: streamed, hashed and capped while it arrives.

Starlette's form parsing reads the whole body before the handler runs, so a 10 GB upload
would be spooled to disk first. Here the multipart stream is parsed incrementally: the file
part goes to a spooled temporary file (memory stays flat), and the request is refused with
413 the moment it crosses the limit, without reading the rest.
"""

from __future__ import annotations

import hashlib
import tempfile
from dataclasses import dataclass, field
from typing import IO, TYPE_CHECKING

from fastapi import Request
from python_multipart.exceptions import MultipartParseError
from python_multipart.multipart import MultipartParser, parse_options_header

if TYPE_CHECKING:  # the library defines its callback type for type checkers only
    from python_multipart.multipart import MultipartCallbacks

from ..errors import BadRequest, PayloadTooLarge, RequestInvalid, UnsupportedMediaType

FILE_FIELD = "bundle"
TEXT_FIELDS = ("filter", "labels", "model_mode")
MAX_TEXT_FIELD_BYTES = 16 * 1024
# Kept in memory up to this size, then on disk.
SPOOL_MEMORY_BYTES = 1024 * 1024
# Room for part headers, boundaries and the small text fields around the file.
ENVELOPE_BYTES = 64 * 1024
EXPECTED = (
    "expected multipart/form-data with a file field named 'bundle' holding the project as "
    ".tar.gz/.tgz or .zip (optional text fields: filter, labels, model_mode)"
)


@dataclass
class Upload:
    file: IO[bytes]
    size: int
    sha256: str
    filename: str | None
    fields: dict[str, str] = field(default_factory=dict)

    def read(self) -> bytes:
        self.file.seek(0)
        return self.file.read()

    def close(self) -> None:
        self.file.close()


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


async def receive_upload(request: Request, *, limit_bytes: int) -> Upload:
    """Parse the multipart body as it streams in; raise before reading past the limit."""
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
        async for chunk in request.stream():
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
