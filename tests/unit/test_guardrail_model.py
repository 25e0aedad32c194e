"""The project's guardrail (judge) model on its way to a case (issue 38, item 6): which names
the API takes, and the runner's command line that carries it."""

from __future__ import annotations

from pathlib import Path

import pytest

from gate_runner.__main__ import main as runner_main
from gate_service.config import Settings
from gate_service.projects.schemas import MAX_MODEL_NAME, model_name_problem
from gate_service.runner_contract import parse_runner_output
from gate_service.worker.handler import runner_argv
from tests.fixtures.projects import calculator_project


@pytest.mark.parametrize(
    "name",
    [
        "openai/gpt-4o-mini",
        "gpt-4o",
        "anthropic/claude-3-5-haiku-latest",
        "gemini/gemini-2.0-flash",
        "ollama/llama3:8b",
        "openrouter/meta-llama/llama-3.1-8b-instruct:free",
        "bedrock/anthropic.claude-3-haiku-20240307-v1:0",
        "vertex_ai/gemini-1.5-pro@001",
        "corp/judge+safety",
        "m" * MAX_MODEL_NAME,
    ],
)
def test_model_names_as_providers_spell_them_are_taken(name: str) -> None:
    assert model_name_problem(name) is None


@pytest.mark.parametrize(
    ("name", "says"),
    [
        ("", "the model name is empty"),
        ("m" * (MAX_MODEL_NAME + 1), "has 201 characters, more than 200"),
        ("-x", "starts with '-'"),
        ("/etc/passwd", "starts with '/'"),
        ("a\x00b", "the unprintable character U+0000 at position 2"),
        ("a\u0085b", "the unprintable character U+0085 at position 2"),
        ("a\ud800b", "the unprintable character U+D800 at position 2"),
        ("gpt 4o", "a space (U+0020) at position 4"),
        ("gpt-4o=x", "'=' (U+003D) at position 7"),
        ("gpt-\uff14o", "'\uff14' (U+FF14) at position 5"),
    ],
)
def test_anything_else_is_refused_saying_which_character_where_and_the_rule(
    name: str, says: str
) -> None:
    problem = model_name_problem(name)
    assert problem is not None and says in problem, problem
    assert problem.endswith("starting with a letter or digit")


def test_the_runner_gets_the_judge_model_only_when_the_project_names_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    settings = Settings()
    plain = runner_argv(settings, "tests/calc.yaml", "adds_two_numbers", "live")
    assert not any(arg.startswith("--guardrail-model") for arg in plain)
    assert runner_argv(settings, "tests/calc.yaml", "adds_two_numbers", "live", None) == plain
    judged = runner_argv(
        settings, "tests/calc.yaml", "adds_two_numbers", "live", "openai/gpt-4o-mini"
    )
    # One argument: the option's value can never be read as an option of its own.
    assert judged == [*plain, "--guardrail-model=openai/gpt-4o-mini"]
    without_mode = runner_argv(settings, "s.yaml", "c", guardrail_model="ollama/llama3:8b")
    assert without_mode[-1] == "--guardrail-model=ollama/llama3:8b"
    assert not any(arg.startswith("--model-mode") for arg in without_mode)

    # The runner takes the option (in-process here: no uid change, no handoff).
    project = calculator_project(tmp_path / "proj", failing=False)
    in_process = ["run-case", "--project", str(project), "--suite=tests/calc.yaml"]
    case = ["--case=adds_two_numbers", "--guardrail-model=openai/gpt-4o-mini"]
    assert runner_main([*in_process, *case]) == 0
    result = parse_runner_output(capsys.readouterr().out.encode())
    assert (result.test_name, result.passed) == ("adds_two_numbers", True)
