"""What the HTTP API and the MCP endpoint share at the edge: the one JSON error envelope
and the bearer-token header rule. Neither edge imports the other; both import this."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse

from .errors import Unauthorized


def error_response(status: int, code: str, message: str) -> JSONResponse:
    """The one error envelope: ``{"error": {"code", "message"}}``."""
    return JSONResponse({"error": {"code": code, "message": message}}, status_code=status)


def bearer(request: Request) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header (None without the header);
    any other form of the header is a 401 ``bad_token``."""
    header = request.headers.get("authorization")
    if not header:
        return None
    scheme, _, value = header.partition(" ")
    if scheme.lower() != "bearer" or not value.strip():
        raise Unauthorized("Authorization must be 'Bearer <token>'", code="bad_token")
    return value.strip()
