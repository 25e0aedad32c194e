"""Model options reach the model (issue 21, item 3): reasoning options and temperature go
with every request, a fallback model answers after the primary's request failed, and the
trace says which model answered. In scripted mode the scripted model receives them.

The real runner in-process (forked invocations), scripted models; the gateway's side of the
same options is tests/unit/test_gateway.py."""

from __future__ import annotations

from pathlib import Path

from tests.fixtures.projects import write
from tests.fixtures.runner import judged

ASKED = """
    import json


    def respond(messages, tools, context, options):
        # Says what it was asked with; the primary's requests fail.
        if options["model"] == "openai/primary":
            raise RuntimeError("the primary is down")
        return {"content": json.dumps(options, sort_keys=True)}
"""


def project(root: Path, agent: str, model: str = ASKED) -> Path:
    return write(
        root,
        {
            "agents/bot.yaml": agent,
            "tests/models/bot.py": model,
            "tests/bot.yaml": """
                tests:
                  - name: asks
                    payload: hi
                    expected_result: output != null
            """,
        },
    )


def invocation(root: Path) -> object:
    result = judged(root, "tests/bot.yaml", "asks")
    assert result.passed, result.failure_reason
    return result.invocations[0]


def test_reasoning_options_and_temperature_reach_the_scripted_model(tmp_path: Path) -> None:
    root = project(
        tmp_path / "p",
        """
            version: "1.0"
            name: bot
            description: Thinks a little.
            model: openai/thinker
            system_prompt: Be brief.
            temperature: 0.3
            reasoning_effort: low
        """,
    )
    run = invocation(root)
    assert run.output == (  # type: ignore[attr-defined]
        '{"model": "openai/thinker", "reasoning_effort": "low", "temperature": 0.3}'
    )
    (span,) = [s for s in run.traces if s.type == "model_call"]  # type: ignore[attr-defined]
    assert span.metadata["reasoning_effort"] == "low" and span.metadata["model"] == "openai/thinker"


def test_auto_is_no_option_and_a_script_without_options_is_called_as_before(
    tmp_path: Path,
) -> None:
    root = project(
        tmp_path / "p",
        """
            version: "1.0"
            name: bot
            description: Default effort.
            model: openai/thinker
            system_prompt: Be brief.
            reasoning_effort: auto
        """,
        model="""
            def respond(messages, tools, context):
                return {"content": "three arguments"}
        """,
    )
    run = invocation(root)
    assert run.output == "three arguments"  # type: ignore[attr-defined]
    (span,) = [s for s in run.traces if s.type == "model_call"]  # type: ignore[attr-defined]
    assert "reasoning_effort" not in span.metadata


def test_a_fallback_answers_after_the_primarys_request_failed_and_the_run_stays_with_it(
    tmp_path: Path,
) -> None:
    root = project(
        tmp_path / "p",
        """
            version: "1.0"
            name: bot
            description: Falls back.
            model: openai/primary
            fallback_model: openai/backup
            system_prompt: Be brief.
            retry_options: {attempts: 4}
        """,
    )
    run = invocation(root)
    assert run.output == '{"model": "openai/backup", "temperature": 1.0}'  # type: ignore[attr-defined]
    assert run.run_context["fallback_model_used"] == "openai/backup"  # type: ignore[attr-defined]
    spans = [s for s in run.traces if s.type == "model_call"]  # type: ignore[attr-defined]
    assert [(s.name, s.status, s.metadata.get("fallback")) for s in spans] == [
        ("openai/primary", "error", None),
        ("openai/backup", "ok", True),
    ]


def test_without_a_fallback_a_failed_request_fails_the_run(tmp_path: Path) -> None:
    root = project(
        tmp_path / "p",
        """
            version: "1.0"
            name: bot
            description: Has no fallback.
            model: openai/primary
            system_prompt: Be brief.
        """,
    )
    result = judged(root, "tests/bot.yaml", "asks")
    assert not result.passed
    assert "the primary is down" in (result.invocations[0].error or "")


def test_a_recording_made_before_options_entered_the_key_still_replays(tmp_path: Path) -> None:
    from gate_runner import gateway_wire as wire
    from gate_runner.models import ReplayModel, request_key, write_recording

    messages = [{"role": "user", "content": "hi"}]
    old = wire.replay_request("openai/x", messages, [], 1.0)  # no options in the key
    write_recording(tmp_path / "bot", request_key(old), old, {"content": "recorded"})
    reply = ReplayModel(tmp_path / "bot").complete(
        model="openai/x", messages=messages, tools=[], temperature=1.0, context={},
        options={"reasoning_effort": "high"},
    )  # fmt: skip
    assert reply.content == "recorded"
