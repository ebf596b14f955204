"""MCP over Streamable HTTP at ``/mcp`` against a live server, with the SDK's own client,
both backends: the tools, each protocol era, and authentication before the MCP layer."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
import httpx
import httpx2
import pytest
from mcp.client.streamable_http import streamable_http_client
from mcp_scenario import agent_flow, call, lists_exactly_the_contract_tools, stranger_flow
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS

from helpers import auth
from mcp import Client

ADMIN_TOKEN = "tdg_test_admin"  # the root conftest's runtime fixture


@asynccontextmanager
async def mcp_http(url: str, token: str | None, mode: str = "auto") -> AsyncIterator[Client]:
    headers = auth(token) if token else {}
    async with httpx2.AsyncClient(headers=headers, timeout=30.0) as http:
        async with Client(streamable_http_client(url + "/mcp", http_client=http), mode=mode) as client:
            yield client


@pytest.mark.parametrize("mode", ["auto", "legacy"])
def test_agent_tools_over_streamable_http(hub, mode):
    """``auto`` speaks the 2026-07-28 single-exchange protocol; ``legacy`` the initialize
    handshake with a stateful session. Both run the whole agent flow."""

    async def main():
        async with mcp_http(hub.url, hub.token("bot"), mode) as client:
            if mode == "auto":
                assert client.protocol_version == "2026-07-28"
            else:
                assert client.protocol_version in HANDSHAKE_PROTOCOL_VERSIONS
            mine = await agent_flow(client, hub)
        # bot's post went through the server's bus: other's mention was routed at once
        hub.runtime.delivery.wait_idle()
        assert hub.owed("other") == [mine["id"]]
        async with mcp_http(hub.url, hub.token("strangers_bot"), mode) as client:
            await stranger_flow(client, hub, mine["id"])

    anyio.run(main)


def test_each_request_is_authenticated_with_an_agent_token_before_the_mcp_layer(hub):
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
    cases = {
        "no token": ({}, 401, "missing_token"),
        "bad token": (auth("tdg_not_a_token"), 401, "bad_token"),
        "not bearer": ({"Authorization": "Basic Ym90OmJvdA=="}, 401, "bad_token"),
        "human token": (auth(hub.token("owner")), 403, "agent_only"),
        "admin token": (auth(ADMIN_TOKEN), 403, "agent_only"),
        "bridge token": (auth(hub.bridge["token"]), 403, "agent_only"),
    }
    with httpx.Client(base_url=hub.url, timeout=10.0) as http:
        for name, (headers, status, code) in cases.items():
            for method in ("POST", "GET", "DELETE"):
                r = http.request(method, "/mcp", json=body if method == "POST" else None,
                                 headers={**headers, "Accept": "application/json, text/event-stream"})
                assert r.status_code == status, (name, method, r.text)
                # a JSON-RPC error answering the request (D56), the reason in its message
                error = r.json()["error"]
                assert r.json() == {"jsonrpc": "2.0", "id": 1 if method == "POST" else None, "error": error}, name
                assert error["code"] == (-32001 if status == 401 else -32003), name
                assert error["data"] == {"code": code, "status": status}, name
                assert error["message"].endswith(f"[{code}]") and len(error["message"]) > len(code) + 3, name
                if status == 401:
                    assert r.headers["www-authenticate"].startswith("Bearer"), name


@pytest.mark.parametrize("mode", ["auto", "legacy"])
def test_the_sdk_client_shows_why_its_token_was_refused(hub, mode):
    """The MCP SDK's own client surfaces the reason, not "Server returned an error response"."""
    from mcp.shared.exceptions import MCPError

    def first_mcp_error(exc: BaseException) -> MCPError | None:
        if isinstance(exc, MCPError):
            return exc
        for inner in getattr(exc, "exceptions", ()):  # the client's task groups wrap it
            found = first_mcp_error(inner)
            if found is not None:
                return found
        return None

    async def refused(token, code):
        with pytest.raises(BaseException) as caught:
            async with mcp_http(hub.url, token, mode) as client:
                await client.list_tools()
        error = first_mcp_error(caught.value)
        assert error is not None, repr(caught.value)
        assert f"[{code}]" in str(error) and "Server returned an error response" not in str(error), str(error)
        assert error.error.code == (-32001 if code != "agent_only" else -32003)

    for token, code in ((None, "missing_token"), ("tdg_not_a_token", "bad_token"), (hub.token("owner"), "agent_only"),
                        (ADMIN_TOKEN, "agent_only")):
        anyio.run(refused, token, code)


def test_a_session_belongs_to_the_agent_that_opened_it(hub):
    """Another agent presenting bot's session id gets the 404 of an unknown session."""
    headers = {"Accept": "application/json, text/event-stream", "MCP-Protocol-Version": "2025-06-18"}
    init = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
            "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                       "clientInfo": {"name": "test", "version": "1"}}}
    listing = {"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": {}}
    with httpx.Client(base_url=hub.url, timeout=10.0) as http:
        r = http.post("/mcp", json=init, headers={**headers, **auth(hub.token("bot"))})
        assert r.status_code == 200, r.text
        session = {**headers, "Mcp-Session-Id": r.headers["mcp-session-id"]}
        r = http.post("/mcp", json={"jsonrpc": "2.0", "method": "notifications/initialized"},
                      headers={**session, **auth(hub.token("bot"))})
        assert r.status_code == 202, r.text
        r = http.post("/mcp", json=listing, headers={**session, **auth(hub.token("other"))})
        assert r.status_code == 404 and "list_channels" not in r.text
        r = http.post("/mcp", json=listing, headers={**session, **auth(hub.token("bot"))})
        assert r.status_code == 200 and "list_channels" in r.text
        r = http.delete("/mcp", headers={**session, **auth(hub.token("bot"))})
        assert r.status_code == 200, r.text


def test_the_endpoint_survives_a_second_run_of_the_app(world):
    """A fresh session manager per run of the host app (the SDK's runs only once)."""
    from live import LiveServer
    from tidings.api import create_app

    app = create_app(world.runtime)

    async def listed(url):
        async with mcp_http(url, world.token("bot"), "legacy") as client:
            await lists_exactly_the_contract_tools(client)
            return (await call(client, "list_channels"))["channels"]

    for _ in range(2):
        with LiveServer(app) as server:
            assert len(anyio.run(listed, server.url)) == 2


def test_tools_take_a_channel_by_its_name(hub):
    """``#name`` works wherever a tool expects a channel id (D55)."""
    from mcp_scenario import call, fails

    async def main():
        async with mcp_http(hub.url, hub.token("bot")) as client:
            posted = await call(client, "post_message", channel_id="#general", text="by name")
            assert posted["message"]["channel_id"] == hub.channels["general"]
            read = await call(client, "read_messages", channel_id="#general")
            assert read["channel_id"] == hub.channels["general"]
            assert read["messages"][-1]["id"] == posted["message"]["id"]
            assert "unknown_channel" in await fails(client, "read_messages", channel_id="#private")

    anyio.run(main)
