"""The engine's images as the port sees them: whether one exists, the inventory garbage
collection reads (each image's own bytes, parent and containers), and a removal that is
never forced."""

from __future__ import annotations

import logging

import docker.errors

from ..port import ImageInfo, SandboxError
from .engine import DOCKER_ERRORS, DockerEngine, docker_errors

log = logging.getLogger(__name__)


class DockerImages(DockerEngine):
    """Looks up, lists and removes images."""

    def image_exists(self, tag: str) -> bool:
        try:
            self.client.images.get(tag)
        except docker.errors.ImageNotFound:
            return False
        except DOCKER_ERRORS as exc:
            raise SandboxError(f"inspecting image {tag} failed: {exc}") from None
        return True

    def list_images(self) -> list[ImageInfo]:
        """Every image with its own bytes and container count (the engine's disk usage)."""
        with docker_errors("listing images"):
            usage = self.client.df()
        images: list[ImageInfo] = []
        for item in usage.get("Images") or []:
            size = int(item.get("Size") or 0)
            shared = int(item.get("SharedSize") or 0)
            images.append(
                ImageInfo(
                    id=str(item.get("Id") or ""),
                    tags=tuple(t for t in item.get("RepoTags") or () if t != "<none>:<none>"),
                    labels=dict(item.get("Labels") or {}),
                    created=float(item.get("Created") or 0),
                    unique_bytes=max(0, size - max(0, shared)),
                    parent_id=str(item.get("ParentId") or ""),
                    containers=max(0, int(item.get("Containers") or 0)),
                )
            )
        return images

    def remove_image(self, ref: str) -> bool:
        try:
            # Never forced: the engine refuses while a container (running or not) uses it.
            self.client.images.remove(ref, force=False, noprune=False)
        except docker.errors.ImageNotFound:
            return False
        except docker.errors.APIError as exc:
            if exc.status_code == 409:  # conflict: in use by a container
                log.info("image %s is in use; kept (%s)", ref, exc.explanation)
                return False
            raise SandboxError(f"removing image {ref} failed: {exc}") from None
        except DOCKER_ERRORS as exc:
            raise SandboxError(f"removing image {ref} failed: {exc}") from None
        return True
