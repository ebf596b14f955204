"""``tidings serve --demo``: a small world a newcomer can poke at once.

People alice and bob, agents ``assistant`` (owned by alice) and ``scout`` (owned by bob),
channels ``#general`` (everyone, the admin too; the assistant subscribed), ``#research`` (scout
subscribed, assistant a plain member) and ``#signal-family`` (alice's Signal "Family" group
linked in; the assistant a plain member, so a mention from Signal steers or owes it), a few
messages, and alice's Signal bridge with a short family chat. Demo accounts get fixed,
well-known tokens so the README tour can be pasted as is; that is why the demo uses its
own database file by default and binds to loopback.
"""

from __future__ import annotations

from typing import Any

from .hub import accounts as accounts_hub
from .hub import channels as channels_hub
from .hub.tokens import Principal, register_token
from .ingest.demo import DEMO_BRIDGE_TOKEN, seed_demo_bridge
from .runtime import Runtime
from .store import accounts as accounts_store
from .store.sql import Stmt

_GROUP_CONVERSATION = Stmt(
    "SELECT id FROM conversations WHERE bridge_id = :bridge_id AND kind = 'group' ORDER BY created_at_ms LIMIT 1",
    name="group_conversation",
)
_DEMO_BRIDGE = Stmt("SELECT id FROM bridges WHERE name = 'Alice''s phone' ORDER BY created_at_ms LIMIT 1", name="demo_bridge")

DEMO_TOKENS = {
    "alice": "tdg_demo_alice",
    "bob": "tdg_demo_bob",
    "assistant": "tdg_demo_assistant",
    "scout": "tdg_demo_scout",
}


def _account(runtime: Runtime, handle: str) -> dict[str, Any] | None:
    with runtime.store.read() as tx:
        return accounts_store.account_by_handle(tx, handle)


def _create(runtime: Runtime, admin: Principal, **kw: Any) -> str:
    created = accounts_hub.create_account(runtime.store, created_by=admin.account_id, **kw)
    with runtime.store.write() as tx:
        register_token(
            tx, DEMO_TOKENS[created.handle], scope="account", account_id=created.id, label="demo", now=runtime.store.now_ms()
        )
    return created.id


def seed_demo(runtime: Runtime, base_url: str) -> str:
    """Seed the demo world if it is not there yet; return the guide to print."""
    admin = Principal(scope="admin", account_id=runtime.system_account_id, kind="system")
    ids: dict[str, str] = {}
    if _account(runtime, "alice") is None:
        ids["alice"] = _create(runtime, admin, kind="human", handle="alice", display_name="Alice")
        ids["bob"] = _create(runtime, admin, kind="human", handle="bob", display_name="Bob")
        ids["assistant"] = _create(
            runtime, admin, kind="agent", handle="assistant", display_name="Assistant", owner=ids["alice"]
        )
        ids["scout"] = _create(runtime, admin, kind="agent", handle="scout", display_name="Scout", owner=ids["bob"])
        alice = Principal(scope="account", account_id=ids["alice"], kind="human")
        # bob's scout joins alice's channels through the admin (agent consent, D42)
        general = channels_hub.create_channel(
            runtime.store, alice, name="general", members=[ids["bob"], ids["assistant"]]
        )
        # The admin (the hub's system account) is in #general too, so the guide's admin link
        # can post there; everywhere else the admin reads only.
        channels_hub.update_members(
            runtime.store, admin, general["id"],
            {"add": [ids["scout"], runtime.system_account_id], "subscribe": [ids["assistant"]]},
        )
        research = channels_hub.create_channel(
            runtime.store, alice, name="research", members=[ids["bob"], ids["assistant"]]
        )
        channels_hub.update_members(runtime.store, admin, research["id"], {"subscribe": [ids["scout"]]})
        family = channels_hub.create_channel(runtime.store, alice, name="signal-family", members=[ids["assistant"]])
        runtime.posting.post(author_id=ids["alice"], channel_id=general["id"], text="Welcome to Tidings, everyone!")
        runtime.posting.post(
            author_id=ids["bob"], channel_id=research["id"], text="@scout can you dig up last week's numbers?"
        )
        _seed_bridge(runtime, admin, ids, family["id"])
    else:
        for handle in DEMO_TOKENS:
            row = _account(runtime, handle)
            if row is not None:
                ids[handle] = row["id"]
    with runtime.store.read() as tx:
        channels = {c["name"]: c["id"] for c in channels_hub.channels_of_account(tx, ids.get("alice"))}
        bridge = tx.one(_DEMO_BRIDGE)
    general_id = channels.get("general", "<general channel id>")
    return _guide(base_url, general_id, bridge[0] if bridge else "<bridge id>")


def _seed_bridge(runtime: Runtime, admin: Principal, ids: dict[str, str], family_id: str) -> None:
    """Alice's Signal bridge with a family chat, its group linked into ``#signal-family``."""
    bridge = seed_demo_bridge(runtime, admin, ids)
    with runtime.store.read() as tx:
        row = tx.one(_GROUP_CONVERSATION, {"bridge_id": bridge["id"]})
    if row is not None:
        runtime.links.link(admin, bridge["id"], {"conversation_id": row[0], "channel_id": family_id})


def _guide(base: str, general_id: str, bridge_id: str) -> str:
    return f"""
[bold]Demo world[/bold]: people alice, bob; agents assistant (alice's), scout (bob's); channels
#general, #research, #signal-family (linked to the "Family" group of alice's Signal bridge).
Tokens: alice=tdg_demo_alice  bob=tdg_demo_bob  assistant=tdg_demo_assistant  scout=tdg_demo_scout
        admin=tdg_demo_admin  signal bridge={DEMO_BRIDGE_TOKEN}
The live page:   {base}/#token=tdg_demo_admin
Be the agent:    curl -N -H 'Authorization: Bearer tdg_demo_assistant' {base}/api/v1/session
Mention it:      curl -H 'Authorization: Bearer tdg_demo_alice' -H 'Content-Type: application/json' \\
                   -d '{{"text": "@assistant what is on the agenda?"}}' {base}/api/v1/channels/%23general/messages
Signal traffic:  uv run tidings ingest tests/ingest/fixtures/signal_sample.jsonl --bridge {bridge_id} \\
                   --url {base} --token {DEMO_BRIDGE_TOKEN}
MCP (agent):     {base}/mcp with header 'Authorization: Bearer tdg_demo_assistant'
"""
