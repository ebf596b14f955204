"""Fixtures for the MCP tests (both backends through the root ``runtime`` fixture).

``world`` builds, straight through the hub's use cases, a small hub an agent can use:

* ``owner`` (human) with two agents, ``bot`` (the MCP client) and ``other``;
* ``stranger`` (human) with ``strangers_bot``;
* ``general``: owner, bot and other are members, nobody subscribed (so a mention of an
  offline agent there is owed); it starts with one message the Signal bridge's account
  posted (external text, as a bridge link would);
* ``private``: the owner's channel bot is not in;
* a Signal bridge owned by ``owner`` with ``tests/ingest/fixtures/signal_sample.jsonl``
  appended and applied (the "Family" group conversation).

``hub`` serves it: a live uvicorn server (``tests/live.py``) over the same runtime, with
the engines started (delivery routes mentions, as ``tidings serve`` does).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from live import LiveServer
from tidings.api import create_app
from tidings.bridges.registry import create_bridge
from tidings.hub import accounts as accounts_hub
from tidings.hub import channels as channels_hub
from tidings.hub.tokens import authenticate
from tidings.store import owed as owed_store

SAMPLE = Path(__file__).parent.parent / "ingest" / "fixtures" / "signal_sample.jsonl"


@dataclass
class McpWorld:
    runtime: Any
    db_url: str
    accounts: dict[str, dict[str, Any]] = field(default_factory=dict)
    channels: dict[str, str] = field(default_factory=dict)
    bridge: dict[str, Any] = field(default_factory=dict)
    conversation_id: str = ""
    bridge_post_id: str = ""
    url: str = ""

    def id(self, name: str) -> str:
        return self.accounts[name]["id"]

    def token(self, name: str) -> str:
        return self.accounts[name]["token"]

    def post(self, author: str, channel: str, text: str) -> dict[str, Any]:
        """Post in-process (as a human would over HTTP) and wait until delivery handled it."""
        row, _ = self.runtime.posting.post(author_id=self.id(author), channel_id=self.channels[channel], text=text)
        self.runtime.delivery.wait_idle()
        return row

    def owed(self, agent: str) -> list[str]:
        with self.runtime.store.read() as tx:
            return [o["message_id"] for o in owed_store.owed_of(tx, self.id(agent))]


@pytest.fixture
def world(runtime, backend_url) -> McpWorld:
    store = runtime.store
    w = McpWorld(runtime=runtime, db_url=backend_url)

    def account(kind: str, handle: str, owner: str | None = None) -> None:
        w.accounts[handle] = accounts_hub.create_account(
            store, kind=kind, handle=handle, owner=w.id(owner) if owner else None
        ).as_json()

    account("human", "owner")
    account("agent", "bot", owner="owner")
    account("agent", "other", owner="owner")
    account("human", "stranger")
    account("agent", "strangers_bot", owner="stranger")
    owner = authenticate(store, w.token("owner"))
    w.channels["general"] = channels_hub.create_channel(
        store, owner, name="general", members=[w.id("bot"), w.id("other")]
    )["id"]
    w.channels["private"] = channels_hub.create_channel(store, owner, name="private")["id"]
    w.channels["home"] = w.accounts["bot"]["home_channel_id"]

    w.bridge = create_bridge(store, platform="signal", name="phone", owner=w.id("owner"))
    frames = [json.loads(line) for line in SAMPLE.read_text().splitlines() if line.strip()]
    runtime.ingest.append_body(w.bridge["id"], {"frames": frames}, platform="signal")
    runtime.ingest.drain()
    with store.read() as tx:
        w.conversation_id = tx.raw("SELECT id FROM conversations").fetchone()[0]

    # A message a bridge link would post: authored by the bridge's account.
    channels_hub.update_members(store, owner, w.channels["general"], {"add": [w.bridge["account_id"]]})
    row, _ = runtime.posting.post(
        author_id=w.bridge["account_id"], channel_id=w.channels["general"], text="Alice (Signal): dinner at 7!"
    )
    w.bridge_post_id = row["id"]
    return w


@pytest.fixture
def hub(world) -> Iterator[McpWorld]:
    """The world served by a live server (engines running); ``world.url`` is its base URL."""
    with LiveServer(create_app(world.runtime, manage_runtime=True)) as server:
        world.url = server.url
        world.runtime.delivery.wait_idle()  # the consumer is open: start scan and replay done
        yield world
