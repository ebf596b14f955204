"""The FastAPI application: error envelope, size limit, routers.

Every error leaves as ``{"error": {"code", "message"}}`` with a 4xx status for anything the
caller did wrong. An unexpected exception is logged with the request id and answered 500
with a generic message (never the exception text, which could leak data).
"""

from __future__ import annotations

import uuid
from contextlib import AsyncExitStack, asynccontextmanager

import structlog
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..errors import TidingsError
from ..http_edge import error_response
from ..mcp import http as mcp_http
from ..runtime import Runtime
from . import (
    admin_routes,
    attachments,
    bridges,
    conversations,
    docs,
    links,
    metrics_route,
    outbox,
    pins_asks,
    routes,
    search,
    sessions,
    web,
)
from .guard import InputGuard
from .limits import DEFAULT_MAX_BODY, BodyLimit

log = structlog.get_logger("tidings.api")

_STATUS_CODES = {400: "bad_request", 401: "unauthorized", 403: "forbidden", 404: "not_found",
                 405: "method_not_allowed", 409: "conflict", 413: "too_large", 415: "unsupported_media_type",
                 422: "bad_request"}


def create_app(runtime: Runtime, *, max_body: int = DEFAULT_MAX_BODY, manage_runtime: bool = False) -> FastAPI:
    """Build the app over ``runtime``; with ``manage_runtime`` the app starts and stops it."""

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        if manage_runtime:
            runtime.start()
        try:
            async with _extra_lifespans(app):
                yield
        finally:
            if manage_runtime:
                runtime.stop()

    app = FastAPI(title="Tidings", version="0.1.0", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.runtime = runtime
    app.state.lifespans = []

    @app.exception_handler(TidingsError)
    async def _domain_error(request: Request, exc: TidingsError):
        return error_response(exc.status, exc.code, exc.message)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError):
        first = exc.errors()[0] if exc.errors() else {}
        where = ".".join(str(p) for p in first.get("loc", ()) if p != "body")
        message = f"{where}: {first.get('msg', 'invalid input')}" if where else first.get("msg", "invalid input")
        return error_response(400, "bad_request", message)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException):
        code = _STATUS_CODES.get(exc.status_code, "error")
        return error_response(exc.status_code, code, str(exc.detail))

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception):
        request_id = request.headers.get("x-request-id") or uuid.uuid4().hex[:12]
        log.error("unhandled error", path=request.url.path, request_id=request_id, exc_info=exc)
        return error_response(500, "internal", f"internal error (request id {request_id})")

    app.include_router(routes.router)
    for install in (sessions.install, bridges.install, conversations.install, links.install, outbox.install,
                    pins_asks.install, web.install, docs.install, mcp_http.install, metrics_route.install,
                    admin_routes.install, search.install, attachments.install):
        install(app, runtime)
    app.add_middleware(InputGuard)  # inside BodyLimit: sees the bounded, buffered body
    app.add_middleware(BodyLimit, max_body=max_body)
    return app


@asynccontextmanager
async def _extra_lifespans(app: FastAPI):
    """Enter the lifespans extensions registered (the MCP session manager needs one)."""
    async with AsyncExitStack() as stack:
        for factory in app.state.lifespans:
            await stack.enter_async_context(factory())
        yield
