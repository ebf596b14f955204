"""Two-way bridge scenes shared by the outbox, echo and connector tests: a Signal "Family"
group linked into a channel, with frames built the way signal-cli writes them."""

from __future__ import annotations

from typing import Any

from tidings.bridges.registry import create_bridge
from tidings.hub.tokens import Principal
from tidings.store import messages as messages_store

GROUP = "q2Vn0aRZ8f0yX8Tt6cJmK1x4Wn9bYl3eQvPzA5oHs7c="
ACCOUNT = "+14155550100"
SELF = ("+14155550100", "a1b2c3d4-0000-4000-8000-000000000001", "Sam Reyes")
MOM = ("+14155550133", "7c0d7e44-1b6a-4c55-9d0e-1f2a3b4c5d6e", "Mom")


def signal_envelope(ts: int, text: str, *, sender=MOM) -> dict[str, Any]:
    number, uuid, name = sender
    data = {"timestamp": ts, "message": text, "expiresInSeconds": 0, "viewOnce": False,
            "groupInfo": {"groupId": GROUP, "groupName": "Family", "revision": 3, "type": "DELIVER"}}
    return {"source": number, "sourceNumber": number, "sourceUuid": uuid, "sourceName": name,
            "sourceDevice": 1, "timestamp": ts, "serverReceivedTimestamp": ts + 200, "dataMessage": data}


def sync_sent_envelope(ts: int, text: str) -> dict[str, Any]:
    number, uuid, name = SELF
    sent = {"destination": None, "destinationNumber": None, "destinationUuid": None, "timestamp": ts,
            "message": text, "expiresInSeconds": 0, "viewOnce": False,
            "groupInfo": {"groupId": GROUP, "groupName": "Family", "revision": 3, "type": "DELIVER"}}
    return {"source": number, "sourceNumber": number, "sourceUuid": uuid, "sourceName": name, "sourceDevice": 2,
            "timestamp": ts, "serverReceivedTimestamp": ts + 200, "syncMessage": {"sentMessage": sent}}


def receive_notification(envelope: dict[str, Any], *, account: str | None = ACCOUNT) -> dict[str, Any]:
    params: dict[str, Any] = {"envelope": envelope}
    if account is not None:
        params["account"] = account
    return {"jsonrpc": "2.0", "method": "receive", "params": params}


def signal_frame(envelope: dict[str, Any], *, account: str | None = ACCOUNT) -> dict[str, Any]:
    key = f"env:{envelope['sourceUuid']}:{envelope['timestamp']}:{'sync' if 'syncMessage' in envelope else 'data'}"
    return {"codec": "signal.jsonrpc", "codec_version": 1, "dedupe_key": key,
            "payload": receive_notification(envelope, account=account)}


def link_signal_family(rt: Any, owner: str, channel_id: str) -> tuple[dict[str, Any], str]:
    """A Signal bridge owned by ``owner`` whose Family group is linked into ``channel_id``.
    The ingest engine is drained on this thread (never started)."""
    bridge = create_bridge(rt.store, platform="signal", name="Alice's phone", owner=owner)
    rt.ingest.append_body(bridge["id"], signal_frame(signal_envelope(1_000, "hello family")))
    rt.ingest.drain()
    with rt.store.read() as tx:
        conversation_id = tx.raw("SELECT id FROM conversations WHERE bridge_id = ?"
                                 if tx.dialect == "sqlite" else
                                 "SELECT id FROM conversations WHERE bridge_id = %s", (bridge["id"],)).fetchone()[0]
    admin = Principal(scope="admin", account_id=rt.system_account_id, kind="system")
    rt.links.link(admin, bridge["id"], {"conversation_id": conversation_id, "channel_id": channel_id})
    return bridge, conversation_id


def channel_texts(store: Any, channel_id: str) -> list[str]:
    with store.read() as tx:
        return [m["text"] for m in messages_store.messages_after(tx, channel_id, 0, 1000)]
