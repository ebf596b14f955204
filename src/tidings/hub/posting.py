"""The post path: one atomic write, then a bus publish only for a newly inserted row.

The post's reads are one statement (channel, membership, topic, a stored message with the
same ``client_request_id``: ``messages.post_context``), then the post policy, a topic
created only when missing, and the channel's next ``channel_seq`` (row lock) with the
idempotent insert, one statement on PostgreSQL (``messages.insert_next_message``).

PostgreSQL, the common post (the topic exists, the channel is not linked, one process, no
caller transaction; ``Posting._post_alone``): the read and the insert each run alone in
autocommit, and the insert commits by itself: two round trips, no BEGIN or COMMIT, and the
channel row lock is held for the server's work and the WAL flush only. Every other post
(and every post on SQLite) runs in one transaction. A repeated ``client_request_id``
from the same author returns the stored message with ``inserted=False`` and publishes
nothing, so a client retry is never delivered twice. The publish happens in
``after_commit``: a bus event always points at a durable row (the reverse is not true; a
crash or the ``bus.drop_publish`` fault can lose the event, which is what the delivery
recovery scan is for).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..bridges import outbox
from ..bus import Bus
from ..errors import BadRequest, Forbidden, NotFound
from ..faults import Faults
from ..ids import new_id
from ..store import channels as channels_store
from ..store import messages as messages_store
from ..store.engine import Store, Tx
from .asks import block_text, normalize_ask_block
from .events import MessagePosted, MessageUpdated

DEFAULT_TOPIC = "general"
MAX_TOPIC = 80
MAX_CLIENT_REQUEST_ID = 200
MAX_BLOCKS = 64


class _Duplicate(Exception):
    """Raised inside the post transaction to roll back a lost idempotency race."""


def normalize_blocks(text: Any, blocks: Any) -> tuple[list[dict[str, Any]], str]:
    """Blocks as stored, and their text: text blocks (and ask questions) joined by newlines.

    Either ``text`` (one text block) or ``blocks`` may be given, not both; a message must
    carry some text.
    """
    if blocks is not None and text is not None:
        raise BadRequest("give either text or blocks, not both", code="bad_blocks")
    if blocks is None:
        if not isinstance(text, str):
            raise BadRequest("text (a string) or blocks is required", code="bad_blocks")
        blocks = [{"kind": "text", "text": text}]
    if not isinstance(blocks, list) or not blocks or len(blocks) > MAX_BLOCKS:
        raise BadRequest(f"blocks must be a list of 1 to {MAX_BLOCKS} blocks", code="bad_blocks")
    clean = []
    for block in blocks:
        if isinstance(block, dict) and block.get("kind") == "ask":
            clean.append(normalize_ask_block(block))  # hub/asks.py: validated, ask_id assigned
            continue
        if not isinstance(block, dict) or block.get("kind") != "text" or not isinstance(block.get("text"), str):
            raise BadRequest('each block must be {"kind": "text", "text": str} or {"kind": "ask", "ask": {...}}',
                             code="bad_blocks")
        if set(block) - {"kind", "text"}:
            raise BadRequest("text blocks have only kind and text", code="bad_blocks")
        clean.append({"kind": "text", "text": block["text"]})
    joined = "\n".join(block_text(b) for b in clean)
    if not joined.strip():
        raise BadRequest("a message needs some text", code="empty_message")
    return clean, joined


class Posting:
    """Posts and edits messages; publishes ``MessagePosted`` / ``MessageUpdated``."""

    def __init__(self, store: Store, bus: Bus, faults: Faults | None = None) -> None:
        self.store = store
        self.bus = bus
        self.faults = faults or store.faults
        #: Cluster (PostgreSQL): ``ClusterNode.notify_posted``, run inside the post transaction.
        self.notify_in_tx: Callable[[Tx, MessagePosted], None] | None = None
        # A cluster node's same notification, sent by the one statement of a post that
        # commits alone (``_post_alone``): its parameters, or None to send none this time.
        self.notify_in_statement: Callable[[], dict[str, str] | None] | None = None

    def post(
        self,
        *,
        author_id: str,
        channel_id: Any,
        text: Any = None,
        blocks: Any = None,
        topic: Any = None,
        client_request_id: Any = None,
        is_admin: bool = False,
        tx: Tx | None = None,
        occurred_at_ms: int | None = None,
    ) -> tuple[dict[str, Any], bool]:
        """Post as ``author_id``; returns (message row, inserted).

        With ``tx`` the post joins the caller's transaction (bridge links post in the same
        transaction as the projection) and the publish waits for that commit.
        ``occurred_at_ms``: the network time of a message that came from a network.
        """
        clean, joined = normalize_blocks(text, blocks)
        topic_name = DEFAULT_TOPIC if topic is None else topic
        if not isinstance(topic_name, str) or not topic_name.strip() or len(topic_name) > MAX_TOPIC:
            raise BadRequest(f"topic must be a non-empty string of at most {MAX_TOPIC} characters", code="bad_topic")
        crid = "" if client_request_id is None else client_request_id
        if not isinstance(crid, str) or len(crid) > MAX_CLIENT_REQUEST_ID:
            raise BadRequest(f"client_request_id must be a string of at most {MAX_CLIENT_REQUEST_ID} characters")
        if not isinstance(channel_id, str):
            raise NotFound("unknown channel", code="unknown_channel")
        args = (author_id, channel_id, clean, joined, topic_name.strip(), crid, is_admin, occurred_at_ms)
        if tx is not None:
            return self._post_in(tx, *args)
        try:
            if self.store.dialect == "postgresql" and (self.notify_in_tx is None or self.notify_in_statement is not None):
                done = self._post_alone(*args)
                if done is not None:
                    return done
            with self.store.write() as own:
                return self._post_in(own, *args)
        except _Duplicate:
            with self.store.read() as rtx:
                existing = messages_store.by_client_request(rtx, author_id, crid)
            if existing is None or existing["channel_id"] != channel_id:
                raise BadRequest("client_request_id was already used for another channel", code="crid_reused")
            return existing, False

    def _post_alone(
        self, author_id: str, channel_id: str, blocks: list, text: str, topic: str, crid: str, is_admin: bool,
        occurred_at_ms: int | None = None,
    ) -> tuple[dict[str, Any], bool] | None:
        """PostgreSQL, the common case: ONE statement that makes the post's checks, takes
        the channel_seq, inserts and commits by itself (autocommit, D110), so the channel row
        lock is held for the server's work and the commit, never across a client turn: one
        round trip, no BEGIN or COMMIT. When its checks do not all pass it writes nothing,
        and the post's reads (``_admit``) say why: a refusal, a retry's stored message, or
        a post that needs more than one statement (a topic to create, a linked channel's
        outbox row). Then either the insert alone follows, or None: the caller runs
        ``_post_in`` in a transaction. Its one write is atomic on its own, so nothing is lost
        against the transaction: the checks read what a transaction under READ COMMITTED
        reads in a statement of its own. A cluster node's posted notification is sent by that
        same statement (``notify_in_statement``), so it still goes out at the commit that
        stored the message, and only then."""
        notify = None
        if self.notify_in_statement is not None:
            notify = self.notify_in_statement()  # None: this notification is dropped (a fault)
        conn = self.store.dedicated()
        try:
            message_id = new_id("msg")
            now = self.store.now_ms()
            with conn.autocommit_write() as wtx:
                taken = messages_store.insert_if_admitted(
                    wtx, id=message_id, channel_id=channel_id, topic=topic, author=author_id, now=now,
                    blocks=blocks, text=text, client_request_id=crid, occurred_at_ms=occurred_at_ms, notify=notify,
                )
                if isinstance(taken, tuple):
                    seq, channel_seq, topic_id = taken
                    return self._stored(wtx, message_id, channel_id, topic_id, author_id, blocks, text, crid,
                                        occurred_at_ms, now, seq, channel_seq, linked=False, alone=True), True
            if taken == messages_store.LINKED:
                return None
            with conn.autocommit_read() as rtx:
                ctx = self._admit(rtx, author_id, channel_id, topic, crid, is_admin)
            if isinstance(ctx, dict):
                return ctx, False
            if ctx.topic_id is None or ctx.channel["linked"]:
                return None
            with conn.autocommit_write() as wtx:
                return self._insert(wtx, ctx.channel, ctx.topic_id, author_id, channel_id, blocks, text, crid,
                                    occurred_at_ms, self.store.now_ms(), alone=True, notify=notify)
        finally:
            conn.close()

    def _admit(
        self, tx: Tx, author_id: str, channel_id: str, topic: str, crid: str, is_admin: bool
    ) -> messages_store.PostContext | dict[str, Any]:
        """The post's reads and checks: the context to insert with, or the author's stored
        message with this ``client_request_id`` (a retry). Raises when the post is refused."""
        ctx = messages_store.post_context(
            tx, channel_id=channel_id, author=author_id, topic=topic, client_request_id=crid
        )
        if ctx is None:
            raise NotFound("unknown channel", code="unknown_channel")
        channel = ctx.channel
        if not ctx.is_member:
            if is_admin:
                raise Forbidden("the admin is not a member of this channel", code="not_a_member")
            if channels_store.owns_an_agent_member(tx, channel_id, author_id):  # it can see it (D55)
                raise Forbidden("you can see this channel but are not a member of it", code="not_a_member")
            raise NotFound("unknown channel", code="unknown_channel")
        if channel["post_policy"] == "owner_only" and channel["owner_account_id"] != author_id:
            raise Forbidden("only the channel owner may post here", code="post_policy")
        existing = ctx.existing
        if existing is not None:
            if existing["channel_id"] != channel_id:
                raise BadRequest("client_request_id was already used for another channel", code="crid_reused")
            return existing
        return ctx

    def _post_in(
        self, tx: Tx, author_id: str, channel_id: str, blocks: list, text: str, topic: str, crid: str, is_admin: bool,
        occurred_at_ms: int | None = None,
    ) -> tuple[dict[str, Any], bool]:
        ctx = self._admit(tx, author_id, channel_id, topic, crid, is_admin)
        if isinstance(ctx, dict):
            return ctx, False
        now = self.store.now_ms()
        topic_id = ctx.topic_id or channels_store.get_or_create_topic(
            tx, id=new_id("top"), channel_id=channel_id, name=topic, created_by=author_id, now=now
        )
        return self._insert(tx, ctx.channel, topic_id, author_id, channel_id, blocks, text, crid, occurred_at_ms, now)

    def _insert(
        self, tx: Tx, channel: dict[str, Any], topic_id: str, author_id: str, channel_id: str, blocks: list,
        text: str, crid: str, occurred_at_ms: int | None, now: int, *, alone: bool = False,
        notify: dict[str, str] | None = None,
    ) -> tuple[dict[str, Any], bool]:
        """Insert the admitted post, queue its outbox row (linked channel), its cluster
        notification and its publish (after the commit). ``alone``: ``tx`` is autocommit and
        ``notify`` the cluster notification its one statement sends."""
        message_id = new_id("msg")
        taken = messages_store.insert_next_message(
            tx,
            id=message_id,
            channel_id=channel_id,
            topic_id=topic_id,
            author=author_id,
            now=now,
            blocks=blocks,
            text=text,
            client_request_id=crid,
            occurred_at_ms=occurred_at_ms,
            alone=alone,
            notify=notify if alone else None,
        )
        if taken is None:  # a concurrent post with the same client_request_id won
            raise _Duplicate()
        seq, channel_seq = taken
        row = self._stored(tx, message_id, channel_id, topic_id, author_id, blocks, text, crid, occurred_at_ms, now,
                           seq, channel_seq, linked=bool(channel["linked"]), alone=alone)
        return row, True

    def _stored(
        self, tx: Tx, message_id: str, channel_id: str, topic_id: str, author_id: str, blocks: list, text: str,
        crid: str, occurred_at_ms: int | None, now: int, seq: int, channel_seq: int, *, linked: bool, alone: bool,
    ) -> dict[str, Any]:
        """What follows a stored post in its transaction: the outbox row (linked channel),
        the cluster notification (not ``alone``: its statement sent it), the kill point and
        the publish after the commit; returns the message row."""
        tx.after_commit(lambda: outbox.kill_point(self.faults, outbox.KILL_AFTER_POST_COMMIT))
        if linked:
            outbox.queue_post(tx, message_id=message_id, channel_id=channel_id, author_id=author_id, text=text, now=now)
        event = MessagePosted(message_id, channel_id, author_id, channel_seq, seq)
        if self.notify_in_tx is not None and not alone:  # cluster hook: other nodes learn of it at this commit
            self.notify_in_tx(tx, event)
        tx.after_commit(lambda: self._publish(event))
        return {
            "id": message_id,
            "seq": seq,
            "channel_id": channel_id,
            "channel_seq": channel_seq,
            "topic_id": topic_id,
            "author_account_id": author_id,
            "at_unix_ms": now,
            "blocks": blocks,
            "text": text,
            "client_request_id": crid,
            "edited_at_ms": None,
            "deleted_at_ms": None,
            "mentions_routed_at": None,
            "occurred_at_ms": occurred_at_ms,
        }

    def _publish(self, event: Any) -> None:
        if self.faults.fire("bus.drop_publish"):
            return  # the crash window: committed, never published
        self.bus.publish(event)

    def edit(self, *, author_id: str, message_id: Any, blocks: Any, is_admin: bool = False) -> dict[str, Any]:
        """Replace a message's blocks; only its author may (others get 403, or 404 if they
        cannot see the channel)."""
        clean, joined = normalize_blocks(None, blocks)
        if not isinstance(message_id, str):
            raise NotFound("unknown message", code="unknown_message")
        with self.store.write() as tx:
            row = messages_store.message(tx, message_id)
            if row is None:
                raise NotFound("unknown message", code="unknown_message")
            if row["author_account_id"] != author_id:
                visible = is_admin or channels_store.membership(tx, row["channel_id"], author_id) is not None
                if not visible:
                    raise NotFound("unknown message", code="unknown_message")
                raise Forbidden("only the author may edit a message", code="not_author")
            now = self.store.now_ms()
            messages_store.set_blocks(tx, message_id, clean, joined, now)
            outbox.queue_edit(tx, message_id=message_id, text=joined, now=now)
            row.update(blocks=clean, text=joined, edited_at_ms=now)
            event = MessageUpdated(message_id, row["channel_id"])
            tx.after_commit(lambda: self.bus.publish(event))
        return row
