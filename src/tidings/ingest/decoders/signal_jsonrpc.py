"""Codec ``signal.jsonrpc``: one signal-cli ``receive`` notification.

What it reads
-------------
signal-cli in ``jsonRpc`` / ``daemon`` mode pushes every incoming envelope as a JSON-RPC
notification (man page ``man/signal-cli-jsonrpc.5.adoc`` in AsamK/signal-cli)::

    {"jsonrpc": "2.0", "method": "receive",
     "params": {"envelope": {...}, "account": "+4915..."}}

In ``--receive-mode=manual`` the same object is wrapped as
``"params": {"subscription": 0, "result": {"envelope": ..., "account": ...}}``; both
forms are accepted, and so is a bare ``{"envelope": ..., "account": ...}`` line. Any
other ``method`` is an error. ``account`` is absent in single-account mode; without it
messages that target our own messages cannot be recognised (see the id rules).

Field names, as confirmed in ``src/main/java/org/asamk/signal/json/`` of AsamK/signal-cli:

* ``JsonMessageEnvelope``: ``source`` (deprecated legacy id), ``sourceNumber``,
  ``sourceUuid``, ``sourceName``, ``sourceDevice``, ``timestamp``, ``dataMessage``,
  ``editMessage``, ``syncMessage``, ``receiptMessage``, ``typingMessage``,
  ``storyMessage``, ``callMessage``.
* ``JsonDataMessage``: ``timestamp``, ``message`` (the text, may be null),
  ``isExpirationUpdate``, ``reaction``, ``quote``, ``attachments``, ``remoteDelete``,
  ``groupInfo``, ``sticker``, polls, pins...
* ``JsonReaction``: ``emoji``, ``targetAuthor``, ``targetAuthorNumber``,
  ``targetAuthorUuid``, ``targetSentTimestamp``, ``isRemove``.
* ``JsonQuote``: ``id`` (the quoted message's sent timestamp), ``author``,
  ``authorNumber``, ``authorUuid``, ``text``.
* ``JsonRemoteDelete``: ``timestamp``. ``JsonEditMessage``: ``targetSentTimestamp``,
  ``dataMessage``.
* ``JsonGroupInfo``: ``groupId`` (base64), ``groupName``, ``revision``, ``type``.
  There is no ``groupV2`` key in the JSON output: v2 groups arrive as ``groupInfo``.
* ``JsonAttachment``: ``contentType``, ``filename``, ``id``, ``size``, ``width``,
  ``height``, ``caption``, ``uploadTimestamp``.
* ``JsonSyncMessage``: ``sentMessage``, ``readMessages``, ``blockedNumbers``, ``type``.
  ``JsonSyncDataMessage`` (``sentMessage``) has ``destination``, ``destinationNumber``,
  ``destinationUuid``, ``editMessage`` and the data message fields *unwrapped* into the
  same object (``@JsonUnwrapped``). ``JsonSyncReadMessage``: ``sender``,
  ``senderNumber``, ``senderUuid``, ``timestamp``.
* ``JsonReceiptMessage``: ``when``, ``isDelivery``, ``isRead``, ``isViewed``,
  ``timestamps``. ``JsonTypingMessage``: ``action``, ``timestamp``, ``groupId``.

Addresses
---------
A Signal account has an ACI (``*Uuid``) and maybe a phone number (``*Number``, hidden
by phone-number privacy). The ACI never changes, so every address below is taken
ACI first, then the number, then the legacy ``source``/``author``/``sender`` value.
Identities use the same order (kind ``signal_aci``, or ``e164`` without an ACI).

Remote id rules
---------------
* Conversation: ``signal-group:<groupInfo.groupId>`` when the data message has a
  ``groupInfo``; otherwise ``signal:<address of the other party>`` (the envelope source
  for incoming, the ``destination*`` of a sync sent message for outgoing).
* Message: ``<author>:<sent timestamp>``. Signal itself names a message by its author and
  sent timestamp, so this is unique within a conversation. ``<author>`` is ``self`` when
  the author is this account (sync sent messages; reaction/quote targets whose author
  equals ``account``) and the author's address otherwise. Edits, deletes, reactions,
  quotes and receipts build their target id with the same rule, so they meet the
  message they refer to.

What becomes what
-----------------
* ``dataMessage`` from someone else: a ``reaction`` -> ReactionEvent (``isRemove`` ->
  remove; an add with an empty emoji is dropped); a ``remoteDelete`` -> delete mutation;
  else text and/or attachments -> incoming MessageEvent (a ``quote`` gives
  ``reply_to_remote_id``). Expiration-timer updates and content without text or
  attachments (group updates, stickers, polls...) -> nothing. A data message whose
  source is this account is skipped: our own messages arrive as sync sent messages.
* envelope ``editMessage`` -> edit mutation of ``<source>:<targetSentTimestamp>``.
* ``syncMessage.sentMessage`` (sent from another of our devices) -> the same mapping as a
  data message, but outgoing and authored by ``self``; its ``editMessage`` -> edit of
  ``self:<targetSentTimestamp>`` (the reference ignores these; we apply them).
* ``syncMessage.readMessages`` -> our own read receipts, one ReceiptEvent per sender in
  ``signal:<sender>``. The sync carries no group id, so a group message read elsewhere
  is aimed at the sender's direct chat; the projection, finding it not there, looks the
  message id up across the bridge (a Signal message id is unique on its bridge) and
  moves the group's read cursor (``RECEIPTS_LOCATE_BY_REMOTE_ID``).
* ``receiptMessage`` -> ReceiptEvent for ``self:<timestamp>`` ids in
  ``signal:<source>`` (``isDelivery`` -> delivered, ``isRead``/``isViewed`` -> read).
  The same caveat holds for group messages: receipts do not name the group.
* Signal never emits ConversationEvents. Typing, calls, stories -> nothing.
"""

from __future__ import annotations

from typing import Any

from tidings.ingest.decoders.base import DecodeError, Decoder, Reader, int_value
from tidings.ingest.events import (
    Event,
    IdentityRef,
    MessageEvent,
    MessageMutationEvent,
    ReactionEvent,
    ReceiptEvent,
)

SELF = "self"


class SignalJsonRpcDecoder(Decoder):
    codec = "signal.jsonrpc"
    platform = "signal"

    def _decode(self, doc: dict[str, Any]) -> list[Event]:
        top = Reader(self.codec, doc, "payload")
        inner = self._unwrap(top)
        env = inner.req_obj("envelope")
        frame = _Frame(self, env, inner.text("account").strip())
        return frame.events()

    def _unwrap(self, top: Reader) -> Reader:
        if top.has("method") or top.has("jsonrpc") or top.has("params"):
            method = top.text("method")
            if method != "receive":
                raise top.fail("method", f"is {method!r}; only 'receive' notifications are frames")
            params = top.req_obj("params")
            if not params.has("envelope") and params.has("result"):
                return params.req_obj("result")
            return params
        if top.has("envelope"):
            return top
        raise top.fail(None, "is not a signal-cli receive notification (no method, no envelope)")


def _address(r: Reader, prefix: str, legacy: str) -> str:
    """ACI first, then number, then the legacy identifier."""
    for key in (f"{prefix}Uuid", f"{prefix}Number", legacy):
        value = r.text(key).strip()
        if value:
            return value
    return ""


class _Frame:
    """One envelope being decoded."""

    def __init__(self, dec: SignalJsonRpcDecoder, env: Reader, account: str) -> None:
        self.dec = dec
        self.env = env
        self.account = account
        self.source = _address(env, "source", "source")
        self.source_name = env.text("sourceName")
        addrs = {env.text("sourceUuid").strip(), env.text("sourceNumber").strip(),
                 env.text("source").strip()} - {""}
        self.from_self = bool(account) and account in addrs
        self.env_ts = env.positive("timestamp")

    # ------------------------------------------------------------------ helpers

    def author_token(self, r: Reader, prefix: str, legacy: str) -> str:
        addrs = [r.text(k).strip() for k in (f"{prefix}Uuid", f"{prefix}Number", legacy)]
        if self.account and self.account in addrs:
            return SELF
        return _address(r, prefix, legacy)

    def self_ref(self) -> IdentityRef:
        # Sync envelopes come from our own address, so their source names us too.
        raw = self.account or self.source
        if not raw:
            raise self.env.fail(None, "has no account and no source to name our own identity")
        # Only sync envelopes ask for us, and their sourceName is our own profile name.
        return self.dec.identity(raw, name=self.source_name, is_self=True)

    def source_ref(self, what: str) -> IdentityRef:
        if not self.source:
            raise self.env.fail(None, f"carries {what} but no source address")
        return self.dec.identity(self.source, name=self.source_name)

    def when(self, r: Reader, key: str = "timestamp") -> int:
        ts = r.positive(key)
        if ts is None:
            ts = self.env_ts
        if ts is None:
            raise r.fail(key, "is missing and the envelope has no timestamp")
        return ts

    def conversation(self, data: Reader, direct_addr: str, what: str) -> str:
        group = data.obj("groupInfo")
        if group is not None:
            return "signal-group:" + group.req_text("groupId")
        if not direct_addr:
            raise data.fail(None, f"{what} has no group and no counterpart address")
        return "signal:" + direct_addr

    # ------------------------------------------------------------------ dispatch

    def events(self) -> list[Event]:
        out: list[Event] = []
        env = self.env
        edit = env.obj("editMessage")
        if edit is not None and not self.from_self:
            out += self.edit(edit, author=self.source, direct_addr=self.source)
        data = env.obj("dataMessage")
        if data is not None and not self.from_self:
            if not self.source:
                raise env.fail(None, "carries a dataMessage but no source address")
            out += self.data(data, author=self.source, sender=None, direct_addr=self.source)
        sync = env.obj("syncMessage")
        if sync is not None:
            out += self.sync(sync)
        receipt = env.obj("receiptMessage")
        if receipt is not None:
            out += self.receipt(receipt)
        return out

    # ------------------------------------------------------------------ data messages

    def data(self, data: Reader, *, author: str, sender: IdentityRef | None,
             direct_addr: str) -> list[Event]:
        """A data message; ``sender`` None means incoming from the envelope source."""
        outgoing = sender is not None
        reaction = data.obj("reaction")
        if reaction is not None:
            return self.reaction(data, reaction, sender, direct_addr)
        delete = data.obj("remoteDelete")
        if delete is not None:
            conv = self.conversation(data, direct_addr, "remote delete")
            target = delete.req_positive("timestamp")
            return [MessageMutationEvent(
                remote_conversation_id=conv,
                remote_message_id=f"{author}:{target}",
                kind="delete",
                body="",
                occurred_at_ms=self.when(data),
            )]
        if data.boolean("isExpirationUpdate"):
            return []
        body = data.text("message")
        attachments = tuple(self.attachment(a) for a in data.objs("attachments"))
        if not body.strip() and not attachments:
            return []
        conv = self.conversation(data, direct_addr, "message")
        ts = self.when(data)
        reply_to = None
        quote = data.obj("quote")
        if quote is not None:
            quoted_ts = quote.positive("id")
            quoted_author = self.author_token(quote, "author", "author")
            if quoted_ts is not None and quoted_author:
                reply_to = f"{quoted_author}:{quoted_ts}"
        return [MessageEvent(
            remote_conversation_id=conv,
            remote_message_id=f"{author}:{ts}",
            sender=sender if sender is not None else self.source_ref("a message"),
            direction="outgoing" if outgoing else "incoming",
            body=body,
            occurred_at_ms=ts,
            reply_to_remote_id=reply_to,
            attachments=attachments,
        )]

    def attachment(self, att: Reader) -> dict[str, Any]:
        out: dict[str, Any] = {"v": 1, "kind": "remote"}
        for key, name in (("id", "att_id"), ("contentType", "content_type"),
                          ("filename", "filename"), ("caption", "caption")):
            value = att.text(key)
            if value:
                out[name] = value
        for key in ("size", "width", "height"):
            number = att.integer(key)
            if number is not None:
                out[key] = number
        return out

    def reaction(self, data: Reader, reaction: Reader, sender: IdentityRef | None,
                 direct_addr: str) -> list[Event]:
        removing = reaction.boolean("isRemove")
        emoji = reaction.text("emoji").strip()
        if not removing and not emoji:
            return []
        target_author = self.author_token(reaction, "targetAuthor", "targetAuthor")
        if not target_author:
            raise reaction.fail(None, "names no target author")
        target_ts = reaction.req_positive("targetSentTimestamp")
        return [ReactionEvent(
            remote_conversation_id=self.conversation(data, direct_addr, "reaction"),
            target_remote_message_id=f"{target_author}:{target_ts}",
            actor=sender if sender is not None else self.source_ref("a reaction"),
            emoji=emoji,
            action="remove" if removing else "add",
            occurred_at_ms=self.when(data),
        )]

    def edit(self, edit: Reader, *, author: str, direct_addr: str) -> list[Event]:
        if not author:
            raise edit.fail(None, "is an edit without a source address")
        target = edit.req_positive("targetSentTimestamp")
        inner = edit.req_obj("dataMessage")
        body = inner.text("message")
        if not body.strip():
            return []
        return [MessageMutationEvent(
            remote_conversation_id=self.conversation(inner, direct_addr, "edit"),
            remote_message_id=f"{author}:{target}",
            kind="edit",
            body=body,
            occurred_at_ms=self.when(inner),
        )]

    # ------------------------------------------------------------------ sync messages

    def sync(self, sync: Reader) -> list[Event]:
        out: list[Event] = []
        sent = sync.obj("sentMessage")
        if sent is not None:
            destination = _address(sent, "destination", "destination")
            edit = sent.obj("editMessage")
            if edit is not None:
                out += self.edit(edit, author=SELF, direct_addr=destination)
            else:
                out += self.data(sent, author=SELF, sender=self.self_ref(),
                                 direct_addr=destination)
        reads = sync.objs("readMessages")
        if reads:
            out += self.read_sync(reads)
        return out

    def read_sync(self, reads: list[Reader]) -> list[Event]:
        by_sender: dict[str, list[str]] = {}
        for read in reads:
            sender = _address(read, "sender", "sender")
            if not sender:
                raise read.fail(None, "names no sender")
            author = self.author_token(read, "sender", "sender")
            ts = read.req_positive("timestamp")
            ids = by_sender.setdefault(sender, [])
            mid = f"{author}:{ts}"
            if mid not in ids:
                ids.append(mid)
        if self.env_ts is None:
            raise self.env.fail("timestamp", "is missing (needed to date the read sync)")
        actor = self.self_ref()
        return [
            ReceiptEvent(
                remote_conversation_id="signal:" + sender,
                remote_message_ids=tuple(ids),
                actor=actor,
                status="read",
                occurred_at_ms=self.env_ts,
            )
            for sender, ids in by_sender.items()
        ]

    # ------------------------------------------------------------------ receipts

    def receipt(self, receipt: Reader) -> list[Event]:
        if receipt.boolean("isDelivery"):
            status = "delivered"
        elif receipt.boolean("isRead") or receipt.boolean("isViewed"):
            status = "read"
        else:
            return []
        ids: list[str] = []
        for i, ts in enumerate(receipt.array("timestamps")):
            where = f"{receipt.path}.timestamps[{i}]"
            value = int_value(self.dec.codec, ts, where)
            if value <= 0:
                raise DecodeError(f"{self.dec.codec}: {where} must be positive, got {value}")
            mid = f"{SELF}:{value}"
            if mid not in ids:
                ids.append(mid)
        if not ids:
            return []
        if not self.source:
            raise self.env.fail(None, "carries a receipt but no source address")
        return [ReceiptEvent(
            remote_conversation_id="signal:" + self.source,
            remote_message_ids=tuple(ids),
            actor=self.source_ref("a receipt"),
            status=status,
            occurred_at_ms=self.when(receipt, "when"),
        )]


__all__ = ["SignalJsonRpcDecoder"]
