"""Logging: GATE_LOG_FORMAT=text (one human line) or json (one JSON object per line).

Workers say what they work on through context variables, which every record then carries:
``gate_id`` and ``worker`` around a job (worker/loop.py), ``case_id`` and ``case`` around a
case (worker/handler.py, in the case's own copy of the context). Threads do not inherit a
context, so a worker thread binds its own and each case task runs in a copy.
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar, Token
from datetime import UTC, datetime
from typing import IO, Any

from .config import LogFormat, Settings

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
CONTEXT_FIELDS = ("gate_id", "case_id", "case", "worker")
_VARS: dict[str, ContextVar[str | None]] = {
    name: ContextVar(f"gate_log_{name}", default=None) for name in CONTEXT_FIELDS
}


def _check(fields: dict[str, object]) -> None:
    unknown = set(fields) - set(_VARS)
    if unknown:
        raise ValueError(f"not a log context field: {', '.join(sorted(unknown))}")


def bind_log_context(**fields: object) -> None:
    """Set fields for the rest of the current context (a thread's, or a task's copy)."""
    _check(fields)
    for name, value in fields.items():
        _VARS[name].set(None if value is None else str(value))


@contextmanager
def log_context(**fields: object) -> Iterator[None]:
    """Set fields for the block, then restore what they were."""
    _check(fields)
    tokens: list[tuple[ContextVar[str | None], Token[str | None]]] = [
        (_VARS[name], _VARS[name].set(None if value is None else str(value)))
        for name, value in fields.items()
    ]
    try:
        yield
    finally:
        for var, token in reversed(tokens):
            var.reset(token)


def current_log_context() -> dict[str, str]:
    return {name: value for name, var in _VARS.items() if (value := var.get()) is not None}


class ContextFilter(logging.Filter):
    """Copies the context fields onto each record (``extra=`` given by the caller wins)."""

    def filter(self, record: logging.LogRecord) -> bool:
        for name, value in current_log_context().items():
            if not hasattr(record, name):
                setattr(record, name, value)
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, the context fields, and the
    traceback (as one string field) when there is one."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for name in CONTEXT_FIELDS:
            value = getattr(record, name, None)
            if value is not None:
                entry[name] = str(value)
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            entry["exception"] = record.exc_text
        if record.stack_info:
            entry["stack"] = self.formatStack(record.stack_info)
        # json.dumps escapes newlines inside strings, so a record is always one line.
        return json.dumps(entry, ensure_ascii=False, default=str)


def make_handler(log_format: LogFormat, stream: IO[str] | None = None) -> logging.Handler:
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.addFilter(ContextFilter())
    if log_format == LogFormat.json:
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter(TEXT_FORMAT))
    return handler


def configure_logging(settings: Settings) -> None:
    """The root logger writes GATE_LOG_FORMAT to stderr (replacing earlier handlers)."""
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(make_handler(settings.log_format))
    root.setLevel(logging.INFO)
    logging.getLogger("httpx").setLevel(logging.WARNING)


def uvicorn_log_config(settings: Settings) -> dict[str, Any] | None:
    """uvicorn's own logging setup for text; none for json, so its records reach the root
    logger's JSON handler instead of uvicorn's text handlers."""
    if settings.log_format == LogFormat.json:
        return None
    from uvicorn.config import LOGGING_CONFIG

    return dict(LOGGING_CONFIG)
