"""A cluster node's post that commits in one statement sends the cluster's "posted"
notification from that same statement (``messages.INSERT_NEXT_MESSAGE_ALONE_NOTIFY``): the
payload decodes to exactly what ``cluster.events.encode_posted`` sends from a transaction,
it arrives only once the message is stored, and the ``cluster.notify_off`` fault drops it.
"""

from __future__ import annotations

import psycopg
import pytest

from tidings.cluster import events
from tidings.cluster.node import NOTIFY_OFF_FAULT
from tidings.hub import accounts as accounts_hub
from tidings.hub import channels as channels_hub
from tidings.hub.events import MessagePosted
from tidings.hub.tokens import Principal
from tidings.store import messages as messages_store
from tidings.store import nodes as nodes_store

pytestmark = pytest.mark.postgres_only


class _Node:
    """What ``cluster.node.attach`` gives a runtime's posting, without the node's threads."""

    def __init__(self, faults, node_id: str = "node-test") -> None:
        self.faults = faults
        self.node_id = node_id
        self.in_tx: list[MessagePosted] = []

    def notify_posted(self, tx, event: MessagePosted) -> None:
        self.in_tx.append(event)
        nodes_store.notify(tx, events.encode_posted(self.node_id, event))

    def posted_notify_params(self):
        if self.faults.fire(NOTIFY_OFF_FAULT):
            return None
        return {"notify_channel": nodes_store.CHANNEL, "notify_kind": str(events.POSTED), "notify_node": self.node_id}


@pytest.fixture
def world(runtime, backend_url):
    store = runtime.store
    owner = accounts_hub.create_account(store, kind="human", handle="owner")
    ch = channels_hub.create_channel(store, Principal(scope="account", account_id=owner.id, kind="human"), name="n")
    runtime.posting.post(author_id=owner.id, channel_id=ch["id"], text="makes the topic")
    node = _Node(runtime.faults)
    runtime.posting.notify_in_tx = node.notify_posted
    runtime.posting.notify_in_statement = node.posted_notify_params
    listener = psycopg.connect(backend_url.replace("postgresql+psycopg://", "postgresql://"), autocommit=True)
    listener.execute(f"LISTEN {nodes_store.CHANNEL}")
    yield runtime, owner, ch, node, listener
    listener.close()


def _received(listener) -> list[dict]:
    return [events.decode(n.payload) for n in listener.notifies(timeout=0.5, stop_after=1)]


def test_a_one_statement_post_sends_the_posted_notification_it_would_send_from_a_transaction(world):
    runtime, owner, ch, node, listener = world
    before = runtime.store.meter.snapshot()
    row, inserted = runtime.posting.post(author_id=owner.id, channel_id=ch["id"], text="hello")
    after = runtime.store.meter.snapshot()
    assert inserted
    # the post's checks, channel_seq, insert and notification: one statement (D110)
    assert {k: after[k] - before[k] for k in after} == {"statements": 1, "round_trips": 1, "commits": 1}
    assert node.in_tx == []  # not sent a second time from a transaction
    expected = events.decode(events.encode_posted(
        node.node_id, MessagePosted(row["id"], ch["id"], owner.id, row["channel_seq"], row["seq"])))
    assert _received(listener) == [expected]


def test_the_notify_off_fault_drops_the_one_statement_posts_notification(world):
    runtime, owner, ch, node, listener = world
    runtime.faults.arm(NOTIFY_OFF_FAULT, 1)
    row, inserted = runtime.posting.post(author_id=owner.id, channel_id=ch["id"], text="quiet")
    assert inserted and node.in_tx == []
    assert _received(listener) == []


def test_a_post_that_needs_a_transaction_still_notifies_from_it(world):
    runtime, owner, ch, node, listener = world
    row, inserted = runtime.posting.post(author_id=owner.id, channel_id=ch["id"], text="x", topic="a new topic")
    assert inserted and [e.message_id for e in node.in_tx] == [row["id"]]
    assert [n["m"] for n in _received(listener)] == [row["id"]]


def test_a_post_its_checking_statement_did_not_take_still_notifies_from_the_insert(world, monkeypatch):
    """D110's fallback: when the checking statement takes nothing (as when a membership
    changed under it) and the reads admit the post, the insert that follows is the one
    statement that commits it, and it carries the notification."""
    runtime, owner, ch, node, listener = world
    monkeypatch.setattr(messages_store, "insert_if_admitted", lambda tx, **kwargs: None)
    row, inserted = runtime.posting.post(author_id=owner.id, channel_id=ch["id"], text="second try")
    assert inserted and node.in_tx == []
    assert [n["m"] for n in _received(listener)] == [row["id"]]
