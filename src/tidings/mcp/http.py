"""``/mcp``: the MCP tools over Streamable HTTP, inside the hub's FastAPI app.

``install(app, runtime)`` (called by ``api.app.create_app``) adds:

* a route at exactly ``/mcp`` whose ASGI endpoint authenticates EVERY request (POST, GET,
  DELETE) before the MCP layer sees it: ``Authorization: Bearer <agent token>``. A
  missing or unknown token is a 401, any other token (human, admin, bridge) a 403, both
  with a JSON-RPC error body the MCP SDK surfaces (``refusal``, D56). The agent then rides
  in the request scope (``scope["tidings.principal"]``), where the tools read it through
  the SDK's per-request context, so each tool call runs as the agent whose token that
  very request carried;
* a lifespan (``app.state.lifespans``) that runs a fresh ``StreamableHTTPSessionManager``
  for each run of the host app (the SDK's manager runs once per instance).

Sessions: the SDK binds a stateful session to the identity that opened it
(``scope["user"]``, set here to the agent), so another agent presenting that session id
gets the same 404 as an unknown session. Requests of the 2026-07-28 protocol are
single-exchange and authenticated the same way.

The SDK's DNS-rebinding Host/Origin check is off: it would refuse a hub bound to a
non-loopback name, and it guards unauthenticated local servers, while every request here
must carry a bearer token that a rebinding page cannot know.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
from mcp.server.auth.provider import AccessToken
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from ..errors import Forbidden, TidingsError
from ..http_edge import bearer, error_response
from ..hub.tokens import Principal, authenticate
from .server import build_server

PATH = "/mcp"
SCOPE_KEY = "tidings.principal"


def principal_of_request(ctx: Context) -> Principal:
    """The agent the ``/mcp`` endpoint authenticated for the request this call came in."""
    request = ctx.request_context.request
    who = request.scope.get(SCOPE_KEY) if isinstance(request, Request) else None
    if not isinstance(who, Principal):
        raise ToolError("this request was not authenticated [unauthorized]")
    return who


class _Manager:
    """The session manager of the current run of the host app (None outside a run)."""

    def __init__(self, server: MCPServer) -> None:
        self.server = server
        self.current: StreamableHTTPSessionManager | None = None

    @asynccontextmanager
    async def lifespan(self) -> AsyncIterator[None]:
        self.server.streamable_http_app(
            streamable_http_path=PATH,
            transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False),
        )
        manager = self.server.session_manager
        async with manager.run():
            self.current = manager
            try:
                yield
            finally:
                self.current = None


class McpEndpoint:
    """The ASGI endpoint at ``/mcp``: authenticate, then hand over to the SDK."""

    def __init__(self, runtime: Any, manager: _Manager) -> None:
        self.runtime = runtime
        self.manager = manager

    def _agent(self, request: Request) -> Principal:
        who = authenticate(self.runtime.store, bearer(request))
        if not who.is_agent or not who.account_id:
            raise Forbidden("the MCP endpoint needs an agent token", code="agent_only")
        return who

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        request = Request(scope, receive)
        try:
            who = await anyio.to_thread.run_sync(self._agent, request)
        except TidingsError as exc:
            response = await refusal(request, exc)
            if exc.status == 401:
                response.headers["WWW-Authenticate"] = 'Bearer realm="tidings"'
            await response(scope, receive, send)
            return
        manager = self.manager.current
        if manager is None:
            await error_response(503, "unavailable", "the MCP endpoint is not running")(scope, receive, send)
            return
        scope[SCOPE_KEY] = who
        scope["user"] = AuthenticatedUser(
            AccessToken(token="", client_id=who.account_id, subject=who.account_id, scopes=["agent"])
        )
        await manager.handle_request(scope, receive, send)


#: JSON-RPC error codes (the server-defined range) of a refused token: 401 and 403.
JSONRPC_UNAUTHORIZED = -32001
JSONRPC_FORBIDDEN = -32003


async def refusal(request: Request, exc: TidingsError) -> JSONResponse:
    """A refused token, in the one form an MCP client shows (D56): the HTTP status (401 or
    403) with a JSON-RPC error body answering the request's id (null when the body is not
    a request), ``message`` = the reason and its code, ``data`` = ``{"code", "status"}``
    (the API envelope's code). The SDK's client surfaces exactly this error to its caller
    instead of a bare "Server returned an error response"."""
    request_id = None
    if request.method == "POST":
        try:
            body = json.loads(await request.body())
            if isinstance(body, dict) and isinstance(body.get("id"), (str, int)) and not isinstance(body["id"], bool):
                request_id = body["id"]
        except ValueError:
            pass
    code = JSONRPC_UNAUTHORIZED if exc.status == 401 else JSONRPC_FORBIDDEN
    return JSONResponse(
        {"jsonrpc": "2.0", "id": request_id,
         "error": {"code": code, "message": f"{exc.message} [{exc.code}]", "data": {"code": exc.code, "status": exc.status}}},
        status_code=exc.status,
    )


def install(app: Any, runtime: Any) -> None:
    server = build_server(runtime, principal_of_request)
    manager = _Manager(server)
    app.state.mcp_server = server
    app.state.lifespans.append(manager.lifespan)
    app.router.routes.append(Route(PATH, endpoint=McpEndpoint(runtime, manager), include_in_schema=False))
