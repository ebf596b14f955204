"""The input guard: every request's path, query string and JSON body meet ``tidings.inputs``
before any route runs, so a route added later is covered without doing anything.

* path and query parameters: no NUL, no lone surrogate (400 ``bad_text``);
* a JSON body (``application/json``, ``*+json`` or no content type) on any route:
  ``inputs.json_body`` (strict UTF-8, bounded depth, no NUL or lone surrogate in any
  string, integers within 64 bits);
* ``POST /api/v1/bridges/{id}/frames`` keeps its codec rules: only the depth and UTF-8
  checks apply (frames may carry anything their codec accepts; the inbox stores it safely);
* ``/mcp`` gets the depth and UTF-8 checks here; its tool arguments are checked by the MCP
  layer, which answers a tool error naming the argument.

It runs inside ``BodyLimit`` (the body is already bounded and buffered) and answers in the
one error envelope.
"""

from __future__ import annotations

import json
import re
from urllib.parse import parse_qsl

from .. import inputs
from ..errors import BadRequest

# Raw bytes, never JSON: a bridge's attachment upload (streamed, checked by its hash).
_BYTE_BODIES = re.compile(r"^/api/v1/bridges/[^/]+/attachments/[^/]+$")
_CODEC_BODIES = re.compile(r"^/api/v1/bridges/[^/]+/frames/?$")
_SHAPE_ONLY = re.compile(r"^/mcp(/.*)?$")


def _is_json(headers: list[tuple[bytes, bytes]]) -> bool:
    for name, value in headers:
        if name == b"content-type":
            media = value.split(b";", 1)[0].strip().lower()
            return media == b"application/json" or media.endswith(b"+json")
    return True


class InputGuard:
    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        try:
            inputs.check_text(scope.get("path", ""), "the path")
            query = scope.get("query_string", b"").decode("latin-1")
            for key, value in parse_qsl(query, keep_blank_values=True, errors="replace"):
                inputs.check_text(key, "a query parameter name")
                inputs.check_text(value, f"query parameter {key}")
        except BadRequest as exc:
            return await _reply(send, exc)
        if (scope.get("method") not in ("POST", "PUT", "PATCH", "DELETE") or not _is_json(scope.get("headers", []))
                or _BYTE_BODIES.match(scope.get("path", ""))):
            return await self.app(scope, receive, send)
        chunks = []
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                break
        raw = b"".join(chunks)
        path = scope.get("path", "")
        if raw:
            try:
                if _CODEC_BODIES.match(path) or _SHAPE_ONLY.match(path):
                    inputs.parse_json(raw)
                else:
                    inputs.json_body(raw)
            except BadRequest as exc:
                return await _reply(send, exc)
        delivered = False

        async def replay():
            nonlocal delivered
            if not delivered:
                delivered = True
                return {"type": "http.request", "body": raw, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


async def _reply(send, exc: BadRequest) -> None:
    body = json.dumps({"error": {"code": exc.code, "message": exc.message}}).encode()
    await send(
        {
            "type": "http.response.start",
            "status": exc.status,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": body})
