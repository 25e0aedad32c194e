"""The API's exception handlers: every error answered in the one shape (errors.py)."""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from .errors import REQUEST_ID_HEADER, REQUEST_ID_SCOPE_KEY, GateError, error_body, new_request_id

log = logging.getLogger(__name__)


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

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        """Anything else: no stack, SQL, host or path in the answer; the log has them."""
        request_id = request.scope.get(REQUEST_ID_SCOPE_KEY) or new_request_id()
        log.error(
            "request %s failed: %s %s",
            request_id,
            request.method,
            request.url.path,
            exc_info=exc,
        )
        return JSONResponse(
            error_body("InternalError", f"the service failed; quote request id {request_id}"),
            status_code=500,
            headers={REQUEST_ID_HEADER: request_id},
        )
