"""Structured logs: `log_format=json` writes one JSON object per line (python-json-logger).

Fields bound with `bind()` (the executor binds thread_id, run_id, attempt and worker_id
for the run it executes) live in a contextvar, so they follow the run's asyncio task and
appear on every line it logs, including lines of libraries; `extra={...}` still wins.
"""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Iterator
from contextvars import ContextVar, Token
from typing import Any

from pythonjsonlogger.json import JsonFormatter

from shared.settings import Settings

_fields: ContextVar[dict[str, Any]] = ContextVar("threadrun_log_fields", default={})  # noqa: B039 - never mutated, always replaced

JSON_FORMAT = "%(asctime)s %(levelname)s %(name)s %(message)s"
RENAMED = {"asctime": "time", "levelname": "level", "name": "logger"}
SERVER_LOGGERS = ("gunicorn.error", "gunicorn.access")


def bind(**fields: Any) -> Token[dict[str, Any]]:
    """Add fields to every log line of the current context; `unbind(token)` restores."""
    return _fields.set({**_fields.get(), **fields})


def unbind(token: Token[dict[str, Any]]) -> None:
    """Undo one `bind`."""
    _fields.reset(token)


@contextlib.contextmanager
def bound(**fields: Any) -> Iterator[None]:
    """`bind` for the length of a block."""
    token = bind(**fields)
    try:
        yield
    finally:
        unbind(token)


def current() -> dict[str, Any]:
    """The fields bound in this context."""
    return dict(_fields.get())


class ContextFilter(logging.Filter):
    """Copies the bound fields onto each record (a record's own `extra` wins)."""

    def filter(self, record: logging.LogRecord) -> bool:
        for key, value in _fields.get().items():
            if not hasattr(record, key):
                setattr(record, key, value)
        return True


def json_formatter() -> logging.Formatter:
    """One JSON object per record: time, level, logger, message, then every extra field."""
    return JsonFormatter(JSON_FORMAT, rename_fields=RENAMED, json_ensure_ascii=False)


def configure(settings: Settings, level: int | str = logging.INFO) -> None:
    """Install the root handler for `log_format=json` (text mode leaves logging as it is,
    adding only the context filter to existing root handlers)."""
    root = logging.getLogger()
    if settings.log_format != "json":
        for handler in root.handlers:
            if not any(isinstance(f, ContextFilter) for f in handler.filters):
                handler.addFilter(ContextFilter())
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(json_formatter())
    handler.addFilter(ContextFilter())
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
    for name in SERVER_LOGGERS:
        for h in logging.getLogger(name).handlers:
            h.setFormatter(json_formatter())


def configure_celery(settings: Settings) -> None:
    """In json mode, take over Celery's logging set-up (a `setup_logging` receiver makes
    Celery leave the root logger to us)."""
    if settings.log_format != "json":
        return
    from celery import signals

    def _setup(loglevel: int | str | None = None, **_: Any) -> None:
        configure(settings, loglevel or logging.INFO)

    signals.setup_logging.connect(_setup, weak=False)
