"""Structured logging: JSON lines to files, readable lines on a terminal (structlog)."""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Any, TextIO

import structlog

_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}


def configure(level: str = "info", json_file: str | Path | None = None, console: TextIO | None = None) -> None:
    """Route structlog to a terminal renderer and, optionally, a JSON-lines file.

    Both sinks see the same event dict; the file gets every level, the console the chosen one.
    """
    console = console or sys.stderr
    shared: list[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    handlers: list[logging.Handler] = []
    term = logging.StreamHandler(console)
    term.setLevel(_LEVELS[level])
    term.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            processor=structlog.dev.ConsoleRenderer(colors=console.isatty()), foreign_pre_chain=shared
        )
    )
    handlers.append(term)
    if json_file is not None:
        Path(json_file).parent.mkdir(parents=True, exist_ok=True)
        file_handler = logging.FileHandler(json_file)
        file_handler.setFormatter(
            structlog.stdlib.ProcessorFormatter(processor=structlog.processors.JSONRenderer(), foreign_pre_chain=shared)
        )
        handlers.append(file_handler)
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    for handler in handlers:
        root.addHandler(handler)
    root.setLevel(logging.DEBUG if json_file is not None else _LEVELS[level])
    structlog.configure(
        processors=[*shared, structlog.stdlib.ProcessorFormatter.wrap_for_formatter],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=False,
    )


def get_logger(name: str, **context: Any) -> Any:
    """A bound structlog logger (context keys appear on every line)."""
    return structlog.get_logger(name).bind(**context)
