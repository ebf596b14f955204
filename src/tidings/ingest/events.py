"""The closed event union that decoders produce and the projection consumes.

A decoder turns one bridge frame into a list of these events; the projection applies
them. Nothing else travels between the two, so everything the projection may rely on is
written down here and enforced by :func:`validate_event`:

* ids (conversation, message, receipt targets) are non-blank, at most ``MAX_ID_LEN``
  characters, and never contain NUL or lone surrogates (PostgreSQL text rejects both);
* times are unix milliseconds in ``1 .. MAX_TIME_MS`` (up to the end of year 9999);
* enumerations are closed (see the ``*_KINDS`` / ``DIRECTIONS`` / ... sets below);
* an identity has a non-blank ``raw`` that :func:`identity_key` can canonicalise.

Anonymous reactors. Google Messages can report a reaction emoji with no participant
ids. Such a reaction is carried with ``IdentityRef(raw="anon:<emoji>",
kind="anonymous", canonical="anon:<emoji>")``. :func:`identity_key` maps any
``anon:`` raw to the kind ``anonymous``; the projection must not create an identity row
for that kind and uses ``canonical`` as the reactor key (one anonymous reactor per emoji
per message, which is what the reference's ``anon:<emoji>`` reactor key does).

Reaction snapshots. ``MessageEvent.reactions_snapshot=True`` (Google only) says the
frame carries the complete reaction set of that message: the ``ReactionEvent``s of the
same frame that target it are the whole set, and reactors absent from them have removed
their reaction. A snapshot with zero reaction events is still a snapshot (it clears).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "ANON_PREFIX",
    "CONVERSATION_KINDS",
    "DIRECTIONS",
    "IDENTITY_KINDS",
    "LEGACY_PARTICIPANT_PREFIX",
    "MAX_EMOJI_LEN",
    "MAX_ID_LEN",
    "MAX_TIME_MS",
    "MUTATION_KINDS",
    "PLATFORMS",
    "REACTION_ACTIONS",
    "RECEIPT_STATUSES",
    "ConversationEvent",
    "Event",
    "IdentityRef",
    "InvalidEvent",
    "MessageEvent",
    "MessageMutationEvent",
    "Participant",
    "ReactionEvent",
    "ReceiptEvent",
    "identity_key",
    "identity_ref",
    "validate_event",
]

#: The bridge platforms, written once (in this order wherever they are listed).
PLATFORMS = ("signal", "whatsapp", "google")
CONVERSATION_KINDS = frozenset({"direct", "group", "broadcast", "system"})
DIRECTIONS = frozenset({"incoming", "outgoing"})
MUTATION_KINDS = frozenset({"edit", "delete"})
REACTION_ACTIONS = frozenset({"add", "remove", "switch"})
RECEIPT_STATUSES = frozenset({"delivered", "read", "failed"})
IDENTITY_KINDS = frozenset(
    {"e164", "signal_aci", "jid", "email", "legacy_participant", "username", "anonymous"}
)

ANON_PREFIX = "anon:"
LEGACY_PARTICIPANT_PREFIX = "legacy-participant:"
MAX_ID_LEN = 512
MAX_EMOJI_LEN = 64
MAX_ROLE_LEN = 32
MAX_TIME_MS = 253_402_300_799_999  # 9999-12-31T23:59:59.999Z
_MAX_ATTACHMENT_DEPTH = 8


class InvalidEvent(ValueError):
    """An event (or identity) that a projection must not accept; the message says why."""


# --------------------------------------------------------------------------- events


@dataclass(frozen=True, slots=True)
class IdentityRef:
    """Who did something. ``raw`` is what the network calls them; ``kind``/``canonical``
    are :func:`identity_key` of it (decoders fill them in, they may be left empty).

    ``platform`` is the proof that ``kind``/``canonical`` ARE ``identity_key(platform,
    raw)``: only :func:`identity_ref` sets it (after canonicalising), the constructor
    cannot (``init=False``), ``dataclasses.replace`` drops it, and the instance is frozen,
    so ``raw`` cannot change under it. ``""`` means "not proven": :func:`validate_event`
    then canonicalises ``raw`` itself, and the projection always does. It takes no part
    in equality, hashing or ``repr``.
    """

    raw: str
    name: str = ""
    is_self: bool = False
    kind: str = ""
    canonical: str = ""
    platform: str = field(default="", init=False, repr=False, compare=False)


@dataclass(frozen=True, slots=True)
class Participant:
    identity: IdentityRef
    role: str = "member"
    active: bool = True


@dataclass(frozen=True, slots=True)
class ConversationEvent:
    """The state of one conversation: its kind, title and full roster."""

    remote_conversation_id: str
    kind: str
    title: str
    participants: tuple[Participant, ...]
    remote_revision: str | None


@dataclass(frozen=True, slots=True)
class MessageEvent:
    remote_conversation_id: str
    remote_message_id: str
    sender: IdentityRef
    direction: str
    body: str
    occurred_at_ms: int
    client_request_id: str = ""
    reply_to_remote_id: str | None = None
    attachments: tuple[dict[str, Any], ...] = ()
    reactions_snapshot: bool = False


@dataclass(frozen=True, slots=True)
class MessageMutationEvent:
    """An edit (new ``body``) or a delete (``body`` empty) of an earlier message."""

    remote_conversation_id: str
    remote_message_id: str
    kind: str
    body: str
    occurred_at_ms: int


@dataclass(frozen=True, slots=True)
class ReactionEvent:
    remote_conversation_id: str
    target_remote_message_id: str
    actor: IdentityRef
    emoji: str
    action: str
    occurred_at_ms: int


@dataclass(frozen=True, slots=True)
class ReceiptEvent:
    remote_conversation_id: str
    remote_message_ids: tuple[str, ...]
    actor: IdentityRef
    status: str
    occurred_at_ms: int


Event = ConversationEvent | MessageEvent | MessageMutationEvent | ReactionEvent | ReceiptEvent

_EVENT_TYPES = (
    ConversationEvent,
    MessageEvent,
    MessageMutationEvent,
    ReactionEvent,
    ReceiptEvent,
)


# --------------------------------------------------------------------------- identities

#: What a phone number's canonical form drops: anything but the ASCII digits 0-9.
_NOT_ASCII_DIGIT = re.compile("[^0-9]")
_UUID_RE = re.compile(
    r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"
)


def identity_key(platform: str, raw: str) -> tuple[str, str]:
    """Canonicalise a network identity into ``(kind, canonical)``.

    The single implementation of the identity rules; the projection imports it. ``raw``
    is trimmed, then the first matching rule wins:

    0. ``anon:<emoji>`` -> ``anonymous``, as-is (see the module docstring);
    1. leading ``+`` -> ``e164``: ``+`` and the digits only (no digit is an error);
    2. Signal and a UUID -> ``signal_aci``, lowercased;
    3. WhatsApp and contains ``@`` -> ``jid``, lowercased;
    4. contains ``@`` -> ``email``, lowercased;
    5. starts with ``legacy-participant:`` -> ``legacy_participant``, as-is;
    6. anything else -> ``username``, as-is.

    An empty value raises :class:`InvalidEvent`; an unknown platform is a caller bug and
    raises ``ValueError``.
    """
    if platform not in PLATFORMS:
        raise ValueError(f"unknown platform {platform!r}; expected one of {sorted(PLATFORMS)}")
    return _canonicalise(platform, raw)


def identity_ref(platform: str, raw: str, name: str = "", is_self: bool = False) -> IdentityRef:
    """An :class:`IdentityRef` whose ``kind``/``canonical`` are ``identity_key(platform,
    raw)``, carrying that proof (``platform``) so that neither :func:`validate_event` nor
    the projection canonicalises it again. Raises :class:`InvalidEvent` like
    :func:`identity_key`. This is how decoders build identities: one canonicalisation
    per sighting."""
    kind, canonical = identity_key(platform, raw)
    ref = IdentityRef(raw, name, is_self, kind, canonical)
    object.__setattr__(ref, "platform", platform)
    return ref


def _canonicalise(platform: str, raw: str) -> tuple[str, str]:
    if not isinstance(raw, str):
        raise InvalidEvent(f"identity must be a string, got {type(raw).__name__}")
    value = raw.strip()
    if not value:
        raise InvalidEvent("identity is empty")
    if value.startswith(ANON_PREFIX):
        if not value[len(ANON_PREFIX):].strip():
            raise InvalidEvent(f"anonymous identity {value!r} names no emoji")
        return "anonymous", value
    if value.startswith("+"):
        digits = _NOT_ASCII_DIGIT.sub("", value)
        if not digits:
            raise InvalidEvent(f"phone number {value!r} has no digits")
        return "e164", "+" + digits
    if platform == "signal" and _UUID_RE.fullmatch(value):
        return "signal_aci", value.lower()
    if "@" in value:
        return ("jid" if platform == "whatsapp" else "email"), value.lower()
    if value.startswith(LEGACY_PARTICIPANT_PREFIX):
        return "legacy_participant", value
    return "username", value


# --------------------------------------------------------------------------- validation


def validate_event(ev: object) -> None:
    """Raise :class:`InvalidEvent` naming the first thing a projection must not accept."""
    if not isinstance(ev, _EVENT_TYPES):
        raise InvalidEvent(f"not an event: {type(ev).__name__}")
    name = type(ev).__name__
    if isinstance(ev, ConversationEvent):
        _check_id(name, "remote_conversation_id", ev.remote_conversation_id)
        _check_enum(name, "kind", ev.kind, CONVERSATION_KINDS)
        _check_text(name, "title", ev.title)
        if not isinstance(ev.participants, tuple):
            raise InvalidEvent(f"{name}.participants must be a tuple")
        for i, part in enumerate(ev.participants):
            where = f"{name}.participants[{i}]"
            if not isinstance(part, Participant):
                raise InvalidEvent(f"{where} must be a Participant, got {type(part).__name__}")
            _check_identity(where + ".identity", part.identity)
            _check_text(where, "role", part.role, blank_ok=False, max_len=MAX_ROLE_LEN)
            _check_bool(where, "active", part.active)
        if ev.remote_revision is not None:
            _check_id(name, "remote_revision", ev.remote_revision)
    elif isinstance(ev, MessageEvent):
        _check_id(name, "remote_conversation_id", ev.remote_conversation_id)
        _check_id(name, "remote_message_id", ev.remote_message_id)
        _check_identity(name + ".sender", ev.sender)
        _check_enum(name, "direction", ev.direction, DIRECTIONS)
        _check_text(name, "body", ev.body)
        _check_time(name, ev.occurred_at_ms)
        _check_text(name, "client_request_id", ev.client_request_id, max_len=MAX_ID_LEN)
        if ev.reply_to_remote_id is not None:
            _check_id(name, "reply_to_remote_id", ev.reply_to_remote_id)
        _check_attachments(name, ev.attachments)
        _check_bool(name, "reactions_snapshot", ev.reactions_snapshot)
    elif isinstance(ev, MessageMutationEvent):
        _check_id(name, "remote_conversation_id", ev.remote_conversation_id)
        _check_id(name, "remote_message_id", ev.remote_message_id)
        _check_enum(name, "kind", ev.kind, MUTATION_KINDS)
        _check_text(name, "body", ev.body)
        if ev.kind == "edit" and not ev.body.strip():
            raise InvalidEvent(f"{name}: an edit must carry the new body, got a blank one")
        if ev.kind == "delete" and ev.body:
            raise InvalidEvent(f"{name}: a delete carries no body")
        _check_time(name, ev.occurred_at_ms)
    elif isinstance(ev, ReactionEvent):
        _check_id(name, "remote_conversation_id", ev.remote_conversation_id)
        _check_id(name, "target_remote_message_id", ev.target_remote_message_id)
        _check_identity(name + ".actor", ev.actor)
        _check_enum(name, "action", ev.action, REACTION_ACTIONS)
        _check_text(name, "emoji", ev.emoji, max_len=MAX_EMOJI_LEN)
        if ev.action != "remove" and not ev.emoji.strip():
            raise InvalidEvent(f"{name}: action {ev.action!r} needs an emoji")
        _check_time(name, ev.occurred_at_ms)
    else:
        assert isinstance(ev, ReceiptEvent)
        _check_id(name, "remote_conversation_id", ev.remote_conversation_id)
        if not isinstance(ev.remote_message_ids, tuple):
            raise InvalidEvent(f"{name}.remote_message_ids must be a tuple")
        if not ev.remote_message_ids:
            raise InvalidEvent(f"{name}.remote_message_ids is empty")
        for i, mid in enumerate(ev.remote_message_ids):
            _check_id(name, f"remote_message_ids[{i}]", mid)
        _check_identity(name + ".actor", ev.actor)
        _check_enum(name, "status", ev.status, RECEIPT_STATUSES)
        _check_time(name, ev.occurred_at_ms)


def _check_text(
    owner: str, field: str, value: Any, *, blank_ok: bool = True, max_len: int | None = None
) -> None:
    if not isinstance(value, str):
        raise InvalidEvent(f"{owner}.{field} must be a string, got {type(value).__name__}")
    if "\x00" in value:
        raise InvalidEvent(f"{owner}.{field} contains a NUL character")
    if not value.isascii():  # ASCII text holds no surrogate: skip the encode
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise InvalidEvent(f"{owner}.{field} is not valid Unicode (lone surrogate)") from None
    if not blank_ok and not value.strip():
        raise InvalidEvent(f"{owner}.{field} is blank")
    if max_len is not None and len(value) > max_len:
        raise InvalidEvent(f"{owner}.{field} is {len(value)} characters long (max {max_len})")


def _check_id(owner: str, field: str, value: Any) -> None:
    _check_text(owner, field, value, blank_ok=False, max_len=MAX_ID_LEN)


def _check_enum(owner: str, field: str, value: Any, allowed: frozenset[str]) -> None:
    if not isinstance(value, str) or value not in allowed:
        raise InvalidEvent(f"{owner}.{field} is {value!r}; expected one of {sorted(allowed)}")


def _check_bool(owner: str, field: str, value: Any) -> None:
    if not isinstance(value, bool):
        raise InvalidEvent(f"{owner}.{field} must be a bool, got {type(value).__name__}")


def _check_time(owner: str, value: Any) -> None:
    if not isinstance(value, int) or isinstance(value, bool):
        raise InvalidEvent(f"{owner}.occurred_at_ms must be an int, got {type(value).__name__}")
    if value <= 0:
        raise InvalidEvent(f"{owner}.occurred_at_ms is {value}; it must be positive")
    if value > MAX_TIME_MS:
        raise InvalidEvent(f"{owner}.occurred_at_ms is {value}; that is past the year 9999")


def _check_identity(where: str, ref: Any) -> None:
    if not isinstance(ref, IdentityRef):
        raise InvalidEvent(f"{where} must be an IdentityRef, got {type(ref).__name__}")
    _check_text(where, "raw", ref.raw, blank_ok=False, max_len=MAX_ID_LEN)
    _check_text(where, "name", ref.name)
    _check_bool(where, "is_self", ref.is_self)
    _check_text(where, "canonical", ref.canonical, max_len=MAX_ID_LEN)
    if ref.kind:
        _check_enum(where, "kind", ref.kind, IDENTITY_KINDS)
        if not ref.canonical.strip():
            raise InvalidEvent(f"{where} has kind {ref.kind!r} but no canonical value")
    elif not isinstance(ref.kind, str):
        raise InvalidEvent(f"{where}.kind must be a string")
    elif ref.canonical:
        raise InvalidEvent(f"{where} has a canonical value but no kind")
    if ref.platform:
        # Built by identity_ref: kind/canonical are identity_key(platform, raw) of this
        # very (frozen) raw, so raw is proven canonicalisable; doing it again proves nothing.
        return
    try:
        # The platform-specific rules only choose between kinds; whether a value can be
        # canonicalised at all does not depend on the platform.
        _canonicalise("google", ref.raw)
    except InvalidEvent as exc:
        raise InvalidEvent(f"{where}.raw cannot be canonicalised: {exc}") from None


def _check_attachments(owner: str, attachments: Any) -> None:
    if not isinstance(attachments, tuple):
        raise InvalidEvent(f"{owner}.attachments must be a tuple")
    for i, att in enumerate(attachments):
        where = f"{owner}.attachments[{i}]"
        if not isinstance(att, dict):
            raise InvalidEvent(f"{where} must be a dict, got {type(att).__name__}")
        _check_json_value(where, att, 0)
        try:
            json.dumps(att, allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise InvalidEvent(f"{where} is not JSON-serialisable: {exc}") from None


def _check_json_value(where: str, value: Any, depth: int) -> None:
    if depth > _MAX_ATTACHMENT_DEPTH:
        raise InvalidEvent(f"{where} is nested too deeply")
    if isinstance(value, str):
        _check_text(where, "<value>", value)
    elif isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise InvalidEvent(f"{where} has a non-string key {key!r}")
            _check_text(where, "<key>", key)
            _check_json_value(f"{where}.{key}", item, depth + 1)
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            _check_json_value(f"{where}[{i}]", item, depth + 1)
    elif value is None or isinstance(value, (bool, int, float)):
        return
    else:
        raise InvalidEvent(f"{where} holds a {type(value).__name__}, which is not JSON")
