"""The three frame decoders: fixtures decode to exact events, bad input to DecodeError.

Fixtures in ``fixtures/`` are modelled on the real tool output each decoder documents
(signal-cli JSON-RPC notifications, whatsmeow events with protojson ``waE2E.Message``,
libgm protojson ``Conversation``/``Message``). The file prefix names the codec.
"""

from __future__ import annotations

import copy
import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tidings.ingest.decoders import (
    DECODERS,
    DecodeError,
    UnknownCodec,
    UnsupportedVersion,
    decode_frame,
)
from tidings.ingest.events import (
    ConversationEvent,
    IdentityRef,
    InvalidEvent,
    MessageEvent,
    MessageMutationEvent,
    Participant,
    ReactionEvent,
    ReceiptEvent,
    identity_key,
    validate_event,
)

FIXTURES = Path(__file__).parent / "fixtures"
CODEC_OF_PREFIX = {"signal": "signal.jsonrpc", "whatsapp": "whatsapp.event", "google": "google.json"}


def load(name: str) -> dict:
    return json.loads((FIXTURES / f"{name}.json").read_text())


def codec_of(name: str) -> str:
    return CODEC_OF_PREFIX[name.split("_", 1)[0]]


def all_fixture_names() -> list[str]:
    return sorted(p.stem for p in FIXTURES.glob("*.json"))


# ------------------------------------------------------------------ the cast

ALICE_ACI = "5e0c1a7e-3f7b-4b8e-9c61-2a4d8f1b0a11"
BOB_ACI = "9b2f6d3c-8e4a-4f1d-a7c2-5d3e1f0b9c22"
ALICE = IdentityRef(raw=ALICE_ACI, name="Alice Moreau", kind="signal_aci", canonical=ALICE_ACI)
BOB = IdentityRef(raw=BOB_ACI, name="Bob Okafor", kind="signal_aci", canonical=BOB_ACI)
SIGNAL_ME = IdentityRef(raw="+14155550100", name="Sam Reyes", is_self=True, kind="e164",
                        canonical="+14155550100")
SIG_ALICE = "signal:" + ALICE_ACI
SIG_BOB = "signal:" + BOB_ACI
SIG_GROUP = "signal-group:q2Vn0aRZ8f0yX8Tt6cJmK1x4Wn9bYl3eQvPzA5oHs7c="

CAROL = IdentityRef(raw="+447700900123", name="Carol", kind="e164", canonical="+447700900123")
DAVE = IdentityRef(raw="123456789012345@lid", name="Dave", kind="jid", canonical="123456789012345@lid")
WA_ME = IdentityRef(raw="+14155550100", is_self=True, kind="e164", canonical="+14155550100")
WA_CAROL = "whatsapp:447700900123@s.whatsapp.net"
WA_GROUP = "whatsapp:120363025246125486@g.us"

GM_ME = IdentityRef(raw="+14155550100", is_self=True, kind="e164", canonical="+14155550100")
JUNE = IdentityRef(raw="+14155550133", name="June Park", kind="e164", canonical="+14155550133")
RAVI = IdentityRef(raw="+14155550144", name="Ravi Shah", kind="e164", canonical="+14155550144")


def legacy(pid: str) -> IdentityRef:
    raw = f"legacy-participant:{pid}"
    return IdentityRef(raw=raw, kind="legacy_participant", canonical=raw)


EXPECTED: dict[str, list] = {
    # ---------------------------------------------------------------- Signal
    "signal_text_direct": [MessageEvent(
        SIG_ALICE, f"{ALICE_ACI}:1717160000000", ALICE, "incoming",
        "Are we still on for Saturday?", 1717160000000)],
    "signal_group_quote": [MessageEvent(
        SIG_GROUP, f"{BOB_ACI}:1717160300000", BOB, "incoming", "Yes! I'll bring the salad",
        1717160300000, reply_to_remote_id=f"{ALICE_ACI}:1717160200000")],
    "signal_attachment": [MessageEvent(
        SIG_ALICE, f"{ALICE_ACI}:1717160400000", ALICE, "incoming", "The view from the hike",
        1717160400000, attachments=({
            "v": 1, "kind": "remote", "att_id": "gq3Tt0nZ5cYlKq1ozOxD.jpg",
            "content_type": "image/jpeg", "filename": "IMG_2041.jpg", "size": 482113,
            "width": 3024, "height": 4032},))],
    "signal_edit": [MessageMutationEvent(
        SIG_ALICE, f"{ALICE_ACI}:1717160000000", "edit", "Are we still on for Sunday?",
        1717160500000)],
    "signal_remote_delete": [MessageMutationEvent(
        SIG_GROUP, f"{BOB_ACI}:1717160300000", "delete", "", 1717160600000)],
    "signal_reaction_add": [ReactionEvent(
        SIG_GROUP, "self:1717160250000", BOB, "👍", "add", 1717160700000)],
    "signal_reaction_remove": [ReactionEvent(
        SIG_GROUP, f"{BOB_ACI}:1717160300000", ALICE, "❤️", "remove", 1717160800000)],
    "signal_receipt_read": [ReceiptEvent(
        SIG_ALICE, ("self:1717160250000", "self:1717160260000"), ALICE, "read", 1717160900000)],
    "signal_receipt_delivery": [ReceiptEvent(
        SIG_ALICE, ("self:1717160250000",), ALICE, "delivered", 1717160255000)],
    "signal_typing": [],
    "signal_expiration_update": [],
    "signal_sync_sent_group": [MessageEvent(
        SIG_GROUP, "self:1717160250000", SIGNAL_ME, "outgoing", "I'll do the dessert 🍰",
        1717160250000)],
    "signal_sync_sent_direct": [MessageEvent(
        SIG_ALICE, "self:1717161000000", SIGNAL_ME, "outgoing", "Sunday works", 1717161000000,
        reply_to_remote_id=f"{ALICE_ACI}:1717160000000")],
    "signal_sync_edit": [MessageMutationEvent(
        SIG_ALICE, "self:1717161000000", "edit", "Sunday works, 2pm?", 1717161100000)],
    "signal_sync_read": [
        ReceiptEvent(SIG_ALICE, (f"{ALICE_ACI}:1717160000000", f"{ALICE_ACI}:1717160400000"),
                     SIGNAL_ME, "read", 1717161200000),
        ReceiptEvent(SIG_BOB, (f"{BOB_ACI}:1717160300000",), SIGNAL_ME, "read", 1717161200000),
    ],
    "signal_bare_envelope": [MessageEvent(
        SIG_BOB, f"{BOB_ACI}:1717161400000", BOB, "incoming", "running 10 min late",
        1717161400000)],
    # ---------------------------------------------------------------- WhatsApp
    "whatsapp_text": [MessageEvent(
        WA_CAROL, "3EB0C767D26A1D2E5F10", CAROL, "incoming", "Did you get the tickets?",
        1717170000000)],
    "whatsapp_group_reply": [MessageEvent(
        WA_GROUP, "A5F1B0C9E2D84C17B3", DAVE, "incoming", "count me in for Friday",
        1717170100000, reply_to_remote_id="3EB0AA11BB22CC33DD44")],
    "whatsapp_image": [MessageEvent(
        WA_CAROL, "3EB0D1E2F3A4B5C6D7E8", CAROL, "incoming", "the seats!", 1717170200000,
        attachments=({
            "v": 1, "kind": "remote", "media_type": "image", "mimetype": "image/jpeg",
            "direct_path": "/o1/v/t62.7118-24/f1/m231/up-oil-image-abc.enc?ccb=9-4&oh=01_Q5"
                           "&oe=66A1B2C3&_nc_sid=5e03e0",
            "file_sha256": "n0mC7x6k0a2W9Kq5gJ3oQ5f2B3yXH0u1pVtZt4Yb6Ds=",
            "file_enc_sha256": "s7T2kL9pQ4vN1mB8xC3zA6dF0gH5jW2eR7tY9uI1oP4=",
            "media_key": "V3k9qN2bY5mS0cZ1dF4gH7jK8lP6oI3uT2rE1wQ9aXs=",
            "file_length": 184533, "caption": "the seats!", "width": 960, "height": 1280},))],
    "whatsapp_reaction": [ReactionEvent(
        WA_CAROL, "3EB0AA11BB22CC33DD55", CAROL, "😂", "add", 1717170299876)],
    "whatsapp_reaction_remove": [ReactionEvent(
        WA_CAROL, "3EB0AA11BB22CC33DD55", CAROL, "", "remove", 1717170399000)],
    "whatsapp_revoke": [MessageMutationEvent(
        WA_GROUP, "A5F1B0C9E2D84C17B3", "delete", "", 1717170500000)],
    "whatsapp_edit": [MessageMutationEvent(
        WA_CAROL, "3EB0C767D26A1D2E5F10", "edit", "Did you get the tickets for Friday?",
        1717170600123)],
    "whatsapp_receipt_read": [ReceiptEvent(
        WA_GROUP, ("3EB0AA11BB22CC33DD44", "3EB0AA11BB22CC33DD66"),
        IdentityRef(raw="123456789012345@lid", kind="jid", canonical="123456789012345@lid"),
        "read", 1717170700000)],
    "whatsapp_receipt_sender": [ReceiptEvent(
        WA_CAROL, ("3EB0AA11BB22CC33DD55",), WA_ME, "delivered", 1717170710000)],
    "whatsapp_receipt_retry": [],
    "whatsapp_history_sync": [
        MessageEvent(WA_CAROL, "3EB0000000000000A001", CAROL, "incoming", "happy birthday!!",
                     1717000000000),
        MessageEvent(WA_CAROL, "3EB0000000000000A002", WA_ME, "outgoing", "thank you 🥳",
                     1717000060000),
        MessageEvent(WA_GROUP, "A5F1000000000000B001", DAVE, "incoming", "", 1717000100000,
                     attachments=({"v": 1, "kind": "remote", "media_type": "document",
                                   "mimetype": "application/pdf",
                                   "direct_path": "/v/t62.7119-24/itinerary.enc",
                                   "file_name": "itinerary.pdf", "file_length": 88211},)),
    ],
    # ---------------------------------------------------------------- Google
    "google_conversation_group": [ConversationEvent(
        "37", "group", "Climbing crew",
        (Participant(GM_ME), Participant(JUNE), Participant(RAVI)), None)],
    "google_conversation_direct": [ConversationEvent(
        "12", "direct", "June Park", (Participant(GM_ME), Participant(JUNE)), None)],
    "google_message_incoming": [MessageEvent(
        "37", "2001", JUNE, "incoming", "see you at 6", 1717180000123,
        reply_to_remote_id="1999", reactions_snapshot=True)],
    "google_message_reactions": [
        MessageEvent("37", "1999", RAVI, "incoming", "new route on the north wall",
                     1717179000000, reactions_snapshot=True),
        ReactionEvent("37", "1999", legacy("2"), "👍", "add", 1717179000000),
        ReactionEvent("37", "1999", legacy("1"), "👍", "add", 1717179000000),
        ReactionEvent("37", "1999", RAVI, "🔥", "add", 1717179000000),
        ReactionEvent("37", "1999", IdentityRef(raw="anon:❤️", kind="anonymous",
                                                canonical="anon:❤️"), "❤️", "add", 1717179000000),
    ],
    "google_message_outgoing": [MessageEvent(
        "12", "2002", GM_ME, "outgoing", "on my way", 1717180060000,
        client_request_id="tmp_402188917363", reactions_snapshot=True)],
    "google_message_empty_stub": [],
    "google_message_media": [MessageEvent(
        "12", "2004", legacy("2"), "incoming", "", 1717180080000, reactions_snapshot=True,
        attachments=({"v": 1, "kind": "remote", "media_id": "MmZiY2I0ZjItMWU3Zi00",
                      "decryption_key_b64": "q83vEjRWeJCrze8SNFZ4kA==", "mime_type": "image/jpeg",
                      "name": "PXL_20240531.jpg", "size": 1048576, "width": 3072, "height": 4080},))],
}


def test_every_fixture_has_an_expectation() -> None:
    assert sorted(EXPECTED) == all_fixture_names()


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_fixture_decodes_to_exact_events(name: str) -> None:
    events = DECODERS[codec_of(name)].decode(load(name))
    assert events == EXPECTED[name]
    for ev in events:
        validate_event(ev)
        _check_proofs(DECODERS[codec_of(name)].platform, ev)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_string_payload_decodes_like_the_object(name: str) -> None:
    text = (FIXTURES / f"{name}.json").read_text()
    assert decode_frame(codec_of(name), 1, text) == EXPECTED[name]


def test_decoding_is_deterministic_and_does_not_touch_the_payload() -> None:
    for name in EXPECTED:
        doc = load(name)
        before = copy.deepcopy(doc)
        first = DECODERS[codec_of(name)].decode(doc)
        assert DECODERS[codec_of(name)].decode(doc) == first
        assert doc == before


def test_registry() -> None:
    assert set(DECODERS) == {"signal.jsonrpc", "whatsapp.event", "google.json"}
    assert {d.platform for d in DECODERS.values()} == {"signal", "whatsapp", "google"}
    for codec, dec in DECODERS.items():
        assert dec.codec == codec
        assert dec.versions == {1}


# ------------------------------------------------------------------ specific behaviour


def test_signal_reaction_to_own_message_needs_the_account() -> None:
    doc = load("signal_reaction_add")
    del doc["params"]["account"]
    [ev] = DECODERS["signal.jsonrpc"].decode(doc)
    # without the account our own ACI cannot be recognised as "self"
    assert ev.target_remote_message_id == "a1b2c3d4-0000-4000-8000-000000000001:1717160250000"


def test_signal_own_data_message_is_skipped() -> None:
    doc = load("signal_text_direct")
    doc["params"]["account"] = doc["params"]["envelope"]["sourceNumber"]
    assert DECODERS["signal.jsonrpc"].decode(doc) == []


def test_signal_number_only_source_falls_back_to_the_number() -> None:
    doc = load("signal_text_direct")
    doc["params"]["envelope"]["sourceUuid"] = None
    [ev] = DECODERS["signal.jsonrpc"].decode(doc)
    assert ev.remote_conversation_id == "signal:+14155550111"
    assert ev.remote_message_id == "+14155550111:1717160000000"
    assert ev.sender.kind == "e164"


def test_signal_reaction_add_without_emoji_is_dropped() -> None:
    doc = load("signal_reaction_add")
    doc["params"]["envelope"]["dataMessage"]["reaction"]["emoji"] = ""
    assert DECODERS["signal.jsonrpc"].decode(doc) == []


def test_signal_edit_and_reaction_meet_the_message_they_target() -> None:
    dec = DECODERS["signal.jsonrpc"]
    [msg] = dec.decode(load("signal_text_direct"))
    [edit] = dec.decode(load("signal_edit"))
    assert edit.remote_message_id == msg.remote_message_id
    [sent] = dec.decode(load("signal_sync_sent_group"))
    [reaction] = dec.decode(load("signal_reaction_add"))
    assert reaction.target_remote_message_id == sent.remote_message_id
    [receipt] = dec.decode(load("signal_receipt_delivery"))
    assert receipt.remote_message_ids == (sent.remote_message_id,)


def test_whatsapp_protocol_enum_as_number_and_device_jid() -> None:
    doc = load("whatsapp_revoke")
    doc["message"]["protocolMessage"]["type"] = 0
    doc["sender_jid"] = "447700900123.0:7@s.whatsapp.net"
    [ev] = DECODERS["whatsapp.event"].decode(doc)
    assert ev.kind == "delete" and ev.remote_message_id == "A5F1B0C9E2D84C17B3"


def test_whatsapp_receipt_type_spellings() -> None:
    dec = DECODERS["whatsapp.event"]
    doc = load("whatsapp_receipt_read")
    for rtype, status, is_self in [("", "delivered", False), ("delivered", "delivered", False),
                                   ("read-self", "read", True), ("played_self", "read", True),
                                   ("played", "read", False), ("server-error", "failed", False)]:
        doc["receipt_type"] = rtype
        [ev] = dec.decode(doc)
        assert (ev.status, ev.actor.is_self) == (status, is_self), rtype
    for rtype in ("inactive", "peer_msg", "hist_sync", "something-new"):
        doc["receipt_type"] = rtype
        assert dec.decode(doc) == []


def test_whatsapp_unsupported_content_is_nothing() -> None:
    dec = DECODERS["whatsapp.event"]
    doc = load("whatsapp_text")
    for message in ({"encReactionMessage": {"targetMessageKey": {"ID": "x"}, "encPayload": "AA=="}},
                    {"protocolMessage": {"type": "EPHEMERAL_SETTING", "ephemeralExpiration": 86400}},
                    {"pollUpdateMessage": {"pollCreationMessageKey": {"ID": "p"}}},
                    {"reactionMessage": {"text": "👍"}},
                    {}):
        doc["message"] = message
        assert dec.decode(doc) == [], message


def test_google_empty_snapshot_message_still_clears() -> None:
    doc = load("google_message_reactions")
    doc["message"]["reactions"] = []
    events = DECODERS["google.json"].decode(doc)
    assert len(events) == 1 and events[0].reactions_snapshot is True


def test_google_outgoing_status_as_number() -> None:
    doc = load("google_message_outgoing")
    del doc["message"]["senderParticipant"]
    doc["message"]["messageStatus"]["status"] = 2
    [ev] = DECODERS["google.json"].decode(doc)
    assert ev.direction == "outgoing" and ev.sender.is_self
    assert ev.sender.raw == "legacy-participant:1"
    assert ev.client_request_id == "tmp_402188917363"


# ------------------------------------------------------------------ errors


def test_unknown_codec() -> None:
    with pytest.raises(UnknownCodec, match="unknown codec 'telegram.json'"):
        decode_frame("telegram.json", 1, {})
    assert issubclass(UnknownCodec, DecodeError)


@pytest.mark.parametrize("version", [0, 2, "1", 1.0, True, None])
def test_unsupported_version(version: Any) -> None:
    with pytest.raises(UnsupportedVersion, match="codec_version"):
        decode_frame("signal.jsonrpc", version, load("signal_text_direct"))


MALFORMED = [
    # codec, payload, expected fragment of the cause
    ("signal.jsonrpc", "{not json", "not valid JSON"),
    ("signal.jsonrpc", '{"a": NaN}', "not valid JSON"),
    ("signal.jsonrpc", "[1, 2]", "must be a JSON object, got an array"),
    ("signal.jsonrpc", 42, "must be a JSON object, got a number"),
    ("signal.jsonrpc", "[" * 100_000, "nested too deeply"),
    ("signal.jsonrpc", {"jsonrpc": "2.0", "method": "send", "params": {}}, "only 'receive'"),
    ("signal.jsonrpc", {"jsonrpc": "2.0", "result": {"timestamp": 1}, "id": 4}, "only 'receive'"),
    ("signal.jsonrpc", {"hello": "world"}, "not a signal-cli receive notification"),
    ("signal.jsonrpc", {"method": "receive", "params": {"envelope": []}}, "params.envelope must be an object"),
    ("signal.jsonrpc", {"method": "receive", "params": {"envelope": {"timestamp": 5,
                        "dataMessage": {"timestamp": 5, "message": "hi"}}}}, "no source address"),
    ("signal.jsonrpc", {"envelope": {"sourceUuid": "u", "timestamp": "soon",
                        "dataMessage": {"message": "hi"}}}, "envelope.timestamp must be an integer"),
    ("signal.jsonrpc", {"envelope": {"sourceUuid": "u", "timestamp": -3,
                        "dataMessage": {"message": "hi"}}}, "must be positive"),
    ("signal.jsonrpc", {"envelope": {"sourceUuid": "u", "dataMessage": {"message": "hi"}}},
     "dataMessage.timestamp is missing"),
    ("signal.jsonrpc", {"envelope": {"sourceUuid": "u", "timestamp": 9,
                        "dataMessage": {"message": 7}}}, "dataMessage.message must be a string"),
    ("signal.jsonrpc", {"envelope": {"sourceUuid": "u", "timestamp": 9, "dataMessage": {
        "reaction": {"emoji": "👍", "targetAuthorUuid": "v"}}}}, "targetSentTimestamp is missing"),
    ("signal.jsonrpc", {"envelope": {"sourceUuid": "u", "timestamp": 9, "receiptMessage": {
        "isRead": True, "timestamps": [1, "x"]}}}, "timestamps[1] must be an integer"),
    ("signal.jsonrpc", {"envelope": {"sourceUuid": "u", "timestamp": 10**30,
                        "dataMessage": {"message": "hi"}}}, "out of the 64-bit range"),
    ("signal.jsonrpc", {"envelope": {"sourceUuid": "u", "timestamp": 2**62,
                        "dataMessage": {"message": "hi"}}}, "year 9999"),
    ("signal.jsonrpc", {"envelope": {"sourceUuid": "u", "timestamp": 9, "syncMessage": {
        "sentMessage": {"timestamp": 9, "message": "hi"}}}, "account": "+1"},
     "no group and no counterpart"),
    ("signal.jsonrpc", {"envelope": {"sourceUuid": "u\x00", "timestamp": 9,
                        "dataMessage": {"message": "hi"}}}, "NUL"),
    ("whatsapp.event", {"kind": "presence"}, "payload.kind is 'presence'"),
    ("whatsapp.event", {"kind": "message", "message_id": "m", "timestamp_ms": 1, "message": {}},
     "payload.chat_jid is missing"),
    ("whatsapp.event", {"kind": "message", "chat_jid": "c@s.whatsapp.net", "message_id": "m",
                        "timestamp_ms": 0, "message": {}}, "timestamp_ms must be positive"),
    ("whatsapp.event", {"kind": "message", "chat_jid": "c@s.whatsapp.net", "message_id": "m",
                        "timestamp_ms": 1}, "payload.message is missing"),
    ("whatsapp.event", {"kind": "message", "chat_jid": "g@g.us", "message_id": "m", "is_group": True,
                        "timestamp_ms": 1, "message": {"conversation": "hi"}}, "sender_jid is missing"),
    ("whatsapp.event", {"kind": "message", "chat_jid": "c@s.whatsapp.net", "message_id": "m",
                        "timestamp_ms": 1, "message": {"protocolMessage": {"type": "REVOKE"}}},
     "protocolMessage.key is missing"),
    ("whatsapp.event", {"kind": "message", "chat_jid": "c@s.whatsapp.net", "message_id": "m",
                        "timestamp_ms": 1, "is_from_me": "yes", "message": {"conversation": "x"}},
     "is_from_me must be a boolean"),
    ("whatsapp.event", {"kind": "receipt", "chat_jid": "c@s.whatsapp.net", "timestamp_ms": 1,
                        "receipt_type": "read", "message_ids": "m1"}, "message_ids must be an array"),
    ("whatsapp.event", {"kind": "history_sync", "conversations": [{"chat_jid": "c@s.whatsapp.net",
                        "messages": [{"message_id": "m", "timestamp_ms": 1, "message": {"conversation": "x"},
                                      "sender_jid": 5}]}]},
     "conversations[0].messages[0].sender_jid must be a string"),
    ("whatsapp.event", {"kind": "message", "chat_jid": "c@s.whatsapp.net", "message_id": "m",
                        "timestamp_ms": 1, "message": {"ephemeralMessage": {"message": {
                            "ephemeralMessage": {"message": {"ephemeralMessage": {"message": {
                                "ephemeralMessage": {"message": {"ephemeralMessage": {"message": {
                                    "ephemeralMessage": {"message": {"ephemeralMessage": {
                                        "message": {"conversation": "deep"}}}}}}}}}}}}}}}},
     "wrapped more than"),
    ("google.json", {"kind": "typing"}, "payload.kind is 'typing'"),
    ("google.json", {"kind": "message"}, "payload.message is missing"),
    ("google.json", {"kind": "conversation", "conversation": {"name": "x"}},
     "conversation.conversationID is missing"),
    ("google.json", {"kind": "message", "message": {"messageID": "1", "conversationID": "2",
                     "timestamp": "12.5"}}, "timestamp must be an integer"),
    ("google.json", {"kind": "message", "message": {"messageID": "1", "conversationID": "2",
                     "timestamp": "999", "participantID": "3",
                     "messageInfo": [{"messageContent": {"content": "hi"}}]}}, "less than a millisecond"),
    ("google.json", {"kind": "message", "message": {"messageID": "1", "conversationID": "2",
                     "timestamp": "1717180000000000",
                     "messageInfo": [{"messageContent": {"content": "hi"}}]}}, "names no sender"),
    ("google.json", {"kind": "message", "message": {"messageID": "1", "conversationID": "2",
                     "timestamp": "1717180000000000", "participantID": "3",
                     "reactions": [{"data": {"unicode": "👍"}, "participantIDs": [3]}]}},
     "participantIDs[0] must be a string"),
    ("google.json", {"kind": "message", "message": {"messageID": "1", "conversationID": "2",
                     "timestamp": "1717180000000000", "participantID": "3",
                     "reactions": [{"data": {"unicode": "👍" * 70}}]}}, "emoji is 70 characters"),
    ("google.json", {"kind": "conversation", "conversation": {"conversationID": "1",
                     "participants": [{"ID": {"number": "+"}}]}}, "has no digits"),
]


@pytest.mark.parametrize(("codec", "payload", "cause"), MALFORMED,
                         ids=[f"{c}-{i}" for i, (c, _, _) in enumerate(MALFORMED)])
def test_malformed_payloads_give_a_useful_cause(codec: str, payload: Any, cause: str) -> None:
    with pytest.raises(DecodeError) as info:
        decode_frame(codec, 1, payload)
    assert cause in info.value.cause
    assert str(info.value) == info.value.cause


def test_safety_net_wraps_unexpected_errors() -> None:
    class Broken(type(DECODERS["google.json"])):
        def _decode(self, doc: dict) -> list:
            return doc["missing"]

    with pytest.raises(DecodeError, match="malformed payload \\(KeyError"):
        Broken().decode({})


# ------------------------------------------------------------------ the README sample


def test_signal_sample_jsonl_is_a_valid_tour() -> None:
    lines = (FIXTURES / "signal_sample.jsonl").read_text().splitlines()
    assert 12 <= len(lines) <= 20
    keys = set()
    bodies = []
    kinds = set()
    for line in lines:
        frame = json.loads(line)
        assert set(frame) <= {"codec", "codec_version", "dedupe_key", "received_at_ms", "payload"}
        assert frame["codec"] == "signal.jsonrpc" and frame["codec_version"] == 1
        assert isinstance(frame["dedupe_key"], str) and frame["dedupe_key"] not in keys
        keys.add(frame["dedupe_key"])
        for ev in decode_frame(frame["codec"], frame["codec_version"], frame["payload"]):
            kinds.add(type(ev).__name__)
            if isinstance(ev, MessageEvent):
                bodies.append(ev.body)
    assert "@assistant what's for dinner" in bodies
    assert kinds == {"MessageEvent", "MessageMutationEvent", "ReactionEvent", "ReceiptEvent"}


# ------------------------------------------------------------------ fuzzing

FIELD_NAMES = sorted({
    # signal-cli
    "jsonrpc", "method", "params", "result", "subscription", "envelope", "account", "source",
    "sourceNumber", "sourceUuid", "sourceName", "timestamp", "dataMessage", "editMessage",
    "syncMessage", "sentMessage", "readMessages", "receiptMessage", "typingMessage", "message",
    "reaction", "emoji", "targetAuthor", "targetAuthorNumber", "targetAuthorUuid",
    "targetSentTimestamp", "isRemove", "remoteDelete", "groupInfo", "groupId", "quote", "id",
    "authorUuid", "attachments", "destination", "destinationUuid", "isDelivery", "isRead",
    "isViewed", "timestamps", "when", "isExpirationUpdate", "sender", "senderUuid",
    # whatsmeow frame
    "kind", "chat_jid", "sender_jid", "message_id", "timestamp_ms", "is_from_me", "is_group",
    "push_name", "receipt_type", "message_ids", "conversations", "messages", "conversation",
    "extendedTextMessage", "text", "contextInfo", "stanzaID", "imageMessage", "caption",
    "reactionMessage", "key", "ID", "protocolMessage", "type", "editedMessage",
    "ephemeralMessage", "senderTimestampMS", "timestampMS", "fileLength",
    # libgm
    "messageID", "conversationID", "participantID", "messageInfo", "messageContent", "content",
    "mediaContent", "mediaID", "messageStatus", "status", "tmpID", "reactions", "data",
    "unicode", "participantIDs", "replyMessage", "senderParticipant", "isMe", "number",
    "fullName", "formattedNumber", "isGroupChat", "participants", "name", "size",
})

NASTY = st.sampled_from([
    None, True, False, 0, -1, 1, 2**31, 2**63, 2**64, -(2**63) - 1, 10**30, 1.5, 1e308, -0.0,
    "", " ", "\x00", "\ud800", "💥", "+", "anon:", "x" * 600, "1717160000000", "-5", "1e3",
    "REVOKE", "MESSAGE_EDIT", "OUTGOING_DELIVERED", "message", "receipt", "history_sync",
    "conversation", "receive", "read-self", [], {}, [None], [""], {"": None},
])

SCALARS = (st.none() | st.booleans() | st.integers(min_value=-(2**70), max_value=2**70)
           | st.floats(allow_nan=False) | st.text(max_size=12) | NASTY)
JSON = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=4)
    | st.dictionaries(st.sampled_from(FIELD_NAMES) | st.text(max_size=6), inner, max_size=5),
    max_leaves=25,
)

FUZZ = settings(max_examples=120, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow])


def _paths(value: Any, prefix: tuple = ()) -> list[tuple]:
    out = [prefix]
    if isinstance(value, dict):
        for k, v in value.items():
            out += _paths(v, prefix + (k,))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out += _paths(v, prefix + (i,))
    return out


def _mutate(doc: Any, data: st.DataObject) -> Any:
    doc = copy.deepcopy(doc)
    for _ in range(data.draw(st.integers(1, 4), label="mutations")):
        path = data.draw(st.sampled_from(_paths(doc)), label="path")
        if not path:
            doc = copy.deepcopy(data.draw(JSON, label="root"))
            continue
        parent = doc
        for step in path[:-1]:
            parent = parent[step]
        last = path[-1]
        op = data.draw(st.sampled_from(["drop", "replace", "nasty", "wrap"]), label="op")
        if op == "drop":
            if isinstance(parent, dict):
                del parent[last]
            else:
                parent.pop(last)
        elif op == "replace":  # drawn values may share objects: copy before inserting
            parent[last] = copy.deepcopy(data.draw(JSON, label="value"))
        elif op == "nasty":
            parent[last] = copy.deepcopy(data.draw(NASTY, label="nasty"))
        elif data.draw(st.booleans(), label="wrap in a list"):
            parent[last] = [parent[last]]
        else:
            parent[last] = {"message": parent[last]}
    return doc


def _check_contract(codec: str, payload: Any) -> None:
    """decode returns validated events or raises DecodeError: never anything else. Every
    identity carries a true proof (``identity_ref``), which is what lets validate_event and
    the projection skip canonicalising it again."""
    try:
        events = DECODERS[codec].decode(payload)
    except DecodeError as exc:
        assert exc.cause and isinstance(exc.cause, str)
        return
    assert isinstance(events, list)
    for ev in events:
        validate_event(ev)
        _check_proofs(DECODERS[codec].platform, ev)


def _check_proofs(platform: str, ev: Any) -> None:
    refs = [getattr(ev, name) for name in ("sender", "actor") if hasattr(ev, name)]
    refs += [part.identity for part in getattr(ev, "participants", ())]
    for ref in refs:
        assert ref.platform == platform, ref
        assert identity_key(platform, ref.raw) == (ref.kind, ref.canonical), ref
    validate_event(_unproven(ev))  # the full check, canonicalisation included, passes too


def _unproven(ev: Any) -> Any:
    """``ev`` with every identity rebuilt by the constructor (no proof)."""
    def plain(ref: IdentityRef) -> IdentityRef:
        return IdentityRef(ref.raw, ref.name, ref.is_self, ref.kind, ref.canonical)

    if isinstance(ev, ConversationEvent):
        return dataclasses.replace(ev, participants=tuple(
            dataclasses.replace(p, identity=plain(p.identity)) for p in ev.participants))
    for name in ("sender", "actor"):
        if hasattr(ev, name):
            return dataclasses.replace(ev, **{name: plain(getattr(ev, name))})
    return ev


def _check_strict(codec: str, payload: dict) -> None:
    """Without the safety net: every failure is a deliberate DecodeError/InvalidEvent."""
    try:
        events = DECODERS[codec]._decode(payload)
    except (DecodeError, InvalidEvent):
        return
    for ev in events:
        try:
            validate_event(ev)
        except InvalidEvent:
            pass


SEEDS = {codec: [load(n) for n in all_fixture_names() if codec_of(n) == codec]
         for codec in DECODERS}


@pytest.mark.parametrize("codec", sorted(DECODERS))
@FUZZ
@given(value=JSON)
def test_fuzz_random_json(codec: str, value: Any) -> None:
    _check_contract(codec, value)
    _check_contract(codec, json.dumps(value))
    if isinstance(value, dict):
        _check_strict(codec, value)


SWEEP_VALUES = [
    None, True, 0, -1, 2**64, -(2**63) - 1, 10**40, 1e300, 0.5, "", " ", "\x00", "\ud800",
    "💥" * 3, "x" * 600, "1717160000000", "+", [], [None], [1, "a"], {}, {"": {}},
]


def _sweep(doc: Any):
    """Every single-point mutation of ``doc``: drop each key/item, swap each value."""
    for path in _paths(doc)[1:]:
        for value in [_DROP] + SWEEP_VALUES:
            mutated = copy.deepcopy(doc)
            parent = mutated
            for step in path[:-1]:
                parent = parent[step]
            if value is _DROP:
                del parent[path[-1]]
            else:
                parent[path[-1]] = copy.deepcopy(value)
            yield mutated


_DROP = object()


@pytest.mark.parametrize("codec", sorted(DECODERS))
def test_every_single_point_mutation_of_every_fixture(codec: str) -> None:
    count = 0
    for seed in SEEDS[codec]:
        for mutated in _sweep(seed):
            _check_contract(codec, mutated)
            _check_strict(codec, mutated)
            count += 1
    assert count > 1000


@pytest.mark.parametrize("codec", sorted(DECODERS))
@settings(FUZZ, max_examples=300)
@given(data=st.data())
def test_fuzz_mutated_fixtures(codec: str, data: st.DataObject) -> None:
    seed = data.draw(st.sampled_from(SEEDS[codec]), label="fixture")
    mutated = _mutate(seed, data)
    _check_contract(codec, mutated)
    if isinstance(mutated, dict):
        _check_strict(codec, mutated)


@pytest.mark.parametrize("codec", sorted(DECODERS))
@FUZZ
@given(text=st.text(max_size=40) | st.binary(max_size=40).map(lambda b: b.decode("latin-1")))
def test_fuzz_random_text(codec: str, text: str) -> None:
    _check_contract(codec, text)


@FUZZ
@given(codec=st.text(max_size=20) | st.sampled_from(sorted(DECODERS)),
       version=st.none() | st.integers() | st.booleans() | st.text(max_size=3), payload=JSON)
def test_fuzz_decode_frame(codec: str, version: Any, payload: Any) -> None:
    try:
        events = decode_frame(codec, version, payload)
    except DecodeError:
        return
    for ev in events:
        validate_event(ev)
        _check_proofs(DECODERS[codec].platform, ev)
