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


# The bundle's Python files (and its dependencies') are compiled once per image: a case
# container's root is read-only and PYTHONDONTWRITEBYTECODE is set, and every invocation
# imports the project afresh, so without this each one would compile the same sources again.
# Compiling runs no bundle code; a file that does not compile is left for its invocation to
# report. The image's user goes back to the runner image's own afterwards.
#
# A bundle without requirements needs no Dockerfile: its test image is one container of the
# runner image (as root, with no network, bounded as the STEP_ figures below say) that the
# bundle is copied into, that compiles it and writes the plan, and that is then committed
# with the changes below (test_image.DockerImageBuilder._build_in_container). The engine's
# classic builder would commit every step of a Dockerfile as an image (LABEL, COPY, USER,
# RUN, USER: 0.6 s more per build here); this commits once, the bundle and its bytecode in
# one layer.
def commit_changes(entrypoint: Sequence[str], labels: Mapping[str, str]) -> list[str]:
    """The Dockerfile instructions a one-stage test image is committed with: the runner's
    user and entrypoint back (the step ran as root, its own command), and its labels."""
    return [
        f"USER {INVOCATION_UID}:{INVOCATION_UID}",
        f"ENTRYPOINT {json.dumps(list(entrypoint))}",
        f"LABEL {_label_instruction(labels)}",
    ]


# The one step's container: what the classic builder gave a RUN step (root, no network), less
# every capability but the two the plan needs to drop to the invocation uid, and bounded. The
# memory bounds compiling files of up to COMPILE_MAX_FILE_BYTES; the builder set none at all.
STEP_MEMORY_MB = 1024
STEP_PIDS = 64
STEP_LOG_BYTES = 1024 * 1024  # never read but on failure; the engine keeps no more than this


# With requirements, two stages: `deps` installs the bundle's wheels into BUNDLE_DEPS_DIR
# (never into the runner's venv, so no wheel can replace a runner module or add a .pth hook
# to the runner's interpreter), and the final image copies only that directory, so the
# wheels themselves never reach it. Every RUN is exec form: the requirement strings are JSON
# arguments to pip that no shell ever sees. chmod leaves the directory root-owned and
# writable by root alone (the case's invocations run as another uid).
#
# Each stage starts with LABEL {stage_labels} (see build_labels): the engine's classic builder
# (what the API's /build runs when not asked for version=2, and docker-py never asks) keeps
# every step of every stage as an image, and its own `labels` go only on the last step of
# the last stage. Labelled from their first step, the images of the dependency stage (the
# wheels and the installed packages: 879 MB for numpy) and of a build cut half-way are
# found by this build's id and removed when it ends, or by garbage collection after a crash.
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
    h.update(json.dumps(commit_changes(["entrypoint"], {"label": "value"})).encode())
    h.update(TEST_DOCKERFILE_DEPS.encode())
    h.update(json.dumps(compile_and_plan_command()).encode())
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


def deps_dockerfile(
    runner: str, requirements: Sequence[str], stage_labels: Mapping[str, str]
) -> str:
    """The Dockerfile of a test image with requirements: the runner, its dependencies and
    the bundle. Every stage is labelled with ``stage_labels`` from its first step."""
    if not requirements:
        raise ValueError("a bundle without requirements is not built from a Dockerfile")
    compiled = {
        "compile_bundle": json.dumps(compile_and_plan_command()),
        "runner_user": f"{INVOCATION_UID}:{INVOCATION_UID}",
        "stage_labels": _label_instruction(stage_labels),
    }
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


def compile_and_plan_command() -> list[str]:
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
