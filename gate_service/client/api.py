"""GateClient: submit a bundle, follow a gate to its verdict, fetch runs."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import quote

import httpx
from pydantic import ValidationError

from .pack import PackError, pack_project
from .shapes import CaseView, RunView

__all__ = [
    "EXIT_CODES",
    "TERMINAL",
    "GateAPIError",
    "GateClient",
    "PackError",
    "absolute_links",
    "pack_project",
]

TERMINAL = frozenset({"passed", "failed", "error", "cancelled"})
EXIT_CODES = {"passed": 0, "failed": 1, "cancelled": 1, "error": 2}

# The results pages' path: a summary's links to them are paths without GATE_PUBLIC_URL.
PAGES_PATH = "/ui/"
# A Markdown link's target that is such a path. The summary escapes every "]" of text (a
# tenant's case name), so only its own links end "](" unescaped.
_PAGE_LINK = re.compile(r"(?<!\\)\]\(/ui/")


def absolute_links(markdown: str, pages_url: str) -> str:
    """A summary's links to the results pages under ``pages_url`` (``http://gate/ui/``)."""
    return _PAGE_LINK.sub(lambda _: "](" + pages_url, markdown)


class GateAPIError(Exception):
    def __init__(self, status_code: int, body: dict[str, Any]) -> None:
        self.status_code = status_code
        self.kind = str(body.get("error", "HTTPError"))
        self.detail = str(body.get("detail", ""))
        self.problems = body.get("problems") or []
        super().__init__(f"{status_code} {self.kind}: {self.detail}")


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
        model_mode: str | None = None,
        baseline: str | None = None,
        changed_only: bool = False,
    ) -> dict[str, Any]:
        """Queue a bundle. ``baseline``: a gate id or ``label:key=value`` to compare each
        case with; ``changed_only``: reuse the baseline's passing cases whose closure is
        unchanged (needs a baseline)."""
        data: dict[str, str] = {}
        if name_filter:
            data["filter"] = name_filter
        if model_mode:
            data["model_mode"] = model_mode
        if labels:
            data["labels"] = json.dumps(labels)
        if baseline:
            data["baseline"] = baseline
        if changed_only:
            data["changed_only"] = "true"
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else {}
        response = self._http.post(
            "/v1/gates", files={"bundle": (filename, bundle)}, data=data, headers=headers
        )
        return self._page_link(self._check(response))

    def whoami(self, *, scope: str | None = None) -> dict[str, Any]:
        """The token this client holds, as the gate knows it: ``{"project", "token": {"id",
        "name", "scopes", ...}}``. With ``scope``, a 403 GateAPIError unless the token holds
        it (its ``problems[0]`` names the project, the scopes held and the one needed): the
        cheap check before packing and uploading."""
        params = {"scope": scope} if scope else None
        return self._check(self._http.get("/v1/whoami", params=params))

    def gate(self, gate_id: str) -> dict[str, Any]:
        """The gate with all its cases: GET answers the first page of them, and the rest
        are fetched by following ``next_cases``."""
        gate = self._page_link(self._check(self._http.get(f"/v1/gates/{gate_id}")))
        return self._all_cases(gate)

    def _all_cases(self, gate: dict[str, Any]) -> dict[str, Any]:
        following = gate.get("next_cases")
        cases = list(gate.get("cases") or [])
        while following:
            page = self._check(self._http.get(following))
            cases.extend(page.get("items") or [])
            following = page.get("next")
        return {**gate, "cases": cases, "next_cases": None}

    def _page_link(self, gate: dict[str, Any]) -> dict[str, Any]:
        """A gate's html_url made absolute: without GATE_PUBLIC_URL the service answers a
        path, and the address this client reached it at is the one to print."""
        link = gate.get("html_url")
        if isinstance(link, str) and link.startswith("/") and not link.startswith("//"):
            gate["html_url"] = str(self._http.base_url.join(link))
        return gate

    def summary_markdown(self, gate_id: str) -> str:
        """The gate's Markdown summary for a pull-request comment (GET
        /v1/gates/{id}/summary.md). Its links are paths when the service has no
        GATE_PUBLIC_URL: they are made absolute with the address this client reached it at,
        as ``html_url`` is."""
        response = self._http.get(f"/v1/gates/{gate_id}/summary.md")
        if response.status_code >= 400:
            self._check(response)
        return absolute_links(response.text, str(self._http.base_url.join(PAGES_PATH)))

    def recordings(self, gate_id: str) -> dict[str, Any]:
        """The gate's answered model calls as replay files: ``{"recordings": [{"path",
        "content"}], "left_out"}``."""
        return self._check(self._http.get(f"/v1/gates/{gate_id}/recordings"))

    def cancel(self, gate_id: str) -> dict[str, Any]:
        return self._check(self._http.post(f"/v1/gates/{gate_id}/cancel"))

    # -- admin ----------------------------------------------------------------------------

    def create_project(self, name: str, *, retention_days: int | None = None) -> dict[str, Any]:
        body: dict[str, Any] = {"name": name}
        if retention_days is not None:
            body["retention_days"] = retention_days
        return self._check(self._http.post("/v1/projects", json=body))

    def delete_project(self, name: str) -> dict[str, Any]:
        return self._check(self._http.delete(self._path("projects", name)))

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
        return self._check(self._http.post(self._path("projects", project, "tokens"), json=body))

    def tokens(self, project: str) -> dict[str, Any]:
        return self._check(self._http.get(self._path("projects", project, "tokens")))

    def model_routes(self, project: str) -> dict[str, Any]:
        return self._check(self._http.get(self._path("projects", project, "model-routes")))

    def set_model_routes(self, project: str, routes: list[dict[str, Any]]) -> dict[str, Any]:
        return self._check(
            self._http.put(self._path("projects", project, "model-routes"), json={"routes": routes})
        )

    def egress(self, project: str) -> dict[str, Any]:
        return self._check(self._http.get(self._path("projects", project, "egress")))

    def set_egress(self, project: str, hosts: list[str]) -> dict[str, Any]:
        return self._check(
            self._http.put(self._path("projects", project, "egress"), json={"hosts": hosts})
        )

    def guardrail_model(self, project: str) -> dict[str, Any]:
        return self._check(self._http.get(self._path("projects", project, "guardrail-model")))

    def set_guardrail_model(self, project: str, model: str) -> dict[str, Any]:
        return self._check(
            self._http.put(
                self._path("projects", project, "guardrail-model"), json={"model": model}
            )
        )

    def clear_guardrail_model(self, project: str) -> dict[str, Any]:
        return self._check(self._http.delete(self._path("projects", project, "guardrail-model")))

    def api_specs(self, project: str) -> dict[str, Any]:
        return self._check(self._http.get(self._path("projects", project, "api-specs")))

    def set_api_spec(
        self,
        project: str,
        prefix: str,
        spec: dict[str, Any],
        base_url: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> dict[str, Any]:
        body: dict[str, Any] = {"spec": spec, "headers": headers or {}}
        if base_url:
            body["base_url"] = base_url
        return self._check(
            self._http.put(self._path("projects", project, "api-specs", prefix), json=body)
        )

    def revoke_token(self, token_id: str) -> dict[str, Any]:
        return self._check(self._http.delete(self._path("tokens", token_id)))

    def audit(self, *, limit: int = 100) -> dict[str, Any]:
        return self._check(self._http.get("/v1/audit", params={"limit": limit}))

    @staticmethod
    def _path(*parts: str) -> str:
        """``/v1/...`` from segments, each quoted whole, dots too: a name holding "#", "?" or
        "/" reaches the API as the name it is (and is refused there), and ".." is never a
        dot-segment that httpx folds into a shorter path (``DELETE
        /v1/projects/p/secrets/..`` would otherwise be ``DELETE /v1/projects/p``)."""
        return "/v1/" + "/".join(quote(part, safe="").replace(".", "%2E") for part in parts)

    def set_secret(self, project: str, name: str, value: str) -> dict[str, Any]:
        """Store or replace a project secret; the answer (name, updated_at, created) never
        holds the value."""
        path = self._path("projects", project, "secrets", name)
        return self._check(self._http.put(path, json={"value": value}))

    def secrets(self, project: str) -> dict[str, Any]:
        """A project's secret names and when each was last set; never a value."""
        return self._check(self._http.get(self._path("projects", project, "secrets")))

    def delete_secret(self, project: str, name: str) -> None:
        """Remove a project secret (the API answers 204, no body)."""
        response = self._http.delete(self._path("projects", project, "secrets", name))
        if response.status_code >= 400:
            self._check(response)

    def verdict_rule(self, project: str) -> dict[str, Any]:
        return self._check(self._http.get(self._path("projects", project, "verdict-rule")))

    def set_verdict_rule(self, project: str, rule: str) -> dict[str, Any]:
        path = self._path("projects", project, "verdict-rule")
        return self._check(self._http.put(path, json={"verdict_rule": rule}))

    def quarantine(self, project: str, body: dict[str, Any]) -> dict[str, Any]:
        """Quarantine a case: ``body`` is ``{case: {suite, agent_name, test_name}, owner,
        reason, expires_at}``."""
        path = self._path("projects", project, "quarantine")
        return self._check(self._http.post(path, json=body))

    def quarantines(self, project: str) -> dict[str, Any]:
        return self._check(self._http.get(self._path("projects", project, "quarantine")))

    def clear_quarantine(self, project: str, quarantine_id: str) -> dict[str, Any]:
        path = self._path("projects", project, "quarantine", quarantine_id)
        return self._check(self._http.delete(path))

    def run(self, run_id: str) -> RunView:
        run: RunView = RunView.model_validate(self._check(self._http.get(f"/v1/runs/{run_id}")))
        return run

    def failed_runs(self, case: dict[str, Any] | CaseView, limit: int = 3) -> dict[str, Any]:
        """Up to ``limit`` failed runs of a case, in the shape of the format CLI's ``failed_runs``.

        Log spans are left out and each span's metadata travels as ``metadata_json`` text, as
        `connic test --json` prints it; a run that cannot be fetched becomes ``fetch_error``.
        """
        failed_ids = CaseView.of(case).failed_run_ids()
        shown: list[dict[str, Any]] = []
        for rid in failed_ids[:limit]:
            try:
                run = self.run(rid)
            except GateAPIError as exc:
                shown.append({"run_id": rid, "fetch_error": f"HTTP {exc.status_code}"})
                continue
            except httpx.HTTPError as exc:
                shown.append({"run_id": rid, "fetch_error": str(exc) or type(exc).__name__})
                continue
            except ValidationError as exc:  # an answer not in a run's shape
                shown.append({"run_id": rid, "fetch_error": f"not a run ({exc.error_count()})"})
                continue
            shown.append(
                {
                    "run_id": rid,
                    "input": run.input,
                    "output": run.output,
                    "error": run.error,
                    "run_context": run.run_context,
                    "traces": [
                        {
                            "name": span.name,
                            "status": span.status,
                            "duration_ms": span.duration_ms,
                            "span_id": span.span_id,
                            "parent_span_id": span.parent_span_id,
                            "span_order": span.span_order,
                            "metadata_json": json.dumps(span.metadata or {}),
                        }
                        for span in run.traces
                        if span.type != "log"
                    ],
                }
            )
        return {"total_failed": len(failed_ids), "shown": shown}

    def wait(
        self,
        gate_id: str,
        *,
        timeout_s: float = 3600,
        on_change: Callable[[dict[str, Any]], None] | None = None,
        network_retries: int = 5,
        retry_delay_s: float = 5.0,
    ) -> dict[str, Any]:
        """Long-poll until the gate ends; ``on_change`` sees every new state.

        A network error is retried after ``retry_delay_s``; ``network_retries`` in a row give
        up with the last one (the format CLI's "Lost contact with backend"). Past
        ``timeout_s`` it raises TimeoutError.
        """
        deadline = time.monotonic() + timeout_s
        etag: str | None = None
        gate: dict[str, Any] = {}
        errors_in_a_row = 0
        while time.monotonic() < deadline:
            headers = {"If-None-Match": etag} if etag else {}
            wait_s = max(1, min(30, int(deadline - time.monotonic())))
            try:
                response = self._http.get(
                    f"/v1/gates/{gate_id}",
                    # No cases while it runs (the counts say how far it is): a poll of a
                    # 500-case gate costs what one of a 5-case gate does. All of them at
                    # the end, by following next_cases.
                    params={"wait": wait_s, "cases_limit": 0},
                    headers=headers,
                    timeout=wait_s + 30,
                )
            except httpx.TransportError:
                errors_in_a_row += 1
                if errors_in_a_row >= network_retries:
                    raise
                time.sleep(retry_delay_s)
                continue
            errors_in_a_row = 0
            if response.status_code == 304:
                continue
            gate = self._page_link(self._check(response))
            etag = response.headers.get("ETag")
            if on_change:
                on_change(gate)
            if gate.get("status") in TERMINAL:
                return self._all_cases(gate)
        raise TimeoutError(f"gate {gate_id} did not finish within {timeout_s:g} s")
