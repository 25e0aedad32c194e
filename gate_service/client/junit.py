"""A gate's verdict as JUnit XML, the report Jenkins, GitLab and most CI systems read.

The structure is the one of the Jenkins xUnit plugin's junit-10.xsd (what Jenkins and GitLab
parse): <testsuites> holding one <testsuite> per YAML suite file, one <testcase> per case,
named ``agent::test``, with classname the suite file as a dotted path (``tests/calc.yaml`` →
``tests.calc``), so CI groups cases by file. A failed case carries <failure> (its
failure_reason, and the failed runs' errors as text); a case that errored carries <error>; a
cancelled or never-judged case <skipped>. A gate that ended in error without cases (invalid
suites, a failed build) is one <testcase name="gate"> with <error>, so the pipeline's report
shows why.

Baselines: a case that regressed against the gate's baseline carries <failure
type="regression"> naming both rates and the p-value, even when its threshold held. A
quarantined case that failed (or regressed) carries <skipped message="quarantined by OWNER
until DAY: REASON; it failed: ...">, since the skipped count and its message are what Jenkins
and GitLab show without failing the build, and the failed runs as its text. A case reused
from the baseline (``--changed-only``) is <skipped> naming the baseline gate and its case.
A case's other notes (likely regression, new or not comparable, flaky, narrow interval,
early stop) and its pass rate's interval are its <system-out>; the baseline as submitted and
the gate it named are the suite's properties ``gate.baseline`` and
``gate.baseline_gate_id`` (junit-10.xsd has no properties on a testcase).

Built with xml.etree; text a bundle controls is cleaned of the characters XML 1.0 cannot
hold (C0 controls other than tab and newline, U+FFFE/U+FFFF, lone surrogates).
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from collections.abc import Mapping
from pathlib import Path, PurePosixPath
from typing import Any

from .notes import case_notes, interval_text, quarantine_text, rate, regression_text
from .shapes import CaseView, FailedRuns, GateView
from .words import Outcome, case_outcome

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
    """JUnit's outcome of a case: ``words.case_outcome``, the word the pages and the terminal
    print, with a case not judged yet reported skipped."""
    outcome = case_outcome(case)
    return Outcome.skipped.value if outcome is Outcome.pending else outcome.value


def _skip_message(case: CaseView) -> str:
    """Why a case that ran or was named is reported skipped: reused, quarantined, not run."""
    if case.reused_from:
        gate = case.baseline.gate_id if case.baseline is not None else None
        return (
            f"reused from baseline gate {gate or '?'}: it passed there with the same closure, "
            f"so it was not run again (that gate's case {case.reused_from})"
        )
    quarantined = quarantine_text(case)
    if quarantined is not None:
        what = []
        if case.passed is not True:
            what.append(f"it failed: {case.failure_reason or case.status or 'failed'}")
        if (regressed := regression_text(case)) is not None:
            what.append(f"it {regressed}")
        return "; ".join([quarantined, *what])
    return case.failure_reason or f"case {case.status or 'not judged'}"


def _notes_text(case: CaseView) -> str:
    """The case's notes and its interval, a line each, for <system-out> (what Jenkins and
    GitLab show under a case); empty when there is nothing to say."""
    lines = [note.text for note in case_notes(case)]
    interval = case.interval
    if interval is not None and not case.reused_from:
        lines.append(
            f"pass rate {rate(case.successes, case.runs_done())}, 95% interval "
            f"{interval_text(interval.low, interval.high)}"
        )
    return "\n".join(lines)


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
    regressed = regression_text(case) if case.regression_level == "regression" else None
    if outcome == "failed" and case.passed is True and regressed is not None:
        # Every threshold held, and the gate fails all the same: name both rates and p.
        failure = ET.SubElement(element, "failure", message=xml_text(regressed), type="regression")
        failure.text = xml_text(regressed)
    elif outcome == "failed":
        message = reason if regressed is None else xml_text(f"{case.failure_reason}; {regressed}")
        failure = ET.SubElement(element, "failure", message=message, type="failed")
        failure.text = xml_text(_failure_text(case))
    elif outcome == "error":
        error = ET.SubElement(element, "error", message=reason, type="error")
        error.text = reason
    elif outcome == "skipped":
        skipped = ET.SubElement(element, "skipped", message=xml_text(_skip_message(case)))
        if case.quarantine and case.passed is not True:
            skipped.text = xml_text(_failure_text(case))
    notes = _notes_text(case)
    if notes:
        ET.SubElement(element, "system-out").text = xml_text(notes)
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
        if mine or link or gate.baseline:
            properties = ET.SubElement(element, "properties")
            if link:  # where a CI's test report links the person reading it
                ET.SubElement(properties, "property", name="gate.html_url", value=xml_text(link))
            for name, value in (
                ("gate.baseline", gate.baseline),
                ("gate.baseline_gate_id", gate.baseline_gate_id),
            ):
                if value:
                    ET.SubElement(properties, "property", name=name, value=xml_text(value))
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
