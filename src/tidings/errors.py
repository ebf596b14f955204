"""Domain errors. Each maps to one HTTP status and one error code in the API envelope.

Engines and the hub raise these; the HTTP edge turns them into
``{"error": {"code", "message"}}`` and never into a 500.
"""

from __future__ import annotations


class TidingsError(Exception):
    status = 400
    code = "bad_request"

    def __init__(self, message: str, *, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        if code:
            self.code = code


class BadRequest(TidingsError):
    status = 400
    code = "bad_request"


class Unauthorized(TidingsError):
    status = 401
    code = "unauthorized"


class Forbidden(TidingsError):
    status = 403
    code = "forbidden"


class NotFound(TidingsError):
    status = 404
    code = "not_found"


class Conflict(TidingsError):
    status = 409
    code = "conflict"


class TooLarge(TidingsError):
    status = 413
    code = "too_large"
