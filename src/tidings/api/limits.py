"""A request-size limit enforced on the raw ASGI stream, before anything parses the body.

The body is read up front, at most ``max_body`` bytes of it: a declared ``Content-Length``
over the limit, or a chunked body that grows past it, is answered 413 with the standard
error envelope, and the application never runs. Otherwise the app sees the buffered body,
then the original ``receive`` (so a streaming response still learns of a disconnect).
"""

from __future__ import annotations

import json
import re

DEFAULT_MAX_BODY = 1024 * 1024  # 1 MiB
# Attachment uploads stream to the blob store and enforce their own (larger) limit.
STREAMED_UPLOAD = re.compile(r"^/api/v1/bridges/[^/]+/attachments/[^/]+$")


class BodyLimit:
    def __init__(self, app, max_body: int = DEFAULT_MAX_BODY) -> None:
        self.app = app
        self.max_body = max_body

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        if scope.get("method") == "PUT" and STREAMED_UPLOAD.match(scope.get("path", "")):
            return await self.app(scope, receive, send)  # streamed, under its own limit
        limit = self.max_body
        for name, value in scope.get("headers", []):
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    return await _reply(send, 400, "bad_request", "Content-Length is not a number")
                if declared > limit:
                    return await _reply(send, 413, "too_large", f"request body is larger than {limit} bytes")
        if scope.get("method") in ("GET", "HEAD", "OPTIONS"):
            return await self.app(scope, receive, send)
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body = message.get("body", b"")
            size += len(body)
            if size > limit:
                return await _reply(send, 413, "too_large", f"request body is larger than {limit} bytes")
            chunks.append(body)
            if not message.get("more_body", False):
                break
        buffered = {"type": "http.request", "body": b"".join(chunks), "more_body": False}
        delivered = False

        async def replay():
            nonlocal delivered
            if not delivered:
                delivered = True
                return buffered
            return await receive()

        await self.app(scope, replay, send)


async def _reply(send, status: int, code: str, message: str) -> None:
    body = json.dumps({"error": {"code": code, "message": message}}).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": body})
