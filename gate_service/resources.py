"""Where the service's non-Python files are: the Alembic migrations and the runner's image context.

In the source tree they sit at the top, beside the package (migrations/, runner_image/). A wheel
carries them inside it, as gate_service/migrations and gate_service/runner_image (setup.py maps
those two data packages onto the top-level directories), where importlib.resources finds them.
A source checkout or an editable install has no copy inside the package, so they are the
checkout's own directories. Both are real directories: Alembic and the Docker build need paths.
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

PACKAGE = "gate_service"
MIGRATIONS = "migrations"
RUNNER_IMAGE = "runner_image"


def bundled_dir(name: str) -> Path:
    """The directory `name` (MIGRATIONS or RUNNER_IMAGE): packaged, else the source tree's."""
    package = files(PACKAGE)
    if not isinstance(package, Path):
        raise RuntimeError(f"{PACKAGE} must be installed as files, not inside an archive")
    packaged = package / name
    if packaged.is_dir():
        return packaged
    checkout = package.parent / name
    if checkout.is_dir():
        return checkout
    raise RuntimeError(f"{name}/ is neither in {package} nor beside it: a broken installation")


def migrations_dir() -> Path:
    return bundled_dir(MIGRATIONS)


def runner_image_dir() -> Path:
    """The runner's build context: Dockerfile, requirements.txt and the gate_runner package."""
    return bundled_dir(RUNNER_IMAGE)
