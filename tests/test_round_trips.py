"""Round trips: deferred statements and read-aheads ride with the next statement on
PostgreSQL, and a frame or a post costs a known count (``Store.meter``), on both backends.

The counts are the guarantee the issue-12 work is judged by (deterministic, unlike timings):
a test pins each hot path's count, so a change that adds a round trip fails here.
"""

from __future__ import annotations

import pytest

from tidings.hub import accounts as accounts_hub
from tidings.hub import channels as channels_hub
from tidings.hub.tokens import Principal
from tidings.store.engine import WriteBehindFailed
from tidings.store.sql import Stmt

PG = "postgresql"
INSERT = Stmt("INSERT INTO rt_probe (k, v) VALUES (:k, :v)")
GET = Stmt("SELECT v FROM rt_probe WHERE k = :k")
LOCK = Stmt("SELECT pg_advisory_xact_lock(42)")


@pytest.fixture
def conn(store):
    c = store.dedicated()
    with c.write() as tx:
        tx.raw("CREATE TEMP TABLE rt_probe (k TEXT PRIMARY KEY, v INTEGER NOT NULL)")
    yield c
    c.close()


def sent(store, before):
    after = store.meter.snapshot()
    return {k: after[k] - before[k] for k in after}


def probe(conn) -> dict[str, int]:
    with conn.read() as tx:
        return dict(tx.raw("SELECT k, v FROM rt_probe").fetchall())


def test_begin_a_deferred_lock_and_a_savepoint_ride_with_the_first_statement(store, conn):
    before = store.meter.snapshot()
    with conn.write() as tx:
        if tx.dialect == PG:
            tx.defer(LOCK)
        with tx.savepoint():
            tx.execute(INSERT, {"k": "a", "v": 1})
        with tx.savepoint():
            tx.execute(INSERT, {"k": "b", "v": 2})
    if store.dialect == PG:
        # [BEGIN, lock, SAVEPOINT, INSERT] [RELEASE, SAVEPOINT, INSERT] COMMIT; the last RELEASE is dropped.
        assert sent(store, before) == {"statements": 8, "round_trips": 3, "commits": 1}
    else:
        # BEGIN IMMEDIATE, then SAVEPOINT, INSERT, RELEASE twice, COMMIT: each one call.
        assert sent(store, before) == {"statements": 8, "round_trips": 8, "commits": 1}
    assert probe(conn) == {"a": 1, "b": 2}


def test_a_savepoint_left_before_any_statement_costs_nothing(store, conn):
    with conn.write() as tx:
        tx.execute(INSERT, {"k": "a", "v": 1})
        before = store.meter.snapshot()
        with pytest.raises(ValueError):
            with tx.savepoint():
                raise ValueError("a decode error: nothing was sent")
        with tx.savepoint():
            pass
        if store.dialect == PG:
            assert sent(store, before) == {"statements": 0, "round_trips": 0, "commits": 0}
        tx.execute(INSERT, {"k": "b", "v": 2})
    assert probe(conn) == {"a": 1, "b": 2}


def test_a_failing_savepoint_takes_back_only_its_own_work_and_what_waited_inside_it(store, conn):
    with conn.write() as tx:
        tx.execute(INSERT, {"k": "a", "v": 1})
        with pytest.raises(Exception) as failed:
            with tx.savepoint():
                tx.execute(INSERT, {"k": "b", "v": 2})
                with tx.savepoint():  # nested, released: its RELEASE waits
                    tx.execute(INSERT, {"k": "c", "v": 3})
                tx.read_ahead(GET, {"k": "a"})  # waits inside the failing savepoint
                tx.execute(INSERT, {"k": "a", "v": 9})  # duplicate key
        assert "rt_probe" in str(failed.value) or "UNIQUE" in str(failed.value) or "duplicate" in str(failed.value)
        # The transaction goes on: the read-ahead issued inside is gone, a read is sent again.
        assert tx.one(GET, {"k": "a"}) == (1,)
        with tx.savepoint():
            tx.execute(INSERT, {"k": "d", "v": 4})
    assert probe(conn) == {"a": 1, "d": 4}


def test_a_read_ahead_answers_its_read_once_in_the_round_trip_of_the_next_statement(store, conn):
    with conn.write() as tx:
        tx.execute(INSERT, {"k": "a", "v": 1})
        before = store.meter.snapshot()
        tx.read_ahead(GET, {"k": "a"})
        tx.read_ahead(GET, {"k": "zz"})
        assert tx.one(GET, {"k": "a"}) == (1,)
        assert tx.one(GET, {"k": "zz"}) is None
        if store.dialect == PG:
            assert sent(store, before) == {"statements": 2, "round_trips": 1, "commits": 0}
        tx.execute(INSERT, {"k": "zz", "v": 5})
        assert tx.one(GET, {"k": "zz"}) == (5,)  # used once: this read is sent again
    assert probe(conn) == {"a": 1, "zz": 5}


UPDATE = Stmt("UPDATE rt_probe SET v = :v WHERE k = :k")


def test_a_withdrawn_read_ahead_never_answers_a_later_read_after_a_write(store, conn):
    """A read announced ahead, sent, then not read (``drop_ahead``): a later read of the
    same statement and params, after a write, sees the write, not the early answer."""
    with conn.write() as tx:
        tx.execute(INSERT, {"k": "a", "v": 1})
        tx.read_ahead(GET, {"k": "a"})
        tx.execute(INSERT, {"k": "b", "v": 2})  # the read-ahead goes out with this one
        tx.drop_ahead(GET, {"k": "a"})
        tx.execute(UPDATE, {"k": "a", "v": 3})
        assert tx.one(GET, {"k": "a"}) == (3,)
    assert probe(conn) == {"a": 3, "b": 2}


def test_an_unsent_deferred_statement_is_dropped_when_the_transaction_ends(store, conn):
    before = store.meter.snapshot()
    with conn.write() as tx:
        tx.defer(LOCK if store.dialect == PG else GET, {} if store.dialect == PG else {"k": "a"})
    if store.dialect == PG:
        # Nothing else ran: no BEGIN, no lock, no COMMIT went out.
        assert sent(store, before) == {"statements": 0, "round_trips": 0, "commits": 1}


def test_a_post_costs_one_round_trip_on_postgresql(runtime):
    store = runtime.store
    owner = accounts_hub.create_account(store, kind="human", handle="owner")
    member = accounts_hub.create_account(store, kind="human", handle="member")
    principal = Principal(scope="account", account_id=owner.id, kind="human")
    ch = channels_hub.create_channel(store, principal, name="rt", members=[member.id])
    runtime.posting.post(author_id=member.id, channel_id=ch["id"], text="first, makes the topic")
    before = store.meter.snapshot()
    row, inserted = runtime.posting.post(
        author_id=member.id, channel_id=ch["id"], text="hello", client_request_id="c1"
    )
    assert inserted and row["channel_seq"] == 2 and row["topic_id"]
    if store.dialect == PG:
        # [the post's checks, channel_seq and insert: one statement that commits alone]
        assert sent(store, before) == {"statements": 1, "round_trips": 1, "commits": 1}
    else:
        # BEGIN IMMEDIATE, the post's reads, channel_seq, insert, COMMIT.
        assert sent(store, before) == {"statements": 5, "round_trips": 5, "commits": 1}
    before = store.meter.snapshot()
    again, inserted = runtime.posting.post(
        author_id=member.id, channel_id=ch["id"], text="hello", client_request_id="c1"
    )
    assert not inserted and again["id"] == row["id"]
    if store.dialect == PG:
        # [the admitted insert: the client request id is used, nothing written]
        # [the post's reads, which carry the stored message]
        assert sent(store, before) == {"statements": 2, "round_trips": 2, "commits": 1}
    with store.read() as tx:
        assert tx.raw("SELECT last_seq FROM channels WHERE id = '%s'" % ch["id"]).fetchone()[0] == 2


# -- the stuck backlog: frames waiting out their backoff --------------------------------------
class _Stuck:
    """Scripted decode/project for the ingest worker: frames whose id is in ``stuck`` fail
    transiently on every try (raised in the client: the failure itself costs no round trip);
    every other frame projects nothing."""

    def __init__(self, dialect: str) -> None:
        from tidings.ingest.apply import busy_error

        self.error = lambda: busy_error(dialect)
        self.stuck: set[str] = set()
        self.tries = 0

    def decode(self, codec, version, payload):
        return [payload]

    def project(self, tx, ctx, events):
        if events[0] in self.stuck:
            self.tries += 1
            raise self.error()
        return False


def test_frames_waiting_out_their_backoff_cost_a_later_frame_no_round_trip_and_a_retry_round_one_try(
    store, clock, faults
):
    """N backed-off frames: a later frame costs what it costs with none (passing them over
    is free), and when their retry comes due the worker's round costs one try per frame."""
    from tidings.bridges.registry import create_bridge
    from tidings.ingest.engine import Ingest
    from tidings.ingest.inbox import Frame

    n = 3
    script = _Stuck(store.dialect)
    sleeps: list[float] = []
    ingest = Ingest(store=store, faults=faults, clock=clock, decode=script.decode, project=script.project,
                    validate=False, sleep=sleeps.append)
    bridge = create_bridge(store, platform="signal", name="rt-stuck")["id"]
    worker = ingest.worker

    def later(name: str) -> dict[str, int]:
        """One later frame as a bridge sends it: the append, then the worker if woken."""
        clock.advance(1)
        before = store.meter.snapshot()
        [res] = ingest.append(bridge, [Frame("test.script", 1, "", None, name)])
        worker.drain_if_due()
        assert not res.replay
        return sent(store, before)

    try:
        later("warm-up")
        none_backed_off = later("first")
        for i in range(n):
            script.stuck.add(f"stuck{i}")
            later(f"stuck{i}")  # left unprocessed on append; its first drain defers it
        assert len(worker.retries) == n and script.tries == n * 5  # 1 on append + 4 in the drain
        assert sleeps == [0.005, 0.010, 0.020] * n
        # While they wait: a later frame is applied on append, exactly as with none backed off.
        assert later("second") == none_backed_off
        assert script.tries == n * 5
        # Their retry comes due: the worker's timer round lists the backlog and gives each
        # backed-off frame ONE try (no in-attempt retries, no sleeps), all still failing.
        clock.advance(1000)
        before = store.meter.snapshot()
        stats = worker.drain_if_due()
        assert stats is not None and stats.deferred == n
        assert script.tries == n * 6 and sleeps == [0.005, 0.010, 0.020] * n
        if store.dialect == PG:
            # list: [page] (autocommit, D106); each try: [BEGIN, claim] [ROLLBACK]
            assert sent(store, before) == {"statements": 1 + 3 * n, "round_trips": 1 + 2 * n, "commits": 0}
        else:
            # list: BEGIN, page, ROLLBACK; each try: BEGIN IMMEDIATE, claim, ROLLBACK
            assert sent(store, before) == {"statements": 3 + 3 * n, "round_trips": 3 + 3 * n, "commits": 0}
        assert later("third") == none_backed_off
    finally:
        ingest.stop()


# -- writes sent behind (``Tx.later``, D105) ------------------------------------------------
def behind(tx):
    """Turn write-behind on for ``tx`` (apply on append does this on PostgreSQL)."""
    tx.write_behind = True
    return tx


def test_a_write_sent_behind_goes_out_with_the_commit_in_one_round_trip(store, conn):
    before = store.meter.snapshot()
    counted: list[int] = []
    with conn.write() as tx:
        behind(tx).execute(INSERT, {"k": "a", "v": 1})
        rows = tx.later(INSERT, {"k": "b", "v": 2})
        tx.after_commit(lambda: counted.append(int(rows)))
    if store.dialect == PG:
        # [BEGIN, INSERT a] [INSERT b, COMMIT]
        assert sent(store, before) == {"statements": 4, "round_trips": 2, "commits": 1}
    else:  # SQLite runs it at once: BEGIN IMMEDIATE, INSERT, INSERT, COMMIT
        assert sent(store, before) == {"statements": 4, "round_trips": 4, "commits": 1}
    assert counted == [1] and probe(conn) == {"a": 1, "b": 2}


def test_a_write_sent_behind_rides_with_the_next_statement_which_sees_it(store, conn):
    with conn.write() as tx:
        behind(tx).execute(INSERT, {"k": "a", "v": 1})
        before = store.meter.snapshot()
        tx.later(UPDATE, {"k": "a", "v": 7})
        assert tx.one(GET, {"k": "a"}) == (7,)
        if store.dialect == PG:
            assert sent(store, before) == {"statements": 2, "round_trips": 1, "commits": 0}
    assert probe(conn) == {"a": 7}


def test_reading_a_write_sent_behind_early_costs_a_round_trip_never_a_wrong_answer(store, conn):
    with conn.write() as tx:
        behind(tx).execute(INSERT, {"k": "a", "v": 1})
        rows = tx.later(UPDATE, {"k": "a", "v": 2}) + tx.later(UPDATE, {"k": "nobody", "v": 2})
        before = store.meter.snapshot()
        assert rows.known() == (store.dialect != PG)
        assert int(rows) == 1 and rows == 1 and rows
        if store.dialect == PG:
            assert sent(store, before) == {"statements": 2, "round_trips": 1, "commits": 0}
        assert rows.known()
    assert probe(conn) == {"a": 2}


def test_a_savepoint_that_sent_nothing_keeps_the_writes_it_sent_behind(store, conn):
    """A savepoint is released for free when no statement of it was sent, but a write sent
    behind inside it must still run: it goes out with the commit."""
    with conn.write() as tx:
        behind(tx).execute(INSERT, {"k": "a", "v": 1})
        with tx.savepoint():
            tx.later(INSERT, {"k": "b", "v": 2})
    assert probe(conn) == {"a": 1, "b": 2}


def test_a_write_sent_behind_that_fails_inside_its_savepoint_is_taken_back_by_it_alone(store, conn):
    with conn.write() as tx:
        behind(tx).execute(INSERT, {"k": "a", "v": 1})
        with pytest.raises(Exception) as failed:
            with tx.savepoint():
                tx.later(INSERT, {"k": "b", "v": 2})
                tx.later(INSERT, {"k": "a", "v": 9})  # duplicate key
                tx.one(GET, {"k": "b"})  # PostgreSQL: the writes go out here, inside
        assert not isinstance(failed.value, WriteBehindFailed)
        assert "UNIQUE" in str(failed.value) or "duplicate" in str(failed.value)
        tx.execute(INSERT, {"k": "c", "v": 3})  # the transaction goes on
    assert probe(conn) == {"a": 1, "c": 3}


@pytest.mark.postgres_only
def test_a_write_sent_behind_that_fails_after_its_savepoint_ended_loses_the_transaction(store, conn):
    """No savepoint can take it back alone (the one it was issued in has ended), so none
    tries: ``WriteBehindFailed``, and the whole transaction is rolled back."""
    ran: list[str] = []
    with pytest.raises(WriteBehindFailed) as failed:
        with conn.write() as tx:
            behind(tx).execute(INSERT, {"k": "a", "v": 1})
            tx.after_commit(lambda: ran.append("after"))
            with tx.savepoint():
                tx.later(INSERT, {"k": "a", "v": 9})  # duplicate key, waiting behind
            with tx.savepoint():  # the next frame: its first statement sends the write
                tx.execute(INSERT, {"k": "b", "v": 2})
    assert "duplicate" in str(failed.value.__cause__)
    assert ran == [] and probe(conn) == {}


@pytest.mark.postgres_only
def test_a_write_sent_behind_that_fails_at_commit_loses_the_transaction(store, conn):
    ran: list[str] = []
    with pytest.raises(WriteBehindFailed):
        with conn.write() as tx:
            behind(tx).execute(INSERT, {"k": "a", "v": 1})
            tx.after_commit(lambda: ran.append("after"))
            tx.later(INSERT, {"k": "a", "v": 9})
    assert ran == [] and probe(conn) == {}
    with conn.write() as tx:  # the connection is usable again
        tx.execute(INSERT, {"k": "b", "v": 2})
    assert probe(conn) == {"b": 2}


def test_a_read_announced_inside_a_savepoint_and_never_read_is_forgotten_when_it_ends(store, conn):
    """Otherwise a later read of the same row, after a write, would take the early answer."""
    with conn.write() as tx:
        tx.execute(INSERT, {"k": "a", "v": 1})
        with tx.savepoint():
            tx.read_ahead(GET, {"k": "a"})
            tx.execute(INSERT, {"k": "b", "v": 2})  # the read goes out with this one
        tx.execute(UPDATE, {"k": "a", "v": 3})
        assert tx.one(GET, {"k": "a"}) == (3,)
    assert probe(conn) == {"a": 3, "b": 2}
