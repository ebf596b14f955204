"""``tidings mcp --token T --url URL``: the MCP tools over stdio, in front of a running hub.

An agent's MCP client spawns a stdio server; this one holds no store. It opens one
Streamable HTTP connection to the hub's ``/mcp`` with the agent's token and forwards
``tools/list`` and ``tools/call`` as they come, so the tools, their schemas, their
answers and their errors are the hub's own (one implementation, ``server.py``). A post
therefore goes through the hub's bus like any ``/mcp`` post: its mentions are routed at
once, where ``--db`` mode leaves them to the hub's recovery scan (D29, D40).

Before serving it checks, and exits 1 with a one-line reason on stderr when one fails:
the hub answers at ``URL``, and it takes the token as an agent's (the hub's own check,
before its MCP layer). The token is checked again by the hub on every call.

Logs go to stderr (stdout is the protocol), at ``TIDINGS_LOG_LEVEL`` (default WARNING).
"""

from __future__ import annotations

import os
import sys
from typing import Any

import anyio
import httpx

from .. import logs

PREFLIGHT = {"jsonrpc": "2.0", "id": 0, "method": "ping", "params": {}}


class StartupError(Exception):
    """A reason not to serve, printed as one line on stderr."""


def mcp_url(url: str) -> str:
    return url.rstrip("/") + "/mcp"


def preflight(url: str, token: str, timeout: float = 10.0) -> None:
    """Fail fast, before any MCP traffic, on an unreachable hub or a token it refuses.

    The hub authenticates ``/mcp`` requests before its MCP layer: a 401 or 403 carries a
    JSON-RPC error whose message names the reason (D56). Any other answer means the hub
    took the token.
    """
    try:
        r = httpx.post(mcp_url(url), json=PREFLIGHT, timeout=timeout, headers={
            "Authorization": f"Bearer {token}", "Accept": "application/json, text/event-stream",
        })
    except httpx.HTTPError as exc:
        raise StartupError(f"cannot reach the hub at {url!r}: {type(exc).__name__}: {exc}") from None
    if r.status_code in (401, 403):
        try:
            reason = str(r.json()["error"]["message"])
        except Exception:  # noqa: BLE001 - not our hub's error shape
            reason = f"HTTP {r.status_code}"
        raise StartupError(f"the hub at {url!r} refused the token: {reason}")
    if r.status_code == 404:
        raise StartupError(f"no MCP endpoint at {mcp_url(url)!r} (is this a Tidings hub?)")


async def serve(url: str, token: str) -> None:
    """Forward stdio MCP requests to the hub's ``/mcp`` until stdin closes."""
    import httpx2
    import mcp_types as types
    from mcp.client.streamable_http import streamable_http_client
    from mcp.server.lowlevel import Server
    from mcp.server.stdio import stdio_server

    from mcp import Client

    headers = {"Authorization": f"Bearer {token}"}
    async with httpx2.AsyncClient(headers=headers, timeout=60.0) as http:
        async with Client(streamable_http_client(mcp_url(url), http_client=http)) as upstream:

            async def list_tools(ctx: Any, params: types.PaginatedRequestParams | None) -> types.ListToolsResult:
                return await upstream.list_tools(cursor=params.cursor if params else None)

            async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
                return await upstream.call_tool(params.name, params.arguments or {})

            info = upstream.server_info
            server = Server(
                info.name if info else "tidings",
                version=info.version if info else "",
                instructions=upstream.instructions,
                on_list_tools=list_tools,
                on_call_tool=call_tool,
            )
            async with stdio_server() as (read_stream, write_stream):
                await server.run(read_stream, write_stream, server.create_initialization_options())


def run_proxy(url: str, token: str) -> int:
    """Serve until stdin closes; the process exit code."""
    logs.configure(level=os.environ.get("TIDINGS_LOG_LEVEL", "WARNING"))
    try:
        preflight(url, token)
    except StartupError as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return 1
    try:
        anyio.run(serve, url, token)
    except KeyboardInterrupt:
        return 130
    return 0
