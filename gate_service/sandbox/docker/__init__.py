"""The Docker backend of the sandbox port: the only code that imports ``docker``.

One module per job: ``engine`` (the client, and engine failures as SandboxError), ``images``
(exists, list, remove), ``recipes`` (test-image recipes, build labels, the runner
digest), ``runner_image`` (the base and runner images), ``test_image`` (test-image builds and
their leftovers), ``cases`` (case containers: run, stdin handoff, wait, halt) and
``reaping``. The classes stack into the port's two sides and one ``DockerSandbox`` with both,
sharing one engine client.
"""

from __future__ import annotations

from .cases import CaseContainers
from .reaping import ContainerReaper
from .test_image import DockerImageBuilder


class DockerCaseRunner(CaseContainers, ContainerReaper):
    """The port's CaseRunner on Docker: case containers and their reaping."""


class DockerSandbox(DockerImageBuilder, DockerCaseRunner):
    """Builds the runner and test images and runs one hardened container per case."""


__all__ = ["DockerCaseRunner", "DockerImageBuilder", "DockerSandbox"]
