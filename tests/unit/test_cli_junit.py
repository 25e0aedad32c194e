"""`gate submit --junit`: valid against the JUnit schema Jenkins and GitLab read, counts right."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest
import xmlschema

from gate_service.client.junit import junit_element, junit_xml, xml_text
from tests.unit.test_cli_submit import CANCELLED, ERRORED, FAILED, PASSED, case, gate

SCHEMA = xmlschema.XMLSchema(str(Path(__file__).parents[1] / "fixtures" / "junit.xsd"))

MIXED = gate(
    "failed",
    [
        case("adds", passed=True, suite="tests/calc.yaml"),
        case("wrong", passed=False, reason="0/2 runs passed", suite="tests/calc.yaml"),
        case(
            "crashed", passed=None, status="error", reason="runner broke", suite="tests/sub/b.yaml"
        ),
        case("never", passed=None, status="cancelled", suite="tests/sub/b.yaml"),
        case("adds_too", passed=True, suite="tests/sub/b.yaml"),
    ],
)
MIXED["cases"][1]["failed_runs"] = {
    "total_failed": 2,
    "shown": [
        {"run_id": "r0", "error": "expected_result failed\x1b[31m"},
        {"run_id": "r1", "fetch_error": "HTTP 404"},
    ],
}


@pytest.mark.parametrize("result", [PASSED, FAILED, CANCELLED, ERRORED, MIXED])
def test_reports_validate_against_the_schema(result: dict[str, Any]) -> None:
    SCHEMA.validate(junit_xml(result).decode())


def test_one_suite_per_yaml_file_with_counts() -> None:
    root = ET.fromstring(junit_xml(MIXED))
    suites = root.findall("testsuite")
    assert [s.get("name") for s in suites] == ["tests/calc.yaml", "tests/sub/b.yaml"]
    calc, sub = suites
    assert (calc.get("tests"), calc.get("failures"), calc.get("errors"), calc.get("skipped")) == (
        "2", "1", "0", "0",
    )  # fmt: skip
    assert (sub.get("tests"), sub.get("failures"), sub.get("errors"), sub.get("skipped")) == (
        "3", "0", "1", "1",
    )  # fmt: skip
    assert (root.get("tests"), root.get("failures"), root.get("errors")) == ("5", "1", "1")
    assert calc.get("time") == "3.000" and root.get("time") == "7.500"


def test_cases_are_named_agent_test_with_outcomes() -> None:
    root = ET.fromstring(junit_xml(MIXED))
    cases = {c.get("name"): c for c in root.iter("testcase")}
    assert set(cases) == {"calc::adds", "calc::wrong", "calc::crashed", "calc::never",
                          "calc::adds_too"}  # fmt: skip
    assert cases["calc::adds"].get("classname") == "tests.calc"
    assert cases["calc::never"].get("classname") == "tests.sub.b"
    assert cases["calc::adds"].get("time") == "1.500" and list(cases["calc::adds"]) == []
    failure = cases["calc::wrong"].find("failure")
    assert failure is not None and failure.get("message") == "0/2 runs passed"
    assert failure.text is not None
    assert "run r0: expected_result failed\\x1b[31m" in failure.text
    assert "run r1: could not load (HTTP 404)" in failure.text
    error = cases["calc::crashed"].find("error")
    assert error is not None and error.get("message") == "runner broke"
    assert cases["calc::never"].find("skipped") is not None


def test_a_gate_that_errored_without_cases_is_one_error() -> None:
    root = ET.fromstring(junit_xml(ERRORED))
    (testcase,) = root.iter("testcase")
    error = testcase.find("error")
    assert error is not None and error.get("message") == "2 suite(s) are invalid"
    assert "tests/x.yaml: unknown agent 'ghost'" in (error.text or "")
    assert root.get("errors") == "1"


def test_characters_xml_cannot_hold_are_made_visible() -> None:
    assert xml_text("a\x00b\x1bc\ufffed\ud800e\tf\ng") == "a\\x00b\\x1bc\\xfffed\\xd800e\tf\ng"
    hostile = gate("failed", [case("x\x01", passed=False, reason="r\x0c")])
    document = junit_xml(hostile)
    SCHEMA.validate(document.decode())
    assert ET.fromstring(document).find("testsuite/testcase") is not None


def test_a_broken_report_fails_validation() -> None:
    """The schema check can fail: a testcase without a name, or counts missing, are refused."""
    root = junit_element(FAILED)
    testcase = root.find("testsuite/testcase")
    assert testcase is not None
    del testcase.attrib["name"]
    with pytest.raises(xmlschema.XMLSchemaValidationError):
        SCHEMA.validate(ET.tostring(root, encoding="unicode"))
    root = junit_element(FAILED)
    suite = root.find("testsuite")
    assert suite is not None
    del suite.attrib["failures"]
    with pytest.raises(xmlschema.XMLSchemaValidationError):
        SCHEMA.validate(ET.tostring(root, encoding="unicode"))


WARNED = gate("passed", [case("adds", passed=True, suite="tests/calc.yaml")])
WARNED["warnings"] = [
    {
        "file": "agents/calculator.yaml",
        "agent": WARNED["cases"][0]["agent_name"],
        "key": "fallback_model",
        "support": "not_in_gate",
        "message": "fallback_model is not in a gate: ignored",
    },
    {"file": "agents/other.yaml", "agent": "other", "key": "session", "message": "x"},
]


def test_a_gates_warnings_are_properties_of_the_suites_of_their_agent() -> None:
    SCHEMA.validate(junit_xml(WARNED).decode())
    (suite,) = ET.fromstring(junit_xml(WARNED)).findall("testsuite")
    properties = [(p.get("name"), p.get("value")) for p in suite.iter("property")]
    # Only the suite's own agent's warning: the other agent has no suite here.
    assert properties == [
        (
            "gate.warning",
            f"agents/calculator.yaml (agent {WARNED['cases'][0]['agent_name']}): "
            "fallback_model is not in a gate: ignored",
        )
    ]
    assert suite[0].tag == "properties"  # before the testcases, as the schema orders
