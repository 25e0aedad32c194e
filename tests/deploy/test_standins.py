"""The stand-in builder never replaces an image it did not make, and knows its own."""

from __future__ import annotations

import subprocess
import tarfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.deploy.standins import STANDIN_LABEL, Standin, ensure_standins, status

pytestmark = pytest.mark.docker


def image_id(tag: str) -> str:
    argv = ["docker", "image", "inspect", "--format", "{{.Id}}", tag]
    return subprocess.run(argv, capture_output=True, text=True, check=True).stdout.strip()


@pytest.fixture
def tiny_image(docker_engine: None, tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """A tag for a one-file image made by `docker import`, and that image's tarball."""
    (tmp_path / "hello").write_text("hi\n")
    tarball = tmp_path / "rootfs.tar"
    with tarfile.open(tarball, "w") as tar:
        tar.add(tmp_path / "hello", arcname="hello")
    tag = f"gate-standin-probe:{uuid.uuid4().hex[:12]}"
    try:
        yield tag, tarball
    finally:
        subprocess.run(["docker", "rmi", "-f", tag], capture_output=True, check=False)


def test_a_real_image_of_that_name_is_left_alone(tiny_image: tuple[str, Path]) -> None:
    tag, tarball = tiny_image
    standin = Standin(tag=tag, packages=("python3",), changes=())
    assert status(standin) == "missing"
    subprocess.run(["docker", "import", str(tarball), tag], capture_output=True, check=True)
    before = image_id(tag)
    assert status(standin) == "foreign"
    ensure_standins((standin,))  # would need debootstrap and minutes if it built anything
    assert image_id(tag) == before


def test_our_label_with_the_recipe_digest_is_current(tiny_image: tuple[str, Path]) -> None:
    tag, tarball = tiny_image
    standin = Standin(tag=tag, packages=("python3",), changes=())
    label = f"LABEL {STANDIN_LABEL}={standin.digest()}"
    argv = ["docker", "import", "--change", label, str(tarball), tag]
    subprocess.run(argv, capture_output=True, check=True)
    assert status(standin) == "current"
    before = image_id(tag)
    ensure_standins((standin,))
    assert image_id(tag) == before
    other = Standin(tag=tag, packages=("python3", "python3-pip"), changes=())
    assert status(other) == "stale"
