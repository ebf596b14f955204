"""The replay's row-write counter and minimal-write oracle, on both backends.

Committed writes only; an UPDATE is effective when a non-bookkeeping column changed (OLD
vs NEW); a conversation's ``updated_at_ms`` touch is effective only right after a roster
change in the same frame (decision D9); nothing of the counter stays in the store.
"""

from __future__ import annotations

import pytest

from tidings.bridges.registry import create_bridge
from tidings.replay.writecount import MARK_TABLE, REPLAY_TABLE, ReplayCounter
from tidings.store import inbox as inbox_store
from tidings.store.batch_rows import Journal, Writer
from tidings.store.conversations import Conversations, RosterRow
from tidings.store.identities import Identities


@pytest.fixture
def counter(store):
    c = ReplayCounter(store).install()
    try:
        yield c
    finally:
        c.uninstall()


def ident(tx, bridge, n, name="A", now=10):
    rows = Identities(tx, Journal(), bridge)
    rows.upsert(id=f"idn_{n}", kind="e164", canonical=f"+1555000{n}", raw=f"+1555000{n}", display_name=name,
                is_self=False, now=now)
    rows.flush(Writer(tx))


def touch(tx, conversation_id, now):
    """A bare touch of a conversation's ``updated_at_ms``."""
    ph = "?" if tx.dialect == "sqlite" else "%s"
    tx.raw(f"UPDATE conversations SET updated_at_ms = {ph} WHERE id = {ph}", (now, conversation_id))


def frame_edge(tx, bridge, key):
    """An inbox write, as at the start and the end of every frame."""
    inbox_store.insert_frame(tx, inbox_id=f"in_{key}", bridge_id=bridge, dedupe_key=key, codec="x",
                             codec_version=1, received_at_ms=1, client_received_at_ms=None, payload="{}")


def test_counts_committed_writes_and_classes_each_update(store, counter):
    bridge = create_bridge(store, platform="signal", name="p")["id"]
    base = counter.snapshot()
    with store.write() as tx:
        ident(tx, bridge, 1)
        ident(tx, bridge, 2)
    with store.write() as tx:
        tx.raw("UPDATE identities SET display_name = display_name")              # nothing changes
        tx.raw("UPDATE identities SET updated_at_ms = updated_at_ms + 1")        # only bookkeeping
        tx.raw("UPDATE identities SET display_name = 'B' WHERE id = 'idn_1'")    # content
        tx.raw("DELETE FROM identities WHERE id = 'idn_2'")
    with pytest.raises(RuntimeError):
        with store.write() as tx:
            ident(tx, bridge, 3)
            raise RuntimeError("rolled back: not counted")
    with store.write() as tx:
        with pytest.raises(RuntimeError):
            with tx.savepoint():
                ident(tx, bridge, 4)
                raise RuntimeError("savepoint rolled back: not counted")
    got = counter.snapshot()["identities"]
    assert got["insert"] - base["identities"]["insert"] == 2
    assert got["update"] == 5 and got["delete"] == 1
    assert got["effective"] - base["identities"]["effective"] == 2 + 1 + 1
    assert got["wasted"] == 4 and got["touch"] == 0


def test_a_conversation_touch_counts_only_after_a_roster_change_in_the_same_frame(store, counter):
    bridge = create_bridge(store, platform="google", name="g")["id"]
    with store.write() as tx:
        ident(tx, bridge, 1)
        convs = Conversations(tx, Journal(), bridge)
        convs.upsert(id="conv_1", remote_id="c1", kind="group", title="T", remote_revision=None, now=10)
        convs.flush(Writer(tx))
    # A frame whose roster changed: the touch records it (effective).
    with store.write() as tx:
        frame_edge(tx, bridge, "a")
        convs = Conversations(tx, Journal(), bridge)
        convs.get("c1")
        convs.rosters.sync(conversation_id="conv_1", rows=[RosterRow("idn_1", "member", "A", True)],
                           touched_at_ms=20)
        convs.flush(Writer(tx))
        frame_edge(tx, bridge, "b")
    # A frame with no roster change: a bare touch is wasted.
    with store.write() as tx:
        frame_edge(tx, bridge, "c")
        touch(tx, "conv_1", 30)
    # The roster mark does not outlive its frame.
    with store.write() as tx:
        frame_edge(tx, bridge, "d")
        convs = Conversations(tx, Journal(), bridge)
        convs.get("c1")
        assert not convs.rosters.ensure_and_touch(conversation_id="conv_1", identity_id="idn_1",
                                                  display_name="A", now=35)  # already there: no write, no mark
        convs.flush(Writer(tx))
        tx.raw("DELETE FROM conversation_participants")
        frame_edge(tx, bridge, "e")
        touch(tx, "conv_1", 40)
    got = counter.snapshot()["conversations"]
    assert (got["insert"], got["update"]) == (1, 3)
    assert got["touch"] == 1 and got["wasted"] == 2 and got["effective"] == 2


def test_uninstall_leaves_nothing_behind(store):
    counter = ReplayCounter(store).install()
    bridge = create_bridge(store, platform="signal", name="p")["id"]
    with store.write() as tx:
        ident(tx, bridge, 1)
    counter.uninstall()
    assert counter.snapshot()["identities"]["insert"] == 1  # still readable
    with store.write() as tx:
        ident(tx, bridge, 2)
    assert counter.snapshot()["identities"]["insert"] == 1  # no longer counting
    with store.read() as tx:
        if store.dialect == "sqlite":
            leftovers = tx.raw(
                "SELECT name FROM sqlite_temp_master UNION ALL SELECT name FROM sqlite_master "
                "WHERE name LIKE 'replay%' OR name LIKE 'rrw_%'"
            ).fetchall()
        else:
            leftovers = tx.raw(
                "SELECT tgname FROM pg_trigger WHERE tgname LIKE 'replay%' UNION ALL "
                f"SELECT relname FROM pg_class WHERE relname IN ('{REPLAY_TABLE}', '{MARK_TABLE}') UNION ALL "
                "SELECT proname FROM pg_proc WHERE proname LIKE 'replay%'"
            ).fetchall()
    assert leftovers == []
