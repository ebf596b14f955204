"""Structured logs (structlog): JSON lines when stderr is not a terminal, readable otherwise.

Every engine binds the ids it works on (``message_id``, ``inbox_id``, ``agent_id``,
``session_id``, ``bridge_id``) so one grep follows one object through the system.
"""

from __future__ import annotations

import logging
import os
import sys

import structlog

_configured = False
_process_fields: dict[str, str] = {}


def bind_process(**fields: str) -> None:
    """Fields every log line of this process carries from now on (a cluster node's id)."""
    _process_fields.update(fields)


def _add_process_fields(logger: object, method: str, event: dict) -> dict:
    for key, value in _process_fields.items():
        event.setdefault(key, value)
    return event


def configure(level: str | None = None, json: bool | None = None) -> None:
    global _configured
    if _configured:
        return
    _configured = True
    level_name = (level or os.environ.get("TIDINGS_LOG_LEVEL", "INFO")).upper()
    use_json = (not sys.stderr.isatty()) if json is None else json
    renderer = structlog.processors.JSONRenderer() if use_json else structlog.dev.ConsoleRenderer(colors=False)
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            _add_process_fields,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(getattr(logging, level_name, logging.INFO)),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=True,
    )
