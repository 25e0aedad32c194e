"""The model mode is always visible (issue 38, item 7): each LLM agent's mode as the runner
chooses it and why (bundles/live_models.py ``agent_modes``, ``mode_reason``), the gate's
effective mode that REST answers (gates/views.py ``effective_model_mode``), and how the
results page and `gate submit` show it, with the model calls a provider answered.

The worker's part (stored when the gate enters building, answered by REST) is
tests/integration/test_model_modes.py."""

from __future__ import annotations

import io
import uuid
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from gate_service.bundles.live_models import NAMED_PER_MODE, agent_modes, mode_reason
from gate_service.bundles.suites import validate_project
from gate_service.client.render import (
    SHOWN_AGENT_MODES,
    json_result,
    model_calls_line,
    model_mode_lines,
    render_results,
)
from gate_service.gates.schemas import BundleRead, GateRead, ModelCallTotals
from gate_service.gates.views import effective_model_mode
from gate_service.models import Gate, utcnow
from gate_service.ui.routes import make_templates
from tests.fixtures.projects import write


def llm(name: str) -> str:
    return f"""
        version: "1.0"
        name: {name}
        description: An LLM agent.
        model: openai/gpt-4o
        system_prompt: Work.
    """


def case(agent: str) -> str:
    return f"""
        agent: {agent}
        tests:
          - name: runs
            payload: hi
    """


SCRIPT = "def respond(messages, tools, context):\n    return {'content': 'hi'}\n"

PROJECT = {
    "agents/planner.yaml": llm("planner"),
    "agents/writer.yaml": llm("writer"),
    "agents/bot.yaml": llm("bot"),
    "agents/unused.yaml": llm("unused"),
    "agents/calc.yaml": """
        version: "1.0"
        name: calc
        description: A tool agent.
        type: tool
        tool_name: calc.add
    """,
    "agents/pipeline.yaml": """
        version: "1.0"
        name: pipeline
        description: Plans, then writes.
        type: sequential
        agents: [planner, writer]
    """,
    "tools/calc.py": "def add(payload: dict) -> dict:\n    return payload\n",
    "tests/models/planner.py": SCRIPT,
    "tests/recordings/writer/k.json": "{}",
    "tests/pipeline.yaml": case("pipeline"),
    "tests/bot.yaml": case("bot"),
    "tests/calc.yaml": case("calc"),
}


def modes_of(root: Path, forced: str | None = None) -> dict[str, str]:
    report = validate_project(root)
    assert not report.problems, report.problems
    return agent_modes(root, report.configs, {c.agent_name for c in report.cases}, forced)


def test_each_reachable_llm_agent_gets_the_mode_the_runner_would_choose(tmp_path: Path) -> None:
    root = write(tmp_path, PROJECT)
    # Not the tool agent, not the sequential agent itself, not an agent no case reaches.
    assert modes_of(root) == {"bot": "live", "planner": "scripted", "writer": "replay"}
    assert modes_of(root, "replay") == {"bot": "replay", "planner": "replay", "writer": "replay"}


def test_the_reason_says_the_default_rule_and_names_the_agents_per_mode() -> None:
    reason = mode_reason({"bot": "live", "planner": "scripted", "writer": "replay"}, None)
    assert reason is not None
    assert reason.startswith("chosen by default (no model_mode was submitted)")
    assert "tests/models/<agent>.py" in reason and "tests/recordings/<agent>/" in reason
    assert reason.endswith("(scripted: planner; replay: writer; live: bot)")
    # A forced mode is its own why.
    assert mode_reason({"bot": "live"}, "live") is None


def test_the_reason_counts_what_it_does_not_name_and_says_when_no_llm_agent_runs() -> None:
    many = {f"agent{i:02}": "live" for i in range(NAMED_PER_MODE + 3)}
    reason = mode_reason(many, None) or ""
    assert "agent00" in reason and f"agent{NAMED_PER_MODE:02}" not in reason
    assert reason.endswith("and 3 more)")
    assert "no selected case reaches an LLM agent" in (mode_reason({}, None) or "")


def gate(**fields: Any) -> Gate:
    values: dict[str, Any] = {
        "status": "running",
        "model_mode": None,
        "model_modes": {},
        "model_mode_reason": None,
    }
    return Gate(**{**values, **fields})


@pytest.mark.parametrize(
    ("fields", "mode"),
    [
        ({"status": "queued"}, "pending"),  # validating has not worked the modes out
        ({"status": "queued", "model_mode": "replay"}, "replay"),  # forced: known at once
        ({"model_modes": {"a": "live", "b": "live"}, "model_mode_reason": "…"}, "live"),
        ({"model_modes": {"a": "live", "b": "scripted"}, "model_mode_reason": "…"}, "mixed"),
        ({"model_modes": {"a": "scripted"}, "model_mode": "scripted"}, "scripted"),
        ({"model_mode_reason": "no selected case reaches an LLM agent"}, "none"),
        ({"status": "error"}, "none"),  # ended in validating: no agent ran
        ({"status": "cancelled"}, "none"),  # cancelled while queued
        ({"model_modes": None}, "pending"),  # a row not yet flushed has no default
    ],
)
def test_the_gate_s_mode_is_never_null(fields: dict[str, Any], mode: str) -> None:
    assert effective_model_mode(gate(**fields)) == mode


def view(**fields: Any) -> GateRead:
    values: dict[str, Any] = {
        "id": uuid.UUID(int=1),
        "status": "passed",
        "phase": "done",
        "created_at": utcnow(),
        "started_at": None,
        "finished_at": None,
        "filter": None,
        "model_mode": "mixed",
        "model_modes": {"bot": "live", "planner": "scripted"},
        "model_mode_reason": "chosen by default (no model_mode was submitted): …",
        "labels": {},
        "bundle": BundleRead(sha256="0" * 64, size_bytes=1, code_bytes=1, fixture_bytes=0),
        "total_cases": 0,
        "passed_cases": 0,
        "failed_cases": 0,
        "judged_cases": 0,
        "error": None,
        "failure_reason": None,
        "problems": [],
        "warnings": [],
        "model_calls": ModelCallTotals(
            calls=4, answered=3, failed=1, tokens_in=3400, tokens_out=900, cost_usd=0.0123
        ),
        "cases": [],
        "html_url": "/ui/gates/1",
    }
    return GateRead(**{**values, **fields})


def page(gate_view: GateRead) -> str:
    template = make_templates().env.get_template("gate_live.html")
    return template.render(gate=gate_view, cases=[], progress=None, gate_ms=None, can_cancel=False)


def test_the_gate_page_shows_the_mode_each_agent_s_and_why() -> None:
    html = page(view())
    assert "<dt>Model mode</dt><dd>mixed" in html
    assert "<code>bot</code> live, <code>planner</code> scripted" in html
    assert "chosen by default (no model_mode was submitted)" in html
    assert "3 model calls answered (1 failed), tokens 3,400 in / 900 out, $0.01230" in html
    forced = page(view(model_mode="replay", requested_model_mode="replay", model_mode_reason=None))
    assert "replay (forced by the submission)" in forced and "chosen by default" not in forced
    queued = page(view(model_mode="pending", model_modes={}, model_mode_reason=None))
    assert "<dd>pending (worked out in validating)" in queued
    # An agent's name is the bundle's text: escaped.
    hostile = page(view(model_modes={"<b>x</b>": "live"}))
    assert "<b>x</b>" not in hostile and "&lt;b&gt;x&lt;/b&gt;" in hostile


def test_the_gate_page_says_when_no_call_was_answered() -> None:
    none_answered = ModelCallTotals(calls=2, answered=0, failed=2)
    html = page(view(model_calls=none_answered))
    assert "no model call answered (2 failed)" in html and "tokens 0 in" not in html
    assert "<dt>Model calls</dt><dd>none</dd>" in page(view(model_calls=ModelCallTotals()))


def printed(gate_json: dict[str, Any]) -> str:
    buffer = io.StringIO()
    render_results(Console(file=buffer, width=200), gate_json)
    return buffer.getvalue()


def test_gate_submit_prints_the_mode_and_why() -> None:
    gate_json = view().model_dump(mode="json")
    out = printed(gate_json)
    assert "model mode: mixed: bot live, planner scripted" in out
    assert "    chosen by default (no model_mode was submitted): …" in out
    assert "3 model calls answered (1 failed), tokens 3,400 in / 900 out, cost $0.01230" in out
    forced = {**gate_json, "model_mode": "live", "requested_model_mode": "live"}
    forced["model_mode_reason"] = None
    assert model_mode_lines(forced) == [
        "model mode: live (forced by the submission's model_mode): bot live, planner scripted"
    ]
    ended = {**gate_json, "model_mode": "none", "model_modes": {}, "model_mode_reason": None}
    assert model_mode_lines(ended) == ["model mode: none (no LLM agent ran)"]
    # --json carries them too.
    assert json_result(gate_json)["model_modes"] == {"bot": "live", "planner": "scripted"}


def test_gate_submit_names_a_few_agents_and_reads_an_older_service() -> None:
    many = {f"a{i:02}": "live" for i in range(SHOWN_AGENT_MODES + 2)}
    (line,) = model_mode_lines({"model_mode": "live", "model_modes": many})
    assert line.endswith("a09 live and 2 more")
    # A gate service without modes or answered counts: nothing made up.
    assert model_mode_lines({"model_mode": None}) == []
    old = {"calls": 12, "tokens_in": 3400, "tokens_out": 900, "cost_usd": 0.0123}
    assert model_calls_line(old) == "model calls: 12, tokens 3,400 in / 900 out, cost $0.01230"


def test_the_totals_line_counts_answered_calls_and_the_failed_apart() -> None:
    def line(**totals: Any) -> str | None:
        return model_calls_line(ModelCallTotals(**totals).model_dump())

    assert line(calls=1, answered=1, tokens_in=3, tokens_out=4) == (
        "1 model call answered, tokens 3 in / 4 out, cost $0.00"
    )
    assert line(calls=3, answered=0, failed=3) == "no model call answered (3 failed)"
    assert line() is None
