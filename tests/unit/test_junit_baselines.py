"""`gate submit --junit` with baselines: a regression is a failure naming both rates and p, a
quarantined failure and a reused case are skipped with a message CI shows, and the notes are
each case's system-out; every report validates against the Jenkins/GitLab schema."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import xmlschema

from gate_service.client.junit import junit_xml
from tests.unit.test_cli_submit import case, gate

SCHEMA = xmlschema.XMLSchema(str(Path(__file__).parents[1] / "fixtures" / "junit.xsd"))
BASE = "5a5a5a5a-0000-4000-8000-000000000002"
BASE_CASE = "5a5a5a5a-0000-4000-8000-0000000000ca"


def compared(successes: int, runs: int, p_value: float) -> dict[str, Any]:
    return {
        "gate_id": BASE,
        "case_id": BASE_CASE,
        "successes": successes,
        "runs": runs,
        "comparable": True,
        "why": None,
        "p_value": p_value,
        "drop_points": 70.0,
    }


QUARANTINE = {"owner": "ana", "reason": "upstream flake", "expires_at": "2027-01-31T00:00:00Z"}


def baselined() -> dict[str, Any]:
    regressed = case("dropped", passed=True, runs=10, successes=3)
    regressed.update(
        baseline=compared(10, 10, 0.0015),
        regression_level="regression",
        regression=True,
        interval={"low": 10.78, "high": 60.32},
    )
    parked = case("parked", passed=False, runs=2, reason="0/2 runs passed")
    parked.update(quarantine=QUARANTINE)
    parked["failed_runs"] = {"total_failed": 2, "shown": [{"run_id": "r0", "error": "boom"}]}
    parked_regressed = case("parked_too", passed=True, runs=10, successes=3)
    parked_regressed.update(
        baseline=compared(10, 10, 0.0015), regression_level="regression", quarantine=QUARANTINE
    )
    reused = case("cached", passed=True)
    reused.update(
        reused_from=BASE_CASE,
        baseline={**compared(2, 2, 1.0), "comparable": False, "why": "reused"},
    )
    wobbly = case("wobbly", passed=True, runs=10, successes=8)
    wobbly.update(baseline=compared(10, 10, 0.24), regression_level="likely")
    early = case("early", passed=True, runs=10, successes=3)
    early.update(stopped_early=True, invocations_run=3, interval={"low": 43.85, "high": 100.0})
    plain = case("plain", passed=True)
    return gate(
        "failed",
        [regressed, parked, parked_regressed, reused, wobbly, early, plain],
        baseline="label:branch=main",
        baseline_gate_id=BASE,
    )


def cases_of(result: dict[str, Any]) -> dict[str, ET.Element]:
    return {c.get("name", ""): c for c in ET.fromstring(junit_xml(result)).iter("testcase")}


def test_a_report_with_every_kind_of_case_validates() -> None:
    SCHEMA.validate(junit_xml(baselined()).decode())


def test_a_regression_whose_threshold_held_is_a_failure_naming_both_rates_and_p() -> None:
    failure = cases_of(baselined())["calc::dropped"].find("failure")
    assert failure is not None and failure.get("type") == "regression"
    assert failure.get("message") == (
        "regressed against baseline gate 5a5a5a5a: 10/10 (100%) then, 3/10 (30%) now, "
        "one-sided Fisher p = 0.0015"
    )


def test_a_quarantined_failure_is_skipped_with_its_owner_end_reason_and_failure() -> None:
    cases = cases_of(baselined())
    parked = cases["calc::parked"]
    assert parked.find("failure") is None
    skipped = parked.find("skipped")
    assert skipped is not None
    assert skipped.get("message") == (
        "quarantined by ana until 2027-01-31: upstream flake; it failed: 0/2 runs passed"
    )
    assert skipped.text is not None and "run r0: boom" in skipped.text
    # A quarantined regression too: skipped, naming the regression.
    message = cases["calc::parked_too"].find("skipped").get("message")  # type: ignore[union-attr]
    assert message is not None and message.startswith("quarantined by ana until 2027-01-31")
    assert "it regressed against baseline gate 5a5a5a5a: 10/10 (100%) then" in message


def test_a_reused_case_is_skipped_naming_the_baseline_gate_and_its_case() -> None:
    skipped = cases_of(baselined())["calc::cached"].find("skipped")
    assert skipped is not None
    assert skipped.get("message") == (
        f"reused from baseline gate {BASE}: it passed there with the same closure, so it was "
        f"not run again (that gate's case {BASE_CASE})"
    )


def test_counts_notes_and_the_baseline_properties() -> None:
    root = ET.fromstring(junit_xml(baselined()))
    (suite,) = root.findall("testsuite")
    # dropped fails; parked, parked_too and cached are skipped; the rest pass.
    assert (suite.get("tests"), suite.get("failures"), suite.get("skipped")) == ("7", "1", "3")
    assert (root.get("failures"), root.get("errors")) == ("1", "0")
    properties = {p.get("name"): p.get("value") for p in suite.iter("property")}
    assert properties["gate.baseline"] == "label:branch=main"
    assert properties["gate.baseline_gate_id"] == BASE
    cases = cases_of(baselined())
    wobbly = cases["calc::wobbly"]
    assert wobbly.find("failure") is None and wobbly.find("skipped") is None
    out = wobbly.findtext("system-out") or ""
    assert (
        "likely regressed against baseline gate 5a5a5a5a: 10/10 (100%) then, 8/10 (80%) now" in out
    )
    early = cases["calc::early"].findtext("system-out") or ""
    assert "stopped early after 3 of 10 runs" in early
    assert "pass rate 3/3 (100%), 95% interval 43.9-100.0%" in early
    # A case with nothing to say has no system-out, as before baselines.
    assert list(cases["calc::plain"]) == []


def test_an_older_services_answer_reads_as_before() -> None:
    # No baselines field at all: no properties but the page, no notes.
    old = gate("passed", [case("adds", passed=True)], html_url="http://gate/ui/gates/x")
    root = ET.fromstring(junit_xml(old))
    assert [p.get("name") for p in root.iter("property")] == ["gate.html_url"]
    assert root.find(".//system-out") is None
