"""Test image builds through the real engine: bounded in time and output, deps kept apart."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import docker.errors
import pytest

from gate_service import sandbox as port
from gate_service.config import Settings
from gate_service.sandbox import (
    BUILD_IMAGE_LABEL,
    BUNDLE_DEPS_DIR,
    LABEL,
    BuildRefused,
    Halted,
    SandboxError,
)
from gate_service.sandbox.docker import DockerSandbox
from gate_service.worker.handler import case_limits
from tests.fixtures.docker import reuse_a_runner
from tests.fixtures.projects import AGENTS, make_wheel, write

pytestmark = pytest.mark.docker


class Builds:
    """Sandboxes with chosen build settings, and every tag they may build, removed after."""

    def __init__(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.tmp_path, self.monkeypatch = tmp_path, monkeypatch
        self.made: list[DockerSandbox] = []
        self.tags: list[str] = []

    def sandbox(self, **settings: float) -> DockerSandbox:
        sandbox = DockerSandbox(Settings(data_dir=self.tmp_path / "data", **settings))
        reuse_a_runner(sandbox, self.monkeypatch)
        self.made.append(sandbox)
        return sandbox

    def tag(self, kind: str) -> str:
        self.tags.append(f"gate-test:{kind}-{uuid.uuid4().hex[:12]}")
        return self.tags[-1]

    def spec(self, *requirements: str, wheel: bool = False) -> port.TestImageSpec:
        ctx = self.tmp_path / uuid.uuid4().hex
        (ctx / "bundle").mkdir(parents=True)
        (ctx / "bundle" / "marker.txt").write_text(uuid.uuid4().hex)  # never a cached build
        if wheel:
            make_wheel(ctx / "wheels")
        return port.TestImageSpec(
            tag=self.tag("limits"), context_dir=ctx, requirements=requirements
        )

    def left_by(self, sandbox: DockerSandbox, tag: str) -> list[str]:
        """Ids of the images (intermediate ones too) a failed build for ``tag`` left."""
        found = sandbox.client.api.images(all=True, filters={"label": f"{BUILD_IMAGE_LABEL}={tag}"})
        return [str(i["Id"]) for i in found]

    def clean(self) -> None:
        for sandbox in self.made:
            for tag in self.tags:
                if sandbox.image_exists(tag):
                    sandbox.client.images.remove(tag, force=True)
                for ref in self.left_by(sandbox, tag):  # only when a test above failed
                    try:
                        sandbox.client.images.remove(ref, force=True)
                    except docker.errors.APIError:
                        pass  # pruned with its child already, or a parent of one left
            sandbox.close()


@pytest.fixture
def builds(
    docker_engine: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Builds]:
    builds = Builds(tmp_path, monkeypatch)
    try:
        yield builds
    finally:
        builds.clean()


def test_a_build_over_the_output_cap_is_refused(builds: Builds) -> None:
    # A build with requirements: pip's output is the bundle's to make long. (A bundle without
    # them runs only our step, whose log the engine caps and nobody reads but on failure.)
    sandbox = builds.sandbox(build_output_limit_bytes=10)
    image = builds.spec("gate-e2e-demo==1.0", wheel=True)
    with pytest.raises(BuildRefused, match="more than 10 bytes of output"):
        sandbox.build_test_image(image)
    assert not sandbox.image_exists(image.tag)
    assert builds.left_by(sandbox, image.tag) == []


def test_a_build_over_the_time_limit_is_refused(builds: Builds) -> None:
    sandbox = builds.sandbox(build_timeout_seconds=0.3)
    # Installing deps starts a container and pip: far longer than 0.3 s.
    image = builds.spec("gate-e2e-demo==1.0", wheel=True)
    with pytest.raises(BuildRefused, match=r"took longer than 0\.3 s"):
        sandbox.build_test_image(image)
    assert not sandbox.image_exists(image.tag)
    assert builds.left_by(sandbox, image.tag) == []


def test_a_silent_build_step_is_cut_off_at_the_time_limit(builds: Builds, tmp_path: Path) -> None:
    sandbox = builds.sandbox()
    ctx = tmp_path / "silent"
    ctx.mkdir()
    (ctx / "Dockerfile").write_text(f'FROM {sandbox.runner_image()}\nRUN ["sleep", "600"]\n')
    tag = builds.tag("silent")
    started = time.monotonic()
    with pytest.raises(BuildRefused, match="took longer than 1 s"):
        sandbox._build(
            "a silent build",
            timeout_seconds=1,
            output_limit_bytes=1_000_000,
            path=str(ctx),
            tag=tag,
            rm=True,
            forcerm=True,
            network_mode="none",
            labels={LABEL: "test"},
        )
    # Not the 600 s the step would take: the bound is far from both.
    assert time.monotonic() - started < 120
    assert not sandbox.image_exists(tag)


def test_a_failing_build_reports_the_tail_of_its_log(builds: Builds) -> None:
    sandbox = builds.sandbox()
    image = builds.spec("not-in-the-wheels==1.0", wheel=True)
    with pytest.raises(SandboxError, match="not-in-the-wheels") as caught:
        sandbox.build_test_image(image)
    assert "returned a non-zero code" in caught.value.detail
    # The dependency stage's steps up to the failed one were images: gone with the build.
    assert builds.left_by(sandbox, image.tag) == []


def test_a_build_halted_during_its_install_step_leaves_no_image(builds: Builds) -> None:
    """Cut while pip runs in the dependency stage: the steps before it were committed as
    images, and the step's container was running; neither outlives the build."""
    sandbox = builds.sandbox()
    image = builds.spec("gate-e2e-demo==1.0", wheel=True)
    build_halted_once(sandbox, image, lambda step: "pip" in str(step.get("Command")))
    assert not sandbox.image_exists(image.tag)
    assert builds.left_by(sandbox, image.tag) == []
    assert step_containers(sandbox, image.tag) == []


def build_halted_once(
    sandbox: DockerSandbox, image: port.TestImageSpec, found: Callable[[dict[str, Any]], bool]
) -> dict[str, Any]:
    """Build ``image``, halting it once one of its step containers is ``found``; that
    container's inspection (empty when the step was gone by then, see below)."""
    halt = threading.Event()
    seen: list[dict[str, Any]] = []

    def watch() -> None:
        deadline = time.monotonic() + 120
        while not halt.is_set() and time.monotonic() < deadline:
            for step in step_containers(sandbox, image.tag):
                if found(step):
                    try:
                        seen.append(sandbox.client.api.inspect_container(step["Id"]))
                    except docker.errors.NotFound:
                        # The listing also holds a step that has ended, and the builder
                        # removes it once it is committed: on a loaded machine that can
                        # happen between the listing and this look. The build is past
                        # that step then, and the halt stops it in a later one.
                        seen.append({})
                    halt.set()
            time.sleep(0.02)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    with pytest.raises(Halted, match="halted during"):
        sandbox.build_test_image(image, halt=halt)
    watcher.join()
    return seen[0]


# About 1.9 MB of functions, under the step's per-file compile cap: a second or so to compile,
# so the step is seen running (and can be cut) while it does.
SLOW_TO_COMPILE = "".join(f"def f{i}(a, b):\n    return a * b + {i}\n" for i in range(45_000))


def step_containers(sandbox: DockerSandbox, tag: str) -> list[dict[str, Any]]:
    return list(
        sandbox.client.api.containers(all=True, filters={"label": f"{BUILD_IMAGE_LABEL}={tag}"})
    )


def test_a_one_stage_build_over_the_time_limit_is_refused_and_leaves_nothing(
    builds: Builds,
) -> None:
    sandbox = builds.sandbox(build_timeout_seconds=0.5)
    image = builds.spec()
    (image.context_dir / "bundle" / "slow.py").write_text(SLOW_TO_COMPILE)
    with pytest.raises(BuildRefused, match=r"took longer than 0\.5 s"):
        sandbox.build_test_image(image)
    assert not sandbox.image_exists(image.tag)
    assert builds.left_by(sandbox, image.tag) == []
    assert step_containers(sandbox, image.tag) == []


def test_a_one_stage_build_step_is_hardened_and_a_halt_cuts_it(builds: Builds) -> None:
    """The step that compiles the bundle and writes the plan runs as the classic builder's
    RUN did (root, no network) but with no capability beyond the plan's drop to the
    invocation uid, no new privileges, and bounded; halted meanwhile, it leaves nothing."""
    sandbox = builds.sandbox()
    image = builds.spec()
    (image.context_dir / "bundle" / "slow.py").write_text(SLOW_TO_COMPILE)
    step = build_halted_once(sandbox, image, lambda step: step.get("State") == "running")
    host, config = step["HostConfig"], step["Config"]
    assert host["CapDrop"] == ["ALL"] and sorted(host["CapAdd"]) == ["SETGID", "SETUID"]
    assert host["SecurityOpt"] == ["no-new-privileges"]
    assert host["NetworkMode"] == "none" and config["NetworkDisabled"] is True
    assert host["Memory"] > 0 and host["PidsLimit"] > 0
    assert config["Labels"][LABEL] == "build"
    assert not sandbox.image_exists(image.tag)
    assert step_containers(sandbox, image.tag) == []


def test_a_one_stage_image_is_one_layer_over_the_runner_with_its_user_and_entrypoint(
    builds: Builds,
) -> None:
    sandbox = builds.sandbox()
    image = builds.spec()
    (image.context_dir / "bundle" / "tools").mkdir()
    (image.context_dir / "bundle" / "tools" / "calc.py").write_text(
        "def add(a, b):\n    return a + b\n"
    )
    sandbox.build_test_image(image)
    built = sandbox.client.images.get(image.tag).attrs
    runner = sandbox.client.images.get(sandbox.runner_image()).attrs
    assert built["RootFS"]["Layers"][:-1] == runner["RootFS"]["Layers"]
    assert built["Config"]["User"] == "10001:10001"
    assert built["Config"]["Entrypoint"] == runner["Config"]["Entrypoint"]
    assert built["Config"]["Env"] == runner["Config"]["Env"]
    assert built["Config"]["WorkingDir"] == "/bundle"
    assert built["Config"]["Labels"][LABEL] == "test"
    assert as_invocation(sandbox, image.tag, BUNDLE_CHECK) == "ok"
    assert step_containers(sandbox, image.tag) == []


# The bundle is root-owned and read-only to the invocations, /bundle keeps the runner
# image's owner and mode, and the bundle was compiled.
BUNDLE_CHECK = """
import os, pathlib
root = pathlib.Path("/bundle")
assert root.stat().st_uid == 0 and root.stat().st_mode & 0o777 == 0o755, oct(root.stat().st_mode)
assert all(p.stat().st_uid == 0 and p.stat().st_gid == 0 for p in root.rglob("*"))
assert (root / "marker.txt").read_text()
assert list(pathlib.Path("/bundle/tools/__pycache__").glob("calc.*.pyc"))
try:
    open(root / "planted.txt", "w")
except PermissionError:
    print("ok")
"""


CHECK = f"""
import importlib.util, os, pathlib
deps = pathlib.Path({BUNDLE_DEPS_DIR!r})
assert (deps / "gate_e2e_demo" / "__init__.py").is_file()
loose = [str(p) for p in [deps, *deps.rglob("*")] if p.stat().st_uid or p.stat().st_mode & 0o022]
assert not loose, loose
assert importlib.util.find_spec("gate_e2e_demo") is None, "installed into the runner's env"
assert not os.path.exists("/tmp/bundle-wheels")
# Compiled at build time, once per image: a case container cannot write bytecode.
assert (deps / "gate_e2e_demo" / "__pycache__").is_dir()
assert list(pathlib.Path("/bundle/tools/__pycache__").glob("calc.*.pyc"))
assert not list(pathlib.Path("/bundle/tools/__pycache__").glob("broken.*.pyc"))
try:
    open(deps / "planted.py", "w")
except PermissionError:
    print("ok")
"""


def as_invocation(sandbox: DockerSandbox, tag: str, script: str) -> str:
    """What ``script`` prints, run by the image's Python as the case's invocations run (uid
    10001, no network)."""
    out = sandbox.client.containers.run(
        tag,
        ["-c", script],
        entrypoint="/opt/gate-runner/bin/python",
        user="10001:10001",
        network_mode="none",
        remove=True,
    )
    return str(out.decode().strip())


def test_deps_install_apart_from_the_runner_root_owned_and_without_the_wheels(
    builds: Builds,
) -> None:
    sandbox = builds.sandbox()
    image = builds.spec("gate-e2e-demo==1.0", wheel=True)
    tools = image.context_dir / "bundle" / "tools"
    tools.mkdir()
    (tools / "calc.py").write_text("def add(a, b):\n    return a + b\n")
    (tools / "broken.py").write_text("def (:\n")  # its invocation reports it; the build goes on
    sandbox.build_test_image(image)
    assert as_invocation(sandbox, image.tag, CHECK) == "ok"
    # Only the bundle, the deps and the bundle's bytecode on top of the runner: the wheels
    # never made a layer.
    built = sandbox.client.images.get(image.tag).attrs["RootFS"]["Layers"]
    runner = sandbox.client.images.get(sandbox.runner_image()).attrs["RootFS"]["Layers"]
    assert built[: len(runner)] == runner and len(built) == len(runner) + 3
    assert sandbox.client.images.get(image.tag).attrs["Config"]["User"] == "10001:10001"


def test_the_base_source_decides_whether_a_present_base_image_is_used(
    docker_engine: None, tmp_path: Path
) -> None:
    """A base image present in the engine (as the deploy tier's python:3.11-slim stand-in
    is) is the runner's base under `auto`; under `debootstrap` it is never looked at, which
    is what the test suite and .ci/run pin (tests/conftest.py)."""
    from gate_service.config import BaseImageSource
    from gate_service.sandbox.docker.runner_image import DEBOOTSTRAP_TAG, RunnerImages

    client = docker.from_env()
    standin = f"gate-test-standin:{uuid.uuid4().hex[:12]}"
    client.images.get(DEBOOTSTRAP_TAG).tag(standin)  # any image will do as the present base
    try:

        def base(source: BaseImageSource) -> str:
            settings = Settings(
                data_dir=tmp_path / "data", base_image=standin, base_image_source=source
            )
            return RunnerImages(settings, client).base_image()

        assert base(BaseImageSource.auto) == standin
        assert base(BaseImageSource.debootstrap) == DEBOOTSTRAP_TAG
        assert Settings().base_image_source is BaseImageSource.debootstrap  # the tests' pin
    finally:
        client.images.remove(standin)
        client.close()


PLAN_CHECK = """
import json, os, stat
info = os.stat("/opt/gate-plan.json")
assert (info.st_uid, info.st_gid, stat.S_IMODE(info.st_mode)) == (0, 0, 0o644), info
plan = json.load(open("/opt/gate-plan.json"))
case = plan["suites"]["tests/calc.yaml"]["cases"]["adds"]
assert case["resolved"]["expected_result"] == "output.sum == 3", case
try:
    open("/opt/gate-plan.json", "a")
except PermissionError:
    print("ok")
"""


def test_the_image_build_writes_the_plan_root_owned_and_read_only_to_cases(
    builds: Builds,
) -> None:
    """The build prepares every case once (gate_runner/plan.py) into a file that the case's
    invocations (uid 10001) read and cannot change."""
    sandbox = builds.sandbox()
    image = builds.spec()
    files = {
        "agents/calc.yaml": AGENTS["agents/calc.yaml"],
        "tools/math_ops.py": AGENTS["tools/math_ops.py"],
        "tests/calc.yaml": "agent: calc\ntests:\n  - name: adds\n"
        '    payload: \'{"a": 1, "b": 2}\'\n    expected_result: output.sum == 3\n',
    }
    write(image.context_dir / "bundle", files)
    sandbox.build_test_image(image)
    assert as_invocation(sandbox, image.tag, PLAN_CHECK) == "ok"


PROBE_TOOL = """
import sys


def probe(payload: dict, context: dict) -> dict:
    # Spelled so that the plan does not see the project name the SDK.
    names = {"sdk": "con" + "nic", "pydantic": "pydantic", "yaml": "yaml", "asyncio": "asyncio"}
    return {key: name in sys.modules for key, name in names.items()}
"""


def test_a_case_container_runs_a_light_project_without_the_sdk(builds: Builds) -> None:
    """Through the engine, as the worker runs a case: the image's plan takes the light path
    (gate_runner/light.py), and neither the runner nor the invocation imports the SDK,
    pydantic, PyYAML or asyncio."""
    from gate_runner import case_env
    from gate_service.runner_contract import parse_runner_output
    from gate_service.worker.handler import runner_argv

    sandbox = builds.sandbox()
    image = builds.spec()
    files = {
        "agents/probe.yaml": 'version: "1.0"\nname: probe\ndescription: p\ntype: tool\n'
        "tool_name: checks.probe\n",
        "tools/checks.py": PROBE_TOOL,
        "tests/probe.yaml": "agent: probe\ntests:\n  - name: bare\n    payload: '{}'\n"
        "    expected_result: output.sdk == false and output.pydantic == false\n",
    }
    write(image.context_dir / "bundle", files)
    sandbox.build_test_image(image)
    assert as_invocation(sandbox, image.tag, LIGHT_CHECK) == "light"
    settings = Settings()
    nonce = uuid.uuid4().hex
    run = sandbox.run(
        image.tag,
        runner_argv(settings, "tests/probe.yaml", "bare"),
        stdin=case_env.encode({}, nonce),
        limits=case_limits(settings, 60),
        labels={},
    )
    result = parse_runner_output(
        run.stdout, nonce=nonce, suite="tests/probe.yaml", test_name="bare"
    )
    assert result.passed, result.failure_reason
    assert result.invocations[0].output == {
        "sdk": False,
        "pydantic": False,
        "yaml": False,
        "asyncio": False,
    }


LIGHT_CHECK = """
import json
plan = json.load(open("/opt/gate-plan.json"))
print("light" if plan["light"] and not plan["imports_sdk"] else plan.get("light_refused"))
"""


def test_a_finished_one_stage_build_leaves_only_the_test_images_own_steps(
    builds: Builds,
) -> None:
    # Its leftovers are not looked for (see DockerImageBuilder.build_test_image): every image
    # the build made must be the test image or one of its parents, which go with it.
    sandbox = builds.sandbox()
    image = builds.spec()
    sandbox.build_test_image(image)
    made = {
        str(i["Id"]): str(i.get("ParentId") or "")
        for i in sandbox.client.api.images(
            all=True, filters={"label": f"{BUILD_IMAGE_LABEL}={image.tag}"}
        )
    }
    chain, at = set(), str(sandbox.client.images.get(image.tag).id)
    while at:
        chain.add(at)
        at = str(sandbox.client.api.inspect_image(at).get("Parent") or "")
    assert made and set(made) <= chain
    sandbox.client.images.remove(image.tag)
    assert builds.left_by(sandbox, image.tag) == []  # the steps went with it
