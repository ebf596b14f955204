"""MCP over stdio (``tidings mcp --token T --db URL`` as a subprocess) with the SDK's own
stdio client, both backends, while a live hub server runs over the same database (as a
user would have it: ``tidings serve`` in one place, an agent's MCP client spawning
``tidings mcp`` in another)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import pytest
from mcp.client.stdio import StdioServerParameters
from mcp_scenario import agent_flow, call, fails, stranger_flow

from mcp import Client

TIDINGS = Path(sys.executable).with_name("tidings")  # the venv's console script


def command(*args: str) -> list[str]:
    if TIDINGS.exists():
        return [str(TIDINGS), *args]
    return [sys.executable, "-c", "from tidings.cli import main; main()", *args]


@asynccontextmanager
async def mcp_stdio(db_url: str, token: str) -> AsyncIterator[Client]:
    argv = command("mcp", "--token", token, "--db", db_url)
    params = StdioServerParameters(command=argv[0], args=argv[1:], env={"TIDINGS_LOG_LEVEL": "ERROR"})
    async with Client(params) as client:
        yield client


def test_agent_tools_over_stdio(hub):
    async def main():
        async with mcp_stdio(hub.db_url, hub.token("bot")) as client:
            mine = await agent_flow(client, hub)
            # This process has no bus subscriber: the server learns of the post from its
            # recovery scan (D29), not at once.
            hub.runtime.delivery.wait_idle()
            assert hub.owed("other") == []
            consumer = hub.runtime.delivery.consumer
            hub.runtime.clock.advance(consumer.options.scan_interval_ms)
            assert consumer.wait_until(lambda: hub.owed("other") == [mine["id"]], timeout=10.0)
            # the server's periodic scan routed bot's mention of other: other is owed it
            async with mcp_stdio(hub.db_url, hub.token("other")) as other:
                owed = (await call(other, "owed_mentions"))["owed"]
                assert [o["message_id"] for o in owed] == [mine["id"]]
                assert (await call(other, "ack", message_id=mine["id"]))["owed_cleared"] is True
        async with mcp_stdio(hub.db_url, hub.token("strangers_bot")) as client:
            await stranger_flow(client, hub, mine["id"])

    anyio.run(main)


def test_a_token_revoked_while_serving_stops_working_at_once(world):
    async def main():
        async with mcp_stdio(world.db_url, world.token("bot")) as client:
            assert len((await call(client, "list_channels"))["channels"]) == 2
            with world.runtime.store.write() as tx:
                tx.raw("DELETE FROM api_tokens WHERE account_id = " + ("?" if tx.dialect == "sqlite" else "%s"),
                       (world.id("bot"),))
            assert "unknown or revoked token [bad_token]" in await fails(client, "list_channels")

    anyio.run(main)


def test_startup_refuses_anything_but_an_agent_token_with_one_line_and_exit_1(world, tmp_path):
    cases = {
        "bad token": (world.db_url, "tdg_not_a_token", "unknown or revoked token"),
        "human token": (world.db_url, world.token("owner"), "not an agent token"),
        "bridge token": (world.db_url, world.bridge["token"], "not an agent token"),
        "no database": (str(tmp_path / "missing.db"), world.token("bot"), "no database at"),
    }
    env = {**os.environ, "TIDINGS_LOG_LEVEL": "ERROR"}
    procs = {
        name: subprocess.Popen(command("mcp", "--token", token, "--db", db), stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True)
        for name, (db, token, _) in cases.items()
    }
    for name, proc in procs.items():
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 1, (name, err)
        assert out == "", name
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: ") and cases[name][2] in lines[0], (name, err)
    assert not (tmp_path / "missing.db").exists()  # never created


@pytest.mark.parametrize("backend_url", ["sqlite"], indirect=True)
def test_a_database_without_a_hub_is_refused_and_not_bootstrapped(tmp_path, backend_url):
    from tidings.store import accounts as accounts_store
    from tidings.store.engine import Store

    Store(backend_url).dispose()  # a migrated, empty database
    proc = subprocess.run(command("mcp", "--token", "tdg_x", "--db", backend_url), capture_output=True, text=True,
                          timeout=60, stdin=subprocess.DEVNULL)
    assert proc.returncode == 1 and "holds no hub yet" in proc.stderr
    store = Store(backend_url)
    try:
        with store.read() as tx:
            assert not accounts_store.admin_token_exists(tx)
    finally:
        store.dispose()


# -- stdio in front of a running hub: ``tidings mcp --url URL --token T`` -------------------
@asynccontextmanager
async def mcp_stdio_proxy(url: str, token: str, mode: str = "auto") -> AsyncIterator[Client]:
    argv = command("mcp", "--token", token, "--url", url)
    params = StdioServerParameters(command=argv[0], args=argv[1:], env={"TIDINGS_LOG_LEVEL": "ERROR"})
    async with Client(params, mode=mode) as client:
        yield client


@pytest.mark.parametrize("mode", ["auto", "legacy"])
def test_stdio_in_front_of_the_hub_routes_a_mention_at_once(hub, mode):
    """With ``--url`` the stdio process holds no store: every call goes to the hub's
    ``/mcp`` with the agent's token, so a post goes through the hub's bus and its mention
    is routed at once, with no scan (compare ``test_agent_tools_over_stdio``). Both
    protocol eras: the 2026-07-28 single exchange and the initialize handshake."""

    async def main():
        recovered = hub.runtime.delivery.status()["scan_recovered"]
        async with mcp_stdio_proxy(hub.url, hub.token("bot"), mode) as client:
            mine = await agent_flow(client, hub)
            hub.runtime.delivery.wait_idle()
            assert hub.owed("other") == [mine["id"]]  # no clock advance, no scan
            assert hub.runtime.delivery.status()["scan_recovered"] == recovered
        async with mcp_stdio_proxy(hub.url, hub.token("strangers_bot")) as client:
            await stranger_flow(client, hub, mine["id"])

    anyio.run(main)


def test_stdio_in_front_of_the_hub_refuses_a_bad_token_or_no_hub_with_one_line(hub):
    env = {**os.environ, "TIDINGS_LOG_LEVEL": "ERROR"}
    cases = {
        "bad token": (hub.url, "tdg_not_a_token", "unknown or revoked token"),
        "human token": (hub.url, hub.token("owner"), "agent"),
        "no hub": ("http://127.0.0.1:9", hub.token("bot"), "cannot reach the hub"),
    }
    for name, (url, token, reason) in cases.items():
        proc = subprocess.run(command("mcp", "--token", token, "--url", url), capture_output=True, text=True,
                              timeout=60, stdin=subprocess.DEVNULL, env=env)
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 1 and proc.stdout == "", (name, proc.stderr)
        assert len(lines) == 1 and lines[0].startswith("error: ") and reason in lines[0], (name, proc.stderr)
    both = subprocess.run(command("mcp", "--token", hub.token("bot"), "--url", hub.url, "--db", hub.db_url),
                          capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL, env=env)
    assert both.returncode == 1 and "either --db" in both.stderr and "not both" in both.stderr
