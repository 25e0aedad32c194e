"""`gate submit`'s errors name the culprit, against the real API (uvicorn, Postgres).

The token is checked before the project is packed (`GET /v1/whoami?scope=submit`): a bad,
missing or read-only token exits 2 naming the token by its prefix (never the whole of it),
what it lacks and GATE_TOKEN, and the pack function and POST /v1/gates are never reached
(both spied on). A project over a limit names its size, the limit and the five largest
files inside and outside tests/files/. Rendered on an emulated terminal (Rich, forced
terminal) at 120 and 80 columns: it wraps at 80 and no key word is lost.
"""

from __future__ import annotations

import io
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient
from rich.console import Console

from gate_service.cli import main
from gate_service.cli import submit as submit_cli
from gate_service.client import api
from gate_service.client import pack as pack_module
from gate_service.client.pack import human_bytes
from tests.fixtures.auth import ADMIN_TOKEN, as_token, bearer, project_token
from tests.fixtures.live import live_server  # noqa: F401 (fixture)
from tests.fixtures.projects import calculator_project

KIB, MIB = 1024, 1024 * 1024
REAL_CLIENT = api.GateClient
UNKNOWN = "gate_Zq9unknown-token-of-nobody-0123456789abcdefgh"


@pytest.fixture
def url(live_server: tuple[str, int]) -> str:  # noqa: F811
    return "http://{}:{}".format(*live_server)


@pytest.fixture
def admin(url: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=url, headers=bearer(ADMIN_TOKEN)) as c:
        yield c


@pytest.fixture
def packed(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """The folders `gate submit` packed (it imports ``pack`` from the module at call time)."""
    calls: list[Path] = []
    real = pack_module.pack

    def spy(root: Path) -> pack_module.PackedProject:
        calls.append(root)
        return real(root)

    monkeypatch.setattr(pack_module, "pack", spy)
    return calls


@pytest.fixture
def wire(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str]]:
    """Every request an httpx client of this process sends from now on: (method, path)."""
    sent: list[tuple[str, str]] = []
    real = httpx.Client.send

    def send(self: httpx.Client, request: httpx.Request, **kwargs: Any) -> httpx.Response:
        sent.append((request.method, request.url.path))
        return real(self, request, **kwargs)

    monkeypatch.setattr(httpx.Client, "send", send)
    return sent


@pytest.fixture
def project(tmp_path: Path) -> Path:
    return calculator_project(tmp_path / "p", failing=False)


def terminal(monkeypatch: pytest.MonkeyPatch, width: int) -> Console:
    """`gate submit`'s stderr as a terminal of ``width`` columns; its text, recorded."""
    console = Console(
        file=io.StringIO(),
        width=width,
        force_terminal=True,
        color_system="standard",
        record=True,
        highlight=False,
    )
    monkeypatch.setattr(submit_cli, "_stderr", lambda: console)
    return console


def submit(url: str, project: Path, *extra: str) -> int:
    return main(["submit", str(project), "--no-wait", "--url", url, *extra])


def flat(text: str) -> str:
    """The words in order, whatever the line breaks."""
    return " ".join(text.split())


@pytest.mark.parametrize(("how", "says"), [("unknown", "is not known"), ("revoked", "was revoked")])
def test_a_bad_token_is_named_before_anything_is_packed_or_sent(
    how: str,
    says: str,
    url: str,
    admin: httpx.Client,
    project: Path,
    packed: list[Path],
    wire: list[tuple[str, str]],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    token = UNKNOWN
    if how == "revoked":
        made = admin.post("/v1/projects/default/tokens", json={"scopes": ["submit", "read"]})
        token = made.json()["token"]
        assert admin.delete(f"/v1/tokens/{made.json()['id']}").status_code == 200
    monkeypatch.setenv("GATE_TOKEN", token)  # as a pipeline sets it
    wire.clear()
    code = submit(url, project, "--json")
    out, err = capsys.readouterr()
    assert (code, out) == (2, "")
    assert packed == []
    assert wire == [("GET", "/v1/whoami")]  # no POST /v1/gates
    text = flat(err)
    assert f"the token {token[:8]}… {says} (the gate at {url})" in text
    assert (
        "Set GATE_TOKEN (or pass --token) to a token of the project with the submit scope." in text
    )
    assert "Nothing was packed or uploaded." in text
    assert token not in err and token[:9] not in err  # the prefix and not one character more
    assert "refused the bundle" not in text  # not the old answer, after packing and uploading


def test_no_token_says_to_set_gate_token_before_any_request(
    url: str,
    project: Path,
    packed: list[Path],
    wire: list[tuple[str, str]],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("GATE_TOKEN", raising=False)
    for blank in ([], ["--token", "  "]):
        code = submit(url, project, *blank)
        _, err = capsys.readouterr()
        assert code == 2
        text = flat(err)
        assert "no token: gate submit needs a token of the project, and none was given" in text
        assert "Set GATE_TOKEN (or pass --token)" in text and "Authorization" not in text
    assert packed == [] and wire == []


def test_a_token_no_header_can_carry_is_refused_without_showing_it(
    url: str,
    project: Path,
    wire: list[tuple[str, str]],
    capsys: pytest.CaptureFixture[str],
) -> None:
    token = ADMIN_TOKEN + "\r"  # a CRLF env file
    code = submit(url, project, "--token", token)
    _, err = capsys.readouterr()
    assert code == 2 and wire == []
    assert f"the token {ADMIN_TOKEN[:8]}… holds a character no token has" in flat(err)
    assert ADMIN_TOKEN not in err


@pytest.mark.parametrize("width", [120, 80])
def test_a_read_only_token_names_its_scopes_and_the_one_it_lacks(
    width: int,
    url: str,
    admin: httpx.Client,
    project: Path,
    packed: list[Path],
    wire: list[tuple[str, str]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    token = project_token(admin, "cli-ro", ["read"])
    console = terminal(monkeypatch, width)
    wire.clear()
    assert submit(url, project, "--token", token) == 2
    assert packed == [] and wire == [("GET", "/v1/whoami")]
    text = console.export_text()
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= width, text
    words = flat(text)
    assert (
        f"the token {token[:8]}… of project cli-ro lacks the submit scope: it holds read" in words
    )
    assert (
        "Set GATE_TOKEN (or pass --token) to a token of the project with the submit scope." in words
    )
    assert token not in text and token[:9] not in text
    # At 120 columns the advice is one line; at 80 Rich wraps it, between words.
    assert (f"  {submit_cli.TOKEN_HINT}" in lines) == (width == 120), text


def sparse(root: Path, rel: str, size: int) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("wb") as f:
        f.truncate(size)


@pytest.mark.parametrize("width", [120, 80])
def test_a_project_over_25_mib_names_its_size_the_limit_and_the_largest_files(
    width: int,
    url: str,
    project: Path,
    packed: list[Path],
    wire: list[tuple[str, str]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fixtures = {
        "tests/files/recordings/very-long-folder-name-for-the-wrap/session_archive.jsonl": 9 * MIB,
        "tests/files/images.bin": 8 * MIB,
        "tests/files/audio.bin": 7 * MIB,
        "tests/files/corpus.csv": 3 * MIB,
        "tests/files/small.txt": 2 * MIB,
        "tests/files/smallest.txt": KIB,  # the sixth: not listed
    }
    code = {f"tools/gen_{i}.py": (900 - 100 * i) * KIB for i in range(6)}  # 3.9 MiB in all
    for rel, size in {**fixtures, **code}.items():
        sparse(project, rel, size)
    total = sum(p.stat().st_size for p in project.rglob("*") if p.is_file())
    console = terminal(monkeypatch, width)
    wire.clear()
    assert submit(url, project, "--token", ADMIN_TOKEN) == 2
    assert packed == [project]  # it was packed, and refused there:
    assert wire == [("GET", "/v1/whoami")]  # nothing was uploaded

    text = console.export_text()
    assert max(len(line) for line in text.splitlines()) <= width, text
    words = flat(text)
    assert "File validation failed: Total file size exceeds 26,214,400 byte limit" in words
    assert (
        f"All files: {human_bytes(total)} ({total:,} bytes); limit 25 MiB (26,214,400 bytes)"
        in words
    )
    assert "Outside tests/files/:" in words and "limit 5 MiB (5,242,880 bytes)" in words
    inside = [f"{human_bytes(size)} {rel}" for rel, size in list(fixtures.items())[:5]]
    outside = [f"{human_bytes(size)} {rel}" for rel, size in list(code.items())[:5]]
    where = [words.index(item) for item in ["Largest in tests/files/:", *inside]]
    where += [words.index(item) for item in ["Largest outside tests/files/:", *outside]]
    assert where == sorted(where), words  # each list the largest first, in its section
    assert "smallest.txt" not in words and "gen_5.py" not in words
    # Every listed path is whole on the screen (at 80 columns the longest moves to a line of
    # its own): lines break between words, never inside one.
    for rel in [*list(fixtures)[:5], *list(code)[:5]]:
        assert rel in text, (rel, text)


def test_an_archive_over_the_limit_is_refused_by_the_service_naming_what_it_read(
    url: str,
    tmp_path: Path,
    wire: list[tuple[str, str]],
    capsys: pytest.CaptureFixture[str],
) -> None:
    archive = tmp_path / "big.tgz"
    with tarfile.open(archive, "w:gz", compresslevel=1) as tar:
        for name, size in {"agents/a.yaml": 5, "tests/files/a.bin": 20 * MIB,
                           "tests/files/b.bin": 10 * MIB}.items():  # fmt: skip
            info = tarfile.TarInfo(name)
            info.size = size
            tar.addfile(info, io.BytesIO(bytes(size)))
    wire.clear()
    code = main(["submit", str(archive), "--url", url, "--token", ADMIN_TOKEN, "--no-wait"])
    _, err = capsys.readouterr()
    assert code == 2 and wire == [("GET", "/v1/whoami"), ("POST", "/v1/gates")]
    text = flat(err)
    assert (
        "gate refused the bundle: 413 PayloadTooLarge: the bundle's files total more than 26214400 bytes (25 MiB)"
        in text
    )
    assert "reading stopped after 26," in text
    assert "the largest files read: tests/files/a.bin (20.0 MiB), tests/files/b.bin (" in text


# -- the route ------------------------------------------------------------------------------


def test_whoami_answers_the_token_and_checks_a_scope(client: TestClient) -> None:
    me = client.get("/v1/whoami")
    assert me.status_code == 200, me.text
    assert me.json()["project"] == "default" and "admin" in me.json()["token"]["scopes"]
    assert ADMIN_TOKEN not in me.text  # never the value
    assert client.get("/v1/whoami", params={"scope": "submit"}).status_code == 200  # admin: all

    reader = as_token(client, project_token(client, "ro", ["read"]))
    mine = reader.get("/v1/whoami").json()
    assert mine["project"] == "ro" and mine["token"]["scopes"] == ["read"]
    assert reader.get("/v1/whoami", params={"scope": "read"}).status_code == 200
    refused = reader.get("/v1/whoami", params={"scope": "submit"})
    assert refused.status_code == 403
    assert refused.json()["detail"] == (
        "this token of project 'ro' holds the scope(s) read; it lacks the submit scope"
    )
    assert refused.json()["problems"] == [
        {"location": "token", "project": "ro", "scopes": ["read"], "needed": "submit"}
    ]
    assert reader.get("/v1/whoami", params={"scope": "root"}).status_code == 422
    assert as_token(client, UNKNOWN).get("/v1/whoami").json()["detail"] == "the token is not known"


def test_an_older_gate_without_whoami_is_still_submitted_to(
    project: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A 404 from the check (a gate from before /v1/whoami) is no verdict on the token: the
    upload goes on, and its own answer judges the token."""
    seen: list[str] = []

    def older(request: httpx.Request) -> httpx.Response:
        seen.append(request.url.path)
        if request.url.path == "/v1/whoami":
            return httpx.Response(404, json={"error": "NotFound", "detail": "Not Found"})
        return httpx.Response(
            401, json={"error": "Unauthorized", "detail": "the token was revoked"}
        )

    class Scripted(REAL_CLIENT):
        def __init__(self, base_url: str, **kwargs: Any) -> None:
            super().__init__(base_url, transport=httpx.MockTransport(older), **kwargs)

    monkeypatch.setattr(api, "GateClient", Scripted)
    code = main(["submit", str(project), "--url", "http://gate.test", "--token", UNKNOWN])
    _, err = capsys.readouterr()
    assert code == 2 and seen == ["/v1/whoami", "/v1/gates"]
    text = flat(err)
    assert "gate refused the bundle: 401 Unauthorized: the token was revoked" in text
    assert "Set GATE_TOKEN (or pass --token)" in text
