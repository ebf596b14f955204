"""The demo's Signal bridge: alice's phone, with a short family-group conversation.

The frames are signal-cli JSON-RPC ``receive`` notifications of the shape the
``signal.jsonrpc`` decoder documents: incoming group messages, a message alice sent from
her phone (a sync sent message), a reaction, a quoted reply, an edit, a read receipt and
a direct message. They are appended like any bridge's frames; the ingest worker applies
them when the hub starts. The bridge token is the fixed ``DEMO_BRIDGE_TOKEN`` so the
README tour can push more frames with curl.

The README tour then feeds the sample capture (``tests/ingest/fixtures/signal_sample.jsonl``)
through this bridge. So the demo's people are the capture's people, with the capture's
names (one name per identity), and its messages are earlier ones that the capture does
not contain (nothing shows twice).
"""

from __future__ import annotations

from typing import Any

from ..bridges.registry import create_bridge
from ..hub.tokens import Principal, hash_token
from ..store import accounts as accounts_store

DEMO_BRIDGE_TOKEN = "tdg_demo_signal_bridge"

ACCOUNT = "+14155550100"  # alice's own number
# The identities of the sample capture, under the names it gives them.
ALICE = ("a1b2c3d4-0000-4000-8000-000000000001", ACCOUNT, "Sam Reyes")
MAYA = ("5e0c1a7e-3f7b-4b8e-9c61-2a4d8f1b0a11", "+14155550111", "Alice Moreau")
THEO = ("9b2f6d3c-8e4a-4f1d-a7c2-5d3e1f0b9c22", "+14155550122", "Bob Okafor")
GROUP = {"groupId": "q2Vn0aRZ8f0yX8Tt6cJmK1x4Wn9bYl3eQvPzA5oHs7c=", "groupName": "Family", "revision": 14,
         "type": "DELIVER"}


def _envelope(who: tuple[str, str, str], ts: int, **content: Any) -> dict[str, Any]:
    uuid, number, name = who
    return {
        "jsonrpc": "2.0",
        "method": "receive",
        "params": {
            "envelope": {
                "source": number, "sourceNumber": number, "sourceUuid": uuid, "sourceName": name,
                "sourceDevice": 1, "timestamp": ts, "serverReceivedTimestamp": ts + 180,
                "serverDeliveredTimestamp": ts + 205, **content,
            },
            "account": ACCOUNT,
        },
    }


def _data(ts: int, text: str | None, group: bool = True, **extra: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"timestamp": ts, "message": text, "expiresInSeconds": 0, "viewOnce": False, **extra}
    if group:
        out["groupInfo"] = GROUP
    return out


def demo_frames(now_ms: int) -> list[dict[str, Any]]:
    """A dozen minutes of a family chat, ending a minute before ``now_ms``; none of its
    messages is one of the sample capture's."""
    t0 = (now_ms // 1000) * 1000 - 15 * 60_000
    t = [t0 + k * 60_000 for k in range(12)]
    payloads = [
        (MAYA, _envelope(MAYA, t[0], dataMessage=_data(t[0], "Anyone up for a hike on Saturday?"))),
        (THEO, _envelope(THEO, t[1], dataMessage=_data(t[1], "Only if it ends at a bakery 🥐"))),
        (ALICE, _envelope(ALICE, t[2], syncMessage={"sentMessage": {
            "destination": None, "destinationNumber": None, "destinationUuid": None,
            **_data(t[2], "I know one by the lake, I'll bring the map")}})),
        (THEO, _envelope(THEO, t[3], dataMessage=_data(t[3], None, reaction={
            "emoji": "😂", "targetAuthor": MAYA[1], "targetAuthorNumber": MAYA[1], "targetAuthorUuid": MAYA[0],
            "targetSentTimestamp": t[0], "isRemove": False}))),
        (THEO, _envelope(THEO, t[4], dataMessage=_data(t[4], "the lake trail is 8 km", quote={
            "id": t[2], "author": ACCOUNT, "authorNumber": ACCOUNT, "authorUuid": ALICE[0],
            "text": "I know one by the lake, I'll bring the map"}))),
        (THEO, _envelope(THEO, t[5], editMessage={"targetSentTimestamp": t[4], "dataMessage": _data(
            t[5], "the lake trail is 8 km, with a café halfway")})),
        (ALICE, _envelope(ALICE, t[6], syncMessage={"sentMessage": {
            "destination": None, "destinationNumber": None, "destinationUuid": None,
            **_data(t[6], "Saturday at 9 then 🥾")}})),
        (MAYA, _envelope(MAYA, t[7], receiptMessage={
            "when": t[7], "isDelivery": False, "isRead": True, "isViewed": False, "timestamps": [t[6]]})),
        (MAYA, _envelope(MAYA, t[8], dataMessage=_data(t[8], None, reaction={
            "emoji": "❤️", "targetAuthor": ACCOUNT, "targetAuthorNumber": ACCOUNT, "targetAuthorUuid": ALICE[0],
            "targetSentTimestamp": t[6], "isRemove": False}))),
        (MAYA, _envelope(MAYA, t[10], dataMessage=_data(t[10], "Can you lend me your rain jacket for Saturday?",
                                                          group=False))),
    ]
    return [
        {"codec": "signal.jsonrpc", "codec_version": 1, "dedupe_key": f"{who[0]}:{payload['params']['envelope']['timestamp']}",
         "payload": payload}
        for who, payload in payloads
    ]


def seed_demo_bridge(runtime: Any, admin: Principal, ids: dict[str, str]) -> dict[str, Any]:
    """Create alice's Signal bridge and append the demo frames; return the bridge."""
    bridge = create_bridge(runtime.store, platform="signal", name="Alice's phone", owner=ids.get("alice"))
    with runtime.store.write() as tx:
        accounts_store.insert_token(
            tx, token_hash=hash_token(DEMO_BRIDGE_TOKEN), scope="bridge", account_id=bridge["account_id"],
            bridge_id=bridge["id"], label="demo", now=runtime.store.now_ms(),
        )
    frames = demo_frames(runtime.store.now_ms())
    runtime.ingest.append(bridge["id"], runtime.ingest.parse(frames, "signal"))
    return {**bridge, "token": DEMO_BRIDGE_TOKEN}
