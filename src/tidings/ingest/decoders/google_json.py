"""Codec ``google.json``: one libgm ``Conversation`` or ``Message`` in protojson.

What it reads
-------------
The bridge (built on mautrix/gmessages' libgm) forwards each ``gmproto.Conversation``
and ``gmproto.Message`` it receives, serialised with protojson and wrapped as::

    {"kind": "conversation", "conversation": {...}}
    {"kind": "message", "message": {...}}

protojson uses the proto field names (libgm's protos are already camelCase, so
``messageID``, ``conversationID``, ``participantID``, ``tmpID``, ``ID`` keep their
capitals), writes enums by name, 64-bit integers as decimal strings and bytes as
base64. Field names confirmed in mautrix/gmessages ``pkg/libgm/gmproto/conversations.proto``:

* ``Message``: ``messageID``, ``msgType``, ``messageStatus{status, ...}``,
  ``timestamp`` (int64, **microseconds**), ``conversationID``, ``participantID``,
  ``messageInfo[]`` (each a oneof ``messageContent{content}`` or ``mediaContent``),
  ``type``, ``tmpID``, ``subject``, ``reactions[]``, ``replyMessage{messageID,
  conversationID}``, ``senderParticipant`` (a ``Participant``).
* ``ReactionEntry``: ``data{unicode, type, customEmoji}``, ``participantIDs[]``.
* ``MediaContent``: ``format``, ``mediaID``, ``mediaName``, ``size``, ``mediaData``,
  ``thumbnailMediaID``, ``decryptionKey``, ``thumbnailDecryptionKey``, ``mimeType``.
* ``MessageStatusType``: ``OUTGOING_*`` values are 1..22, ``INCOMING_*`` 100..114,
  tombstones 200+, ``MESSAGE_DELETED`` 300.
* ``Conversation``: ``conversationID``, ``name``, ``isGroupChat``, ``participants[]``,
  ``otherParticipants``, ``type``, ``status``, ``lastMessageTimestamp``...
* ``Participant``: ``ID`` (``SmallInfo{type, number, participantID}``), ``firstName``,
  ``fullName``, ``isMe``, ``formattedNumber``, ``isVisible``, ``contactID``.

Remote id rules
---------------
* Conversation: libgm's ``conversationID`` as is (bridges have separate id spaces, so no
  prefix is needed; Signal/WhatsApp prefix theirs only to tell chat kinds apart).
* Message: ``messageID`` as is; ``replyMessage.messageID`` for replies.
* Identities: a participant's ``ID.number``, else ``formattedNumber``, else
  ``legacy-participant:<participantID>``; the name is ``fullName`` (else ``firstName``).
  A reactor is named by participant id only: when that id is the message's own sender
  it gets the sender's identity, otherwise ``legacy-participant:<id>``.
* Anonymous reactors (an emoji with no participant ids):
  ``IdentityRef(raw="anon:<emoji>", kind="anonymous")``; see ``tidings.ingest.events``.

What becomes what
-----------------
* ``conversation`` -> one ConversationEvent: kind ``group`` if ``isGroupChat`` else
  ``direct``, title ``name``, every participant with a usable identity as an active
  ``member`` (``isMe`` -> is_self); no remote revision.
* ``message`` -> one MessageEvent with ``reactions_snapshot=True``, then one
  ReactionEvent (action ``add``) per distinct (emoji, reactor) of ``reactions``; these
  are the complete reaction set of the message. From me = ``senderParticipant.isMe``
  or an ``OUTGOING_*`` status. ``client_request_id`` = ``tmpID`` when from me and
  different from ``messageID``. The time is ``timestamp`` // 1000. At most one
  attachment (the first ``mediaContent``).
* An empty stub (no text, no media, no reactions) -> nothing.
* Google never emits mutations or receipts. Tapback text bodies (``Loved "..."``) stay
  plain messages: the reference turns them into reactions with no target, which only
  ever counted as orphaned, and a target-less reaction is not a valid event here.
"""

from __future__ import annotations

from typing import Any

from tidings.ingest.decoders.base import Decoder, Reader
from tidings.ingest.events import (
    ANON_PREFIX,
    LEGACY_PARTICIPANT_PREFIX,
    ConversationEvent,
    Event,
    IdentityRef,
    MessageEvent,
    Participant,
    ReactionEvent,
)

_KINDS = ("conversation", "message")


class GoogleJsonDecoder(Decoder):
    codec = "google.json"
    platform = "google"

    def _decode(self, doc: dict[str, Any]) -> list[Event]:
        top = Reader(self.codec, doc, "payload")
        kind = top.text("kind")
        if kind == "conversation":
            return [self._conversation(top.req_obj("conversation"))]
        if kind == "message":
            return self._message(top.req_obj("message"))
        raise top.fail("kind", f"is {kind!r}; expected one of {list(_KINDS)}")

    # ------------------------------------------------------------------ identities

    def _participant_ref(self, p: Reader) -> IdentityRef | None:
        small = p.obj("ID")
        raw = small.text("number").strip() if small is not None else ""
        if not raw:
            raw = p.text("formattedNumber").strip()
        if not raw and small is not None and small.text("participantID").strip():
            raw = LEGACY_PARTICIPANT_PREFIX + small.text("participantID").strip()
        if not raw:
            return None
        name = p.text("fullName").strip() or p.text("firstName").strip()
        return self.identity(raw, name=name, is_self=p.boolean("isMe"))

    # ------------------------------------------------------------------ conversations

    def _conversation(self, c: Reader) -> ConversationEvent:
        participants: list[Participant] = []
        seen: set[str] = set()
        for p in c.objs("participants"):
            ref = self._participant_ref(p)
            if ref is None or ref.canonical in seen:
                continue
            seen.add(ref.canonical)
            participants.append(Participant(identity=ref))
        return ConversationEvent(
            remote_conversation_id=c.req_text("conversationID"),
            kind="group" if c.boolean("isGroupChat") else "direct",
            title=c.text("name"),
            participants=tuple(participants),
            remote_revision=None,
        )

    # ------------------------------------------------------------------ messages

    def _message(self, m: Reader) -> list[Event]:
        message_id = m.req_text("messageID")
        conv = m.req_text("conversationID")
        micros = m.req_positive("timestamp")
        occurred = micros // 1000
        if occurred <= 0:
            raise m.fail("timestamp", f"is {micros} microseconds, less than a millisecond")

        body = ""
        media: Reader | None = None
        for info in m.objs("messageInfo"):
            content = info.obj("messageContent")
            if content is not None and not body:
                body = content.text("content")
            found = info.obj("mediaContent")
            if found is not None and media is None:
                media = found

        reactions = self._reaction_entries(m)
        if not body.strip() and media is None and not reactions:
            return []  # an empty stub

        sender_p = m.obj("senderParticipant")
        from_me = (sender_p is not None and sender_p.boolean("isMe")) or _outgoing(m)
        sender_pid = m.text("participantID").strip()
        sender: IdentityRef | None = None
        if sender_p is not None:
            sender = self._participant_ref(sender_p)
            small = sender_p.obj("ID")
            if not sender_pid and small is not None:
                sender_pid = small.text("participantID").strip()
        if sender is None and sender_pid:
            sender = self.identity(LEGACY_PARTICIPANT_PREFIX + sender_pid)
        if sender is None:
            raise m.fail(None, "names no sender (no senderParticipant, no participantID)")
        if sender.is_self != from_me:
            sender = self.identity(sender.raw, name=sender.name, is_self=from_me)

        tmp_id = m.text("tmpID").strip()
        reply = m.obj("replyMessage")
        reply_to = reply.text("messageID").strip() if reply is not None else ""

        out: list[Event] = [MessageEvent(
            remote_conversation_id=conv,
            remote_message_id=message_id,
            sender=sender,
            direction="outgoing" if from_me else "incoming",
            body=body,
            occurred_at_ms=occurred,
            client_request_id=tmp_id if from_me and tmp_id != message_id else "",
            reply_to_remote_id=reply_to or None,
            attachments=(_attachment(media),) if media is not None else (),
            reactions_snapshot=True,
        )]
        seen: set[tuple[str, str]] = set()
        for emoji, pids in reactions:
            actors = [self._reactor(pid, sender_pid, sender) for pid in pids] or [
                self.identity(ANON_PREFIX + emoji)
            ]
            for actor in actors:
                if (emoji, actor.canonical) in seen:
                    continue
                seen.add((emoji, actor.canonical))
                out.append(ReactionEvent(
                    remote_conversation_id=conv,
                    target_remote_message_id=message_id,
                    actor=actor,
                    emoji=emoji,
                    action="add",
                    occurred_at_ms=occurred,
                ))
        return out

    def _reaction_entries(self, m: Reader) -> list[tuple[str, list[str]]]:
        entries = []
        for entry in m.objs("reactions"):
            data = entry.obj("data")
            emoji = data.text("unicode").strip() if data is not None else ""
            if not emoji:
                continue  # a custom emoji without a unicode form: nothing to show
            pids = [pid.strip() for pid in entry.strs("participantIDs") if pid.strip()]
            entries.append((emoji, pids))
        return entries

    def _reactor(self, pid: str, sender_pid: str, sender: IdentityRef) -> IdentityRef:
        if sender_pid and pid == sender_pid:
            return sender
        return self.identity(LEGACY_PARTICIPANT_PREFIX + pid)


def _outgoing(m: Reader) -> bool:
    status = m.obj("messageStatus")
    if status is None:
        return False
    value = status.enum("status")
    if isinstance(value, str):
        return value.startswith("OUTGOING")
    return value is not None and 1 <= value < 100


def _attachment(media: Reader) -> dict[str, Any]:
    out: dict[str, Any] = {"v": 1, "kind": "remote"}
    media_id = media.text("mediaID").strip()
    key = media.text("decryptionKey")
    if not media_id:
        media_id = media.text("thumbnailMediaID").strip()
        key = media.text("thumbnailDecryptionKey")
    if media_id:
        out["media_id"] = media_id
    if key:
        out["decryption_key_b64"] = key
    for field, name in (("mimeType", "mime_type"), ("mediaName", "name")):
        value = media.text(field)
        if value:
            out[name] = value
    size = media.integer("size")
    if size is not None:
        out["size"] = size
    dimensions = media.obj("dimensions")
    if dimensions is not None:
        for field in ("width", "height"):
            dimension = dimensions.integer(field)
            if dimension is not None:
                out[field] = dimension
    return out


__all__ = ["GoogleJsonDecoder"]
