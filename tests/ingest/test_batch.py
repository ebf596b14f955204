"""A request's frames are projected in one batch (D115), both backends:

* a frame that fails part-way through is taken back whole: a later frame of the same batch
  never sees what it changed, and neither does the store;
* a batch writes each changed row once, whatever the number of its frames that changed it,
  and a row changed and changed back not at all;
* the link hook, which reads the store, sees the rows of its own frame and of the batch's
  earlier frames; a frame that may call it runs inside a savepoint of its own, so when it
  fails after the hook ran, neither its rows flushed for the hook nor the hook's writes stay;
* a sender already on the roster is not added again, and its conversation is not touched:
  the flush writes the conversation's new recency alone;
* a row the batch did not ask for ahead is read when first used: never a wrong answer;
* every writer of a bridge's rows holds the bridge's lock, the drain included
  (PostgreSQL), since the batch trusts what it read until it writes; an outgoing message's
  echo read goes out behind its conversation's echo lock (PostgreSQL);
* a frame that may call the link hook sends its savepoint with its first statement and
  leaves the release to the ``COMMIT``, which releases it anyway (PostgreSQL);
* a set-based read probes an index a key, whatever the planner's estimates (PostgreSQL).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from test_projection_support import World, msg, ref
from writecount import WriteCounter

from tidings.bridges.registry import create_bridge
from tidings.counters import Counters
from tidings.ingest.batch import Batch
from tidings.ingest.counters import INGEST_COUNTERS
from tidings.ingest.engine import Ingest
from tidings.ingest.events import IdentityRef, MessageEvent
from tidings.ingest.projection import ProjectionContext, conversation_id_for, project_frame, want_rows
from tidings.store import identities as identities_store
from tidings.store import inbox as inbox_store
from tidings.store.batch_rows import Journal, Table
from tidings.store.engine import Tx

CODEC = "test.events"
FIXTURES = Path(__file__).parent / "fixtures"


def decode(codec: str, version: int, payload: Any) -> list[Any]:
    """A test codec: the payload lists messages ``[conversation, id, sender raw, sender
    name, body, at]``; a sender ``anon:`` fails the projection after its conversation
    was minted (an anonymous identity cannot send)."""
    doc = json.loads(payload) if isinstance(payload, str) else payload
    out = []
    for conv, mid, raw, name, body, at in doc["messages"]:
        sender = ref(raw, name, platform="signal") if not raw.startswith("anon:") else IdentityRef(raw)
        out.append(MessageEvent(conv, mid, sender, "incoming", body, at))
    return out


def frame(key: str, *messages: list[Any]) -> dict[str, Any]:
    return {"codec": CODEC, "codec_version": 1, "dedupe_key": key, "payload": {"messages": list(messages)}}


@pytest.fixture
def ingest(store, faults):
    ing = Ingest(store=store, faults=faults, decode=decode, codec_platforms={CODEC: "signal"})
    yield ing
    ing.stop()


def conversation(store, bridge: str, remote: str) -> dict[str, Any] | None:
    ph = "?" if store.dialect == "sqlite" else "%s"
    with store.read() as tx:
        row = tx.raw(f"SELECT last_message_at_ms, created_at_ms, updated_at_ms FROM conversations "
                     f"WHERE bridge_id = {ph} AND remote_conversation_id = {ph}", (bridge, remote)).fetchone()
    return None if row is None else {"last_message_at_ms": row[0], "created_at_ms": row[1], "updated_at_ms": row[2]}


def outcomes(store, bridge: str) -> list[str | None]:
    ph = "?" if store.dialect == "sqlite" else "%s"
    with store.read() as tx:
        return [r[0] for r in tx.raw(f"SELECT outcome FROM inbox WHERE bridge_id = {ph} ORDER BY dedupe_key",
                                     (bridge,)).fetchall()]


class wire_log(list):  # noqa: N801 - used as a plain list of SQL texts
    """The SQL texts sent on the PostgreSQL wire, in order, once ``start`` is called."""

    def start(self, monkeypatch: pytest.MonkeyPatch) -> None:
        from tidings.store import pg_wire

        real = pg_wire.Wire.run
        log = self

        def run(wire: Any, batch: Any) -> None:
            log.extend(sql for sql, _, _ in batch)
            real(wire, batch)

        monkeypatch.setattr(pg_wire.Wire, "run", run)


def test_a_frame_that_fails_part_way_is_taken_back_whole_and_a_later_frame_never_sees_it(store, ingest):
    bridge = create_bridge(store, platform="signal", name="p")["id"]
    bob = ["+15550100", "Bob"]
    results = ingest.append_body(bridge, {"frames": [
        frame("1", ["signal:c", "m1", *bob, "hi", 1_000]),
        # mints conversation d at 9,000, then fails on its anonymous sender: taken back
        frame("2", ["signal:d", "m2", "anon:👍", "", "boo", 9_000]),
        frame("3", ["signal:d", "m3", *bob, "there", 2_000]),  # mints d again, at 2,000
    ]}, "signal")
    assert [r.replay for r in results] == [False] * 3
    assert outcomes(store, bridge) == ["applied", "quarantined", "applied"]
    assert conversation(store, bridge, "signal:d")["last_message_at_ms"] == 2_000  # not 9,000
    counts = ingest.counters.of(bridge).snapshot()
    assert (counts["conversations_written"], counts["messages_written"]) == (2, 2)  # frame 2 counted nothing


def test_a_batch_writes_a_row_once_whatever_the_number_of_its_frames_that_changed_it(store, ingest):
    bridge = create_bridge(store, platform="signal", name="p")["id"]
    ingest.append_body(bridge, frame("0", ["signal:c", "m0", "+15550100", "Bob", "hi", 1_000]), "signal")
    with WriteCounter(store, ["identities", "conversations"]) as wc:
        ingest.append_body(bridge, {"frames": [
            frame("1", ["signal:c", "m1", "+15550100", "Robert", "a", 2_000]),
            frame("2", ["signal:c", "m2", "+15550100", "Rob", "b", 3_000]),
            frame("3", ["signal:c", "m3", "+15550100", "Bobby", "c", 4_000]),
        ]}, "signal")
        # three renames and three recency bumps, one write each row
        assert wc.snapshot()["identities"]["update"] == 1 and wc.snapshot()["conversations"]["update"] == 1
        wc.reset()
        store.clock.advance(60_000)  # the renames below are stamped later than the stored row
        sent: list[str] = []
        real_execute, real_later = Tx.execute, Tx.later

        def execute(tx: Tx, stmt: Any, params: Any = None) -> Any:
            sent.append(stmt.name)
            return real_execute(tx, stmt, params)

        def later(tx: Tx, stmt: Any, params: Any = None) -> Any:
            sent.append(stmt.name)
            return real_later(tx, stmt, params)

        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(Tx, "execute", execute)
            mp.setattr(Tx, "later", later)
            ingest.append_body(bridge, {"frames": [
                frame("4", ["signal:c", "m4", "+15550100", "Robert", "d", 4_000]),
                frame("5", ["signal:c", "m5", "+15550100", "Bobby", "e", 4_000]),
            ]}, "signal")
        # renamed and renamed back: not written, not even sent
        assert wc.of("identities") == 0 and "identities.write_rows" not in sent
    with store.read() as tx:
        [row] = identities_store.of_bridge(tx, bridge)
    assert row["display_name"] == "Bobby" and conversation(store, bridge, "signal:c")["last_message_at_ms"] == 4_000
    counts = ingest.counters.of(bridge).snapshot()
    assert counts["identities_written"] == 1 + 3 + 2  # what each frame changed, counted as before


def test_the_link_hook_sees_the_rows_of_its_frame_and_of_the_batchs_earlier_frames(store):
    seen: list[tuple[str, str | None]] = []
    ph = "?" if store.dialect == "sqlite" else "%s"

    class Hook:
        def acts_on(self, tx: Tx, conversation_id: str) -> bool:
            return True

        def __call__(self, tx: Tx, change: Any) -> None:
            name = tx.raw(f"SELECT display_name FROM identities WHERE id = {ph}", (change.sender_identity_id,)).fetchone()
            body = tx.raw(f"SELECT body FROM bridge_messages WHERE id = {ph}", (change.message_id,)).fetchone()
            seen.append((name and name[0], body and body[0]))

    ingest = Ingest(store=store, decode=decode, codec_platforms={CODEC: "signal"}, on_message=Hook())
    try:
        bridge = create_bridge(store, platform="signal", name="p")["id"]
        ingest.append_body(bridge, {"frames": [
            frame("1", ["signal:a", "m1", "+15550100", "Dad", "first", 1_000]),  # Dad is new here
            frame("2", ["signal:b", "m2", "+15550100", "", "second", 2_000]),
        ]}, "signal")
    finally:
        ingest.stop()
    assert seen == [("Dad", "first"), ("Dad", "second")]


def test_a_frame_that_fails_after_the_link_hook_ran_leaves_neither_its_rows_nor_the_hooks_writes(store):
    ph = "?" if store.dialect == "sqlite" else "%s"
    seen: list[str] = []

    class Hook:
        def acts_on(self, tx: Tx, conversation_id: str) -> bool:
            return True

        def __call__(self, tx: Tx, change: Any) -> None:  # writes to the store, as the link hook posts
            tx.raw(f"UPDATE bridge_messages SET body = body || ' (posted)' WHERE id = {ph}", (change.message_id,))
            seen.append(change.remote_message_id)

    ingest = Ingest(store=store, decode=decode, codec_platforms={CODEC: "signal"}, on_message=Hook())
    try:
        bridge = create_bridge(store, platform="signal", name="p")["id"]
        ingest.append_body(bridge, {"frames": [
            # m1 is flushed for the hook, which writes; then the frame fails on m2's anonymous sender
            frame("1", ["signal:c", "m1", "+15550100", "Bob", "taken back", 1_000],
                  ["signal:c", "m2", "anon:👍", "", "boo", 1_001]),
            frame("2", ["signal:c", "m3", "+15550100", "Bob", "kept", 2_000]),
        ]}, "signal")
    finally:
        ingest.stop()
    assert seen == ["m1", "m3"]
    assert outcomes(store, bridge) == ["quarantined", "applied"]
    with store.read() as tx:
        bodies = [r[0] for r in tx.raw("SELECT body FROM bridge_messages ORDER BY body").fetchall()]
    assert bodies == ["kept (posted)"]


def test_a_frame_that_may_call_the_hook_never_takes_an_earlier_frames_rows_down_with_it(store):
    ph = "?" if store.dialect == "sqlite" else "%s"

    class Hook:  # acts on conversation h only: a frame of another conversation has no savepoint
        def acts_on(self, tx: Tx, conversation_id: str) -> bool:
            return conversation_id == conversation_id_for(bridge, "signal:h")

        def __call__(self, tx: Tx, change: Any) -> None:
            tx.raw(f"SELECT body FROM bridge_messages WHERE id = {ph}", (change.message_id,)).fetchone()

    ingest = Ingest(store=store, decode=decode, codec_platforms={CODEC: "signal"}, on_message=Hook())
    try:
        bridge = create_bridge(store, platform="signal", name="p")["id"]
        ingest.append_body(bridge, {"frames": [
            frame("1", ["signal:a", "m1", "+15550100", "Bob", "kept", 1_000]),
            # the hook runs for m2, then the frame fails on m3's anonymous sender: its savepoint
            # is rolled back, and frame 1's rows must not have been written inside it
            frame("2", ["signal:h", "m2", "+15550100", "Bob", "taken back", 2_000],
                  ["signal:h", "m3", "anon:👍", "", "boo", 2_001]),
        ]}, "signal")
    finally:
        ingest.stop()
    assert outcomes(store, bridge) == ["applied", "quarantined"]
    with store.read() as tx:
        bodies = [r[0] for r in tx.raw("SELECT body FROM bridge_messages ORDER BY body").fetchall()]
    assert bodies == ["kept"]
    assert conversation(store, bridge, "signal:a")["last_message_at_ms"] == 1_000

def test_a_known_members_message_moves_recency_but_never_touches_its_conversation(store, ingest):
    bridge = create_bridge(store, platform="signal", name="p")["id"]
    ingest.append_body(bridge, frame("1", ["signal:c", "m1", "+15550100", "Bob", "hi", 1_000]), "signal")
    first = conversation(store, bridge, "signal:c")
    store.clock.advance(60_000)
    ingest.append_body(bridge, {"frames": [  # Bob is on the roster already: nobody joins
        frame("2", ["signal:c", "m2", "+15550100", "Bob", "again", 2_000]),
        frame("3", ["signal:c", "m3", "+15550100", "Bob", "and again", 3_000]),
    ]}, "signal")
    later = conversation(store, bridge, "signal:c")
    assert later["last_message_at_ms"] == 3_000
    assert later["updated_at_ms"] == first["updated_at_ms"] == first["created_at_ms"]
    assert ingest.counters.of(bridge).snapshot()["roster_changes"] == 1


def test_a_row_not_asked_for_ahead_is_read_when_first_used(store):
    w = World(store, "signal")
    bob = ref("+15550100", "Bob", platform="signal")
    w.frame([msg("signal:c", "m1", bob, at=1_000)])
    events = [msg("signal:c", "m2", bob, at=2_000), msg("signal:c", "m1", bob, at=1_000)]
    with store.write() as tx:
        batch = Batch(tx, w.bridge_id, "signal")  # nothing asked for: every row read when used
        ctx = ProjectionContext(w.bridge_id, "signal", "in_x", 5, 5, Counters(INGEST_COUNTERS), batch=batch)
        assert project_frame(tx, ctx, events)
        batch.flush()
    counts = {k: v for k, v in ctx.counters.snapshot().items() if v}
    # the stored sender and m1 were read, not taken for new: one message and one bump written
    assert counts == {"messages_written": 1, "conversations_written": 1, "imported": 1}
    assert w.message("signal:c", "m2")["body"] == "hello"


def test_a_row_read_inside_a_frame_that_fails_stays_known_with_its_id(store):
    w = World(store, "signal")
    w.frame([msg("signal:c", "m1", ref("+15550100", "Bob", platform="signal"), at=1_000)])
    cid = conversation_id_for(w.bridge_id, "signal:c")
    with store.write() as tx:
        batch = Batch(tx, w.bridge_id, "signal")
        with pytest.raises(RuntimeError), batch.frame():
            assert batch.conversations.get("signal:c") is not None  # read here, not asked for ahead
            raise RuntimeError("the frame fails")
        # a read is a fact about the store, not a change of the frame: it is not taken back
        assert batch.conversations.exists(cid)
        assert batch.conversations.touch(cid, w.now + 60_000) == 1

def test_a_batch_reads_every_row_it_asked_for_in_one_round_trip(store):
    w = World(store, "signal")
    bob, ann = ref("+15550100", "Bob", platform="signal"), ref("+15550111", "Ann", platform="signal")
    events = [msg(f"signal:{c}", f"m{n}", who, at=1_000 + n) for n, (c, who) in
              enumerate([("a", bob), ("b", ann), ("a", ann), ("c", bob)])]
    with store.write() as tx:
        batch = Batch(tx, w.bridge_id, "signal")
        want_rows(batch, events)
        before = store.meter.snapshot()
        batch.read()
        after = store.meter.snapshot()
    reads = after["statements"] - before["statements"]
    # identities, conversations, roster places, messages: one statement each, for every key
    assert reads == 4 + (1 if store.dialect == "postgresql" else 0)  # (+ BEGIN on PostgreSQL)
    assert after["round_trips"] - before["round_trips"] == (1 if store.dialect == "postgresql" else 4)


@pytest.mark.postgres_only
def test_the_drain_takes_the_bridges_lock_before_it_reads_a_frames_rows(store, monkeypatch):
    sent = wire_log()
    ingest = Ingest(store=store, apply_on_append=False, decode=decode, codec_platforms={CODEC: "signal"})
    try:
        bridge = create_bridge(store, platform="signal", name="p")["id"]
        ingest.append_body(bridge, frame("1", ["signal:a", "m1", "+15550100", "Bob", "hi", 1_000]), "signal")
        sent.start(monkeypatch)
        ingest.worker.drain_if_due()
    finally:
        ingest.stop()
    assert outcomes(store, bridge) == ["applied"]
    lock = next(i for i, sql in enumerate(sent) if "pg_advisory_xact_lock(hashtextextended" in sql)
    first_read = next(i for i, sql in enumerate(sent) if "FROM identities" in sql)
    assert lock < first_read


@pytest.mark.postgres_only
def test_an_outgoing_message_takes_its_echo_lock_before_its_echo_read(store, monkeypatch):
    sent = wire_log()
    payload = json.loads((FIXTURES / "signal_sync_sent_direct.json").read_text())
    ingest = Ingest(store=store)
    try:
        bridge = create_bridge(store, platform="signal", name="p")["id"]
        sent.start(monkeypatch)
        ingest.append_body(bridge, {"codec": "signal.jsonrpc", "codec_version": 1, "dedupe_key": "s0",
                                    "payload": payload}, "signal")
    finally:
        ingest.stop()
    assert outcomes(store, bridge) == ["applied"]
    locks = [i for i, sql in enumerate(sent) if "pg_advisory_xact_lock(" in sql and "hashtextextended" not in sql]
    reads = [i for i, sql in enumerate(sent) if "FROM outbox" in sql]
    assert len(locks) == 1 and len(reads) == 1 and locks[0] < reads[0], sent


@pytest.mark.postgres_only
def test_a_frame_that_may_call_the_hook_leaves_its_savepoints_release_to_the_commit(store, monkeypatch):
    sent = wire_log()
    class Hook:
        def acts_on(self, tx: Tx, conversation_id: str) -> bool:
            return True

        def __call__(self, tx: Tx, change: Any) -> None:  # reads the store: the savepoint goes out
            tx.raw("SELECT body FROM bridge_messages WHERE id = %s", (change.message_id,)).fetchone()

    ingest = Ingest(store=store, decode=decode, codec_platforms={CODEC: "signal"}, on_message=Hook())
    try:
        bridge = create_bridge(store, platform="signal", name="p")["id"]
        sent.start(monkeypatch)
        ingest.append_body(bridge, frame("1", ["signal:a", "m1", "+15550100", "Bob", "hi", 1_000]), "signal")
    finally:
        ingest.stop()
    assert outcomes(store, bridge) == ["applied"]
    assert any(sql.startswith("SAVEPOINT ") for sql in sent), sent
    assert not any(sql.startswith("RELEASE SAVEPOINT ") for sql in sent), sent  # the COMMIT releases it


@pytest.mark.postgres_only
def test_a_set_read_probes_an_index_a_key_even_in_a_generic_plan(store):
    w = World(store, "signal")
    with store.write() as tx:
        tx.raw(
            "INSERT INTO identities (id, bridge_id, kind, canonical, raw, created_at_ms, updated_at_ms) "
            "SELECT 'idn_' || n, %s, 'e164', '+1555' || n, '+1555' || n, 1, 1 FROM generate_series(1, 5000) n",
            (w.bridge_id,),
        )
        tx.raw("ANALYZE identities")
    stmt, params = identities_store.READ_BY_KEYS.of([("e164", "+15551"), ("e164", "+15552")], bridge_id=w.bridge_id)
    sql, _ = stmt.compiled("postgresql")
    with store.write() as tx:
        tx.raw("SET LOCAL plan_cache_mode = force_generic_plan")
        plan = "\n".join(r[0] for r in tx.raw("EXPLAIN " + sql, params).fetchall())
    assert "Seq Scan on identities" not in plan and "identities_bridge_id_kind_canonical_key" in plan, plan


def test_the_drain_applies_a_frame_in_a_batch_of_its_own(store):
    ingest = Ingest(store=store, apply_on_append=False, decode=decode, codec_platforms={CODEC: "signal"})
    try:
        bridge = create_bridge(store, platform="signal", name="p")["id"]
        for n in range(3):
            ingest.append_body(bridge, frame(str(n), ["signal:a", f"m{n}", "+15550100", "Bob", "hi", 1_000 + n]),
                               "signal")
        stats = ingest.worker.drain_if_due()
    finally:
        ingest.stop()
    assert stats is not None and stats.applied == 3
    assert conversation(store, bridge, "signal:a")["last_message_at_ms"] == 1_002
    assert conversation_id_for(bridge, "signal:a").startswith("conv_")
    with store.read() as tx:
        assert inbox_store.backlog(tx) == 0


def test_a_read_that_brings_a_row_again_never_takes_back_what_the_batch_made_of_it():
    # Two reads may name one key (a message by id and by its remote id; a roster whole and
    # its member): the second must leave the batch's row, with its changes, as it is.
    table = Table(Journal())
    table.load("m1", "stored")
    table.put("m1", "edited")
    table.load("m1", "stored")
    table.load_found(["m1"], {})
    assert table.get("m1") == "edited"
    assert table.changed() == [("m1", "stored", "edited")]


def test_a_batch_makes_only_the_families_its_frames_use_and_writes_them_parents_first(store):
    """A table family is made on first use (a lone message never makes the attachments,
    read cursors or echo claims); the flush still writes parents first (identities, then
    conversations, then messages: the foreign keys' order), in whatever order they were made."""
    w = World(store, "signal")
    events = [msg("signal:c", "m1", ref("+15550100", "Bob", platform="signal"), at=1_000)]
    with store.write() as tx:
        batch = Batch(tx, w.bridge_id, "signal")
        assert batch._made == {}
        batch.messages, batch.conversations  # noqa: B018 - made children first, on purpose
        want_rows(batch, events)
        assert list(batch._made) == ["messages", "conversations", "identities"]
        batch.read()
        ctx = ProjectionContext(w.bridge_id, "signal", "in_x", 5, 5, Counters(INGEST_COUNTERS), batch=batch)
        assert project_frame(tx, ctx, events)
        assert sorted(batch._made) == ["conversations", "identities", "messages", "reactions"]
        batch.flush()  # (a message before its conversation or sender breaks a foreign key here)
    assert w.message("signal:c", "m1")["body"] == "hello"
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        batch.nothing  # noqa: B018 - not a family: an AttributeError as usual
