"""Fixtures the unit tests of `gate submit` share."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import pytest

from gate_service.client import api


@pytest.fixture
def use_api(monkeypatch: pytest.MonkeyPatch) -> Callable[[Callable[..., httpx.Response]], None]:
    """The CLI's client answered by ``handler`` (an httpx MockTransport handler)."""
    real = api.GateClient

    def install(handler: Callable[..., httpx.Response]) -> None:
        class Scripted(real):  # type: ignore[misc, valid-type]
            def __init__(self, base_url: str, **kwargs: Any) -> None:
                super().__init__(base_url, transport=httpx.MockTransport(handler), **kwargs)

        monkeypatch.setattr(api, "GateClient", Scripted)

    return install
