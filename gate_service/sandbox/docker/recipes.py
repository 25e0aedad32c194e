"""What test images are built from: their Dockerfiles (text only, no engine), the labels of
every image a build makes, and the runner digest, the content address that names the runner
image and ends every test image's tag."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from pathlib import Path

from gate_runner.plan import PLAN_PATH

from ..port import (
    BUILD_ID_LABEL,
    BUILD_IMAGE_LABEL,
    BUILD_STAGE,
    BUNDLE_DEPS_DIR,
    INVOCATION_UID,
    LABEL,
    TestImageSpec,
)

# The bundle's Python files (and its dependencies') are compiled here, once per image: a case
# container's root is read-only and PYTHONDONTWRITEBYTECODE is set, and every invocation
# imports the project afresh, so without this each one would compile the same sources again.
# Compiling runs no bundle code; a file that does not compile is left for its invocation to
# report. The image's user goes back to the runner image's own afterwards.
#
# Each stage starts with LABEL {stage_labels} (see build_labels): the engine's classic builder
# (what the API's /build runs when not asked for version=2, and docker-py never asks) keeps
# every step of every stage as an image, and its own `labels` go only on the last step of
# the last stage. Labelled from their first step, the images of the dependency stage (the
# wheels and the installed packages: 879 MB for numpy) and of a build cut half-way are
# found by this build's id and removed when it ends, or by garbage collection after a crash.
TEST_DOCKERFILE = """\
FROM {runner}
LABEL {stage_labels}
COPY --chown=0:0 bundle/ /bundle/
USER 0:0
RUN {compile_bundle}
USER {runner_user}
"""
# With requirements, two stages: `deps` installs the bundle's wheels into BUNDLE_DEPS_DIR
# (never into the runner's venv, so no wheel can replace a runner module or add a .pth hook
# to the runner's interpreter), and the final image copies only that directory, so the
# wheels themselves never reach it. Every RUN is exec form: the requirement strings are JSON
# arguments to pip that no shell ever sees. chmod leaves the directory root-owned and
# writable by root alone (the case's invocations run as another uid).
TEST_DOCKERFILE_DEPS = """\
FROM {runner} AS deps
LABEL {stage_labels}
USER 0:0
COPY wheels/ /tmp/bundle-wheels/
RUN {mkdir}
RUN {install}
RUN {compile_deps}
RUN {chmod}

FROM {runner}
LABEL {stage_labels}
COPY --chown=0:0 bundle/ /bundle/
COPY --from=deps --chown=0:0 {deps}/ {deps}/
USER 0:0
RUN {compile_bundle}
USER {runner_user}
"""
BUNDLE_WHEELS_DIR = "/tmp/bundle-wheels"
COMPILE_MAX_FILE_BYTES = 2 * 1024 * 1024  # 2 MiB


def runner_digest(src: Path, base: str) -> str:
    """The runner image's tag: its base and the bytes of its build context under `src`.

    Only the files the build reads, by their paths relative to `src`, so a checkout's
    runner_image/ and a wheel's gate_service/runner_image give the same tag.
    """
    h = hashlib.sha256(base.encode())
    for path in sorted(
        [src / "Dockerfile", src / "requirements.txt", *(src / "gate_runner").rglob("*.py")]
    ):
        h.update(path.relative_to(src).as_posix().encode())
        h.update(path.read_bytes())
    # Test image tags end in this digest, so the recipes they are built by count too: a
    # changed test Dockerfile must never reuse images built by the old one.
    h.update(TEST_DOCKERFILE.encode())
    h.update(TEST_DOCKERFILE_DEPS.encode())
    h.update(json.dumps(_compile_and_plan_command()).encode())
    return h.hexdigest()[:12]


# What a label key or value in our Dockerfiles may hold: ours only (tags, hex ids), never
# the bundle's text, and nothing the Dockerfile parser would read as quoting or a variable.
_LABEL_TEXT = re.compile(r"[A-Za-z0-9._:/@-]+")


def build_labels(spec: TestImageSpec, build_id: str) -> dict[str, str]:
    """The labels of every image one test-image build makes besides the test image."""
    return {
        **spec.labels,
        LABEL: BUILD_STAGE,
        BUILD_ID_LABEL: build_id,
        BUILD_IMAGE_LABEL: spec.tag,
    }


def _label_instruction(labels: Mapping[str, str]) -> str:
    pairs = []
    for key, value in sorted(labels.items()):
        if not (_LABEL_TEXT.fullmatch(key) and _LABEL_TEXT.fullmatch(value)):
            raise ValueError(f"a build label must match {_LABEL_TEXT.pattern}: {key}={value}")
        pairs.append(f'"{key}"="{value}"')
    return " ".join(pairs)


def bundle_dockerfile(
    runner: str, requirements: Sequence[str], stage_labels: Mapping[str, str]
) -> str:
    """The test image's Dockerfile: the runner, the bundle and, if any, its dependencies.

    Every stage is labelled with ``stage_labels`` from its first step (see TEST_DOCKERFILE).
    """
    compiled = {
        "compile_bundle": json.dumps(_compile_and_plan_command()),
        "runner_user": f"{INVOCATION_UID}:{INVOCATION_UID}",
        "stage_labels": _label_instruction(stage_labels),
    }
    if not requirements:
        return TEST_DOCKERFILE.format(runner=runner, **compiled)
    install = [
        "/opt/gate-runner/bin/pip", "install",
        "--no-cache-dir", "--disable-pip-version-check", "--no-input",
        "--no-index", "--find-links", BUNDLE_WHEELS_DIR,
        "--only-binary=:all:", "--no-compile",
        "--target", BUNDLE_DEPS_DIR,
        "--", *requirements,
    ]  # fmt: skip
    return TEST_DOCKERFILE_DEPS.format(
        runner=runner,
        mkdir=json.dumps(["/bin/mkdir", "-p", BUNDLE_DEPS_DIR]),
        install=json.dumps(install),
        compile_deps=json.dumps(_compile_command(BUNDLE_DEPS_DIR)),
        chmod=json.dumps(["/bin/chmod", "-R", "u=rwX,go=rX", BUNDLE_DEPS_DIR]),
        deps=BUNDLE_DEPS_DIR,
        **compiled,
    )


def _compile_and_plan_command() -> list[str]:
    """Exec-form argv that compiles the bundle (see _compile_command), then writes the
    image's plan (gate_runner/plan.py): every case prepared once, here, instead of in each
    case container. One step, so one container, for both. The plan reads the project in the
    SDK's validation mode, which runs none of its code, under the invocation uid once its
    root-owned file is open, and never fails the build: without a plan, cases are prepared
    from their suites."""
    argv = _compile_command("/bundle")
    plan = [
        "plan", "--project", "/bundle", "--out", PLAN_PATH, "--as-uid", str(INVOCATION_UID),
    ]  # fmt: skip
    argv[-1] += (
        "import runpy, sys\n"
        f"sys.argv = ['gate_runner', *{plan!r}]\n"
        "try:\n"
        "    runpy.run_module('gate_runner', run_name='__main__', alter_sys=True)\n"
        "except BaseException:\n"
        "    pass\n"
    )
    return argv


def _compile_command(directory: str) -> list[str]:
    """Exec-form argv that writes __pycache__ for the .py files under ``directory``.

    Only compiles: nothing is imported or run, and links are not followed. A file that does
    not compile (or is over COMPILE_MAX_FILE_BYTES, which bounds the build's memory) is left
    as it is, for its invocation to compile or report; the step itself never fails the build.
    """
    script = (
        "import os, py_compile\n"
        f"for d, _, names in os.walk({directory!r}):\n"
        "    for n in names:\n"
        "        p = os.path.join(d, n)\n"
        "        try:\n"
        "            if (n.endswith('.py') and not os.path.islink(p) and os.path.isfile(p)\n"
        f"                    and os.path.getsize(p) <= {COMPILE_MAX_FILE_BYTES}):\n"
        "                py_compile.compile(p, doraise=True)\n"
        "        except Exception:\n"
        "            pass\n"
    )
    return ["/opt/gate-runner/bin/python", "-I", "-c", script]
