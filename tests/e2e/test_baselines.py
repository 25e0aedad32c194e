"""Baselines end to end (issue 44, item 8): the real service, engine and Postgres.

A passing gate labelled ``branch=main``; then a gate of a changed bundle whose case drops
from 10 of 10 to 3 of 10 at an unchanged threshold of 30%. The threshold holds (3 of 10 is
30%), and the gate fails all the same: a regression against the baseline, whose reason
carries both rates and the p-value. With a baseline named, the passing case runs all ten
invocations (early stop would have stopped it after its third pass).
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.fixtures.auth import ADMIN_TOKEN, bearer
from tests.fixtures.baseline_projects import write_answerer
from tests.fixtures.projects import bundle_of

pytestmark = pytest.mark.docker

GATE_SECONDS = 600


def wait_done(http: httpx.Client, gate_id: str) -> dict[str, Any]:
    deadline = time.monotonic() + GATE_SECONDS
    while time.monotonic() < deadline:
        gate = http.get(f"/v1/gates/{gate_id}", params={"wait": 30}).json()
        if gate["phase"] in ("done", "error"):
            return gate  # type: ignore[no-any-return]
    pytest.fail(f"gate {gate_id} did not finish in {GATE_SECONDS} s")


def submit(http: httpx.Client, bundle: bytes, **fields: str) -> dict[str, Any]:
    answer = http.post("/v1/gates", files={"bundle": ("b.tgz", bundle)}, data=fields)
    assert answer.status_code == 202, answer.text
    return wait_done(http, answer.json()["id"])


def test_a_drop_from_10_of_10_to_3_of_10_fails_on_regression_at_an_unchanged_threshold(
    gate_url: str, tmp_path: Path
) -> None:
    project = f"baselines-{uuid.uuid4().hex[:8]}"
    admin = httpx.Client(base_url=gate_url, headers=bearer(ADMIN_TOKEN), timeout=60)
    assert admin.post("/v1/projects", json={"name": project}).status_code == 201
    made = admin.post(f"/v1/projects/{project}/tokens", json={"scopes": ["submit", "read"]})
    http = httpx.Client(
        base_url=gate_url, headers=bearer(made.json()["token"]), timeout=GATE_SECONDS
    )

    main = submit(
        http,
        bundle_of(write_answerer(tmp_path / "main", passes_of_ten=10)),
        labels='{"branch": "main"}',
    )
    assert main["status"] == "passed", main["failure_reason"]
    (base_case,) = main["cases"]
    assert (base_case["successes"], base_case["invocations_run"]) == (10, 10)

    change = submit(
        http,
        bundle_of(write_answerer(tmp_path / "change", passes_of_ten=3)),
        labels='{"branch": "feature"}',
        baseline="label:branch=main",
    )
    (case,) = change["cases"]
    # The threshold held: the case itself passed ...
    assert (case["status"], case["successes"], case["runs"]) == ("passed", 3, 10)
    # ... every invocation ran, though three passes had met the threshold ...
    assert (case["invocations_run"], case["stopped_early"]) == (10, False)
    # ... and the gate failed on the regression against main's gate.
    assert change["baseline_gate_id"] == main["id"]
    assert case["baseline"]["gate_id"] == main["id"]
    assert (case["baseline"]["successes"], case["baseline"]["runs"]) == (10, 10)
    assert case["baseline"]["comparable"] is True
    assert case["regression_level"] == "regression"
    assert change["status"] == "failed"
    reason = change["failure_reason"]
    assert "answerer::answers_most_of_the_time" in reason
    assert "10/10 (100%)" in reason and "3/10 (30%)" in reason
    assert "p = 0.001548" in reason  # scipy.stats.fisher_exact([[10, 0], [3, 7]], "greater")
