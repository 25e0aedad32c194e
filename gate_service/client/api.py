"""GateClient: submit a bundle, follow a gate to its verdict, fetch runs."""

from __future__ import annotations

import io
import json
import tarfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx

from ..bundles.archive import ROOT_FILES, UPLOAD_ROOTS

TERMINAL = frozenset({"passed", "failed", "error", "cancelled"})
EXIT_CODES = {"passed": 0, "failed": 1, "cancelled": 1, "error": 2}


class GateAPIError(Exception):
    def __init__(self, status_code: int, body: dict[str, Any]) -> None:
        self.status_code = status_code
        self.kind = str(body.get("error", "HTTPError"))
        self.detail = str(body.get("detail", ""))
        self.problems = body.get("problems") or []
        super().__init__(f"{status_code} {self.kind}: {self.detail}")


def _upload_files(root: Path) -> Iterator[Path]:
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root)
        if not path.is_file() or path.is_symlink():
            continue
        if any(p.startswith(".") for p in rel.parts) or "__pycache__" in rel.parts:
            continue
        if path.suffix == ".pyc":
            continue
        if rel.parts[0] in UPLOAD_ROOTS or (len(rel.parts) == 1 and rel.name in ROOT_FILES):
            yield path


def pack_project(root: Path) -> bytes:
    """A .tar.gz of the project's upload set, paths relative to the project root."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for path in _upload_files(root):
            info = tar.gettarinfo(str(path), arcname=path.relative_to(root).as_posix())
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            with path.open("rb") as fh:
                tar.addfile(info, fh)
    return buf.getvalue()


class GateClient:
    """A client of one project: every call carries that project's bearer token."""

    def __init__(
        self,
        base_url: str,
        *,
        token: str | None = None,
        timeout: float = 120.0,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._http = httpx.Client(
            base_url=base_url, headers=headers, timeout=timeout, transport=transport
        )

    def close(self) -> None:
        self._http.close()

    def _check(self, response: httpx.Response) -> dict[str, Any]:
        try:
            body = response.json()
        except ValueError:
            body = {"error": "HTTPError", "detail": response.text[:500]}
        if response.status_code >= 400:
            raise GateAPIError(response.status_code, body)
        return body if isinstance(body, dict) else {"items": body}

    def submit(
        self,
        bundle: bytes,
        *,
        filename: str = "bundle.tar.gz",
        name_filter: str | None = None,
        labels: dict[str, Any] | None = None,
        idempotency_key: str | None = None,
    ) -> dict[str, Any]:
        data: dict[str, str] = {}
        if name_filter:
            data["filter"] = name_filter
        if labels:
            data["labels"] = json.dumps(labels)
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else {}
        response = self._http.post(
            "/v1/gates", files={"bundle": (filename, bundle)}, data=data, headers=headers
        )
        return self._check(response)

    def gate(self, gate_id: str) -> dict[str, Any]:
        return self._check(self._http.get(f"/v1/gates/{gate_id}"))

    def cancel(self, gate_id: str) -> dict[str, Any]:
        return self._check(self._http.post(f"/v1/gates/{gate_id}/cancel"))

    # -- admin ----------------------------------------------------------------------------

    def create_project(self, name: str, *, retention_days: int | None = None) -> dict[str, Any]:
        body: dict[str, Any] = {"name": name}
        if retention_days is not None:
            body["retention_days"] = retention_days
        return self._check(self._http.post("/v1/projects", json=body))

    def create_token(
        self,
        project: str,
        scopes: list[str],
        *,
        expires_in_days: int | None = None,
        name: str | None = None,
    ) -> dict[str, Any]:
        body: dict[str, Any] = {"scopes": scopes}
        if expires_in_days is not None:
            body["expires_in_days"] = expires_in_days
        if name is not None:
            body["name"] = name
        return self._check(self._http.post(f"/v1/projects/{project}/tokens", json=body))

    def tokens(self, project: str) -> dict[str, Any]:
        return self._check(self._http.get(f"/v1/projects/{project}/tokens"))

    def revoke_token(self, token_id: str) -> dict[str, Any]:
        return self._check(self._http.delete(f"/v1/tokens/{token_id}"))

    def audit(self, *, limit: int = 100) -> dict[str, Any]:
        return self._check(self._http.get("/v1/audit", params={"limit": limit}))

    def run(self, run_id: str) -> dict[str, Any]:
        return self._check(self._http.get(f"/v1/runs/{run_id}"))

    def wait(
        self,
        gate_id: str,
        *,
        timeout_s: float = 3600,
        on_change: Callable[[dict[str, Any]], None] | None = None,
    ) -> dict[str, Any]:
        """Long-poll until the gate ends; ``on_change`` sees every new state."""
        deadline = time.monotonic() + timeout_s
        etag: str | None = None
        gate: dict[str, Any] = {}
        while time.monotonic() < deadline:
            headers = {"If-None-Match": etag} if etag else {}
            response = self._http.get(
                f"/v1/gates/{gate_id}", params={"wait": 30}, headers=headers, timeout=60
            )
            if response.status_code == 304:
                continue
            gate = self._check(response)
            etag = response.headers.get("ETag")
            if on_change:
                on_change(gate)
            if gate.get("status") in TERMINAL:
                return gate
        raise TimeoutError(f"gate {gate_id} did not finish within {timeout_s} s")
