"""Codec ``whatsapp.event``: one whatsmeow event, serialised by the bridge as JSON.

What it reads
-------------
The bridge flattens whatsmeow's ``events.Message`` / ``events.Receipt`` (their
``MessageInfo``/``MessageSource``: Chat, Sender, ID, Timestamp, IsFromMe, IsGroup,
PushName; a receipt's MessageIDs and Type) into the docs/api.md §6 shape::

    {"kind": "message"|"receipt"|"history_sync", "chat_jid", "sender_jid",
     "message_id", "timestamp_ms", "is_from_me", "is_group", "push_name",
     "message": <waE2E.Message in protojson>, "receipt_type", "message_ids"}

``message`` is a ``waE2E.Message`` as protojson writes it: lowerCamelCase JSON names of
the proto fields (which in whatsmeow's protos are already camelCase, so names such as
``stanzaID``, ``ID``, ``remoteJID`` keep their capitals), enums by name, 64-bit integers
and bytes as strings. Confirmed in tulir/whatsmeow ``proto/waE2E/WAWebProtobufsE2E.proto``
and ``proto/waCommon/WACommon.proto``:

* ``Message``: ``conversation`` (plain text), ``extendedTextMessage`` (``text``,
  ``contextInfo``), ``imageMessage``/``videoMessage``/``ptvMessage`` (``caption``),
  ``documentMessage`` (``caption``, ``fileName``, ``title``), ``audioMessage``,
  ``stickerMessage``, ``reactionMessage``, ``encReactionMessage``, ``protocolMessage``,
  and the wrappers ``ephemeralMessage``, ``viewOnceMessage``, ``viewOnceMessageV2``,
  ``viewOnceMessageV2Extension``, ``documentWithCaptionMessage``, ``editedMessage``
  (all ``FutureProofMessage{message}``) and ``deviceSentMessage{destinationJID,
  message}``, which are unwrapped first.
* media messages: ``mimetype``, ``fileSHA256``, ``fileEncSHA256``, ``mediaKey``,
  ``directPath``, ``fileLength`` (uint64 -> string), ``contextInfo``.
* ``ContextInfo``: ``stanzaID`` (the id of the quoted message), ``participant``,
  ``quotedMessage``, ``mentionedJID``.
* ``ReactionMessage``: ``key`` (``MessageKey``), ``text`` (the emoji; empty = removed),
  ``senderTimestampMS``.
* ``ProtocolMessage``: ``key``, ``type`` (``REVOKE`` = 0, ``MESSAGE_EDIT`` = 14, ...),
  ``editedMessage`` (a ``Message``), ``timestampMS``.
* ``WACommon.MessageKey``: ``remoteJID``, ``fromMe``, ``ID``, ``participant``.
* Receipt types (``types.ReceiptType`` in whatsmeow): ``""`` (delivered), ``sender``,
  ``retry``, ``read``, ``read-self``, ``played``, ``played-self``, ``server-error``,
  ``inactive``, ``peer_msg``, ``hist_sync``. Both ``-`` and ``_`` spellings are
  accepted, and ``delivered`` as a synonym of ``""``.

History sync (our own simplified shape; whatsmeow's ``waHistorySync.HistorySync`` is
protobuf, the bridge reduces it to this)::

    {"kind": "history_sync",
     "conversations": [{"chat_jid": "...", "is_group": false,
                        "messages": [<a "message" frame without "kind">, ...]}]}

Each item inherits ``chat_jid`` and ``is_group`` from its conversation when it lacks
them. Only MessageEvents are kept from history (reactions, edits and deletes in a
history chunk are dropped, as in the reference); a malformed item is a DecodeError that
names its index.

Remote id rules
---------------
* Conversation: ``whatsapp:<chat_jid>`` (trimmed).
* Message: the WhatsApp message id (``message_id``, the stanza id) as is. Reactions,
  edits and revokes target ``key.ID``, replies ``contextInfo.stanzaID`` and receipts
  ``message_ids``: all the same id space.
* Sender: a phone-number JID (``<digits>[.agent][:device]@s.whatsapp.net``) becomes
  ``+<digits>`` (kind ``e164``); any other JID (``@lid``, ...) is kept without its
  device part (kind ``jid``). ``push_name`` is the name; ``is_from_me`` sets is_self.

What becomes what
-----------------
* ``reactionMessage`` -> ReactionEvent on ``key.ID`` (empty text -> remove); without a
  key id -> nothing. ``encReactionMessage`` -> nothing (we cannot decrypt it).
* ``protocolMessage`` ``REVOKE`` -> delete mutation of ``key.ID`` (a missing key is an
  error); ``MESSAGE_EDIT`` -> edit mutation with the text of ``editedMessage`` (no text
  -> nothing); other protocol types -> nothing.
* anything else with text or media -> MessageEvent (direction from ``is_from_me``, at
  most one attachment); nothing readable -> nothing. Mentions stay as WhatsApp wrote
  them (``@<number>``); no rewriting.
* ``receipt``: ``""``/``delivered`` -> delivered, ``sender`` -> delivered (self),
  ``read``/``played`` -> read, ``read-self``/``played-self`` -> read (self),
  ``server-error`` -> failed; other types (``retry``, ``inactive``, ``peer_msg``,
  ``hist_sync``, anything newer), or no message ids -> nothing. The actor is
  ``sender_jid`` (the chat itself in a direct chat when it is absent).
* WhatsApp emits no ConversationEvents here (a history conversation has no roster).
"""

from __future__ import annotations

from typing import Any

from tidings.ingest.decoders.base import DecodeError, Decoder, Reader
from tidings.ingest.events import (
    Event,
    IdentityRef,
    MessageEvent,
    MessageMutationEvent,
    ReactionEvent,
    ReceiptEvent,
)

_WRAPPERS = (
    "ephemeralMessage",
    "viewOnceMessage",
    "viewOnceMessageV2",
    "viewOnceMessageV2Extension",
    "documentWithCaptionMessage",
    "editedMessage",
    "deviceSentMessage",
)
_MAX_UNWRAP = 6
_MEDIA = (
    ("imageMessage", "image"),
    ("videoMessage", "video"),
    ("ptvMessage", "video"),
    ("audioMessage", "audio"),
    ("documentMessage", "document"),
    ("stickerMessage", "sticker"),
)
# sub-messages that can carry a contextInfo with the quoted stanza id
_CONTEXT_CARRIERS = ("extendedTextMessage",) + tuple(key for key, _ in _MEDIA)

_RECEIPTS = {
    "": ("delivered", False),
    "delivered": ("delivered", False),
    "sender": ("delivered", True),
    "read": ("read", False),
    "read_self": ("read", True),
    "played": ("read", False),
    "played_self": ("read", True),
    "server_error": ("failed", False),
}
_KINDS = ("message", "receipt", "history_sync")


class WhatsAppEventDecoder(Decoder):
    codec = "whatsapp.event"
    platform = "whatsapp"

    def _decode(self, doc: dict[str, Any]) -> list[Event]:
        top = Reader(self.codec, doc, "payload")
        kind = top.text("kind")
        if kind == "message":
            return self._message(top)
        if kind == "receipt":
            return self._receipt(top)
        if kind == "history_sync":
            return self._history(top)
        raise top.fail("kind", f"is {kind!r}; expected one of {list(_KINDS)}")

    # ------------------------------------------------------------------ identities

    def _sender(self, r: Reader, chat_jid: str) -> IdentityRef:
        return self._jid_ref(r, chat_jid, is_self=r.boolean("is_from_me"),
                             name=r.text("push_name"))

    def _jid_ref(self, r: Reader, chat_jid: str, *, is_self: bool, name: str = "") -> IdentityRef:
        jid = r.text("sender_jid").strip()
        if not jid and not is_self and not r.boolean("is_group"):
            jid = chat_jid  # a direct chat is named after the other party
        if not jid:
            raise r.fail("sender_jid", "is missing (required in a group chat or from us)")
        return self.identity(_jid_identity(jid), name=name, is_self=is_self)

    # ------------------------------------------------------------------ messages

    def _message(self, r: Reader) -> list[Event]:
        chat_jid = r.req_text("chat_jid")
        message_id = r.req_text("message_id")
        ts = r.req_positive("timestamp_ms")
        conv = "whatsapp:" + chat_jid
        content = _unwrap(r.req_obj("message"))
        reaction = content.obj("reactionMessage")
        if reaction is not None:
            return self._reaction(r, conv, chat_jid, reaction, ts)
        if content.has("encReactionMessage"):
            return []
        protocol = content.obj("protocolMessage")
        if protocol is not None:
            return self._protocol(conv, protocol, ts)
        body = _text_of(content)
        attachment = _attachment(content)
        if not body.strip() and attachment is None:
            return []
        reply_to = None
        for key in _CONTEXT_CARRIERS:
            sub = content.obj(key)
            ctx = sub.obj("contextInfo") if sub is not None else None
            if ctx is not None and ctx.text("stanzaID").strip():
                reply_to = ctx.text("stanzaID").strip()
                break
        return [MessageEvent(
            remote_conversation_id=conv,
            remote_message_id=message_id,
            sender=self._sender(r, chat_jid),
            direction="outgoing" if r.boolean("is_from_me") else "incoming",
            body=body,
            occurred_at_ms=ts,
            reply_to_remote_id=reply_to,
            attachments=(attachment,) if attachment is not None else (),
        )]

    def _reaction(self, r: Reader, conv: str, chat_jid: str, reaction: Reader,
                  ts: int) -> list[Event]:
        key = reaction.obj("key")
        target = key.text("ID").strip() if key is not None else ""
        if not target:
            return []
        emoji = reaction.text("text").strip()
        return [ReactionEvent(
            remote_conversation_id=conv,
            target_remote_message_id=target,
            actor=self._sender(r, chat_jid),
            emoji=emoji,
            action="add" if emoji else "remove",
            occurred_at_ms=reaction.positive("senderTimestampMS") or ts,
        )]

    def _protocol(self, conv: str, protocol: Reader, ts: int) -> list[Event]:
        kind = protocol.enum("type")
        if kind in ("REVOKE", 0):
            key = protocol.req_obj("key")
            return [MessageMutationEvent(
                remote_conversation_id=conv,
                remote_message_id=key.req_text("ID"),
                kind="delete",
                body="",
                occurred_at_ms=ts,
            )]
        if kind in ("MESSAGE_EDIT", 14):
            key = protocol.req_obj("key")
            edited = protocol.obj("editedMessage")
            body = _text_of(_unwrap(edited)) if edited is not None else ""
            if not body.strip():
                return []
            return [MessageMutationEvent(
                remote_conversation_id=conv,
                remote_message_id=key.req_text("ID"),
                kind="edit",
                body=body,
                occurred_at_ms=protocol.positive("timestampMS") or ts,
            )]
        return []

    # ------------------------------------------------------------------ receipts

    def _receipt(self, r: Reader) -> list[Event]:
        chat_jid = r.req_text("chat_jid")
        ts = r.req_positive("timestamp_ms")
        rtype = r.text("receipt_type").strip().lower().replace("-", "_")
        if rtype not in _RECEIPTS:  # retry, inactive, peer_msg, hist_sync, future types
            return []
        status, is_self = _RECEIPTS[rtype]
        ids: list[str] = []
        for mid in r.strs("message_ids"):
            mid = mid.strip()
            if mid and mid not in ids:
                ids.append(mid)
        if not ids:
            return []
        actor = self._jid_ref(r, chat_jid, is_self=is_self)
        return [ReceiptEvent(
            remote_conversation_id="whatsapp:" + chat_jid,
            remote_message_ids=tuple(ids),
            actor=actor,
            status=status,
            occurred_at_ms=ts,
        )]

    # ------------------------------------------------------------------ history

    def _history(self, r: Reader) -> list[Event]:
        out: list[Event] = []
        for conv in r.objs("conversations"):
            chat_jid = conv.req_text("chat_jid")
            is_group = conv.boolean("is_group")
            for item in conv.objs("messages"):
                merged = dict(item.doc)
                merged.setdefault("chat_jid", chat_jid)
                merged.setdefault("is_group", is_group)
                if merged.get("kind") not in (None, "message"):
                    raise item.fail("kind", "must be 'message' (or absent) in a history sync")
                events = self._message(Reader(self.codec, merged, item.path))
                out += [ev for ev in events if isinstance(ev, MessageEvent)]
        return out


# ---------------------------------------------------------------------- helpers


def _jid_identity(jid: str) -> str:
    """``+<digits>`` for a phone-number JID, else the JID without agent/device."""
    user, at, server = jid.partition("@")
    if not at:
        return jid
    user = user.split(":", 1)[0]
    if server.lower() == "s.whatsapp.net":
        digits = user.split(".", 1)[0]
        if digits.isascii() and digits.isdigit():
            return "+" + digits
    return f"{user}@{server}"


def _unwrap(message: Reader) -> Reader:
    """Peel the future-proof / device-sent envelopes off a ``waE2E.Message``."""
    current = message
    for _ in range(_MAX_UNWRAP):
        for key in _WRAPPERS:
            wrapper = current.obj(key)
            inner = wrapper.obj("message") if wrapper is not None else None
            if inner is not None:
                current = inner
                break
        else:
            return current
    raise DecodeError(f"{message.codec}: {message.path} is wrapped more than {_MAX_UNWRAP} deep")


def _text_of(content: Reader) -> str:
    text = content.text("conversation")
    if text.strip():
        return text
    ext = content.obj("extendedTextMessage")
    if ext is not None and ext.text("text").strip():
        return ext.text("text")
    for key in ("imageMessage", "videoMessage", "ptvMessage", "documentMessage"):
        sub = content.obj(key)
        if sub is not None and sub.text("caption").strip():
            return sub.text("caption")
    return ""


def _attachment(content: Reader) -> dict[str, Any] | None:
    for key, media_type in _MEDIA:
        sub = content.obj(key)
        if sub is None:
            continue
        out: dict[str, Any] = {"v": 1, "kind": "remote", "media_type": media_type}
        for field, name in (("mimetype", "mimetype"), ("directPath", "direct_path"),
                            ("fileSHA256", "file_sha256"), ("fileEncSHA256", "file_enc_sha256"),
                            ("mediaKey", "media_key"), ("fileName", "file_name")):
            value = sub.text(field)
            if value:
                out[name] = value
        length = sub.integer("fileLength")
        if length is not None:
            out["file_length"] = length
        caption = sub.text("caption")
        if caption:
            out["caption"] = caption
        for field in ("width", "height"):
            dimension = sub.integer(field)
            if dimension is not None:
                out[field] = dimension
        return out
    return None


__all__ = ["WhatsAppEventDecoder"]
