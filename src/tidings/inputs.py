"""What any input may hold before it reaches a handler or the store: one set of rules.

Both databases must accept whatever passes here, and they must agree: PostgreSQL text
refuses NUL and lone surrogates, SQLite stores both; PostgreSQL BIGINT and SQLite INTEGER
both stop at 2^63 - 1. So, for every request body (except bridge frames, which keep their
codec rules), every query parameter, every path id and every MCP tool argument:

* JSON bodies are strict UTF-8, nested at most ``MAX_DEPTH`` deep, with no NaN/Infinity;
* no string (key or value) holds NUL or a lone surrogate;
* no integer lies outside the signed 64-bit range.

A breach is a ``BadRequest`` naming where it is, never a 500.
"""

from __future__ import annotations

import json
from typing import Any

from .errors import BadRequest

MAX_DEPTH = 64
INT64_MAX = 2**63 - 1
INT64_MIN = -(2**63)


def _no_constants(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def parse_json(raw: bytes, *, max_depth: int = MAX_DEPTH) -> Any:
    """Decode ``raw`` as strict UTF-8 JSON nested at most ``max_depth`` deep."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadRequest(f"the body is not valid UTF-8 (byte {exc.start})", code="bad_json") from None
    depth = _bracket_depth(text)
    if depth > max_depth:
        raise BadRequest(f"malformed JSON: nested deeper than {max_depth}", code="bad_json")
    try:
        return json.loads(text, parse_constant=_no_constants)
    except ValueError as exc:
        raise BadRequest(f"malformed JSON: {exc}", code="bad_json") from None
    except RecursionError:  # pragma: no cover - the depth scan above stops this first
        raise BadRequest("malformed JSON: nested too deeply", code="bad_json") from None


def _bracket_depth(text: str) -> int:
    """The deepest ``[``/``{`` nesting of ``text``, brackets inside strings not counted."""
    depth = deepest = 0
    in_string = escaped = False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            if depth > deepest:
                deepest = depth
        elif ch in "]}":
            depth -= 1
    return deepest


def text_problem(value: str) -> str | None:
    """Why ``value`` cannot be stored alike on both backends, or None."""
    if "\x00" in value:
        return "must not contain NUL (\\u0000)"
    if not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return "is not valid Unicode (lone surrogate)"
    return None


def check_text(value: str, where: str) -> str:
    problem = text_problem(value)
    if problem:
        raise BadRequest(f"{where} {problem}", code="bad_text")
    return value


def check_value(value: Any, where: str = "body") -> None:
    """Walk a decoded JSON value (iteratively); raise BadRequest at the first breach."""
    stack: list[tuple[Any, str]] = [(value, where)]
    while stack:
        item, at = stack.pop()
        if isinstance(item, str):
            check_text(item, at)
        elif isinstance(item, bool) or item is None or isinstance(item, float):
            continue
        elif isinstance(item, int):
            if not INT64_MIN <= item <= INT64_MAX:
                raise BadRequest(f"{at} is out of range (a signed 64-bit integer)", code="bad_number")
        elif isinstance(item, dict):
            for key, sub in item.items():
                if isinstance(key, str):
                    check_text(key, f"{at} key")
                stack.append((sub, f"{at}.{key}" if isinstance(key, str) and not text_problem(key) else at))
        elif isinstance(item, (list, tuple)):
            for i, sub in enumerate(item):
                stack.append((sub, f"{at}[{i}]"))


def json_body(raw: bytes) -> Any:
    """The one request-body path: parsed under ``parse_json`` and checked by ``check_value``."""
    value = parse_json(raw)
    check_value(value)
    return value
