"""The live path through LiteLLM against an OpenAI-compatible fake provider on loopback:
the library's own retry and timeout handling runs, and recordings replay."""

import json
from pathlib import Path

import pytest

from tests.fixtures.fake_llm import FakeProvider
from tests.fixtures.projects import live_project
from tests.fixtures.runner import judged


@pytest.fixture(scope="module", autouse=True)
def _litellm_imported_once() -> None:
    """LiteLLM imported in this process before the runner forks invocations from it: each one
    finds it loaded instead of paying seconds of CPU to import it again. What is tested (the
    live path's requests, retries, timeouts and recordings) is the same either way."""
    import litellm  # noqa: F401


@pytest.mark.slow
def test_a_429_is_retried_by_the_library_then_succeeds(
    fake_provider: FakeProvider, tmp_path: Path
) -> None:
    project = live_project(tmp_path / "p")
    fake_provider.script = ["429", "ok"]
    result = judged(project, "tests/live-bot.yaml", "answers", fresh=fake_provider.rewind)
    assert result.passed, result.failure_reason
    # Requests live in the forked child; the server saw both attempts.
    assert len(fake_provider.requests) == 2
    assert fake_provider.requests[1]["messages"][0] == {"role": "system", "content": "Be brief."}
    model_span = next(s for s in result.invocations[0].traces if s.type == "model_call")
    assert model_span.metadata["mode"] == "live"


@pytest.mark.slow
def test_a_hang_past_the_timeout_fails_the_invocation(
    fake_provider: FakeProvider, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GATE_MODEL_TIMEOUT_SECONDS", "1")
    project = live_project(tmp_path / "p")
    fake_provider.script = ["hang"]
    result = judged(
        project, "tests/impatient-bot.yaml", "gives_up_at_the_timeout", fresh=fake_provider.rewind
    )
    assert result.passed, result.failure_reason
    # The model call's own timeout ended it, not the case's 60 s timeout_s (no wall-clock
    # assertion here: importing LiteLLM alone can take seconds on a loaded machine).
    error = result.invocations[0].error or ""
    assert "model call to openai/gpt-4o failed: Timeout" in error, error
    assert "timed out after 60 s" not in error


@pytest.mark.slow
def test_record_then_replay_without_the_provider(
    fake_provider: FakeProvider, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    project = live_project(tmp_path / "p")
    monkeypatch.setenv("GATE_MODEL_MODE", "record")
    assert judged(project, "tests/live-bot.yaml", "answers").passed
    recordings = list((project / "tests/recordings/live-bot").glob("*.json"))
    assert len(recordings) == 1
    assert json.loads(recordings[0].read_text())["response"]["content"] == fake_provider.answer
    monkeypatch.setenv("GATE_MODEL_MODE", "replay")
    monkeypatch.setenv("OPENAI_API_BASE", "http://127.0.0.1:9/v1")  # nothing listens there
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:9/v1")
    before = len(fake_provider.requests)
    replayed = judged(project, "tests/live-bot.yaml", "answers")
    assert replayed.passed, replayed.failure_reason
    assert len(fake_provider.requests) == before


@pytest.mark.slow
def test_gate_record_writes_recordings_that_replay(
    fake_provider: FakeProvider, tmp_path: Path
) -> None:
    import subprocess
    import sys

    project = live_project(tmp_path / "p")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "gate_service.cli",
            "record",
            str(project),
            "--suite",
            "tests/live-bot.yaml",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert "PASS  tests/live-bot.yaml::answers  1/1" in proc.stdout
    assert len(list((project / "tests/recordings/live-bot").glob("*.json"))) == 1
