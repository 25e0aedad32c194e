"""Which packages and files the wheel holds; everything else is in pyproject.toml.

The service and the runner install together: the service uses the runner's expression checker
to refuse bad assertions before any build. The top-level migrations/ and runner_image/ (the
runner image's build context) ship inside the service as two data packages, so an installed
wheel finds them with importlib.resources (gate_service/resources.py); an editable install
reads the checkout's own directories.
"""

from setuptools import find_packages, setup

DATA_PACKAGES = {
    "gate_service.migrations": "migrations",
    "gate_service.runner_image": "runner_image",
}

setup(
    packages=[
        *find_packages(".", include=["gate_service", "gate_service.*"]),
        *find_packages("runner_image", include=["gate_runner", "gate_runner.*"]),
        *DATA_PACKAGES,
    ],
    package_dir={"gate_runner": "runner_image/gate_runner", **DATA_PACKAGES},
    package_data={
        "gate_service.ui": ["templates/*.html", "static/*"],
        "gate_service.migrations": ["alembic.ini", "script.py.mako", "versions/*.py"],
        "gate_service.runner_image": ["Dockerfile", "requirements.txt", "gate_runner/**/*.py"],
    },
)
