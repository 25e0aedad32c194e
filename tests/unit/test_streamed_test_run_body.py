"""The connic test-run body scanned as it streams (connic_api/body.py): files_data decoded on
the way, the rest judged by the model exactly as a whole body was."""

from __future__ import annotations

import base64
import hashlib
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gate_service.connic_api.body import TestRunBody
from gate_service.connic_api.service import JSON_ENVELOPE_BYTES, parse_submission
from gate_service.errors import BadRequest, PayloadTooLarge

LIMIT = 1024 * 1024


def fed(raw: bytes, *, step: int = 7, limit: int = LIMIT) -> TestRunBody:
    body = TestRunBody(limit, JSON_ENVELOPE_BYTES)
    for at in range(0, len(raw), step):
        body.feed(raw[at : at + step])
    return body


def decoded(raw: bytes, **kwargs: int) -> bytes:
    upload = parse_submission(fed(raw, **kwargs), upload_limit_bytes=LIMIT)
    try:
        upload.file.seek(0)
        data = upload.file.read()
        assert upload.size == len(data) and upload.sha256 == hashlib.sha256(data).hexdigest()
        return data
    finally:
        upload.close()


def refused(raw: bytes) -> str:
    with pytest.raises((BadRequest, PayloadTooLarge)) as caught:
        parse_submission(fed(raw), upload_limit_bytes=LIMIT)
    return str(caught.value.detail)


@settings(max_examples=200, deadline=None)
@given(
    data=st.binary(min_size=1, max_size=3000),
    step=st.integers(1, 97),
    escape_every=st.integers(0, 5),
    before=st.sampled_from(["", '"environment_id": "default", ', '"x": {"files_data": 1}, ']),
)
def test_any_chunking_and_any_legal_escaping_decodes_to_the_same_bytes(
    data: bytes, step: int, escape_every: int, before: str
) -> None:
    text = base64.b64encode(data).decode()
    if escape_every:  # JSON may escape any character as \\uXXXX and '/' as \\/
        text = "".join(
            ("\\/" if c == "/" else f"\\u{ord(c):04x}") if i % escape_every == 0 else c
            for i, c in enumerate(text)
        )
    raw = ("{" + before + '"files_data": "' + text + '", "test_filter": "a"}').encode()
    assert decoded(raw, step=step) == data


def test_the_key_may_be_escaped_and_spaced_like_any_json_key() -> None:
    raw = b'{ "files\\u005fdata"  :\n "' + base64.b64encode(b"hello") + b'" }'
    assert decoded(raw, step=1) == b"hello"


def test_only_the_top_level_files_data_is_the_archive() -> None:
    inner = base64.b64encode(b"inner").decode()
    raw = json.dumps({"meta": {"files_data": inner}, "files_data": "b3V0ZXI="}).encode()
    assert decoded(raw) == b"outer"
    # Nested only: as the model says of a body without it.
    assert "body.files_data: Field required" in refused(
        json.dumps({"m": {"files_data": inner}}).encode()
    )


@pytest.mark.parametrize(
    ("raw", "said"),
    [
        (b'{"files_data": "QUJD=A==", "environment_id": "default"}', "not valid base64"),
        (b'{"files_data": "QQ==QUJD"}', "not valid base64"),
        (b'{"files_data": "QUJDQ"}', "not valid base64"),
        (b'{"files_data": "QUJD\\n"}', "not valid base64"),
        (b'{"files_data": "\\u00e9QUJ"}', "not valid base64"),
        (b'{"files_data": "QU\x01JD"}', "Invalid JSON"),
        (b'{"files_data": "QU\\qJD"}', "Invalid JSON"),
        (b'{"files_data": "QU\\u00zzJD"}', "Invalid JSON"),
        (b'{"files_data": "QUJD"', "Invalid JSON"),
        (b'{"files_data": "QUJD', "Invalid JSON"),
        (b'{"files_data": ""}', "body.files_data"),
        (b'{"files_data": 12}', "body.files_data"),
        (b'{"files_data": ["QUJD"]}', "body.files_data"),
        (b'["files_data", "QUJD"]', "Input should be an object"),
        (b'{"files_data": "QUJD", "files_data": "QUJD"}', "more than once"),
        (b'{"files_data": "QUJD", "environment_id": "prod"}', "unknown environment 'prod'"),
        (b'{"files_data": "QUJD", "test_filter": "a\\u0000b"}', "NUL"),
    ],
)
def test_what_a_whole_body_refused_is_refused_alike(raw: bytes, said: str) -> None:
    assert said in refused(raw)


def test_the_json_around_files_data_is_bounded_while_it_streams() -> None:
    raw = b'{"files_data": "QUJD", "other": "' + b"x" * (JSON_ENVELOPE_BYTES + 10) + b'"}'
    body = fed(raw, step=4096)
    # Scanning stopped at the bound: nothing past it is kept.
    assert len(body.skeleton) <= JSON_ENVELOPE_BYTES + 1
    with pytest.raises(PayloadTooLarge, match="JSON around files_data"):
        parse_submission(body, upload_limit_bytes=LIMIT)


def test_an_archive_over_the_upload_limit_is_413_and_not_kept_past_it() -> None:
    data = b"z" * 3000
    raw = b'{"files_data": "' + base64.b64encode(data) + b'"}'
    body = fed(raw, step=100, limit=2000)
    assert body.files is not None and body.files.file.tell() <= 2000
    with pytest.raises(PayloadTooLarge, match="upload limit is 2000 bytes"):
        parse_submission(body, upload_limit_bytes=2000)
