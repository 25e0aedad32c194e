"""One error hierarchy, rendered everywhere as {"error", "detail", "problems"}."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException


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


class PayloadTooLarge(GateError):
    status_code = 413


class UnsupportedMediaType(GateError):
    status_code = 415


class UnsafeArchive(GateError):
    status_code = 422


class SandboxError(GateError):
    """Docker failed underneath us: an infrastructure error, never the bundle's fault."""

    status_code = 502


def error_body(
    kind: str, detail: str, problems: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    return {"error": kind, "detail": detail, "problems": problems or []}


def install_handlers(app: FastAPI) -> None:
    @app.exception_handler(GateError)
    async def _gate_error(_: Request, exc: GateError) -> JSONResponse:
        return JSONResponse(
            error_body(type(exc).__name__, exc.detail, exc.problems),
            status_code=exc.status_code,
            headers=exc.headers,
        )

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        problems = [
            {"location": ".".join(str(p) for p in e.get("loc", ())), "message": e.get("msg", "")}
            for e in exc.errors()
        ]
        detail = "; ".join(f"{p['location']}: {p['message']}" for p in problems)
        if any(p["location"] == "body.bundle" for p in problems):
            detail += (
                " (expected multipart/form-data with a file field named 'bundle' holding the "
                "project as .tar.gz/.tgz or .zip)"
            )
        return JSONResponse(error_body("RequestInvalid", detail, problems), status_code=422)

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        return JSONResponse(error_body("HTTPError", str(exc.detail)), status_code=exc.status_code)
