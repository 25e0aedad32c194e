"""Browser safety (issue 9, item 6): only trusted Host names are answered, and no CORS unless
an operator lists the origins."""

import pytest
from fastapi.testclient import TestClient

from gate_service.config import Settings
from gate_service.main import create_app
from tests.fixtures.auth import ADMIN_TOKEN, bearer

PREFLIGHT = {
    "Access-Control-Request-Method": "GET",
    "Access-Control-Request-Headers": "authorization",
}


def app_client(settings: Settings, base_url: str = "http://testserver") -> TestClient:
    return TestClient(create_app(settings), base_url=base_url, headers=bearer(ADMIN_TOKEN))


@pytest.fixture
def embedded_default(database_url: str) -> Settings:
    """The settings as `gate serve` has them with nothing set: GATE_TRUSTED_HOSTS unset."""
    settings = Settings(database_url=database_url, bootstrap_token=ADMIN_TOKEN)
    assert settings.trusted_hosts == "localhost,127.0.0.1,::1"
    assert settings.cors_origins == ""
    return settings


@pytest.mark.parametrize(
    "base_url",
    ["http://localhost", "http://localhost:8080", "http://127.0.0.1:5555", "http://[::1]:8080"],
)
def test_the_embedded_default_answers_loopback_names(
    embedded_default: Settings, base_url: str
) -> None:
    with app_client(embedded_default, base_url) as c:
        assert c.get("/v1/gates").status_code == 200
        assert c.get("/healthz").status_code == 200


@pytest.mark.parametrize(
    "host",
    ["attacker.example", "testserver", "localhost.attacker.example", "127.0.0.2", "[::2]"],
)
def test_other_hosts_get_400_in_the_error_shape_before_any_route(
    embedded_default: Settings, host: str
) -> None:
    # DNS rebinding: a page on attacker.example, whose name now resolves to 127.0.0.1, still
    # sends `Host: attacker.example`.
    with app_client(embedded_default, "http://localhost") as c:
        for method, path in (("GET", "/v1/gates"), ("GET", "/healthz"), ("POST", "/v1/projects")):
            response = c.request(method, path, headers={"Host": host})
            assert response.status_code == 400, (host, response.text)
            body = response.json()
            assert body["error"] == "BadRequest"
            assert "GATE_TRUSTED_HOSTS" in body["detail"] and body["problems"] == []
            assert response.headers["X-Request-ID"]


def test_a_configured_list_replaces_the_default_and_wildcards_match_subdomains(
    database_url: str,
) -> None:
    settings = Settings(
        database_url=database_url,
        bootstrap_token=ADMIN_TOKEN,
        trusted_hosts="gate.example.com, *.ci.example.com",
    )
    with app_client(settings, "http://gate.example.com") as c:
        assert c.get("/v1/gates").status_code == 200
        assert (
            c.get("/v1/gates", headers={"Host": "runner-7.ci.example.com:443"}).status_code == 200
        )
        assert c.get("/v1/gates", headers={"Host": "localhost"}).status_code == 400
        assert c.get("/v1/gates", headers={"Host": "ci.example.com.evil"}).status_code == 400


def test_a_bad_trusted_hosts_setting_refuses_to_start(database_url: str) -> None:
    for value in ("", " , ", "gate.*.example", "*example.com"):
        with pytest.raises(ValueError, match="GATE_TRUSTED_HOSTS"):
            create_app(Settings(database_url=database_url, trusted_hosts=value))


def test_no_cors_unless_configured(client: TestClient) -> None:
    origin = {"Origin": "https://attacker.example"}
    preflight = client.options("/v1/gates", headers={**origin, **PREFLIGHT})
    assert "access-control-allow-origin" not in preflight.headers
    assert preflight.status_code == 405  # no CORS middleware: OPTIONS is just not a route
    simple = client.get("/v1/gates", headers=origin)
    assert simple.status_code == 200
    assert not [h for h in simple.headers if h.lower().startswith("access-control-")]


def test_configured_cors_allows_exactly_those_origins_without_credentials(
    database_url: str,
) -> None:
    settings = Settings(
        database_url=database_url,
        bootstrap_token=ADMIN_TOKEN,
        trusted_hosts="testserver",
        cors_origins="https://ci.example.com",
    )
    with app_client(settings) as c:
        allowed = {"Origin": "https://ci.example.com"}
        preflight = c.options("/v1/gates", headers={**allowed, **PREFLIGHT})
        assert preflight.status_code == 200
        assert preflight.headers["access-control-allow-origin"] == "https://ci.example.com"
        assert "access-control-allow-credentials" not in preflight.headers
        simple = c.get("/v1/gates", headers=allowed)
        assert simple.headers["access-control-allow-origin"] == "https://ci.example.com"
        assert "X-Request-ID" in simple.headers["access-control-expose-headers"]

        other = {"Origin": "https://attacker.example"}
        refused = c.options("/v1/gates", headers={**other, **PREFLIGHT})
        assert refused.status_code == 400
        assert "access-control-allow-origin" not in refused.headers
        assert "access-control-allow-origin" not in c.get("/v1/gates", headers=other).headers
