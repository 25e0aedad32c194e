"""The upload cap holds on a real HTTP stream with no Content-Length to trust."""

import json

from tests.fixtures.live import stream_upload

MIB = 1024 * 1024


def test_chunked_upload_over_the_limit_is_refused_before_it_is_read_whole(
    live_server: tuple[str, int],
) -> None:
    sent, status, body = stream_upload(*live_server, total_bytes=200 * MIB)
    assert status == 413
    # The server answered once it had a little over 25 MiB, not after all 200 MiB.
    assert 25 * MIB <= sent < 40 * MIB
    detail = json.loads(body)
    assert detail["error"] == "PayloadTooLarge"
    assert "26214400" in detail["detail"]
