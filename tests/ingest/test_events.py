"""The event union's guard (validate_event) and the identity canonicalisation."""

from __future__ import annotations

import dataclasses

import pytest

from tidings.ingest.events import (
    MAX_TIME_MS,
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

ALICE = IdentityRef(raw="+14155550111", name="Alice", kind="e164", canonical="+14155550111")

GOOD = {
    "conversation": ConversationEvent(
        remote_conversation_id="37",
        kind="group",
        title="Climbing crew",
        participants=(Participant(identity=ALICE), Participant(IdentityRef(raw="bob"), "admin")),
        remote_revision=None,
    ),
    "message": MessageEvent(
        remote_conversation_id="c1",
        remote_message_id="m1",
        sender=ALICE,
        direction="incoming",
        body="",
        occurred_at_ms=1,
        attachments=({"v": 1, "kind": "remote", "nested": {"a": [1, "x", None]}},),
    ),
    "mutation": MessageMutationEvent("c1", "m1", "edit", "new text", 1717000000000),
    "reaction": ReactionEvent("c1", "m1", ALICE, "", "remove", 1717000000000),
    "receipt": ReceiptEvent("c1", ("m1", "m2"), ALICE, "read", MAX_TIME_MS),
}


@pytest.mark.parametrize("name", sorted(GOOD))
def test_valid_events_pass(name: str) -> None:
    validate_event(GOOD[name])


def _bad(name: str, **changes):
    return dataclasses.replace(GOOD[name], **changes)


BAD = [
    ("not an event", {"x": 1}, "not an event"),
    ("blank conversation id", _bad("message", remote_conversation_id="  "), "remote_conversation_id is blank"),
    ("blank message id", _bad("mutation", remote_message_id=""), "remote_message_id is blank"),
    ("id too long", _bad("message", remote_message_id="x" * 513), "max 512"),
    ("NUL in body", _bad("message", body="a\x00b"), "NUL"),
    ("lone surrogate", _bad("message", body="\ud800"), "lone surrogate"),
    ("zero time", _bad("message", occurred_at_ms=0), "must be positive"),
    ("negative time", _bad("receipt", occurred_at_ms=-5), "must be positive"),
    ("time past 9999", _bad("reaction", occurred_at_ms=MAX_TIME_MS + 1), "year 9999"),
    ("bool time", _bad("mutation", occurred_at_ms=True), "must be an int"),
    ("float time", _bad("mutation", occurred_at_ms=1.5), "must be an int"),
    ("bad direction", _bad("message", direction="sideways"), "direction is 'sideways'"),
    ("bad conversation kind", _bad("conversation", kind="channel"), "kind is 'channel'"),
    ("bad mutation kind", _bad("mutation", kind="pin"), "kind is 'pin'"),
    ("bad action", _bad("reaction", action="toggle"), "action is 'toggle'"),
    ("bad status", _bad("receipt", status="seen"), "status is 'seen'"),
    ("blank edit", _bad("mutation", body="  "), "an edit must carry"),
    ("delete with body", _bad("mutation", kind="delete", body="x"), "a delete carries no body"),
    ("add without emoji", _bad("reaction", action="add", emoji=" "), "needs an emoji"),
    ("emoji too long", _bad("reaction", action="add", emoji="👍" * 65), "max 64"),
    ("no receipt ids", _bad("receipt", remote_message_ids=()), "is empty"),
    ("receipt ids as list", _bad("receipt", remote_message_ids=["m1"]), "must be a tuple"),
    ("blank receipt id", _bad("receipt", remote_message_ids=("m1", "")), "remote_message_ids[1] is blank"),
    ("blank raw", _bad("message", sender=IdentityRef(raw=" ")), "raw is blank"),
    ("phone without digits", _bad("message", sender=IdentityRef(raw="+")), "has no digits"),
    ("unknown identity kind", _bad("message", sender=IdentityRef(raw="x", kind="aim", canonical="x")), "kind is 'aim'"),
    ("kind without canonical", _bad("message", sender=IdentityRef(raw="x", kind="username")), "no canonical"),
    ("canonical without kind", _bad("message", sender=IdentityRef(raw="x", canonical="x")), "no kind"),
    ("sender not identity", _bad("message", sender="alice"), "must be an IdentityRef"),
    ("attachments as list", _bad("message", attachments=[{}]), "must be a tuple"),
    ("attachment not dict", _bad("message", attachments=("x",)), "must be a dict"),
    ("attachment with a set", _bad("message", attachments=({"s": {1}},)), "not JSON"),
    ("attachment with NaN", _bad("message", attachments=({"n": float("nan")},)), "not JSON-serialisable"),
    ("blank reply id", _bad("message", reply_to_remote_id=""), "reply_to_remote_id is blank"),
    ("snapshot not bool", _bad("message", reactions_snapshot=1), "must be a bool"),
    ("participants as list", _bad("conversation", participants=[]), "must be a tuple"),
    ("participant not Participant", _bad("conversation", participants=(ALICE,)), "must be a Participant"),
    ("blank role", _bad("conversation", participants=(Participant(ALICE, role=""),)), "role is blank"),
    ("blank revision", _bad("conversation", remote_revision=""), "remote_revision is blank"),
]


@pytest.mark.parametrize(("label", "event", "cause"), BAD, ids=[b[0] for b in BAD])
def test_invalid_events_are_refused_with_a_cause(label: str, event, cause: str) -> None:
    with pytest.raises(InvalidEvent) as info:
        validate_event(event)
    assert cause in str(info.value)


def test_invalid_event_is_a_value_error() -> None:
    assert issubclass(InvalidEvent, ValueError)


def test_events_are_frozen_and_slotted() -> None:
    ev = GOOD["mutation"]
    with pytest.raises(dataclasses.FrozenInstanceError):
        ev.body = "x"  # type: ignore[misc]
    assert not hasattr(ev, "__dict__")


@pytest.mark.parametrize(
    ("platform", "raw", "expected"),
    [
        ("signal", " +1 (415) 555-0111 ", ("e164", "+14155550111")),
        ("whatsapp", "+447700900123", ("e164", "+447700900123")),
        ("signal", "5E0C1A7E-3F7B-4B8E-9C61-2A4D8F1B0A11", ("signal_aci", "5e0c1a7e-3f7b-4b8e-9c61-2a4d8f1b0a11")),
        ("google", "5E0C1A7E-3F7B-4B8E-9C61-2A4D8F1B0A11", ("username", "5E0C1A7E-3F7B-4B8E-9C61-2A4D8F1B0A11")),
        ("whatsapp", "123456789012345@LID", ("jid", "123456789012345@lid")),
        ("google", "June@Example.com", ("email", "june@example.com")),
        ("signal", "June@Example.com", ("email", "june@example.com")),
        ("google", "legacy-participant:5", ("legacy_participant", "legacy-participant:5")),
        ("google", "Mom", ("username", "Mom")),
        ("google", "anon:❤️", ("anonymous", "anon:❤️")),
        ("signal", "signal-uuid-ish", ("username", "signal-uuid-ish")),
    ],
)
def test_identity_key_rules(platform: str, raw: str, expected: tuple[str, str]) -> None:
    assert identity_key(platform, raw) == expected


@pytest.mark.parametrize("raw", ["", "   ", "+", "+ - ()", "anon:", "anon:  "])
def test_identity_key_refuses_uncanonicalisable_values(raw: str) -> None:
    with pytest.raises(InvalidEvent):
        identity_key("signal", raw)


def test_identity_key_refuses_an_unknown_platform() -> None:
    with pytest.raises(ValueError, match="unknown platform"):
        identity_key("telegram", "+1555")
