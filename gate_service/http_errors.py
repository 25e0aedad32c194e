"""The API's exception handlers: every error answered in the one shape (errors.py)."""

from __future__ import annotations

import logging
from collections.abc import Callable

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from .errors import (
    REQUEST_ID_HEADER,
    REQUEST_ID_SCOPE_KEY,
    BadRequest,
    GateError,
    NotFound,
    error_body,
    new_request_id,
)

log = logging.getLogger(__name__)


# A request's error as an HTML page, or None when the request is not a page's (the results
# pages pass theirs: gate_service.ui.routes.error_page).
ErrorPages = Callable[[Request, GateError], Response | None]


def install_handlers(app: FastAPI, pages: ErrorPages | None = None) -> None:
    def page(request: Request, exc: GateError) -> Response | None:
        return pages(request, exc) if pages is not None else None

    @app.exception_handler(GateError)
    async def _gate_error(request: Request, exc: GateError) -> Response:
        shown = page(request, exc)
        if shown is not None:
            return shown
        return JSONResponse(
            error_body(type(exc).__name__, exc.detail, exc.problems),
            status_code=exc.status_code,
            headers=exc.headers,
        )

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> Response:
        problems = [
            {"location": ".".join(str(p) for p in e.get("loc", ())), "message": e.get("msg", "")}
            for e in exc.errors()
        ]
        detail = "; ".join(f"{p['location']}: {p['message']}" for p in problems)
        in_path = any(p["location"].startswith("path") for p in problems)
        shown = page(
            request, (NotFound if in_path else BadRequest)(f"not a valid address: {detail}")
        )
        if shown is not None:
            return shown
        if any(p["location"] == "body.bundle" for p in problems):
            detail += (
                " (expected multipart/form-data with a file field named 'bundle' holding the "
                "project as .tar.gz/.tgz or .zip)"
            )
        return JSONResponse(error_body("RequestInvalid", detail, problems), status_code=422)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> Response:
        error = GateError(str(exc.detail))
        error.status_code = exc.status_code
        shown = page(request, error)
        if shown is not None:
            return shown
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
