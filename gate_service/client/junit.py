"""A gate's verdict as JUnit XML, the report Jenkins, GitLab and most CI systems read.

The structure is the one of the Jenkins xUnit plugin's junit-10.xsd (what Jenkins and GitLab
parse): <testsuites> holding one <testsuite> per YAML suite file, one <testcase> per case,
named ``agent::test``, with classname the suite file as a dotted path (``tests/calc.yaml`` →
``tests.calc``), so CI groups cases by file. A failed case carries <failure> (its
failure_reason, and the failed runs' errors as text); a case that errored carries <error>; a
cancelled or never-judged case <skipped>. A gate that ended in error without cases (invalid
suites, a failed build) is one <testcase name="gate"> with <error>, so the pipeline's report
shows why.

Built with xml.etree; text a bundle controls is cleaned of the characters XML 1.0 cannot
hold (C0 controls other than tab and newline, U+FFFE/U+FFFF, lone surrogates).
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from collections.abc import Mapping
from pathlib import Path, PurePosixPath
from typing import Any

from .shapes import CaseView, FailedRuns, GateView

_NOT_XML = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def xml_text(value: object) -> str:
    """``value`` as text XML 1.0 can hold; what it cannot becomes a visible ``\\xNN``."""
    return _NOT_XML.sub(lambda m: f"\\x{ord(m.group()):02x}", str(value))


def _seconds(ms: object) -> str:
    value = ms if isinstance(ms, int | float) and not isinstance(ms, bool) else 0
    return f"{max(0, value) / 1000:.3f}"


def classname(suite: str) -> str:
    path = PurePosixPath(suite or "gate")
    return ".".join(path.with_suffix("").parts) if path.suffix else ".".join(path.parts)


def _failure_text(case: CaseView) -> str:
    lines = [str(case.failure_reason or "")]
    detail = case.failed_runs or FailedRuns()
    for run in detail.shown:
        if run.fetch_error:
            lines.append(f"run {run.run_id}: could not load ({run.fetch_error})")
        elif run.error:
            lines.append(f"run {run.run_id}: {run.error}")
        else:
            lines.append(f"run {run.run_id}: failed")
    remaining = (detail.total_failed or 0) - len(detail.shown)
    if remaining > 0:
        lines.append(f"... and {remaining} more failed run(s)")
    return "\n".join(line for line in lines if line)


def _outcome(case: CaseView) -> str:
    status = case.status
    if case.passed is True:
        return "passed"
    if case.passed is False or status == "failed":
        return "failed"
    if status == "error":
        return "error"
    return "skipped"


def warning_line(warning: Any) -> str:
    """One gate warning as ``file (agent): message``."""
    if not isinstance(warning, dict):
        return str(warning)
    where = str(warning.get("file") or "")
    if warning.get("agent"):
        where += f" (agent {warning['agent']})"
    message = str(warning.get("message") or warning.get("key") or warning)
    return f"{where}: {message}" if where else message


def _testcase(parent: ET.Element, case: CaseView) -> str:
    element = ET.SubElement(
        parent,
        "testcase",
        name=xml_text(f"{case.agent_name}::{case.test_name}"),
        classname=xml_text(classname(str(case.suite or ""))),
        time=_seconds(case.duration_ms),
    )
    outcome = _outcome(case)
    reason = xml_text(case.failure_reason or "")
    if outcome == "failed":
        failure = ET.SubElement(element, "failure", message=reason, type="failed")
        failure.text = xml_text(_failure_text(case))
    elif outcome == "error":
        error = ET.SubElement(element, "error", message=reason, type="error")
        error.text = reason
    elif outcome == "skipped":
        status = case.status or "not judged"
        ET.SubElement(element, "skipped", message=xml_text(reason or f"case {status}"))
    return outcome


def _counts(element: ET.Element, outcomes: list[str], time_ms: int) -> None:
    element.set("tests", str(len(outcomes)))
    element.set("failures", str(outcomes.count("failed")))
    element.set("errors", str(outcomes.count("error")))
    element.set("skipped", str(outcomes.count("skipped")))
    element.set("time", _seconds(time_ms))


def junit_element(answer: GateView | Mapping[str, Any]) -> ET.Element:
    gate = GateView.of(answer)
    cases = gate.cases
    root = ET.Element("testsuites", name=xml_text(f"gate {gate.id}"))
    by_suite: dict[str, list[CaseView]] = {}
    for case in cases:
        by_suite.setdefault(str(case.suite or "gate"), []).append(case)
    all_outcomes: list[str] = []
    total_ms = 0
    warnings = gate.warnings
    for suite, members in by_suite.items():
        element = ET.SubElement(root, "testsuite", name=xml_text(suite))
        # The gate's warnings for this suite's agents, first (the schema's order): what the
        # gate did not run as the platform would.
        agents = {case.agent_name for case in members}
        mine = [w for w in warnings if w.get("agent") in agents]
        link = gate.html_url
        if mine or link:
            properties = ET.SubElement(element, "properties")
            if link:  # where a CI's test report links the person reading it
                ET.SubElement(properties, "property", name="gate.html_url", value=xml_text(link))
            for warning in mine:
                value = xml_text(warning_line(warning))
                ET.SubElement(properties, "property", name="gate.warning", value=value)
        outcomes = [_testcase(element, case) for case in members]
        suite_ms = sum(int(case.duration_ms or 0) for case in members)
        _counts(element, outcomes, suite_ms)
        all_outcomes += outcomes
        total_ms += suite_ms
    if gate.status == "error" and not cases:
        element = ET.SubElement(root, "testsuite", name="gate")
        if gate.html_url:
            properties = ET.SubElement(element, "properties")
            value = xml_text(gate.html_url)
            ET.SubElement(properties, "property", name="gate.html_url", value=value)
        testcase = ET.SubElement(element, "testcase", name="gate", classname="gate", time="0.000")
        reason = xml_text(gate.failure_reason or gate.error or "the gate errored")
        error = ET.SubElement(testcase, "error", message=reason, type="error")
        problems = [
            f"{p.get('file') or ''}: {p.get('message') or p}".lstrip(": ") for p in gate.problems
        ]
        error.text = xml_text("\n".join([reason, *problems]))
        _counts(element, ["error"], 0)
        all_outcomes.append("error")
    _counts(root, all_outcomes, total_ms)
    del root.attrib["skipped"]  # junit-10.xsd allows no `skipped` on <testsuites>
    return root


def junit_xml(gate: GateView | Mapping[str, Any]) -> bytes:
    root = junit_element(gate)
    ET.indent(root)
    return bytes(ET.tostring(root, encoding="utf-8", xml_declaration=True))


def write_junit(path: Path, gate: GateView | Mapping[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(junit_xml(gate))
