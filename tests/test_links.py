"""Bridge links (issue 6 item 3), both backends: a linked conversation's new incoming
messages are posted into the channel in the projection's transaction, once; mentions in
them reach agents like any post; edits and deletes follow; access is admin-only."""

from __future__ import annotations

import pytest
from delivery_world import World

from helpers import auth
from tidings.bridges.registry import create_bridge
from tidings.hub.tokens import Principal
from tidings.store import messages as messages_store

GROUP = "q2Vn0aRZ8f0yX8Tt6cJmK1x4Wn9bYl3eQvPzA5oHs7c="
MOM = ("+14155550133", "7c0d7e44-1b6a-4c55-9d0e-1f2a3b4c5d6e", "Mom")


def signal_frame(ts: int, *, text: str | None = None, edit_of: int | None = None, delete_of: int | None = None,
                 sender=MOM, received: int | None = None) -> dict:
    number, uuid, name = sender
    data: dict = {"timestamp": ts, "message": text, "expiresInSeconds": 0, "viewOnce": False,
                  "groupInfo": {"groupId": GROUP, "groupName": "Family", "revision": 3, "type": "DELIVER"}}
    envelope: dict = {"source": number, "sourceNumber": number, "sourceUuid": uuid, "sourceName": name,
                      "sourceDevice": 1, "timestamp": ts, "serverReceivedTimestamp": ts + 200}
    if edit_of is not None:
        envelope["editMessage"] = {"targetSentTimestamp": edit_of, "dataMessage": data}
    elif delete_of is not None:
        data["message"] = None
        data["remoteDelete"] = {"timestamp": delete_of}
        envelope["dataMessage"] = data
    else:
        envelope["dataMessage"] = data
    return {"codec": "signal.jsonrpc", "codec_version": 1, "dedupe_key": f"env:{uuid}:{ts}:{edit_of}:{delete_of}",
            "payload": {"jsonrpc": "2.0", "method": "receive",
                        "params": {"envelope": envelope, "account": "+14155550100"}}}


@pytest.fixture
def world(runtime):
    ingest = runtime.ingest
    w = World(runtime)  # synchronous delivery; it also takes the ingest engine away...
    runtime.ingest = ingest  # ...which we keep, drained on this thread (never started)
    yield w
    w.close()


def setup_linked(world, client=None, *, subscribed=()):
    rt = world.rt
    alice = world.human("alice")
    assistant = world.agent("assistant", owner=alice)
    ch = world.channel("family", alice, members=[assistant], subscribe=[world.ids[h] for h in subscribed])
    bridge = create_bridge(rt.store, platform="signal", name="Alice's phone", owner=alice)
    # A first message creates the conversation; the link is made after it exists.
    rt.ingest.append_body(bridge["id"], signal_frame(1_000, text="hello family"))
    rt.ingest.drain()
    with rt.store.read() as tx:
        conversation_id = tx.raw("SELECT id FROM conversations").fetchone()[0]
    admin = Principal(scope="admin", account_id=rt.system_account_id, kind="system")
    rt.links.link(admin, bridge["id"], {"conversation_id": conversation_id, "channel_id": ch})
    return alice, assistant, ch, bridge, conversation_id


def channel_messages(world, ch):
    with world.store.read() as tx:
        return messages_store.messages_after(tx, ch, 0, 100)


def append(world, bridge, frame):
    world.rt.ingest.append_body(bridge["id"], frame)
    world.rt.ingest.drain()


def test_a_linked_signal_mention_owes_an_offline_agent_then_steers_it(world):
    alice, assistant, ch, bridge, _ = setup_linked(world)
    assert channel_messages(world, ch) == []  # the message before the link is not back-filled
    append(world, bridge, signal_frame(2_000, text="@assistant what's for dinner"))
    world.pump()
    posted = channel_messages(world, ch)
    assert [m["text"] for m in posted] == ["Mom: @assistant what's for dinner"]
    m = posted[0]["id"]
    assert world.owed(assistant) == [m]  # offline, outside its sweep set: owed
    world.connect(assistant)
    world.pump()
    assert world.got(assistant) == [("steer", m)]


def test_a_live_agent_is_steered_at_once(world):
    alice, assistant, ch, bridge, _ = setup_linked(world)
    world.connect(assistant)
    world.pump()
    append(world, bridge, signal_frame(2_000, text="@assistant what's for dinner"))
    world.pump()
    (m,) = channel_messages(world, ch)
    assert world.got(assistant) == [("steer", m["id"])]


def test_a_repeated_or_retried_frame_posts_once(world):
    alice, assistant, ch, bridge, _ = setup_linked(world)
    frame = signal_frame(2_000, text="just once")
    append(world, bridge, frame)
    append(world, bridge, frame)  # the same dedupe key: a replay
    again = dict(frame, dedupe_key="")  # a re-delivery without a key: projected again, unchanged
    append(world, bridge, again)
    assert [m["text"] for m in channel_messages(world, ch)] == ["Mom: just once"]


def test_edit_and_delete_follow_the_network_message(world):
    alice, assistant, ch, bridge, _ = setup_linked(world)
    append(world, bridge, signal_frame(2_000, text="dinner at 7"))
    append(world, bridge, signal_frame(2_500, text="dinner at 8", edit_of=2_000))
    (m,) = channel_messages(world, ch)
    assert m["text"] == "Mom: dinner at 8" and m["edited_at_ms"] is not None
    append(world, bridge, signal_frame(2_600, delete_of=2_000))
    (m,) = channel_messages(world, ch)
    assert m["deleted_at_ms"] is not None


def test_outgoing_messages_are_not_echoed(world):
    alice, assistant, ch, bridge, _ = setup_linked(world)
    me = ("+14155550100", "a1b2c3d4-0000-4000-8000-000000000001", "Me")
    frame = signal_frame(3_000, text="sent from my phone", sender=me)
    append(world, bridge, frame)
    assert channel_messages(world, ch) == []


def test_a_failed_projection_takes_its_post_with_it(world):
    alice, assistant, ch, bridge, _ = setup_linked(world)
    import sqlite3

    worker = world.rt.ingest.worker
    real_hook = worker.applier.on_message
    # The append's try and the drain's first attempt (4 tries) fail after the post was made;
    # the frame's retry round (one try once it is backed off) applies it.
    failures = {"left": 5}

    def post_then_fail(tx, change):
        real_hook(tx, change)
        if failures["left"]:
            failures["left"] -= 1
            busy = sqlite3.OperationalError("database is locked (injected after the link post)")
            busy.sqlite_errorcode = 5
            raise busy

    worker.applier.on_message = post_then_fail
    world.rt.ingest.append_body(bridge["id"], signal_frame(4_000, text="after a hiccup"))
    world.rt.ingest.drain()
    assert channel_messages(world, ch) == []  # rolled back with the frame
    world.clock.advance(1_000)  # the frame's backoff
    world.rt.ingest.drain()
    assert failures["left"] == 0
    assert [m["text"] for m in channel_messages(world, ch)] == ["Mom: after a hiccup"]


def test_links_are_admin_only_and_validated(client, runtime):
    alice = client.post("/api/v1/accounts", json={"kind": "human", "handle": "alice"}, headers=client.admin).json()
    ch = client.post("/api/v1/channels", json={"name": "family"}, headers=auth(alice["token"])).json()
    bridge = client.post("/api/v1/bridges", json={"platform": "signal", "name": "phone", "owner": alice["id"]},
                         headers=client.admin).json()
    other = client.post("/api/v1/bridges", json={"platform": "signal", "name": "other"}, headers=client.admin).json()
    r = client.post(f"/api/v1/bridges/{bridge['id']}/frames", json=signal_frame(1_000, text="hi"),
                    headers=auth(bridge["token"]))
    assert r.status_code == 202
    runtime.ingest.drain()
    with runtime.store.read() as tx:
        conversation_id = tx.raw("SELECT id FROM conversations").fetchone()[0]
    url = f"/api/v1/bridges/{bridge['id']}/links"
    body = {"conversation_id": conversation_id, "channel_id": ch["id"]}
    for headers in (auth(alice["token"]), auth(bridge["token"])):
        r = client.post(url, json=body, headers=headers)
        assert r.status_code == 403 and set(r.json()) == {"error"}
    assert client.post(url, json=body, headers={}).status_code == 401
    assert client.post(url, json={"conversation_id": conversation_id}, headers=client.admin).status_code == 400
    assert client.post(url, json={**body, "channel_id": "ch_nope"}, headers=client.admin).status_code == 404
    r = client.post(f"/api/v1/bridges/{other['id']}/links", json=body, headers=client.admin)
    assert r.status_code == 404  # that conversation is not the other bridge's
    r = client.post(url, json=body, headers=client.admin)
    assert r.status_code == 200 and r.json()["created"] is True
    r = client.post(url, json=body, headers=client.admin)
    assert r.status_code == 200 and r.json()["created"] is False
    r = client.get(url, headers=client.admin)
    assert [(l["conversation_id"], l["channel_id"]) for l in r.json()["links"]] == [(conversation_id, ch["id"])]


def test_the_demo_links_signal_family_so_the_sample_file_steers_the_assistant(world):
    import json
    from pathlib import Path

    from tidings.demo import seed_demo

    seed_demo(world.rt, "http://127.0.0.1:0")
    with world.store.read() as tx:
        family = tx.raw("SELECT id FROM channels WHERE name = 'signal-family'").fetchone()[0]
        bridge = tx.raw("SELECT id FROM bridges").fetchone()[0]
        assistant = tx.raw("SELECT id FROM accounts WHERE handle = 'assistant'").fetchone()[0]
    sample = Path(__file__).parent / "ingest" / "fixtures" / "signal_sample.jsonl"
    frames = [json.loads(line) for line in sample.read_text().splitlines() if line.strip()]
    world.rt.ingest.append_body(bridge, {"frames": frames})
    world.rt.ingest.drain()
    world.pump()
    texts = {m["text"]: m["id"] for m in channel_messages(world, family)}
    dinner = [mid for text, mid in texts.items() if text.endswith("@assistant what's for dinner")]
    assert len(dinner) == 1
    assert dinner[0] in world.owed(assistant)


def test_the_demo_then_the_sample_capture_show_each_message_once_and_one_name_per_identity(world):
    """Issue 15 item 8: the demo seeds nothing the sample capture brings again, and its
    people carry the capture's names, so each Signal identity shows one name."""
    import json
    from collections import Counter
    from pathlib import Path

    from tidings.demo import seed_demo

    seed_demo(world.rt, "http://127.0.0.1:0")
    world.rt.ingest.drain()
    with world.store.read() as tx:
        family = tx.raw("SELECT id FROM channels WHERE name = 'signal-family'").fetchone()[0]
        bridge = tx.raw("SELECT id FROM bridges").fetchone()[0]
    with world.store.read() as tx:
        assert tx.raw("SELECT count(*) FROM bridge_messages").fetchone()[0] > 5  # the demo's own chat
    sample = Path(__file__).parent / "ingest" / "fixtures" / "signal_sample.jsonl"
    frames = [json.loads(line) for line in sample.read_text().splitlines() if line.strip()]
    world.rt.ingest.append_body(bridge, {"frames": frames})
    world.rt.ingest.drain()
    texts = [m["text"] for m in channel_messages(world, family)]
    bodies = Counter(text.split(": ", 1)[1] for text in texts)
    assert [b for b, n in bodies.items() if n > 1] == []
    with world.store.read() as tx:
        rows = tx.raw("SELECT b.body FROM bridge_messages b JOIN conversations c ON c.id = b.conversation_id "
                      "WHERE c.bridge_id = '%s' AND b.body IS NOT NULL AND b.body <> ''" % bridge).fetchall()
    conversation_bodies = Counter(r[0] for r in rows)
    assert [b for b, n in conversation_bodies.items() if n > 1] == []
    # one name per identity: the names the channel shows per sender, and the frames' names
    names_of: dict[str, set[str]] = {}
    from tidings.ingest.demo import demo_frames

    for frame in [*demo_frames(world.clock.now_ms()), *frames]:
        envelope = frame["payload"]["params"]["envelope"]
        names_of.setdefault(envelope["sourceUuid"], set()).add(envelope["sourceName"])
    assert {uuid: len(names) for uuid, names in names_of.items()} == {uuid: 1 for uuid in names_of}
    shown = {text.split(": ", 1)[0] for text in texts}
    assert shown <= {name for names in names_of.values() for name in names}, shown


def sent_by(world, fn) -> dict[str, int]:
    before = world.store.meter.snapshot()
    fn()
    after = world.store.meter.snapshot()
    return {k: after[k] - before[k] for k in after}


def test_a_hub_with_links_applies_an_unlinked_conversations_message_in_two_round_trips(world):
    """The link hook says which conversations it acts on, with a read announced with the
    frame's other reads: a message of a conversation linked nowhere goes behind as in a
    hub without links (D107), and one of a linked conversation still posts (eagerly)."""
    alice, assistant, ch, bridge, _ = setup_linked(world)
    other = ("+14155550199", "9f0d7e44-1b6a-4c55-9d0e-1f2a3b4c5d6f", "Bob")

    def direct(ts: int, text: str) -> dict:
        frame = signal_frame(ts, text=text, sender=other)
        del frame["payload"]["params"]["envelope"]["dataMessage"]["groupInfo"]  # Bob's 1:1 chat
        return frame

    append(world, bridge, direct(2_000, "first, mints Bob's chat"))
    unlinked = sent_by(world, lambda: world.rt.ingest.append_body(bridge["id"], direct(2_100, "hi")))
    linked = sent_by(world, lambda: world.rt.ingest.append_body(bridge["id"], signal_frame(2_200, text="to the family")))
    assert [m["text"] for m in channel_messages(world, ch)] == ["Mom: to the family"]
    if world.store.dialect == "postgresql":
        assert unlinked["round_trips"] == 2 and unlinked["commits"] == 1, unlinked
        assert linked["round_trips"] > 2, linked
    else:
        assert unlinked["round_trips"] == unlinked["statements"]
