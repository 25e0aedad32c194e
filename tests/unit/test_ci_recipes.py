"""The CI recipes under docs/ci/ gate a pipeline the way docs/results.md says they do.

Each recipe is parsed with yaml.safe_load and held to the same rules: it installs the client
from something real (a checkout path or a documented variable, never a made-up host), runs
`gate submit . --wait --junit FILE` with the URL and token from CI secrets or variables, lets
the command's exit code fail the job (no `|| true`, no continue-on-error, no allow_failure),
and publishes FILE as JUnit even when that step fails. The checkers return their problems, so
the tests below also show that a broken copy of each recipe is caught.
"""

from __future__ import annotations

import copy
import posixpath
import re
import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml

DOCS = Path(__file__).resolve().parents[2] / "docs" / "ci"
GITHUB = DOCS / "github-actions.yml"
GITLAB = DOCS / "gitlab-ci.yml"

# Ways a shell line swallows a failing command's exit code.
SWALLOWED = re.compile(r"\|\|\s*(true|:|exit\s+0)\b|;\s*true\b|set\s+\+e|\|\s*tee\b")
GH_SECRET = re.compile(r"^\$\{\{\s*(secrets|vars)\.[A-Za-z_][A-Za-z0-9_]*\s*\}\}$")
PUBLISHERS = ("dorny/test-reporter@", "mikepenz/action-junit-report@", "actions/upload-artifact@")


def load(path: Path) -> dict[Any, Any]:
    doc = yaml.safe_load(path.read_text())
    assert isinstance(doc, dict), f"{path.name} is not a YAML mapping"
    return doc


def submit_args(line: str) -> list[str] | None:
    """The arguments after `gate submit` on a shell line, or None when it runs something else."""
    words = shlex.split(line)
    for i in range(len(words) - 1):
        if words[i] == "gate" and words[i + 1] == "submit":
            return words[i + 2 :]
    return None


def junit_of(args: list[str]) -> str | None:
    for i, word in enumerate(args):
        if word == "--junit" and i + 1 < len(args):
            return args[i + 1]
        if word.startswith("--junit="):
            return word.split("=", 1)[1]
    return None


def submit_problems(lines: list[str]) -> tuple[list[str], str | None]:
    """Problems of the shell lines that hold the gate command, and its JUnit file."""
    problems: list[str] = []
    calls = [(line, args) for line in lines if (args := submit_args(line)) is not None]
    if len(calls) != 1:
        return [f"expected one `gate submit` command, found {len(calls)}"], None
    line, args = calls[0]
    if not args or args[0] != ".":
        problems.append("`gate submit` does not submit the project folder `.`")
    if "--wait" not in args:
        problems.append("`gate submit` without --wait does not wait for the verdict")
    junit = junit_of(args)
    if not junit:
        problems.append("`gate submit` writes no JUnit report (--junit FILE)")
    if any(a.startswith("--token") for a in args):
        problems.append("the token is given on the command line instead of GATE_TOKEN")
    if SWALLOWED.search(line):
        problems.append(f"the gate's exit code is swallowed: {line!r}")
    return problems, junit


# ---------------------------------------------------------------- GitHub Actions


def github_problems(doc: dict[Any, Any]) -> list[str]:
    problems: list[str] = []
    # YAML 1.1 reads the key `on` as True.
    if not (doc.get("on") or doc.get(True)):
        problems.append("the workflow has no trigger (on:)")
    jobs = doc.get("jobs") or {}
    gate_jobs = [
        (name, job)
        for name, job in jobs.items()
        if any(submit_args(str(step.get("run", ""))) is not None for step in job.get("steps", []))
    ]
    if len(gate_jobs) != 1:
        return [*problems, f"expected one job that runs `gate submit`, found {len(gate_jobs)}"]
    name, job = gate_jobs[0]
    steps: list[dict[str, Any]] = job.get("steps", [])
    if job.get("continue-on-error"):
        problems.append(f"job {name} has continue-on-error")

    at = next(i for i, s in enumerate(steps) if submit_args(str(s.get("run", ""))) is not None)
    gate = steps[at]
    lines = [ln for ln in str(gate["run"]).splitlines() if ln.strip()]
    found, junit = submit_problems(lines)
    problems += found
    if gate.get("continue-on-error"):
        problems.append("the gate step has continue-on-error")
    if gate.get("if"):
        problems.append(f"the gate step runs only if {gate['if']!r}")

    env = {**(doc.get("env") or {}), **(job.get("env") or {}), **(gate.get("env") or {})}
    for var in ("GATE_URL", "GATE_TOKEN"):
        value = env.get(var)
        if value is None:
            problems.append(f"{var} is not set for the gate step")
        elif not GH_SECRET.match(str(value)):
            problems.append(f"{var} is a literal, not a secret or variable: {value!r}")
    if not str(env.get("GATE_TOKEN", "")).replace(" ", "").startswith("${{secrets."):
        problems.append("GATE_TOKEN does not come from secrets")

    # The report, at the path relative to the workspace.
    if junit:
        report = posixpath.normpath(posixpath.join(gate.get("working-directory", "."), junit))
        publishers = [
            s
            for s in steps[at + 1 :]
            if str(s.get("uses", "")).startswith(PUBLISHERS)
            and "always()" in str(s.get("if", ""))
            and posixpath.normpath(str((s.get("with") or {}).get("path", ""))) == report
        ]
        if not publishers:
            problems.append(f"nothing after the gate publishes {report} with if: always()")
        if any(str(s["uses"]).startswith("dorny/") for s in publishers):
            if (doc.get("permissions") or {}).get("checks") != "write":
                problems.append("dorny/test-reporter needs permissions: checks: write")

    # The client comes from a checkout of gate-service named by a repository variable.
    installs = [s for s in steps[:at] if re.search(r"\bpip\s+install\b", str(s.get("run", "")))]
    checkouts = {
        str((s.get("with") or {}).get("path", ".")).rstrip("/"): s
        for s in steps[:at]
        if str(s.get("uses", "")).startswith("actions/checkout@")
    }
    if not installs:
        problems.append("the client is not installed before the gate step")
    for step in installs:
        words = shlex.split(str(step["run"]))
        targets = [w for w in words if w.startswith("./")]
        for target in targets:
            checkout = checkouts.get(target[2:].rstrip("/"))
            repo = str(((checkout or {}).get("with") or {}).get("repository", ""))
            if not GH_SECRET.match(repo):
                problems.append(f"{target} is not a checkout of a repository named by a variable")
        if not targets:
            problems.append(f"the client is installed from no checkout path: {step['run']!r}")
        if "git+" in str(step["run"]) or "://" in str(step["run"]):
            problems.append(f"the client is installed from a URL: {step['run']!r}")
    return problems


def test_github_recipe() -> None:
    assert github_problems(load(GITHUB)) == []


def publisher(doc: dict[str, Any]) -> dict[str, Any]:
    for job in doc["jobs"].values():
        for step in job["steps"]:
            if str(step.get("uses", "")).startswith("dorny/"):
                return dict(step)
    raise AssertionError("no publisher")


def _gh_swallow(doc: dict[str, Any]) -> None:
    gate_step_ref(doc)["run"] += " || true"


def _gh_continue(doc: dict[str, Any]) -> None:
    gate_step_ref(doc)["continue-on-error"] = True


def _gh_no_wait(doc: dict[str, Any]) -> None:
    step = gate_step_ref(doc)
    step["run"] = step["run"].replace("--wait ", "")


def _gh_no_junit(doc: dict[str, Any]) -> None:
    step = gate_step_ref(doc)
    step["run"] = step["run"].replace("--junit gate-junit.xml", "")


def _gh_literal_token(doc: dict[str, Any]) -> None:
    gate_step_ref(doc)["env"]["GATE_TOKEN"] = "gt_0123456789abcdef"


def _gh_literal_url(doc: dict[str, Any]) -> None:
    gate_step_ref(doc)["env"]["GATE_URL"] = "http://gate.example:8080"


def _gh_not_always(doc: dict[str, Any]) -> None:
    for job in doc["jobs"].values():
        for step in job["steps"]:
            if str(step.get("uses", "")).startswith(PUBLISHERS):
                step.pop("if", None)


def _gh_other_file(doc: dict[str, Any]) -> None:
    for job in doc["jobs"].values():
        for step in job["steps"]:
            if str(step.get("uses", "")).startswith(PUBLISHERS):
                step["with"]["path"] = "gate-junit.xml"  # not under the project's folder


def _gh_made_up_host(doc: dict[str, Any]) -> None:
    for job in doc["jobs"].values():
        for step in job["steps"]:
            if "pip install" in str(step.get("run", "")):
                step["run"] = 'pip install "git+https://git.example.com/gate-service"'


def gate_step_ref(doc: dict[str, Any]) -> dict[str, Any]:
    for job in doc["jobs"].values():
        for step in job["steps"]:
            if "gate submit" in str(step.get("run", "")):
                assert isinstance(step, dict)
                return step
    raise AssertionError("no gate step")


@pytest.mark.parametrize(
    ("mutate", "reason"),
    [
        (_gh_swallow, "swallowed"),
        (_gh_continue, "continue-on-error"),
        (_gh_no_wait, "--wait"),
        (_gh_no_junit, "JUnit report"),
        (_gh_literal_token, "GATE_TOKEN is a literal"),
        (_gh_literal_url, "GATE_URL is a literal"),
        (_gh_not_always, "if: always()"),
        (_gh_other_file, "publishes project/gate-junit.xml"),
        (_gh_made_up_host, "from a URL"),
    ],
    ids=lambda f: f.__name__.removeprefix("_gh_") if callable(f) else "",
)
def test_a_broken_github_recipe_is_caught(mutate: Any, reason: str) -> None:
    doc = copy.deepcopy(load(GITHUB))
    mutate(doc)
    problems = github_problems(doc)
    assert any(reason in problem for problem in problems), problems


# ---------------------------------------------------------------- GitLab CI


def script_lines(job: dict[str, Any], key: str) -> list[str]:
    value = job.get(key) or []
    return [str(line) for line in (value if isinstance(value, list) else [value])]


def gitlab_problems(doc: dict[str, Any], text: str) -> list[str]:
    problems: list[str] = []
    jobs = {
        name: job
        for name, job in doc.items()
        if isinstance(job, dict)
        and any(submit_args(line) is not None for line in script_lines(job, "script"))
    }
    if len(jobs) != 1:
        return [f"expected one job whose script runs `gate submit`, found {len(jobs)}"]
    name, job = next(iter(jobs.items()))
    found, junit = submit_problems(script_lines(job, "script"))
    problems += found
    if job.get("allow_failure"):
        problems.append(f"job {name} has allow_failure")
    for key in ("before_script", "script"):
        for line in script_lines(job, key):
            if SWALLOWED.search(line) and submit_args(line) is None and "pip" in line:
                problems.append(f"a failed install is swallowed: {line!r}")

    # GATE_URL and GATE_TOKEN are CI/CD variables: never given a value in the file.
    for scope in (doc.get("variables") or {}, job.get("variables") or {}):
        for var in ("GATE_URL", "GATE_TOKEN"):
            value = scope.get(var)
            if value is not None and not re.fullmatch(
                r"\$\{?[A-Za-z_][A-Za-z0-9_]*\}?", str(value)
            ):
                problems.append(f"{var} is given a literal value: {value!r}")
    for var in ("GATE_URL", "GATE_TOKEN"):
        if not re.search(rf"^#.*\b{var}\b", text, re.MULTILINE):
            problems.append(f"the recipe does not say where {var} comes from")

    artifacts = job.get("artifacts") or {}
    if artifacts.get("when") != "always":
        problems.append("artifacts are not uploaded when the job fails (when: always)")
    reported = (artifacts.get("reports") or {}).get("junit")
    reported_files = reported if isinstance(reported, list) else [reported]
    if junit and junit not in reported_files:
        problems.append(f"reports: junit is {reported!r}, not the gate's {junit!r}")

    # The client comes from a documented variable, not a made-up host.
    installs = [
        line
        for line in script_lines(job, "before_script") + script_lines(job, "script")
        if re.search(r"\bpip\s+install\b", line)
    ]
    if not installs:
        problems.append("the client is not installed")
    for line in installs:
        words = shlex.split(line)
        after = words[words.index("install") + 1 :]
        targets = [w for w in after if not w.startswith("-")]
        for target in targets:
            variable = re.fullmatch(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?", target)
            if variable is None:
                problems.append(f"the client is installed from a literal {target!r}")
            elif not re.search(rf"^#.*\b{variable[1]}\b", text, re.MULTILINE):
                problems.append(f"${variable[1]} is not documented in the recipe")
    return problems


def test_gitlab_recipe() -> None:
    assert gitlab_problems(load(GITLAB), GITLAB.read_text()) == []


def gitlab_job(doc: dict[str, Any]) -> dict[str, Any]:
    for job in doc.values():
        if isinstance(job, dict) and "gate submit" in str(job.get("script", "")):
            return job
    raise AssertionError("no gate job")


def _gl_swallow(doc: dict[str, Any]) -> None:
    job = gitlab_job(doc)
    job["script"] = [line + " || true" for line in job["script"]]


def _gl_allow_failure(doc: dict[str, Any]) -> None:
    gitlab_job(doc)["allow_failure"] = True


def _gl_on_success(doc: dict[str, Any]) -> None:
    gitlab_job(doc)["artifacts"]["when"] = "on_success"


def _gl_other_report(doc: dict[str, Any]) -> None:
    gitlab_job(doc)["artifacts"]["reports"]["junit"] = "report.xml"


def _gl_no_wait(doc: dict[str, Any]) -> None:
    job = gitlab_job(doc)
    job["script"] = [line.replace("--wait ", "") for line in job["script"]]


def _gl_literal_token(doc: dict[str, Any]) -> None:
    gitlab_job(doc)["variables"] = {"GATE_TOKEN": "gt_0123456789abcdef"}


def _gl_made_up_host(doc: dict[str, Any]) -> None:
    job = gitlab_job(doc)
    job["before_script"] = ['pip install "git+https://git.example.com/gate-service"']


@pytest.mark.parametrize(
    ("mutate", "reason"),
    [
        (_gl_swallow, "swallowed"),
        (_gl_allow_failure, "allow_failure"),
        (_gl_on_success, "when: always"),
        (_gl_other_report, "reports: junit"),
        (_gl_no_wait, "--wait"),
        (_gl_literal_token, "GATE_TOKEN is given a literal"),
        (_gl_made_up_host, "installed from a literal"),
    ],
    ids=lambda f: f.__name__.removeprefix("_gl_") if callable(f) else "",
)
def test_a_broken_gitlab_recipe_is_caught(mutate: Any, reason: str) -> None:
    doc = copy.deepcopy(load(GITLAB))
    mutate(doc)
    problems = gitlab_problems(doc, GITLAB.read_text())
    assert any(reason in problem for problem in problems), problems


def test_both_recipes_publish_the_same_file_name() -> None:
    gh = junit_of(submit_args(str(gate_step_ref(load(GITHUB))["run"])) or [])
    gl_lines = script_lines(gitlab_job(load(GITLAB)), "script")
    gl = next(junit_of(args) for line in gl_lines if (args := submit_args(line)) is not None)
    assert gh == gl == "gate-junit.xml"
    assert publisher(load(GITHUB))["with"]["reporter"] == "java-junit"
