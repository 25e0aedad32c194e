"""The gateway's HTTP clients, which refuse every request (each redirect hop included) to an
address a project may not point the worker at (endpoints.refused_address: link-local,
cloud metadata), checked as the request is sent.

A project chooses its endpoints (model routes, ``*_API_BASE`` secrets, its egress allowlist),
so an endpoint may answer with a redirect to cloud metadata; the check at the call's start
sees only the first host. LiteLLM's OpenAI client and the gateway's own clients send through
``GuardedTransport`` and follow no redirect on their own.
"""

from __future__ import annotations

from typing import Any

import httpx

from ..endpoints import refused_address


class RefusedAddress(httpx.ConnectError):
    """A request to an address the gateway does not call: a connection error to the client
    (no retry can reach it either)."""


class GuardedTransport(httpx.HTTPTransport):
    def handle_request(self, request: httpx.Request) -> httpx.Response:
        problem = refused_address(str(request.url))
        if problem is not None:
            raise RefusedAddress(problem, request=request)
        return super().handle_request(request)


def guarded_client(**kwargs: Any) -> httpx.Client:
    """An httpx client whose every request goes through GuardedTransport, following no
    redirect by itself."""
    return httpx.Client(transport=GuardedTransport(), follow_redirects=False, **kwargs)
