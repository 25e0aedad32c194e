"""A test-run body read as it streams: files_data decoded into a spooled file on the way in.

A bundle at the 25 MiB limit arrives as about 35 MB of base64 inside one JSON string. Parsed
whole, the body, the str pydantic makes of it and the decoded bytes were all in memory at
once. Here the JSON is scanned as it arrives instead: the string value of the top-level key
``files_data`` is decoded four characters at a time into a spooled temporary file (hashed
and counted as it goes) and stands in the rest of the JSON as a one-character placeholder.
That rest, the skeleton (environment_id, test_filter, whatever a newer CLI adds), is
bounded and then validated by the same pydantic model as before, so every answer about the
JSON itself is still the parser's own.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import re
import tempfile
from typing import IO

from ..gates.submission import SPOOL_MEMORY_BYTES

FILES_DATA = "files_data"
_SPECIAL = re.compile(rb'["\\]')
_CONTROL = re.compile(rb"[\x00-\x1f]")
_HEX = re.compile(rb"[0-9A-Fa-f]{4}")
# JSON's one-letter escapes; \uXXXX is handled on its own.
_ESCAPES = {
    ord('"'): b'"', ord("\\"): b"\\", ord("/"): b"/", ord("b"): b"\b",
    ord("f"): b"\f", ord("n"): b"\n", ord("r"): b"\r", ord("t"): b"\t",
}  # fmt: skip
_WHITESPACE = frozenset(b" \t\r\n")
# A key longer than this is not files_data: it is kept in the skeleton, never decoded.
_MAX_KEY_BYTES = 256


class Base64Sink:
    """Base64 text in, decoded bytes out to a spooled file; refuses what ``b64decode`` with
    ``validate=True`` refuses (anything outside the alphabet, padding before the end)."""

    def __init__(self, limit_bytes: int) -> None:
        self.limit = limit_bytes
        self.file: IO[bytes] = tempfile.SpooledTemporaryFile(max_size=SPOOL_MEMORY_BYTES)
        self.hash = hashlib.sha256()
        self.size = 0  # decoded bytes, counted past the limit (then no longer kept)
        self.chars = 0
        self.error: str | None = None
        self._carry = b""
        self._padded = False

    def write(self, text: bytes) -> None:
        self.chars += len(text)
        if self.error is not None:
            return
        data = self._carry + text
        whole = len(data) // 4 * 4
        self._carry = data[whole:]
        if whole == 0:
            return
        if self._padded:  # '=' ended an earlier quartet, and more followed
            self.error = "padding before the end"
            return
        try:
            decoded = base64.b64decode(data[:whole], validate=True)
        except binascii.Error as exc:
            self.error = str(exc)
            return
        self._padded = data[whole - 1] == ord("=")
        self.size += len(decoded)
        if self.size <= self.limit:
            self.hash.update(decoded)
            self.file.write(decoded)

    def end(self) -> None:
        if self.error is None and self._carry:
            try:  # b64decode's own words for a length that is not a multiple of four
                base64.b64decode(self._carry, validate=True)
                self.error = "Incorrect padding"
            except binascii.Error as exc:
                self.error = str(exc)


class TestRunBody:
    """Feed the body's chunks in order, then read ``skeleton`` and ``files``."""

    __test__ = False  # not a pytest class, whatever its name

    def __init__(self, upload_limit_bytes: int, skeleton_limit_bytes: int) -> None:
        self.skeleton = bytearray()
        self.skeleton_limit = skeleton_limit_bytes
        self.files: Base64Sink | None = None
        self.duplicate = False  # files_data given twice
        self._upload_limit = upload_limit_bytes
        self._stack = bytearray()  # the open containers, b"{" or b"["
        self._in_string = False
        self._escaped = False
        self._key: bytearray | None = None  # a top-level key being read
        self._expect_key = False
        self._last_key: str | None = None
        self._after_colon = False  # a top-level value is about to start
        # Inside files_data's string: the escape being read (after its backslash), if any.
        self._streaming = False
        self._escape: bytearray | None = None
        self._broken = False  # files_data's string is not valid JSON

    @property
    def over_skeleton_limit(self) -> bool:
        return len(self.skeleton) > self.skeleton_limit

    def feed(self, chunk: bytes) -> None:
        at, end = 0, len(chunk)
        while at < end and not self.over_skeleton_limit:
            at = self._stream(chunk, at) if self._streaming else self._scan(chunk, at)

    def close(self) -> None:
        if self.files is not None:
            self.files.file.close()

    # -- outside files_data: byte by byte, into the skeleton (which is bounded) ----------

    def _scan(self, chunk: bytes, at: int) -> int:
        end = len(chunk)
        while at < end:
            if len(self.skeleton) > self.skeleton_limit:
                return end
            b = chunk[at]
            at += 1
            if self._in_string:
                self.skeleton.append(b)
                if self._key is not None and len(self._key) <= _MAX_KEY_BYTES:
                    self._key.append(b)
                if self._escaped:
                    self._escaped = False
                elif b == 0x5C:  # backslash
                    self._escaped = True
                elif b == 0x22:  # the closing quote
                    self._in_string = False
                    if self._key is not None:
                        self._last_key = _key_text(self._key)
                        self._key = None
                continue
            top_object = self._stack == b"{"
            if b == 0x22:
                if top_object and self._after_colon and self._last_key == FILES_DATA:
                    self._after_colon = False
                    if self.files is None:
                        self.skeleton.append(b)
                        self.files = Base64Sink(self._upload_limit)
                        self._streaming = True
                        return at
                    self.duplicate = True
                self._in_string = True
                if top_object and self._expect_key:
                    self._key = bytearray(b'"')
                    self._expect_key = False
                self._after_colon = False
            elif b in b"{[":
                self._stack.append(b)
                self._after_colon = False
                if self._stack == b"{":
                    self._expect_key = True
            elif b in b"}]":
                if self._stack:
                    self._stack.pop()
            elif b == 0x3A and top_object:  # ':'
                self._after_colon = True
            elif b == 0x2C and top_object:  # ','
                self._expect_key = True
                self._after_colon = False
            elif b not in _WHITESPACE:
                self._after_colon = False
            self.skeleton.append(b)
        return at

    # -- inside files_data's string: spans between quotes and backslashes, decoded --------

    def _stream(self, chunk: bytes, at: int) -> int:
        files = self.files
        assert files is not None
        end = len(chunk)
        while at < end:
            if self._escape is not None:
                self._escape.append(chunk[at])
                at += 1
                self._read_escape(files)
                continue
            special = _SPECIAL.search(chunk, at)
            stop = special.start() if special else end
            if stop > at:
                span = chunk[at:stop]
                if _CONTROL.search(span):
                    self._broken = True  # a raw control character: not JSON
                files.write(span)
            if special is None:
                return end
            at = stop + 1
            if chunk[stop] == 0x5C:
                self._escape = bytearray()
                continue
            # The closing quote: the skeleton gets a stand-in the model accepts as it did
            # the real value (empty stays empty), or an invalid escape if that was not JSON.
            files.end()
            self.skeleton += b"\\x" if self._broken else (b"A" if files.chars else b"")
            self.skeleton.append(0x22)
            self._streaming = False
            return at
        return at

    def _read_escape(self, files: Base64Sink) -> None:
        escape = self._escape
        assert escape is not None
        if escape[0] != ord("u"):
            simple = _ESCAPES.get(escape[0])
            if simple is None:
                self._broken = True
            else:
                files.write(simple)
            self._escape = None
        elif len(escape) == 5:
            if _HEX.fullmatch(escape, 1):
                code = int(escape[1:], 16)
                # Only ASCII can be base64; anything else is written as a byte that is not.
                files.write(bytes([code]) if code < 0x80 else b"\x80")
            else:
                self._broken = True
            self._escape = None


def _key_text(raw: bytearray) -> str | None:
    try:
        key = json.loads(bytes(raw))
    except ValueError:
        return None
    return key if isinstance(key, str) else None
