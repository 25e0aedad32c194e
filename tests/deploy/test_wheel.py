"""The built wheel works on its own: installed in a fresh venv from requirements.lock, it serves.

The wheel is built from a copy of the files packaging reads (what a Docker build context or an
sdist holds), installed with `pip install -c requirements.lock <wheel>` into a venv that sees
nothing of this checkout, and must then find its migrations and the runner's build context
inside itself, give the runner image the tag a checkout gives it, and pass a gate end to end.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from gate_service.client.api import GateClient
from gate_service.sandbox.docker.recipes import runner_digest
from tests.e2e.conftest import free_port, wait_ready
from tests.fixtures.auth import ADMIN_TOKEN
from tests.fixtures.projects import bundle_of, calculator_project

ROOT = Path(__file__).resolve().parents[2]
LOCK = ROOT / "requirements.lock"
# What packaging reads; nothing else of the checkout reaches the wheel.
SOURCES = ("pyproject.toml", "setup.py", "README.md", "gate_service", "runner_image", "migrations")
IGNORED = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
INSTALL_SECONDS = 900
IMAGES_SECONDS = 900  # a first run bootstraps the base image and builds the runner


def run(argv: list[str | Path], *, timeout: float, **kwargs: object) -> str:
    proc = subprocess.run(
        [str(a) for a in argv],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        **kwargs,  # type: ignore[call-overload]
    )
    assert proc.returncode == 0, (
        f"{argv} exited with {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    )
    return str(proc.stdout) + str(proc.stderr)


def clean_env(**settings: str) -> dict[str, str]:
    """This environment without GATE_ settings or a PYTHONPATH reaching into the checkout."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("GATE_") and k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")
    }
    env.update(settings)
    return env


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A snapshot of the packaged sources, so concurrent edits cannot race the comparisons."""
    src = tmp_path_factory.mktemp("src")
    for name in SOURCES:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, src / name, ignore=IGNORED)
        else:
            shutil.copy2(ROOT / name, src / name)
    return src


@pytest.fixture(scope="module")
def wheel(source: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--wheel-dir", out, source],
        timeout=INSTALL_SECONDS,
        cwd=out,
        env=clean_env(),
    )
    (built,) = out.glob("gate_service-*.whl")
    return built


@contextmanager
def open_dir(prefix: str) -> Iterator[Path]:
    """A directory others may traverse, outside pytest's private (0700) temporary root.

    Run as root, the embedded Postgres runs as the `postgres` user: it must reach its binaries
    inside the venv and its data directory, as it does in any system install. pytest resets
    its own root to 0700 on every session start, here or in a concurrent run.
    """
    path = Path(tempfile.mkdtemp(prefix=prefix))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def venv(wheel: Path) -> Iterator[Path]:
    """A fresh venv (no system site-packages) holding the wheel and its locked dependencies."""
    with open_dir("gate-wheel-venv-") as root:
        home = root / "venv"
        run([sys.executable, "-m", "venv", home], timeout=120)
        run(
            [home / "bin" / "python", "-m", "pip", "install", "-c", LOCK, wheel],
            timeout=INSTALL_SECONDS,
            cwd=root,
            env=clean_env(),
        )
        yield home


def tree(root: Path, pattern: str = "*") -> dict[str, bytes]:
    return {
        p.relative_to(root).as_posix(): p.read_bytes()
        for p in root.rglob(pattern)
        if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"
    }


def test_the_wheel_holds_the_service_the_runner_its_context_and_the_migrations(
    source: Path, wheel: Path
) -> None:
    with zipfile.ZipFile(wheel) as zf:
        held = {name: zf.read(name) for name in zf.namelist() if ".dist-info/" not in name}
    expected = {f"gate_service/{k}": v for k, v in tree(source / "gate_service", "*.py").items()}
    runner = tree(source / "runner_image" / "gate_runner", "*.py")
    expected |= {f"gate_runner/{k}": v for k, v in runner.items()}
    # The runner image's build context, byte for byte: Dockerfile, requirements, sources.
    context = {"Dockerfile", "requirements.txt", *(f"gate_runner/{k}" for k in runner)}
    expected |= {
        f"gate_service/runner_image/{k}": (source / "runner_image" / k).read_bytes()
        for k in context
    }
    expected |= {f"gate_service/migrations/{k}": v for k, v in tree(source / "migrations").items()}
    # The results pages' templates and assets, which the service serves itself.
    ui = source / "gate_service" / "ui"
    for folder in ("templates", "static"):
        expected |= {f"gate_service/ui/{folder}/{k}": v for k, v in tree(ui / folder).items()}
    assert sorted(set(expected) - set(held)) == [], "missing from the wheel"
    assert sorted(set(held) - set(expected)) == [], "unexpected in the wheel"
    assert [k for k in expected if held[k] != expected[k]] == []


def installed(venv: Path) -> dict[str, str]:
    """What the venv's interpreter imports and resolves, run away from the checkout."""
    script = """if True:
        import json, gate_runner, gate_service
        from gate_service.config import Settings
        from gate_service.resources import migrations_dir
        from gate_service.sandbox.docker.recipes import runner_digest
        context = Settings().runner_source_dir
        print(json.dumps({
            "gate_service": gate_service.__file__,
            "gate_runner": gate_runner.__file__,
            "migrations": str(migrations_dir()),
            "context": str(context),
            "digest": runner_digest(context, "some-base:1"),
        }))
    """
    out = run(
        [venv / "bin" / "python", "-I", "-c", script],
        timeout=120,
        cwd=venv,
        env=clean_env(),
    )
    answer: dict[str, str] = json.loads(out.strip().splitlines()[-1])
    return answer


def test_the_installed_wheel_finds_its_files_inside_itself(source: Path, venv: Path) -> None:
    found = installed(venv)
    site = (venv / "lib").resolve()
    for key in ("gate_service", "gate_runner", "migrations", "context"):
        assert Path(found[key]).resolve().is_relative_to(site), (key, found[key])
        assert not Path(found[key]).resolve().is_relative_to(ROOT), (key, found[key])
    package = Path(found["gate_service"]).parent
    assert Path(found["migrations"]) == package / "migrations"
    assert Path(found["context"]) == package / "runner_image"
    migrations = Path(found["migrations"])
    assert sorted(p.name for p in (migrations / "versions").glob("*.py")) == sorted(
        p.name for p in (source / "migrations" / "versions").glob("*.py")
    )
    assert (migrations / "env.py").read_bytes() == (source / "migrations" / "env.py").read_bytes()
    context = Path(found["context"])
    assert (context / "Dockerfile").read_bytes() == (
        source / "runner_image" / "Dockerfile"
    ).read_bytes()
    # Same bytes, same runner image tag, whether the service runs from a wheel or a checkout.
    assert found["digest"] == runner_digest(source / "runner_image", "some-base:1")


@pytest.mark.docker
def test_the_installed_wheel_builds_its_images_and_passes_a_gate(
    docker_engine: None, venv: Path, tmp_path: Path
) -> None:
    with open_dir("gate-wheel-data-") as data_dir:
        serve_a_gate(venv / "bin" / "gate", data_dir, tmp_path)


def serve_a_gate(gate: Path, data_dir: Path, tmp_path: Path) -> None:
    settings = {
        "GATE_DATA_DIR": str(data_dir),
        "GATE_BOOTSTRAP_TOKEN": ADMIN_TOKEN,
    }
    out = run([gate, "images"], timeout=IMAGES_SECONDS, cwd=data_dir, env=clean_env(**settings))
    assert "gate-runner:" in out

    port = free_port()
    log_path = data_dir / "serve.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [str(gate), "serve"],
            cwd=data_dir,
            env=clean_env(**settings, GATE_PORT=str(port)),
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url, proc, log_path)
        client = GateClient(url, token=ADMIN_TOKEN)
        try:
            submitted = client.submit(bundle_of(calculator_project(tmp_path / "p", failing=False)))
            verdict = client.wait(submitted["id"], timeout_s=600)
        finally:
            client.close()
        assert (verdict["status"], verdict["phase"]) == ("passed", "done"), verdict
        assert verdict["passed_cases"] == verdict["total_cases"] == 4
        # The results pages render from the wheel's own templates and assets.
        assert verdict["html_url"] == f"{url}/ui/gates/{submitted['id']}"
        form = httpx.get(verdict["html_url"], follow_redirects=True, timeout=30)
        assert form.status_code == 200 and 'name="token"' in form.text, form.text[:500]
        assert httpx.get(f"{url}/ui/static/gate.css", timeout=30).status_code == 200
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            code = proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            pytest.fail(f"`gate serve` ignored SIGTERM:\n{log_path.read_text()[-3000:]}")
    # uvicorn shuts down gracefully, then re-raises the signal: the conventional exit status.
    log_text = log_path.read_text()
    assert code in (0, -signal.SIGTERM), log_text[-3000:]
    assert "Application shutdown complete" in log_text, log_text[-3000:]
