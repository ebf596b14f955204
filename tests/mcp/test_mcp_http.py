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
                assert r.json() == {"error": {"code": code, "message": r.json()["error"]["message"]}}, name
                assert r.json()["error"]["message"], name
                if status == 401:
                    assert r.headers["www-authenticate"].startswith("Bearer"), name

    async def refused(token):
        with pytest.raises(Exception):
            async with mcp_http(hub.url, token) as client:
                await client.list_tools()

    for token in (None, "tdg_not_a_token", hub.token("owner")):
        anyio.run(refused, token)


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
