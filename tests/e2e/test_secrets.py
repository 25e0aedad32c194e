"""A project secret through the real service and engine: in the case container, in no answer.

The secret is put through the API, the worker decrypts it into the case container's
environment, and a tool hands `dict(os.environ)` back, prints the value and raises with it.
"""

from __future__ import annotations

import secrets
from pathlib import Path

import httpx
import pytest

from gate_service.client.api import GateClient
from tests.fixtures.auth import ADMIN_TOKEN, bearer
from tests.fixtures.leaky import leaky_project
from tests.fixtures.projects import bundle_of

pytestmark = pytest.mark.docker


def test_a_secret_reaches_the_container_and_no_answer_holds_it(
    gate_url: str, tmp_path: Path
) -> None:
    value = "sk-e2e-" + secrets.token_hex(16)
    http = httpx.Client(base_url=gate_url, headers=bearer(ADMIN_TOKEN), timeout=60)
    client = GateClient(gate_url, token=ADMIN_TOKEN)
    try:
        put = http.put("/v1/projects/default/secrets/API_KEY", json={"value": value})
        assert put.status_code in (200, 201), put.text
        gate = client.wait(
            client.submit(bundle_of(leaky_project(tmp_path / "p")))["id"], timeout_s=900
        )
        assert (gate["status"], gate["phase"]) == ("failed", "done"), gate

        answers = [
            put,
            http.get(f"/v1/gates/{gate['id']}"),
            http.get("/v1/gates"),
            http.get("/v1/projects/default/secrets"),
            http.get("/v1/audit"),
        ]
        runs = [
            http.get(f"/v1/runs/{run_id}")
            for case in gate["cases"]
            for run_id in case["agent_run_ids"]
        ]
        assert len(runs) == 3 and all(r.status_code == 200 for r in runs)
        for answer in answers + runs:
            assert value not in answer.text, answer.url

        # The value did reach the container: it comes back redacted, by name, everywhere.
        by_name = {c["test_name"]: c for c in gate["cases"]}
        assert by_name["returns_the_environment"]["status"] == "passed"
        assert "[REDACTED:API_KEY]" in by_name["compares_against_the_secret"]["failure_reason"]
        assert "[REDACTED:API_KEY]" in by_name["raises_with_the_secret"]["failure_reason"]
        environ = next(r.json() for r in runs if "HOME" in (r.json()["output"] or {}))
        assert environ["output"]["API_KEY"] == "[REDACTED:API_KEY]"
        assert not any(k.startswith("GATE_") for k in environ["output"])  # nonce included
        logs = [s for s in environ["traces"] if "[REDACTED:API_KEY]" in str(s["metadata"])]
        assert logs, environ["traces"]
    finally:
        http.delete("/v1/projects/default/secrets/API_KEY")
        http.close()
        client.close()
