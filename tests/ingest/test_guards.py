"""Write guards (spec §3, §6.2-§6.3), with row writes counted by triggers on both backends:
a repeated snapshot writes nothing, a changed one writes only the difference, every
guarded column changed alone writes its row, the recency bump, the reaction fence (the
empty-snapshot rule and its negative control), and the roster's no-lock unchanged check.
"""

from __future__ import annotations

import threading

import pytest
from test_projection_support import PROJECTION_TABLES, World, conv, gmsg, member, msg, once, react, ref
from writecount import WriteCounter

from tidings.store import bridge_messages, conversations, identities, reactions
from tidings.store.batch_rows import Writer
from tidings.store.bridge_messages import Messages
from tidings.store.conversations import Conversations, RosterError, RosterRow
from tidings.store.identities import Identities
from tidings.store.reactions import Reactions, SnapshotEntry


@pytest.fixture
def counted(store):
    with WriteCounter(store, PROJECTION_TABLES) as wc:
        yield wc


def group_snapshot(n_members=20, *, rename=None, drop=None, add_admin=None, title="Friends"):
    members = [member("+1555000%04d" % i, f"Member {i}") for i in range(n_members)]
    if rename is not None:
        members[rename] = member("+1555000%04d" % rename, "Renamed")
    if drop is not None:
        del members[drop]
    if add_admin is not None:
        members.append(member(add_admin, "New Admin", role="admin"))
    members.append(member("+15559999", "Me", self_=True))
    return conv("grp", members, title=title)


# -- snapshots ---------------------------------------------------------------------------
def test_repeated_group_snapshot_writes_nothing(store, counted):
    w = World(store, "google")
    assert w.frame([group_snapshot()])
    assert counted.nonzero() == {
        "identities": {"insert": 21}, "conversations": {"insert": 1}, "conversation_participants": {"insert": 21},
    }
    before = w.dump()
    counted.reset()
    store.clock.advance(60_000)
    assert not w.frame([group_snapshot()])
    assert counted.total() == 0
    assert w.dump() == before


def test_changed_group_snapshot_writes_only_the_difference(store, counted):
    w = World(store, "google")
    w.frame([group_snapshot()])
    created = w.conversation("grp")
    counted.reset()
    store.clock.advance(60_000)
    # rename member 3, drop member 7, add an admin, retitle
    assert w.frame([group_snapshot(rename=3, drop=7, add_admin="+15558888", title="Best friends")])
    assert counted.nonzero() == {
        "identities": {"update": 1, "insert": 1},
        "conversations": {"update": 1},
        "conversation_participants": {"update": 1, "delete": 1, "insert": 1},
    }
    c = w.conversation("grp")
    assert c["title"] == "Best friends" and c["updated_at_ms"] == w.now and c["created_at_ms"] == created["created_at_ms"]
    roster = w.roster("grp")
    assert roster["+15550000003"] == ("member", "Renamed", True) and "+15550000007" not in roster
    assert roster["+15558888"] == ("admin", "New Admin", True)
    assert w.identity("+15550000003")["display_name"] == "Renamed"
    assert w.identity("+15550000003")["updated_at_ms"] == w.now

    # A roster-only change: one roster delete and the conversation's touch.
    counted.reset()
    store.clock.advance(1_000)
    assert w.frame([group_snapshot(rename=3, drop=7, title="Best friends")])
    assert counted.nonzero() == {"conversations": {"update": 1}, "conversation_participants": {"delete": 1}}
    assert w.conversation("grp")["updated_at_ms"] == w.now


def test_every_roster_column_changed_alone_writes_its_row(store, counted):
    """Role, roster display name and active flag, each changed alone on one member: the
    change writes exactly that roster row and touches the conversation; the same roster
    again writes no roster row; changing it back writes the row again. (Both the
    unchanged-roster check and the diff must compare every column.)"""
    w = World(store, "google")
    base = [member("+15550100", "A"), member("+15550111", "B")]
    w.frame([conv("g", base)])
    cases = [
        ("role", member("+15550100", "A", role="admin"), ("admin", "A", True)),
        ("display_name", member("+15550100", "A2"), ("member", "A2", True)),
        ("is_active", member("+15550100", "A", active=False), ("member", "A", False)),
    ]
    for column, changed, stored in cases:
        counted.reset()
        store.clock.advance(1_000)
        w.frame([conv("g", [changed, base[1]])])
        assert counted.snapshot()["conversation_participants"] == {"insert": 0, "update": 1, "delete": 0}, column
        assert counted.of("conversations", "update") == 1, column  # the roster change's touch
        assert w.roster("g")["+15550100"] == stored, column
        assert w.conversation("g")["updated_at_ms"] == w.now, column
        counted.reset()
        store.clock.advance(1_000)
        w.frame([conv("g", [changed, base[1]])])
        assert counted.of("conversation_participants") == 0 and counted.of("conversations") == 0, column
        counted.reset()
        w.frame([conv("g", base)])
        assert counted.of("conversation_participants", "update") == 1, column
        assert w.roster("g")["+15550100"] == ("member", "A", True), column


def test_roster_touch_never_moves_updated_at_backwards(store):
    w = World(store, "google")
    store.clock.set(10_000)
    w.frame([conv("g", [member("+15550100")])])
    store.clock.set(5_000)  # a clock that went back (e.g. a replay pinned to old receipt times)
    w.frame([conv("g", [member("+15550100"), member("+15550111")])])
    assert len(w.roster("g")) == 2
    assert w.conversation("g")["updated_at_ms"] == 10_000


def test_repeated_message_frames_write_nothing(store, counted):
    w = World(store, "signal")
    frame = [msg("signal:+15550100", "bob:1", ref("+15550100", "Bob", platform="signal"), at=1_000)]
    w.frame(frame)
    counted.reset()
    store.clock.advance(60_000)
    assert not w.frame(frame)
    assert counted.total() == 0


def test_repeated_google_message_frame_writes_only_the_fence_when_newer(store, counted):
    w = World(store, "google")
    frame = [gmsg("c1", "m1", ref("+15550100"), at=1_000), react("c1", "m1", ref("+15550111"), "👍")]
    w.frame(frame, received_at_ms=100)
    counted.reset()
    assert not w.frame(frame, received_at_ms=100)  # a write at the fence's own sequence
    assert counted.total() == 0
    assert w.frame(frame, received_at_ms=200)  # newer, unchanged: the fence alone advances
    assert counted.nonzero() == {"reaction_fences": {"update": 1}}
    counted.reset()
    assert not w.frame(frame, received_at_ms=150)  # older: rejected whole
    assert counted.total() == 0
    assert w.fence("c1", "m1") == 200


# -- every guarded column, alone ---------------------------------------------------------
def _count(store, tables):
    return WriteCounter(store, tables)


def test_every_identity_guard_column_changed_alone_writes_its_row(store):
    w = World(store, "google")
    base = dict(id="idn_x", kind="e164", canonical="+1555", raw="+1555", display_name="Bob", is_self=False,
                metadata="{}")

    def upsert(tx, values, now):
        return once(tx, Identities, w.bridge_id, lambda r: r.upsert(**values, now=now))

    with _count(store, ["identities"]) as wc:
        with store.write() as tx:
            assert upsert(tx, base, 1)
        for column, value in [("raw", "+1 555"), ("display_name", "Robert"), ("display_name", ""),
                              ("is_self", True), ("metadata", '{"a": 1}')]:
            wc.reset()
            changed = {**base, column: value}
            with store.write() as tx:
                assert not upsert(tx, base, 2), "same values must not write"
                assert upsert(tx, changed, 3), column
                assert not upsert(tx, changed, 4)
                assert upsert(tx, base, 5)
            assert wc.snapshot()["identities"] == {"insert": 0, "update": 2, "delete": 0}, column
        with store.read() as tx:
            row = identities.by_id(tx, "idn_x")
        assert row["created_at_ms"] == 1 and row["updated_at_ms"] == 5


def test_a_change_undone_within_one_batch_writes_nothing(store):
    """A batch writes each row's net change: a column changed and changed back by the
    frames of one batch leaves the row unwritten (D115)."""
    w = World(store, "google")
    base = dict(id="idn_x", kind="e164", canonical="+1555", raw="+1555", display_name="Bob", is_self=False)
    with store.write() as tx:
        once(tx, Identities, w.bridge_id, lambda r: r.upsert(**base, now=1))

    def there_and_back(rows):
        assert rows.upsert(**{**base, "display_name": "Robert"}, now=2)
        assert rows.upsert(**base, now=3)

    with _count(store, ["identities"]) as wc:
        with store.write() as tx:
            once(tx, Identities, w.bridge_id, there_and_back)
        assert wc.total() == 0
    with store.read() as tx:
        assert identities.by_id(tx, "idn_x")["updated_at_ms"] == 1


def test_every_conversation_guard_column_changed_alone_writes_its_row(store):
    w = World(store, "google")
    base = dict(id="conv_x", remote_id="r", kind="group", title="T", remote_revision=None)

    def upsert(tx, values, now):
        return once(tx, Conversations, w.bridge_id, lambda r: r.upsert(**values, now=now))

    with _count(store, ["conversations"]) as wc:
        with store.write() as tx:
            assert upsert(tx, base, 1)
        cases = [("kind", "direct"), ("title", ""), ("title", "U"), ("remote_revision", "1")]
        for column, value in cases:
            wc.reset()
            changed = {**base, column: value}
            with store.write() as tx:
                assert not upsert(tx, base, 2)
                assert upsert(tx, changed, 3), column
                assert not upsert(tx, changed, 4)
                assert upsert(tx, base, 5)
            assert wc.snapshot()["conversations"]["update"] == 2, column
        # NULL transitions of the revision both ways, and a value change
        wc.reset()
        with store.write() as tx:
            for rev in ("1", "2", None, None):
                upsert(tx, {**base, "remote_revision": rev}, 6)
        assert wc.snapshot()["conversations"]["update"] == 3


def test_every_message_guard_column_changed_alone_writes_its_row(store):
    w = World(store, "signal")
    w.frame([msg("signal:a", "m0", ref("+15550100", platform="signal"), at=500)])
    sender = w.ident_id("+15550100")
    conv_id = w.conv_id("signal:a")
    base = dict(id="bmsg_x", conversation_id=conv_id, remote_message_id="x", sender_identity_id=None,
                direction="incoming", body="b", reply_to_remote_id=None, occurred_at_ms=1_000)
    def upsert(tx, values, now):
        return once(tx, Messages, w.bridge_id, lambda r: r.upsert(**values, now=now))

    with _count(store, ["bridge_messages"]) as wc:
        with store.write() as tx:
            assert upsert(tx, base, 1) == "inserted"
        for column, value in [("sender_identity_id", sender), ("direction", "outgoing"), ("body", ""),
                              ("body", "c"), ("reply_to_remote_id", "m0"), ("occurred_at_ms", 1_001)]:
            wc.reset()
            changed = {**base, column: value}
            with store.write() as tx:
                assert upsert(tx, base, 2) is None
                assert upsert(tx, changed, 3) == "updated", column
                assert upsert(tx, changed, 4) is None
                assert upsert(tx, base, 5) == "updated"
            assert wc.snapshot()["bridge_messages"] == {"insert": 0, "update": 2, "delete": 0}, column


# -- recency -----------------------------------------------------------------------------
def test_recency_bump_writes_only_when_strictly_newer(store):
    w = World(store, "google")
    w.frame([gmsg("c1", "m1", ref("+15550100"), at=5_000)])
    cid = w.conv_id("c1")

    def bump(tx, at):
        return once(tx, Conversations, w.bridge_id,
                    lambda r: r.mint_or_bump(id=cid, remote_id="c1", kind="direct", at_ms=at, now=9))

    with _count(store, ["conversations"]) as wc:
        with store.write() as tx:
            assert not bump(tx, 5_000)  # equal
            assert not bump(tx, 4_000)  # older
        assert wc.total() == 0
        with store.write() as tx:
            assert bump(tx, 5_001)
        assert wc.snapshot()["conversations"]["update"] == 1
    # the message path: an equal-time message in a later frame bumps nothing
    with _count(store, ["conversations"]) as wc:
        w.frame([gmsg("c1", "m2", ref("+15550100"), at=5_001)])
        assert wc.of("conversations") == 0


# -- the reaction fence ------------------------------------------------------------------
def test_older_google_reaction_snapshot_cannot_override_a_newer_empty_one(store):
    w = World(store, "google")
    bob, me = ref("+15550100"), ref("+15559999", self_=True)
    empty = [gmsg("c1", "m1", bob, at=1_000)]
    reacted = empty + [react("c1", "m1", me, "👍")]
    w.frame(empty, received_at_ms=200)
    assert w.fence("c1", "m1") == 200
    w.frame(reacted, received_at_ms=100)  # the deferred older frame, retried late
    assert w.reactions("c1", "m1", active_only=False) == {}
    assert w.fence("c1", "m1") == 200
    w.frame(reacted, received_at_ms=300)
    assert w.reactions("c1", "m1") == {"self": "👍"}
    w.frame(empty, received_at_ms=400)
    assert w.reactions("c1", "m1") == {}
    assert w.fence("c1", "m1") == 400


def test_newer_empty_snapshot_writes_exactly_one_fence_row(store, counted):
    w = World(store, "google")
    w.frame([gmsg("c1", "m1", ref("+15550100"), at=1_000)], received_at_ms=100)
    counted.reset()
    w.frame([gmsg("c1", "m1", ref("+15550100"), at=1_000)], received_at_ms=200)
    assert counted.nonzero() == {"reaction_fences": {"update": 1}}


def test_snapshot_at_the_fence_sequence_is_accepted_and_its_fence_write_skipped(store, counted):
    w = World(store, "google")
    bob = ref("+15550100")
    w.frame([gmsg("c1", "m1", bob, at=1_000)], received_at_ms=100)
    counted.reset()
    w.frame([gmsg("c1", "m1", bob, at=1_000), react("c1", "m1", bob, "😮")], received_at_ms=100)
    assert w.reactions("c1", "m1") == {w.ident_id("+15550100"): "😮"}
    assert counted.nonzero() == {"reactions": {"insert": 1}}


def _snapshot(store, w, message_id, conversation_id, entries, seq):
    with store.write() as tx:
        return once(tx, Reactions, w.bridge_id, lambda r: r.apply_snapshot(
            message_id=message_id, conversation_id=conversation_id, entries=entries, source_seq_ms=seq,
            now=store.clock.now_ms()))


def test_empty_snapshot_fence_is_load_bearing_without_reactions(store):
    """Negative control (spec §3.8): with one message's fence row removed, the stale
    reaction of an older snapshot comes back on that message only."""
    w = World(store, "google")
    bob = ref("+15550100")
    w.frame([gmsg("c1", "m1", bob, at=1_000), gmsg("c1", "m2", bob, at=1_001)], received_at_ms=200)
    m1, m2, cid = w.msg_id("c1", "m1"), w.msg_id("c1", "m2"), w.conv_id("c1")
    assert w.fence("c1", "m1") == w.fence("c1", "m2") == 200
    assert w.reactions("c1", "m1") == w.reactions("c1", "m2") == {}
    with store.write() as tx:  # the planted bug: the empty snapshot's fence write skipped for m2
        tx.raw("DELETE FROM reaction_fences WHERE message_id = " + ("?" if store.dialect == "sqlite" else "%s"), (m2,))
    stale = {"self": SnapshotEntry(None, True, "👍", 1_000)}
    r1 = _snapshot(store, w, m1, cid, stale, 100)
    r2 = _snapshot(store, w, m2, cid, stale, 100)
    assert (r1.accepted, r2.accepted) == (False, True)
    assert w.reactions("c1", "m1") == {}
    assert w.reactions("c1", "m2") == {"self": "👍"}


def test_snapshot_writes_only_changed_reactions_and_tombstones_absent_ones(store, counted):
    w = World(store, "google")
    bob, carol, dave = ref("+15550100"), ref("+15550111"), ref("+15550122")
    head = [gmsg("c1", "m1", bob, at=1_000)]
    w.frame(head + [react("c1", "m1", carol, "👍"), react("c1", "m1", dave, "❤️")], received_at_ms=100)
    counted.reset()
    w.frame(head + [react("c1", "m1", carol, "👍"), react("c1", "m1", dave, "😂")], received_at_ms=200)
    assert counted.nonzero() == {"reactions": {"update": 1}, "reaction_fences": {"update": 1}}
    counted.reset()
    w.frame(head + [react("c1", "m1", dave, "😂")], received_at_ms=300)
    assert counted.nonzero() == {"reactions": {"update": 1}, "reaction_fences": {"update": 1}}
    assert w.reactions("c1", "m1") == {w.ident_id("+15550122"): "😂"}
    counts = w.counts()
    assert counts["reactions_applied"] == 3 and counts["reactions_removed"] == 1


# -- the roster --------------------------------------------------------------------------
def _sync(tx, bridge_id, remote, conversation_id, rows, touched_at_ms=0):
    def op(convs):
        convs.get(remote)  # the conversation, read as the projection reads it first
        return convs.rosters.sync(conversation_id=conversation_id, rows=rows, touched_at_ms=touched_at_ms)

    return once(tx, Conversations, bridge_id, op)


def test_roster_sync_rejects_a_repeated_identity_even_when_the_count_matches(store, counted):
    w = World(store, "google")
    w.frame([conv("g", [member("+15550100", "A"), member("+15550111", "B")])])
    cid, a = w.conv_id("g"), w.ident_id("+15550100")
    repeated = [RosterRow(a, "member", "A", True), RosterRow(a, "member", "A", True)]
    counted.reset()
    with pytest.raises(RosterError, match="appears twice"):
        with store.write() as tx:
            _sync(tx, w.bridge_id, "g", cid, repeated, touched_at_ms=9)
    assert counted.total() == 0


def test_roster_sync_of_a_missing_conversation_is_an_error(store):
    w = World(store, "google")
    with pytest.raises(RosterError, match="does not exist"):
        with store.write() as tx:
            _sync(tx, w.bridge_id, "nope", "conv_nope", [])


def test_unchanged_roster_check_takes_no_write_lock(store):
    """The unchanged check is one plain read and a comparison in memory: it completes while
    another connection holds the write lock (SQLite: BEGIN IMMEDIATE; PostgreSQL:
    exclusive locks on both tables), and writes nothing."""
    w = World(store, "google")
    w.frame([conv("g", [member("+15550100", "A"), member("+15550111", "B", role="admin")])])
    cid = w.conv_id("g")
    rows = [RosterRow(w.ident_id("+15550100"), "member", "A", True),
            RosterRow(w.ident_id("+15550111"), "admin", "B", True)]
    holder = store.raw_connection()
    dbapi = holder.driver_connection
    try:
        if store.dialect == "sqlite":
            dbapi.execute("BEGIN IMMEDIATE")
        else:
            dbapi.execute("LOCK TABLE conversations, conversation_participants IN EXCLUSIVE MODE")
        result: list[int] = []

        def check() -> None:
            with store.read() as tx:
                result.append(_sync(tx, w.bridge_id, "g", cid, rows))

        t = threading.Thread(target=check, daemon=True)
        t.start()
        t.join(10)
        assert not t.is_alive(), "the unchanged-roster check waited for the write lock"
        assert result == [0]
    finally:
        try:
            dbapi.rollback() if store.dialect != "sqlite" else dbapi.execute("ROLLBACK")
        finally:
            holder.close()


def test_unchanged_writes_touch_no_rows(store, counted):
    w = World(store, "google")
    w.frame([conv("g", [member("+15550100", "A")], title="T"), ])
    w.frame([gmsg("g", "m1", ref("+15550100", "A"), at=5_000)], received_at_ms=300)
    cid, mid, a = w.conv_id("g"), w.msg_id("g", "m1"), w.ident_id("+15550100")
    counted.reset()
    with store.write() as tx:
        assert not once(tx, Identities, w.bridge_id, lambda r: r.upsert(
            id=a, kind="e164", canonical="+15550100", raw="+15550100", display_name="A", is_self=False, now=1))
        assert not once(tx, Conversations, w.bridge_id, lambda r: r.upsert(
            id=cid, remote_id="g", kind="group", title="T", remote_revision=None, now=1))
        assert _sync(tx, w.bridge_id, "g", cid, [RosterRow(a, "member", "A", True)], touched_at_ms=1) == 0
        for at in (5_000, 4_000):
            assert not once(tx, Conversations, w.bridge_id, lambda r: r.mint_or_bump(
                id=cid, remote_id="g", kind="group", at_ms=at, now=1))
    assert _snapshot(store, w, mid, cid, {}, 300) == (True, 0, 0, False)  # same sequence
    assert _snapshot(store, w, mid, cid, {}, 200) == (False, 0, 0, False)  # stale
    assert counted.total() == 0


# -- the SQL guards behind the projection's own skips, and the statement budget -------------
def test_every_write_statement_is_guarded_in_sql(store):
    """A batch writes only rows it changed; each flush statement is guarded on its own too
    (the safety net): a row sent as the database already holds it writes nothing, and a
    fence never moves back or to its own sequence. Checked here directly."""
    w = World(store, "google")
    w.frame([conv("g", [member("+15550100", "A")], title="T")])
    w.frame([gmsg("g", "m1", ref("+15550100"), at=1_000), react("g", "m1", ref("+15550111"), "👍")],
            received_at_ms=100)
    mid, cid = w.msg_id("g", "m1"), w.conv_id("g")
    b = {"bridge_id": w.bridge_id}
    tables = [
        (identities.WRITE_ROWS, "SELECT id, kind, canonical, raw, display_name, is_self, metadata, created_at_ms, "
         "updated_at_ms FROM identities"),
        (conversations.WRITE_ROWS, "SELECT id, remote_conversation_id, kind, title, remote_revision, "
         "last_message_at_ms, created_at_ms, updated_at_ms FROM conversations"),
        (conversations.WRITE_PARTICIPANTS, "SELECT conversation_id, identity_id, role, display_name, is_active "
         "FROM conversation_participants"),
        (bridge_messages.WRITE_ROWS, "SELECT id, conversation_id, remote_message_id, sender_identity_id, direction, "
         "body, reply_to_remote_id, state, occurred_at_ms, mutated_at_ms, created_at_ms, updated_at_ms "
         "FROM bridge_messages"),
        (reactions.WRITE_ROWS, "SELECT message_id, reactor_key, conversation_id, reactor_identity_id, "
         "reactor_is_self, emoji, state, occurred_at_ms, source_seq_ms, created_at_ms, updated_at_ms FROM reactions"),
    ]
    with store.write() as tx:
        write = Writer(tx)
        for stmt, sql in tables:
            cur = tx.raw(sql)
            names = [d[0] for d in cur.description]
            rows = [dict(zip(names, r)) for r in cur.fetchall()]
            for row in rows:  # the stored rows as they are, with a later update time
                for flag in ("is_self", "is_active", "reactor_is_self"):
                    if flag in row:
                        row[flag] = bool(row[flag])
                if "updated_at_ms" in row and stmt is not conversations.WRITE_ROWS:
                    row["updated_at_ms"] += 1  # (a conversation's touch is content, D9: written)
            assert rows, stmt.name
            assert int(write(stmt, rows, **b)) == 0, stmt.name
        fence = {"message_id": mid, "updated_at_ms": 5}
        for seq, wrote in ((100, 0), (50, 0), (150, 1)):  # its own sequence, older, newer
            assert int(write(reactions.WRITE_FENCES, [{**fence, "source_seq_ms": seq}], **b)) == wrote, seq
    assert w.fence("g", "m1") == 150 and cid


class StatementCounter:
    def __init__(self, monkeypatch):
        from tidings.store.engine import Tx

        self.names: list[str] = []
        original, original_many = Tx.execute, Tx.execute_many

        def counting(tx, stmt, params=None):
            self.names.append(stmt.name)
            return original(tx, stmt, params)

        def counting_many(tx, stmt, rows):
            self.names.append(stmt.name)
            return original_many(tx, stmt, rows)

        monkeypatch.setattr(Tx, "execute", counting)
        monkeypatch.setattr(Tx, "execute_many", counting_many)

    def frame(self, w, events, **kw):
        self.names = []
        w.frame(events, **kw)
        return self.names


def test_statement_budget_per_frame(store, monkeypatch):
    """One read per table family a frame touches, whatever the number of rows, and one
    write per family it changed; nothing for what is unchanged (this pins the batch's
    in-memory skips, which the SQL guards would otherwise mask; D115)."""
    sig, goo = World(store, "signal"), World(store, "google")
    bob = ref("+15550100", "Bob", platform="signal")
    count = StatementCounter(monkeypatch)
    signal_reads = ["identities.read_by_keys", "conversations.read_by_remote_ids", "participants.read_members",
                    "bridge_messages.read_by_ids"]
    # a new sender, conversation, roster entry (with the conversation's touch) and message
    assert count.frame(sig, [msg("signal:+15550100", "bob:1", bob, at=1_000)]) == [
        *signal_reads, "identities.write_rows", "conversations.write_rows", "participants.write_rows",
        "bridge_messages.write_rows"]
    second = [msg("signal:+15550100", "bob:2", bob, at=2_000)]
    # the recency bump and the new message; the sender and its roster place are unchanged
    assert count.frame(sig, second) == [*signal_reads, "conversations.write_rows", "bridge_messages.write_rows"]
    assert count.frame(sig, second) == signal_reads  # a repeat writes nothing

    gbob = ref("+15550100", "Bob")
    goo.frame([gmsg("c1", "m0", gbob, at=500)], received_at_ms=50)
    frame = [gmsg("c1", "m1", gbob, at=1_000), react("c1", "m1", gbob, "👍")]
    google_reads = ["identities.read_by_keys", "conversations.read_by_remote_ids", "bridge_messages.read_by_ids",
                    "reactions.read_of_messages", "fences.read"]
    assert count.frame(goo, frame, received_at_ms=100) == [
        *google_reads, "conversations.write_rows", "bridge_messages.write_rows", "reactions.write_rows",
        "fences.write_rows"]
    assert count.frame(goo, frame, received_at_ms=100) == google_reads  # unchanged: no write
    assert count.frame(goo, frame, received_at_ms=200) == [*google_reads, "fences.write_rows"]  # the fence moves

    goo.frame([group_snapshot()])
    # 21 identities, the conversation and its roster, one read each family: nothing else
    assert count.frame(goo, [group_snapshot()]) == [
        "identities.read_by_keys", "conversations.read_by_remote_ids", "participants.read_rosters"]
