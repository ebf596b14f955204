"""Echo suppression (issue 13 item 3), both backends, all three codecs: the network's copy
of a message we sent is matched to its outbox item by remote id, projected as outgoing, and
never posted into the linked channel a second time."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from delivery_world import World

from bridgekit import SELF, channel_texts, signal_envelope, signal_frame, sync_sent_envelope
from tidings.bridges import echo
from tidings.bridges import outbox as outbox_hub
from tidings.bridges.registry import create_bridge
from tidings.hub.tokens import Principal

FIXTURES = Path(__file__).parent.parent / "ingest" / "fixtures"


def fixture(name: str) -> dict:
    return json.loads((FIXTURES / name).read_text())


@pytest.fixture
def world(runtime):
    ingest = runtime.ingest
    w = World(runtime)
    runtime.ingest = ingest
    yield w
    w.close()


def frame(codec: str, payload: dict, key: str) -> dict:
    return {"codec": codec, "codec_version": 1, "dedupe_key": key, "payload": payload}


def append(world, bridge, body):
    world.rt.ingest.append_body(bridge["id"], body)
    world.rt.ingest.drain()


def linked(world, platform: str, first: dict):
    """A bridge of ``platform`` whose conversation (made by frame ``first``) is linked into
    a fresh channel alice posts in."""
    alice = world.human("alice")
    ch = world.channel(f"{platform}-chat", alice)
    bridge = create_bridge(world.store, platform=platform, name=f"alice {platform}", owner=alice)
    append(world, bridge, first)
    with world.store.read() as tx:
        (conversation_id,) = tx.raw(
            "SELECT id FROM conversations WHERE bridge_id = " + ("?" if tx.dialect == "sqlite" else "%s"),
            (bridge["id"],),
        ).fetchone()
    admin = Principal(scope="admin", account_id=world.rt.system_account_id, kind="system")
    world.rt.links.link(admin, bridge["id"], {"conversation_id": conversation_id, "channel_id": ch})
    return alice, ch, bridge, conversation_id


def send_through(world, alice, ch, bridge, text: str, remote_id: str) -> dict:
    """Post ``text``, pull its item, report it sent as ``remote_id``."""
    world.post(alice, ch, text)
    box = outbox_hub.Outbox(world.store)
    (item,) = box.pending(bridge["id"])
    return box.report(bridge["id"], item["id"], {"state": "sent", "remote_id": remote_id})


def directions(world, conversation_id) -> dict[str, str]:
    with world.store.read() as tx:
        rows = tx.raw(
            "SELECT body, direction FROM bridge_messages WHERE conversation_id = "
            + ("?" if tx.dialect == "sqlite" else "%s"), (conversation_id,),
        ).fetchall()
    return dict(rows)


def assert_echo_suppressed(world, ch, bridge, conversation_id, item, text, inbound_text):
    assert channel_texts(world.store, ch) == [inbound_text, text]  # our post once, no echo post
    assert directions(world, conversation_id)[text] == "outgoing"
    assert outbox_hub.Outbox(world.store).one(bridge["id"], item["id"])["echoed"] is True


def test_signal_sync_sent_echo_is_ours(world):
    alice, ch, bridge, conv = linked(world, "signal", signal_frame(signal_envelope(1_000, "hello family")))
    append(world, bridge, signal_frame(signal_envelope(2_000, "dinner?")))
    item = send_through(world, alice, ch, bridge, "pasta at 7", "1717160250000")
    append(world, bridge, signal_frame(sync_sent_envelope(1717160250000, "pasta at 7")))
    assert_echo_suppressed(world, ch, bridge, conv, item, "pasta at 7", "Mom: dinner?")


def test_signal_data_message_with_our_timestamp_is_ours_without_an_account(world):
    """A daemon that does not name its account hands our own message back as a
    dataMessage from our number: only the outbox's timestamp tells it is ours."""
    alice, ch, bridge, conv = linked(world, "signal", signal_frame(signal_envelope(1_000, "hello family")))
    append(world, bridge, signal_frame(signal_envelope(2_000, "dinner?")))
    item = send_through(world, alice, ch, bridge, "pasta at 7", "1717160250000")
    append(world, bridge, signal_frame(signal_envelope(1717160250000, "pasta at 7", sender=SELF), account=None))
    assert_echo_suppressed(world, ch, bridge, conv, item, "pasta at 7", "Mom: dinner?")
    # a message of someone else at another time is still posted
    append(world, bridge, signal_frame(signal_envelope(1717160260000, "yum"), account=None))
    assert channel_texts(world.store, ch)[-1] == "Mom: yum"


def test_whatsapp_is_from_me_echo_is_ours(world):
    first = fixture("whatsapp_text.json")
    alice, ch, bridge, conv = linked(world, "whatsapp", frame("whatsapp.event", first, "wa:1"))
    inbound = copy.deepcopy(first)
    inbound.update(message_id="3EB0INBOUND", timestamp_ms=1717170001000)
    append(world, bridge, frame("whatsapp.event", inbound, "wa:2"))
    item = send_through(world, alice, ch, bridge, "yes, got them", "3EB0SENTBYHUB")
    mine = copy.deepcopy(first)
    mine.update(message_id="3EB0SENTBYHUB", is_from_me=True, timestamp_ms=1717170002000,
                message={"conversation": "yes, got them"})
    append(world, bridge, frame("whatsapp.event", mine, "wa:3"))
    assert_echo_suppressed(world, ch, bridge, conv, item, "yes, got them",
                           channel_texts(world.store, ch)[0])


def test_google_is_me_echo_is_ours(world):
    first = fixture("google_message_outgoing.json")
    incoming = copy.deepcopy(first)
    incoming["message"].update(messageID="1999", timestamp="1717180050000000",
                               messageStatus={"status": "INCOMING_COMPLETE"})
    incoming["message"]["senderParticipant"].update(isMe=False, fullName="Dana")
    incoming["message"]["senderParticipant"]["ID"].update(number="+14155550177", participantID="7")
    incoming["message"]["participantID"] = "7"
    incoming["message"]["messageInfo"][0]["messageContent"]["content"] = "running late?"
    alice, ch, bridge, conv = linked(world, "google", frame("google.json", incoming, "g:1"))
    item = send_through(world, alice, ch, bridge, "on my way", "2002")
    append(world, bridge, frame("google.json", first, "g:2"))
    texts = channel_texts(world.store, ch)
    assert texts == ["on my way"] or texts[-1] == "on my way"
    assert sum(1 for t in texts if t.endswith("on my way")) == 1
    assert directions(world, conv)["on my way"] == "outgoing"
    assert outbox_hub.Outbox(world.store).one(bridge["id"], item["id"])["echoed"] is True


def test_without_echo_suppression_the_signal_echo_is_posted_twice(world, monkeypatch):
    """The negative control, kept in the suite: switching the claim off reposts the echo."""
    monkeypatch.setattr(echo, "ENABLED", False)
    alice, ch, bridge, _ = linked(world, "signal", signal_frame(signal_envelope(1_000, "hello family")))
    send_through(world, alice, ch, bridge, "pasta at 7", "1717160250000")
    append(world, bridge, signal_frame(signal_envelope(1717160250000, "pasta at 7", sender=SELF), account=None))
    assert channel_texts(world.store, ch) == ["pasta at 7", "Sam Reyes: pasta at 7"]
