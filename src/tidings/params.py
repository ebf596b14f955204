"""Query-string parameters: one parser, one error wording, for every route."""

from __future__ import annotations

from typing import Any

from .errors import BadRequest
from .inputs import INT64_MAX


def int_param(value: Any, name: str, *, default: int | None, lo: int, hi: int | None = None) -> int | None:
    """``value`` as an int in [lo, hi]; ``default`` when absent or empty; else BadRequest.
    Without ``hi`` the bound is what both databases store (a signed 64-bit integer)."""
    if value is None or value == "":
        return default
    try:
        n = int(value)
    except (TypeError, ValueError):
        raise BadRequest(f"{name} must be an integer") from None
    if n < lo or n > (INT64_MAX if hi is None else hi):
        raise BadRequest(f"{name} must be between {lo} and {INT64_MAX if hi is None else hi}")
    return n
