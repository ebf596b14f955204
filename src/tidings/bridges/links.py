"""Bridge links: a bridge conversation linked to a channel posts its new messages there.

The post happens inside the transaction that projects the message (the ingest worker's,
or the append's when the frame is applied on append), through the one post path, as the
bridge's own hub account, with ``client_request_id = "link:<channel>:<bridge message>"``.
So a frame that is retried, replayed or re-delivered posts at most once per channel, and a
projection that rolls back takes its post with it: the channel message exists exactly when
the network message does. The bus publish runs after that commit, so the delivery engine
treats a linked message like any other post: "@assistant what's for dinner" from a Signal
group steers the assistant if it is live, or owes it if it is offline.

An edit of the network message replaces the channel message's text; a delete marks it
deleted. Only incoming messages are posted (the hub's own outgoing messages would echo).
"""

from __future__ import annotations

from typing import Any

import structlog

from ..errors import BadRequest, NotFound
from ..hub.events import MessageUpdated
from ..hub.tokens import Principal
from ..store import channels as channels_store
from ..store import links as links_store
from ..store import messages as messages_store
from ..store.engine import Tx
from ..store.sql import Stmt
from . import echo

log = structlog.get_logger("tidings.bridges")

_BRIDGE = Stmt("SELECT id, account_id, owner_id FROM bridges WHERE id = :id", name="bridge")


def link_request_id(channel_id: str, bridge_message_id: str) -> str:
    return f"link:{channel_id}:{bridge_message_id}"


def linked_text(sender: str, body: str) -> str:
    return f"{sender}: {body}"


class LinkHook:
    """The projection's message hook for bridge links (``ProjectionContext.on_message``).

    Calling it is ``Links.on_message``. ``acts_on`` tells the projection whether a
    conversation is linked anywhere, so that messages of one linked nowhere are written
    behind like any other (D107); ``announce`` sends that read with the frame's other
    reads. A conversation linked after ``acts_on`` read it gets its messages posted from
    the next frame on, as when the link commits just after the frame."""

    __slots__ = ("links",)

    def __init__(self, links: Links) -> None:
        self.links = links

    def __call__(self, tx: Tx, change: Any) -> None:
        self.links.on_message(tx, change)

    def announce(self, tx: Tx, conversation_id: str) -> None:
        links_store.read_ahead_linked_channels(tx, conversation_id)

    def acts_on(self, tx: Tx, conversation_id: str) -> bool:
        return bool(links_store.linked_channels(tx, conversation_id))


class Links:
    def __init__(self, runtime: Any) -> None:
        self.runtime = runtime
        self.store = runtime.store
        #: What the ingest projection calls for new, edited and deleted messages.
        self.hook = LinkHook(self)

    # -- management --------------------------------------------------------------------
    def link(self, who: Principal, bridge_id: str, body: dict[str, Any]) -> dict[str, Any]:
        """Link a conversation of ``bridge_id`` to a channel (admin only; idempotent).

        The bridge's account joins the channel unsubscribed in the same transaction, so its
        posts pass the membership check and it never receives deliveries itself.
        """
        unknown = set(body) - {"conversation_id", "channel_id"}
        if unknown:
            raise BadRequest(f"unknown fields: {sorted(unknown)}")
        conversation_id, channel_id = body.get("conversation_id"), body.get("channel_id")
        if not isinstance(conversation_id, str) or not isinstance(channel_id, str):
            raise BadRequest("conversation_id and channel_id are required strings", code="bad_link")
        with self.store.write() as tx:
            bridge = tx.mapping(_BRIDGE, {"id": bridge_id})
            if bridge is None:
                raise NotFound("unknown bridge", code="unknown_bridge")
            if links_store.conversation_of_bridge(tx, conversation_id, bridge_id) is None:
                raise NotFound("unknown conversation for this bridge", code="unknown_conversation")
            if channels_store.channel(tx, channel_id) is None:
                raise NotFound("unknown channel", code="unknown_channel")
            now = self.store.now_ms()
            channels_store.add_member(tx, channel_id, bridge["account_id"], False, now)
            created = links_store.insert_link(
                tx, conversation_id=conversation_id, channel_id=channel_id, bridge_id=bridge_id,
                created_by=who.account_id, now=now,
            )
        log.info("bridge link", bridge_id=bridge_id, conversation_id=conversation_id, channel_id=channel_id,
                 created=created)
        return {"bridge_id": bridge_id, "conversation_id": conversation_id, "channel_id": channel_id,
                "created": created}

    def links(self, bridge_id: str) -> list[dict[str, Any]]:
        with self.store.read() as tx:
            return links_store.links_of_bridge(tx, bridge_id)

    def links_of_known_bridge(self, bridge_id: str) -> list[dict[str, Any]]:
        """``links`` of a bridge that exists; 404 ``unknown_bridge`` otherwise."""
        with self.store.read() as tx:
            if tx.one(_BRIDGE, {"id": bridge_id}) is None:
                raise NotFound("unknown bridge", code="unknown_bridge")
            return links_store.links_of_bridge(tx, bridge_id)

    # -- the projection hook -----------------------------------------------------------
    def on_message(self, tx: Tx, change: Any) -> None:
        """Called by the projection, inside the frame's transaction, for every newly
        inserted incoming message and every applied edit or delete."""
        targets = links_store.linked_channels(tx, change.conversation_id)
        if not targets:
            return
        if change.kind == "new":
            if change.direction != "incoming":
                return
            if echo.claim_incoming(tx, bridge_id=change.bridge_id, conversation_id=change.conversation_id,
                                   message_id=change.message_id, remote_message_id=change.remote_message_id,
                                   now=self.store.now_ms()):
                return  # our own message coming back: never posted a second time
            text = linked_text(links_store.sender_label(tx, change.sender_identity_id), change.body)
            for channel_id, bridge_account in targets:
                _, inserted = self.runtime.posting.post(
                    author_id=bridge_account, channel_id=channel_id, text=text,
                    client_request_id=link_request_id(channel_id, change.message_id), tx=tx,
                    occurred_at_ms=change.occurred_at_ms,
                )
                if inserted:
                    tx.after_commit(lambda b=change.bridge_id: self.runtime.ingest.counters.of(b).incr("links_posted"))
            return
        for channel_id, bridge_account in targets:
            row = messages_store.by_client_request(tx, bridge_account, link_request_id(channel_id, change.message_id))
            if row is None:
                continue  # posted before the link existed, or an outgoing message
            now = self.store.now_ms()
            if change.kind == "edit":
                text = linked_text(links_store.sender_label(tx, change.sender_identity_id), change.body)
                messages_store.set_blocks(tx, row["id"], [{"kind": "text", "text": text}], text, now)
            elif change.kind == "delete":
                messages_store.mark_deleted(tx, row["id"], now)
            else:
                continue
            event = MessageUpdated(row["id"], channel_id)
            tx.after_commit(lambda e=event: self.runtime.bus.publish(e))
