"""Property: no upload, however broken, makes the API answer 500."""

from __future__ import annotations

from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.unit.test_archive_properties import MEMBERS, build_tar, build_zip

UPLOADS = st.one_of(
    st.binary(max_size=2048),
    MEMBERS.map(build_tar),
    MEMBERS.map(build_zip),
    st.tuples(MEMBERS.map(build_tar), st.integers(1, 400)).map(lambda t: t[0][: t[1]]),
)


@settings(
    max_examples=80,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(upload=UPLOADS, filename=st.sampled_from(["b.tgz", "b.zip", "b.tar.gz", "", "../x"]))
def test_random_uploads_never_make_the_api_fail(
    client: TestClient, upload: bytes, filename: str
) -> None:
    response = client.post("/v1/gates", files={"bundle": (filename, upload)})
    assert response.status_code < 500, response.text
    assert response.status_code in (200, 202, 400, 413, 415, 422)
    if response.status_code >= 400:
        assert set(response.json()) == {"error", "detail", "problems"}
