"""One error hierarchy, rendered everywhere as {"error", "detail", "problems"}.

Domain code raises these; it imports no HTTP code. The API renders them (http_errors.py):
each error's ``status_code`` and ``headers`` are what its answer carries.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, Field

# Where the request-id middleware (gate_service/middleware.py) leaves each request's id.
REQUEST_ID_SCOPE_KEY = "gate.request_id"
REQUEST_ID_HEADER = "X-Request-ID"


class GateError(Exception):
    """Base of every error the service reports on purpose.

    Args:
        detail: what went wrong, in a sentence a pipeline user can act on.
        problems: itemised findings (file, case, message), when there are several.
    """

    status_code = 500

    def __init__(
        self,
        detail: str,
        *,
        problems: list[dict[str, Any]] | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(detail)
        self.detail = detail
        self.problems = problems or []
        self.headers = headers or {}


class Unauthorized(GateError):
    """No token, or one that is unknown, expired or revoked."""

    status_code = 401

    def __init__(self, detail: str) -> None:
        super().__init__(detail, headers={"WWW-Authenticate": "Bearer"})


class Forbidden(GateError):
    """A valid token without the scope the route needs (in its own project)."""

    status_code = 403


class TooManyRequests(GateError):
    status_code = 429

    def __init__(self, detail: str, *, retry_after_s: int | None = None) -> None:
        headers = {"Retry-After": str(retry_after_s)} if retry_after_s is not None else None
        super().__init__(detail, headers=headers)


class ServiceUnavailable(GateError):
    status_code = 503

    def __init__(self, detail: str, *, retry_after_s: int = 5) -> None:
        super().__init__(detail, headers={"Retry-After": str(retry_after_s)})


class NotFound(GateError):
    status_code = 404


class Conflict(GateError):
    status_code = 409


class BadRequest(GateError):
    status_code = 400


class RequestInvalid(GateError):
    """The request is well-formed HTTP but misses or mangles a field."""

    status_code = 422


class RequestTimeout(GateError):
    """The client sent its request body too slowly; the connection is closed after the answer
    (the rest of the body is never read, so the connection cannot carry another request)."""

    status_code = 408

    def __init__(self, detail: str, *, problems: list[dict[str, Any]] | None = None) -> None:
        super().__init__(detail, problems=problems, headers={"Connection": "close"})


class PayloadTooLarge(GateError):
    status_code = 413


class UnsupportedMediaType(GateError):
    status_code = 415


class UnsafeArchive(GateError):
    status_code = 422


class SecretUnreadable(GateError):
    """A stored secret does not decrypt with this process's GATE_SECRETS_KEY.

    Only workers decrypt (no route returns a value), so this ends a gate `error` as an
    infrastructure error; the status code is there for completeness.
    """

    status_code = 503


class ErrorBody(BaseModel):
    """The one shape of every error answer."""

    error: str = Field(description="The kind of error, e.g. NotFound or RequestInvalid")
    detail: str = Field(description="What went wrong, in a sentence")
    problems: list[dict[str, Any]] = Field(
        default_factory=list, description="Itemised findings, when there are several"
    )


def error_responses(descriptions: Mapping[int, str]) -> dict[int | str, dict[str, Any]]:
    """OpenAPI `responses=` for these statuses, each in the error shape, plus the 500."""
    statuses = {**descriptions, 500: "The service failed; the answer quotes a request id"}
    return {
        code: {"model": ErrorBody, "description": text} for code, text in sorted(statuses.items())
    }


def new_request_id() -> str:
    return secrets.token_hex(8)


def _storable(value: Any) -> Any:
    """Text that UTF-8 can encode: a lone surrogate echoed from a request becomes \\udXXX."""
    if isinstance(value, str):
        return value.encode("utf-8", "backslashreplace").decode("utf-8")
    if isinstance(value, list):
        return [_storable(v) for v in value]
    if isinstance(value, dict):
        return {_storable(k): _storable(v) for k, v in value.items()}
    return value


def error_body(
    kind: str, detail: str, problems: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    return {"error": kind, "detail": _storable(detail), "problems": _storable(problems or [])}
