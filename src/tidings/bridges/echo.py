"""Echo suppression: the network's copy of a message we sent is ours, not a new post.

When a bridge sends an outbox item, the network hands the message back inbound: Signal as
``syncMessage.sentMessage`` (or, when the daemon does not name its account, as a
``dataMessage`` from our own number carrying our timestamp), WhatsApp with ``IsFromMe``
and the id ``SendMessage`` returned, Google Messages with ``isMe``. The projection asks
``claim`` about every outgoing message, and the link hook asks ``claim_incoming`` about every
incoming message of a linked conversation before posting it: a message whose remote id
matches a ``send``/``reply`` item of the same bridge and conversation is ours. It is linked
to that item (``echo_message_id``), made ``outgoing`` if it came in as incoming, and never
posted into the channel a second time.

Matching keys: the id a bridge reports as ``remote_id``. Signal names a message
``<author>:<timestamp>`` and a connector reports signal-cli's ``timestamp``, so on Signal
the key is the part after the last ``:``; on WhatsApp and Google it is the whole id.
"""

from __future__ import annotations

import hashlib
from typing import Any

from ..store import outbox as outbox_store
from ..store.batch_rows import Journal, Table, Writer
from ..store.engine import Tx
from ..store.sql import Stmt

ENABLED = True  # the negative control of the echo tests switches this off


def echo_key(remote_message_id: str) -> str:
    """Signal ``<author>:<timestamp>`` -> the timestamp; WhatsApp and Google ids (no ``:``)
    stay whole."""
    return remote_message_id.rsplit(":", 1)[-1]


class Claims:
    """The echo claims of a batch of frames of one bridge (``ingest/batch.py``): the
    outbox items that its outgoing messages may echo are read once, under each
    conversation's echo lock (``want`` and ``reads``); ``claim`` links the unlinked ones;
    ``flush`` writes those links in one statement."""

    __slots__ = ("tx", "journal", "bridge_id", "table", "links")

    def __init__(self, tx: Tx, journal: Journal, bridge_id: str) -> None:
        self.tx = tx
        self.journal = journal
        self.bridge_id = bridge_id
        # (conversation id, echo key) -> ((item id, echo message id or None), ...) in seq order
        self.table = Table(journal)
        self.links: dict[str, tuple[str, int]] = {}  # item id -> (echo message id, now), to write

    def want(self, conversation_id: str, remote_message_id: str) -> None:
        if ENABLED:
            self.table.want((conversation_id, echo_key(remote_message_id)))

    def reads(self) -> list[Any]:
        keys = self.table.take_wanted()
        if not keys:
            return []
        for conversation_id in sorted({cid for cid, _ in keys}):
            _serialize(self.tx, conversation_id)  # the locks go first, in the same round trip

        def take(rows: list[tuple[Any, ...]]) -> None:
            found: dict[tuple[str, str], list[tuple[str, str | None]]] = {key: [] for key in keys}
            for cid, remote_id, item_id, echo, _seq in rows:
                found[(cid, remote_id)].append((item_id, echo))
            for key in keys:
                self.table.load(key, tuple(found[key]))

        return [(*outbox_store.ECHO_CANDIDATES_OF.of(keys, bridge_id=self.bridge_id), take)]

    def claim(self, *, conversation_id: str, message_id: str, remote_message_id: str, now: int) -> bool:
        """An outgoing message (Signal sync sent, WhatsApp IsFromMe, Google isMe): link the
        items it echoes that no message echoes yet. Returns whether any item matched."""
        if not ENABLED:
            return False
        key = (conversation_id, echo_key(remote_message_id))
        table = self.table
        items = table.fetch(key, self.tx, self.reads)
        if any(echo is None for _, echo in items):
            for item_id, echo in items:
                if echo is None:
                    self.journal.put(self.links, item_id, (message_id, now))
            table.put(key, tuple((item_id, echo or message_id) for item_id, echo in items))
        return bool(items)

    def flush(self, send: Writer) -> None:
        if self.links:
            rows = [{"id": item_id, "echo_message_id": mid, "updated_at_ms": now}
                    for item_id, (mid, now) in self.links.items()]
            send(outbox_store.SET_ECHOES, rows)
            for item_id in list(self.links):
                self.journal.drop(self.links, item_id)
            self.table.written([key for key, _, _ in self.table.changed()])


def claim(tx: Tx, *, bridge_id: str, conversation_id: str, message_id: str, remote_message_id: str,
          now: int) -> bool:
    """``Claims.claim`` for one message on its own: the lock and the read now, the link
    written now. Returns whether it matched."""
    claims = Claims(tx, Journal(), bridge_id)
    matched = claims.claim(conversation_id=conversation_id, message_id=message_id,
                           remote_message_id=remote_message_id, now=now)
    claims.flush(Writer(tx))
    return matched


def claim_incoming(tx: Tx, *, bridge_id: str, conversation_id: str, message_id: str, remote_message_id: str,
                   now: int) -> bool:
    """An incoming message of a linked conversation (the link hook asks before posting it):
    when it carries the remote id of an item we sent (a daemon that does not name its
    account hands our message back as a dataMessage from our number), it is ours: made
    outgoing, linked to the item, and not posted. Only linked conversations have items,
    so an unlinked conversation never pays for this read."""
    if not ENABLED:
        return False
    if not claim(tx, bridge_id=bridge_id, conversation_id=conversation_id, message_id=message_id,
                 remote_message_id=remote_message_id, now=now):
        return False
    tx.execute(_MAKE_OUTGOING, {"id": message_id})
    return True


_LOCK = Stmt("SELECT pg_advisory_xact_lock(:key)")


def _serialize(tx: Tx, conversation_id: str) -> None:
    """PostgreSQL: an echo being projected and its item being reported sent must not both
    miss each other (READ COMMITTED lets each read before the other commits), so both take
    one transaction-scoped lock per conversation. SQLite has one writer already."""
    if tx.dialect == "postgresql":
        key = int.from_bytes(hashlib.sha256(("echo:" + conversation_id).encode()).digest()[:8], "big", signed=True)
        # Nobody reads the lock's result: it goes out in the round trip of the read that
        # follows it, and is taken before that read runs (a pipeline runs in order).
        tx.defer(_LOCK, {"key": key})


_PROJECTED = Stmt(
    "SELECT id FROM bridge_messages WHERE bridge_id = :bridge_id AND conversation_id = :conversation_id "
    "AND remote_message_id IN (:rid, :self_rid) ORDER BY id"
)
_MAKE_OUTGOING = Stmt("UPDATE bridge_messages SET direction = 'outgoing' WHERE id = :id AND direction <> 'outgoing'")


def claim_on_report(tx: Tx, *, bridge_id: str, platform: str, conversation_id: str, item_id: str,
                    remote_id: str, now: int) -> bool:
    """The other order: the echo was projected before the bridge reported the send (the
    network is often faster than the report). Link the item to it now."""
    if not ENABLED:
        return False
    _serialize(tx, conversation_id)
    self_rid = f"self:{remote_id}" if platform == "signal" else remote_id
    row = tx.one(_PROJECTED, {"bridge_id": bridge_id, "conversation_id": conversation_id, "rid": remote_id,
                              "self_rid": self_rid})
    if row is None:
        return False
    tx.execute(_MAKE_OUTGOING, {"id": row[0]})
    return outbox_store.set_echo(tx, item_id, row[0], now)
