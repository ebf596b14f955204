"""The consumer's cheap paths (D33): bus events handled in batches with one read for all of
them, autocommit reads and a single-statement flush on PostgreSQL, a relaxed session only
for the flush, and one reader wake-up per event loop. Each must change the cost and nothing
else: the equivalence property runs the same posts one event per batch and all in one batch
and requires identical dispatches, owed rows, marks and counters.
"""

from __future__ import annotations

import asyncio
import threading

import pytest
from delivery_world import ADMIN_TOKEN, World, fresh_database_urls
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tidings.clock import FakeClock
from tidings.delivery import consumer as consumer_mod
from tidings.delivery import sessions as sessions_mod
from tidings.delivery import unit as unit_mod
from tidings.delivery.sessions import Dispatch, Session, coalesced_wakes
from tidings.faults import Faults
from tidings.runtime import Runtime
from tidings.store import delivery as delivery_store
from tidings.store import engine as engine_mod
from tidings.store import messages as messages_store
from tidings.store import owed as owed_store


def _fresh_urls(backend_url, tmp_path):
    return fresh_database_urls(backend_url, tmp_path, "batch")


# -- batched == one by one ---------------------------------------------------------------------
AUTHORS = ("hu", "hu", "hu", "a1", "a2", "a3")  # a1, a2 live (held); a3 offline (fans out now)
PINGS = ("a0", "a1", "a2", "a3", "everyone", "users")
POST = st.tuples(st.just("post"), st.sampled_from(AUTHORS), st.sampled_from(("C", "D")),
                 st.lists(st.sampled_from(PINGS), max_size=2, unique=True))
OPS = st.lists(
    st.one_of(POST, POST, POST, st.tuples(st.sampled_from(("edit", "delete")), st.integers(0, 20))),
    min_size=1,
    max_size=14,
)


def _run(url, ops, event_batch):
    """One world, the ops applied with no pump in between, then the consumer run dry; the
    observable outcome with message ids replaced by their tags and agents by handle."""
    clock = FakeClock()
    rt = Runtime(url, clock=clock, faults=Faults(), admin_token=ADMIN_TOKEN)
    # Small queues, so refusals and catch-up sweeps happen inside a batch too.
    w = World(rt, session_capacity=3, session_low_water=1, sweep_page=2, event_batch=event_batch)
    try:
        hu = w.human("hu")
        ids = {"hu": hu, **{a: w.agent(a, owner=hu) for a in ("a0", "a1", "a2", "a3")}}
        ch = {
            "C": w.channel("C", hu, members=[ids["a0"], ids["a1"], ids["a2"]], subscribe=[ids["a0"], ids["a2"]]),
            "D": w.channel("D", hu, members=[ids["a1"], ids["a2"], ids["a3"]], subscribe=[ids["a1"], ids["a3"]]),
        }
        members = {"C": ("a0", "a1", "a2"), "D": ("a1", "a2", "a3")}
        for a in ("a0", "a1", "a2"):
            w.connect(ids[a])
        w.pump()
        for a in ("a0", "a1", "a2"):
            w.got(ids[a])  # the (empty) start sweeps
        tag_of: dict[str, str] = {}
        posted: list[str] = []
        for n, op in enumerate(ops):
            if op[0] == "post":
                _, author, channel, pings = op
                if author != "hu" and author not in members[channel]:
                    continue
                text = " ".join(f"@{p}" for p in pings) + f" m{n}"
                mid = w.post(ids[author], ch[channel], text)
                tag_of[mid] = f"m{n}"
                posted.append(mid)
            elif posted:
                mid = posted[op[1] % len(posted)]
                if op[0] == "edit":
                    with w.store.write() as tx:
                        messages_store.set_blocks(tx, mid, [{"kind": "text", "text": f"edited {tag_of[mid]}"}],
                                                  f"edited {tag_of[mid]}", clock.now_ms())
                else:
                    with w.store.write() as tx:
                        messages_store.mark_deleted(tx, mid, clock.now_ms())
        handle_of = {v: k for k, v in ids.items()}
        seen: dict[str, list[tuple[str, str, str]]] = {a: [] for a in ("a0", "a1", "a2")}

        def drain_all():
            moved = False
            for a in ("a0", "a1", "a2"):
                for item in w.sessions[ids[a]].drain():
                    assert isinstance(item, Dispatch)
                    text = item.message["blocks"][0]["text"]
                    seen[a].append((item.kind, tag_of[item.message_id], text))
                    moved = True
            return moved

        def run_dry():
            while True:
                n = w.pump()
                if not drain_all() and not n:
                    return

        run_dry()
        for a in ("a1", "a2"):  # the live authors settle: their held posts fire
            w.settle(ids[a])
        run_dry()
        with w.store.read() as tx:
            owed = sorted(
                (handle_of[a], tag_of[m])
                for a, m in tx.raw("SELECT agent_id, message_id FROM owed_mentions WHERE acked_at_ms IS NULL")
            )
            routed = sorted(
                tag_of[m] for (m,) in tx.raw("SELECT id FROM messages WHERE mentions_routed_at IS NOT NULL")
            )
        counters = {k: v for k, v in w.counters().items() if k in (
            "delivered", "steered", "owed_recorded", "held", "settled", "dispatch_refused", "deliver_deferred",
            "deliver_deduped", "route_failures", "flush_failures")}
        woken = sorted({handle_of[a] for a, _ in w.waker.calls})
        return {"seen": seen, "owed": owed, "routed": routed, "counters": counters, "woken": woken}
    finally:
        w.close()
        rt.stop()


def test_a_batch_is_handled_exactly_as_its_events_one_by_one(backend_url, tmp_path):
    fresh = _fresh_urls(backend_url, tmp_path)

    @settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(ops=OPS)
    def check(ops):
        one_by_one = _run(fresh(), ops, event_batch=1)
        batched = _run(fresh(), ops, event_batch=256)
        assert batched == one_by_one

    check()


def test_an_example_batch_with_every_path_in_it(world):
    # Held, fanned out, deleted, edited, gap mention (owed + steer), in-sweep mention
    # (steer only), @everyone, two channels: all in one pump, one read.
    hu = world.human("hu")
    a0, a1, a2 = (world.agent(h, owner=hu) for h in ("a0", "a1", "a2"))
    c = world.channel("C", hu, members=[a0, a1, a2], subscribe=[a0, a2])
    d = world.channel("D", hu, members=[a1], subscribe=[a1])
    for a in (a0, a1, a2):
        world.connect(a)
    world.pump()
    m1 = world.post(hu, c, "@a1 gap")  # a1 outside C's sweep set: owed + steer
    m2 = world.post(a2, c, "@a0 held")  # a2 is live: held until it settles
    m3 = world.post(hu, d, "plain in D")
    m4 = world.post(hu, c, "@a0 in sweep")  # a0 steered only, a2 delivered
    m5 = world.post(hu, c, "to be deleted")
    m6 = world.post(hu, c, "before edit")
    with world.store.write() as tx:
        messages_store.mark_deleted(tx, m5, 1)
        messages_store.set_blocks(tx, m6, [{"kind": "text", "text": "after edit"}], "after edit", 2)
    calls = []
    original = delivery_store.messages_with_agents
    delivery_store.messages_with_agents = (
        lambda tx, ids, channels=None, roster=None: calls.append(list(ids)) or original(tx, ids, channels, roster)
    )
    try:
        world.pump()
    finally:
        delivery_store.messages_with_agents = original
    assert calls == [[m1, m3, m4, m5, m6]]  # one read; the held m2 is not read
    assert world.got(a0) == [("deliver", m1), ("steer", m4), ("deliver", m6)]
    assert world.got(a1) == [("steer", m1), ("deliver", m3)]
    assert world.got(a2) == [("deliver", m1), ("deliver", m4), ("deliver", m6)]
    assert world.owed() == [(a1, m1)]
    assert [world.routed(m) for m in (m1, m2, m3, m4, m5, m6)] == [True, False, True, True, True, True]
    world.settle(a2)
    world.pump()
    assert world.got(a0) == [("steer", m2)]
    assert world.routed(m2)


def test_the_consumer_reads_and_flushes_a_batch_in_two_statements(world):
    hu = world.human("hu")
    agents = [world.agent(f"a{i}", owner=hu) for i in range(4)]
    chans = [world.channel(f"C{i}", hu, members=agents, subscribe=agents[:3]) for i in range(3)]
    for a in agents:
        world.connect(a)
    world.pump()
    for i in range(60):
        world.post(hu, chans[i % 3], f"@a{i % 4} @a3 item {i}")  # a3 is a gap member: owed rows too
    count = [0]
    original = engine_mod.Tx.execute

    def counting(self, stmt, params=None):
        count[0] += 1
        return original(self, stmt, params)

    engine_mod.Tx.execute = counting
    try:
        world.pump()
    finally:
        engine_mod.Tx.execute = original
    # The rows and the agents of the events' channels in one statement; the flush: one
    # statement on PostgreSQL (in autocommit, so no BEGIN/COMMIT either), owed rows then
    # marks in one transaction on SQLite.
    assert count[0] == (2 if world.store.dialect == "postgresql" else 3)
    assert world.counters()["steered"] == 60 + 45 and world.counters()["owed_recorded"] == 60
    with world.store.read() as tx:
        assert delivery_store.unrouted_page(tx, 0, 100) == []


def test_a_failed_batched_read_falls_back_to_reading_each_message(world):
    hu = world.human("hu")
    gap = world.agent("gap", owner=hu)
    sub = world.agent("sub", owner=hu)
    c = world.channel("C", hu, members=[gap, sub], subscribe=[sub])
    world.connect(sub)
    world.pump()
    world.faults.arm(consumer_mod.BATCH_READ_FAULT, 1)
    ms = [world.post(hu, c, f"@gap m{i}") for i in range(3)]
    world.pump()
    assert world.got(sub) == [("deliver", m) for m in ms]
    assert sorted(world.owed(gap)) == sorted(ms)
    assert all(world.routed(m) for m in ms)
    assert world.counters()["route_failures"] == 0


def test_a_settle_fires_its_held_messages_with_one_read(world):
    hu = world.human("hu")
    author, reader = world.agent("author", owner=hu), world.agent("reader", owner=hu)
    c = world.channel("C", hu, members=[author, reader], subscribe=[reader])
    world.connect(author)
    world.connect(reader)
    world.pump()
    held = [world.post(author, c, f"turn {i}") for i in range(5)]
    world.pump()
    assert world.got(reader) == []
    calls = []
    original = delivery_store.messages_by_ids
    delivery_store.messages_by_ids = lambda tx, ids: calls.append(list(ids)) or original(tx, ids)
    try:
        world.settle(author)
        world.pump()
    finally:
        delivery_store.messages_by_ids = original
    assert calls == [held]
    assert world.got(reader) == [("deliver", m) for m in held]
    assert world.counters()["settled"] == 5 and not world.d.consumer.held_ids


def test_an_overrun_met_while_taking_a_batch_comes_after_the_events_taken_before_it(world):
    # The event taken before the overrun is handled first (held: its author is live), so
    # the overrun's scan skips it instead of routing it before its author settled.
    hu = world.human("hu")
    author, gap = world.agent("author", owner=hu), world.agent("gap", owner=hu)
    c = world.channel("C", hu, members=[author, gap], subscribe=[author])
    world.connect(author)
    world.connect(gap)
    world.pump()
    m1 = world.post(author, c, "@gap during my turn")
    world.faults.arm("bus.overrun", 1)
    m2 = world.post(hu, c, "@gap lost publish")
    world.pump()
    assert world.counters()["overruns_handled"] == 1
    assert world.got(gap) == [("steer", m2)]  # the scan routed m2 only
    assert not world.routed(m1) and m1 in world.d.consumer.held_ids
    world.settle(author)
    world.pump()
    assert world.got(gap) == [("steer", m1)]
    assert sorted(world.owed(gap)) == sorted([m1, m2])


# -- the store's cheap paths ---------------------------------------------------------------------
def test_autocommit_reads_open_no_transaction_on_postgres_and_a_snapshot_on_sqlite(store):
    ded = store.dedicated()
    try:
        with ded.autocommit_read() as tx:
            assert tx.raw("SELECT 1").fetchone()[0] == 1
            if store.dialect == "postgresql":
                from psycopg.pq import TransactionStatus

                assert ded.dbapi.info.transaction_status == TransactionStatus.IDLE  # no BEGIN was sent
            else:
                assert ded.dbapi.in_transaction  # SQLite keeps its snapshot
        with ded.read() as tx:
            tx.raw("SELECT 1").fetchone()
            if store.dialect == "postgresql":
                from psycopg.pq import TransactionStatus

                assert ded.dbapi.info.transaction_status == TransactionStatus.INTRANS
        if store.dialect == "postgresql":
            assert ded.dbapi.autocommit is False  # given back as it was
        with ded.write() as tx:  # the ordinary transactions still work after it
            tx.raw("CREATE TEMP TABLE probe (x INTEGER)")
            tx.raw("DROP TABLE probe")
    finally:
        ded.close()


@pytest.mark.postgres_only
def test_an_autocommit_write_runs_one_statement_and_refuses_a_second(store):
    ded = store.dedicated()
    try:
        with ded.write() as tx:
            tx.raw("CREATE TEMP TABLE probe (x INTEGER)")
        with pytest.raises(RuntimeError, match="one statement"):
            with ded.autocommit_write() as tx:
                tx.raw("INSERT INTO probe VALUES (1)")
                tx.raw("INSERT INTO probe VALUES (2)")
        with ded.read() as tx:
            assert tx.raw("SELECT count(*) FROM probe").fetchone()[0] == 1  # the first committed alone
        with ded.write() as tx:
            tx.raw("DROP TABLE probe")
    finally:
        ded.close()


@pytest.mark.sqlite_only
def test_an_autocommit_write_is_a_transaction_on_sqlite(store):
    ded = store.dedicated()
    try:
        with ded.write() as tx:
            tx.raw("CREATE TEMP TABLE probe (x INTEGER)")
        with pytest.raises(RuntimeError):
            with ded.autocommit_write() as tx:
                tx.raw("INSERT INTO probe VALUES (1)")
                tx.raw("INSERT INTO probe VALUES (2)")
                raise RuntimeError("rolled back together")
        with ded.read() as tx:
            assert tx.raw("SELECT count(*) FROM probe").fetchone()[0] == 0
        with ded.write() as tx:
            tx.raw("DROP TABLE probe")
    finally:
        ded.close()


@pytest.mark.postgres_only
def test_session_settings_stay_on_their_connection_and_strict_commit_restores_the_default(store):
    def setting(tx):
        return tx.raw("SELECT current_setting('synchronous_commit')").fetchone()[0]

    with store.read() as tx:
        default = setting(tx)
    assert default != "off"  # the server's own default (the test server's is "on")
    ded = store.dedicated(pg_settings=delivery_store.CONSUMER_PG_SETTINGS)
    try:
        with ded.autocommit_read() as tx:
            assert setting(tx) == "off"
        with ded.write() as tx:
            delivery_store.strict_commit(tx)
            assert setting(tx) == default  # this transaction commits as durably as any other
        with ded.read() as tx:
            assert setting(tx) == "off"  # SET LOCAL ended with it
        ded.reconnect()
        with ded.read() as tx:
            assert setting(tx) == "off"  # applied again on the fresh connection
        dbapi = ded.dbapi
    finally:
        ded.close()
    assert dbapi.closed  # discarded, never handed back to the pool with the setting
    for _ in range(3):
        with store.read() as tx:
            assert setting(tx) == default


@pytest.mark.postgres_only
def test_the_consumer_connection_relaxes_the_flush_only(world):
    consumer = world.d.consumer
    consumer.open()

    def setting(tx):
        return tx.raw("SELECT current_setting('synchronous_commit')").fetchone()[0]

    with consumer._db.autocommit_write() as tx:  # how the flush runs
        assert setting(tx) == "off"
    with consumer._strict_write() as tx:  # session rows and every other write
        assert setting(tx) != "off"


def test_record_and_mark_commit_together_or_not_at_all(world):
    hu = world.human("hu")
    gap = world.agent("gap", owner=hu)
    c = world.channel("C", hu, members=[gap])
    m1, m2 = world.post(hu, c, "@gap one"), world.post(hu, c, "@gap two")
    with world.store.read() as tx:
        s1, s2 = (messages_store.message(tx, m)["seq"] for m in (m1, m2))
    ded = world.store.dedicated(pg_settings=delivery_store.CONSUMER_PG_SETTINGS)
    try:
        with pytest.raises(Exception):  # an owed row naming no account: the whole flush fails
            with ded.autocommit_write() as tx:
                owed_store.record_and_mark(tx, [(gap, m1, c), ("acc_nobody", m2, c)], [s1, s2], 5)
        assert world.owed() == [] and not world.routed(m1) and not world.routed(m2)
        with ded.autocommit_write() as tx:
            assert owed_store.record_and_mark(tx, [(gap, m1, c), (gap, m2, c)], [s1, s2], 5) == (2, 2)
        with ded.autocommit_write() as tx:
            assert owed_store.record_and_mark(tx, [(gap, m1, c)], [s1], 6) == (0, 0)
        with ded.autocommit_write() as tx:
            assert owed_store.record_and_mark(tx, [], [], 7) == (0, 0)
    finally:
        ded.close()
    assert sorted(world.owed(gap)) == sorted([m1, m2]) and world.routed(m1) and world.routed(m2)


# -- reader wake-ups ------------------------------------------------------------------------------
def _sessions(n):
    return [Session(f"ses{i}", f"acc{i}", capacity=8, low_water=2) for i in range(n)]


def _message(i):
    return Dispatch("deliver", {"id": f"msg{i}", "channel_id": "ch", "seq": i}, "ch")


def test_one_wake_per_event_loop_however_many_of_its_sessions_got_something():
    sessions = _sessions(5)
    got: dict[str, list[str]] = {}
    calls = []
    ready = threading.Event()

    async def main():
        loop = asyncio.get_running_loop()
        original = loop.call_soon_threadsafe

        def counting(*args, **kw):
            calls.append(args[0])
            return original(*args, **kw)

        loop.call_soon_threadsafe = counting

        async def read(s):
            while len(got.setdefault(s.agent_id, [])) < 2:
                item = await s.next(10)
                got[s.agent_id].append(item.message_id)

        tasks = [asyncio.ensure_future(read(s)) for s in sessions]
        await asyncio.sleep(0)
        ready.set()
        await asyncio.gather(*tasks)

    thread = threading.Thread(target=lambda: asyncio.run(main()))
    thread.start()
    assert ready.wait(10)
    _wait_until(lambda: all(s._waiter is not None for s in sessions))
    with coalesced_wakes():
        with coalesced_wakes():  # re-entrant: the outer block issues them
            for s in sessions:
                s.offer(_message(1))
        assert calls == []
    _wait_until(lambda: all(s._waiter is not None for s in sessions))
    assert len(calls) == 1
    for s in sessions:  # outside the block: one wake per waiting reader, as before
        s.offer(_message(2))
    thread.join(10)
    assert not thread.is_alive()
    assert len(calls) == 1 + len(sessions)
    assert got == {s.agent_id: ["msg1", "msg2"] for s in sessions}


def _wait_until(predicate, timeout=10.0):
    done = threading.Event()
    for _ in range(int(timeout / 0.01)):
        if predicate():
            return
        done.wait(0.01)
    raise AssertionError("condition not reached")


def test_next_times_out_with_none_and_a_later_offer_is_still_read():
    (s,) = _sessions(1)

    async def main():
        assert await s.next(0.01) is None
        assert s._waiter is None  # the timed-out waiter is gone
        waiting = asyncio.ensure_future(s.next(None))
        await asyncio.sleep(0)
        asyncio.get_running_loop().run_in_executor(None, s.offer, _message(7))
        item = await asyncio.wait_for(waiting, 10)
        assert item.message_id == "msg7"
        cancelled = asyncio.ensure_future(s.next(None))
        await asyncio.sleep(0)
        cancelled.cancel()
        with pytest.raises(asyncio.CancelledError):
            await cancelled
        assert s._waiter is None
        s.offer(_message(8))  # a wake for the cancelled waiter would be harmless; there is none
        assert (await s.next(1)).message_id == "msg8"

    asyncio.run(main())
    assert sessions_mod._deferred.__dict__.get("wakes") is None


# -- the consumer thread's held-back flush -----------------------------------------------------
@pytest.fixture
def slow_flush_world(runtime):
    # A flush held back far longer than any test: only an edge, a scan or a full unit
    # (or the wait_idle-bounded delay where a test asks for it) can flush.
    w = World(runtime, threaded=True, flush_delay_ms=60_000)
    try:
        yield w
    finally:
        w.close()


def test_a_start_edge_flushes_first_so_its_owed_sweep_sees_the_mention_just_routed(slow_flush_world):
    w = slow_flush_world
    hu = w.human("hu")
    gap = w.agent("gap", owner=hu)
    c = w.channel("C", hu, members=[gap])
    m = w.post(hu, c, "@gap while you were away")
    session = w.connect(gap)  # its start edge comes after the post's event
    item = session.get(timeout=10)
    assert isinstance(item, Dispatch) and (item.kind, item.message_id) == ("steer", m)
    assert w.owed(gap) == [m] and w.routed(m)


def test_a_scan_flushes_first_so_it_never_routes_a_mention_again(slow_flush_world):
    w = slow_flush_world
    hu = w.human("hu")
    gap = w.agent("gap", owner=hu)
    c = w.channel("C", hu, members=[gap])
    session = w.connect(gap)
    consumer = w.d.consumer
    assert consumer.wait_until(lambda: consumer.edges_done >= 1)
    m = w.post(hu, c, "@gap live")
    item = session.get(timeout=10)
    assert (item.kind, item.message_id) == ("steer", m)
    assert not w.routed(m)  # held back: the unit is not flushed yet
    scans = w.d.counters.get("scans")
    w.clock.advance(30_000)  # the periodic scan
    assert consumer.wait_until(lambda: w.d.counters.get("scans") > scans)
    assert w.routed(m) and w.owed(gap) == [m]
    assert w.d.counters.get("steered") == 1 and w.d.counters.get("scan_recovered") == 0
    assert session.pending() == 0


def test_wait_idle_returns_after_the_held_back_flush_and_close_posts_share_it(runtime):
    w = World(runtime, threaded=True, flush_delay_ms=2_000)
    try:
        hu = w.human("hu")
        gap = w.agent("gap", owner=hu)
        c = w.channel("C", hu, members=[gap])
        w.d.wait_idle()
        writes = []
        original = unit_mod.Flusher._write
        unit_mod.Flusher._write = lambda self, marks, owed: writes.append(len(marks)) or original(self, marks, owed)
        try:
            ms = [w.post(hu, c, f"@gap m{i}") for i in range(5)]
            w.d.wait_idle(10)
        finally:
            unit_mod.Flusher._write = original
        assert sorted(w.owed(gap)) == sorted(ms) and all(w.routed(m) for m in ms)
        assert writes == [5]  # one commit for the five
        assert w.waker.wait_for(1) and w.waker.of(gap) == ["mention"]
    finally:
        w.close()
