"""Query-string parameters: one parser, one error wording, for every route."""

from __future__ import annotations

from typing import Any

from .errors import BadRequest


def int_param(value: Any, name: str, *, default: int | None, lo: int, hi: int | None = None) -> int | None:
    """``value`` as an int in [lo, hi]; ``default`` when absent or empty; else BadRequest."""
    if value is None or value == "":
        return default
    try:
        n = int(value)
    except (TypeError, ValueError):
        raise BadRequest(f"{name} must be an integer") from None
    if n < lo or (hi is not None and n > hi):
        raise BadRequest(f"{name} must be between {lo} and {hi}" if hi is not None else f"{name} must be >= {lo}")
    return n
