"""The gateway's one error shape: a wire ``GatewayError``, raised as an exception inside."""

from __future__ import annotations

from gate_runner.gateway_wire import ERROR_STATUS, ErrorKind, GatewayError


class Failure(Exception):
    """A call that ends in a ``GatewayError``; the channel answers it with its status."""

    def __init__(
        self,
        kind: ErrorKind,
        message: str,
        *,
        limit: str | None = None,
        allowed: float | None = None,
        used: float | None = None,
        secret: str | None = None,
        provider_status: int | None = None,
    ) -> None:
        super().__init__(message)
        # The project secret whose absence this is (resolve_route's), for the worker's check
        # of a gate's models before its cases run; not on the wire.
        self.secret = secret
        self.error = GatewayError(
            kind=kind,
            message=message,
            limit=limit,
            allowed=allowed,
            used=used,
            provider_status=provider_status,
        )
        self.attempts = 0  # tries made at the provider before it failed, for the record

    @property
    def status(self) -> int:
        return ERROR_STATUS[self.error.kind]


def first_line(text: str, limit: int = 300) -> str:
    """A library's message cut to its first line (never a traceback after it), at most
    ``limit`` characters: what a stored reason may quote of it."""
    return text.strip().split("\n", 1)[0].strip()[:limit]
