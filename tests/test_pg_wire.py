"""``store.pg_wire``: the store's PostgreSQL statements on libpq pipelines (D101).

Pinned here: values mean what they mean through a psycopg cursor (a property over the
types the store binds); a statement is prepared once per connection; a prepare the server
skipped is forgotten; the first error of a batch is psycopg's own class and leaves the
connection usable; a wait for the server releases the GIL.
"""

from __future__ import annotations

import datetime as dt
import decimal
import faulthandler
import threading

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tidings.store.pg_wire import Result, wire_of

pytestmark = pytest.mark.postgres_only


@pytest.fixture
def pg(store):
    """A raw psycopg connection of the store's pool, in autocommit (nothing to roll back)."""
    conn = store.engine.raw_connection()
    dbapi = conn.driver_connection
    dbapi.autocommit = True
    yield dbapi
    dbapi.autocommit = False
    conn.close()


def run_one(dbapi, sql, params=None) -> Result:
    result = Result()
    wire_of(dbapi).run([(sql, params, result)])
    return result


def through_cursor(dbapi, sql, params=None):
    cur = dbapi.cursor()
    cur.execute(sql, params)
    rows = cur.fetchall() if cur.description is not None else []
    cur.close()
    return rows


# -- values: the same as through a cursor ----------------------------------------------------
_VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00")),
    st.binary(max_size=64),
    st.floats(allow_nan=False),
    st.decimals(allow_nan=False, allow_infinity=False, places=3, max_value=10**12, min_value=-(10**12)),
    st.lists(st.text(alphabet="abc,{}\" \\", max_size=5), max_size=4),
    st.lists(st.integers(min_value=-(2**63), max_value=2**63 - 1), max_size=4),
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(values=st.lists(_VALUES, min_size=1, max_size=5))
def test_values_bound_and_loaded_are_what_a_psycopg_cursor_binds_and_loads(pg, values):
    names = [f"v{i}" for i in range(len(values))]
    sql = "SELECT " + ", ".join(f"%({n})s" for n in names)
    params = dict(zip(names, values, strict=True))
    expected = through_cursor(pg, sql, params)
    assert run_one(pg, sql, params).fetchall() == expected
    assert run_one(pg, sql, params).fetchall() == expected  # now prepared


def test_rows_rowcount_and_description_read_like_a_cursor(pg):
    pg.execute("CREATE TEMP TABLE w (k text PRIMARY KEY, n int, at timestamptz, doc jsonb)")
    at = dt.datetime(2026, 12, 1, tzinfo=dt.UTC)
    ins = run_one(pg, "INSERT INTO w VALUES (%(k)s, %(n)s, %(at)s, CAST(%(doc)s AS jsonb)), ('b', 2, NULL, NULL)",
                  {"k": "a", "n": 1, "at": at, "doc": '{"x": [1, 2]}'})
    assert ins.rowcount == 2 and ins.description is None and ins.fetchall() == []
    sel = run_one(pg, "SELECT k, n, at, doc FROM w ORDER BY k", {})
    assert [d[0] for d in sel.description] == ["k", "n", "at", "doc"]
    assert sel.rowcount == 2
    assert sel.fetchone() == ("a", 1, at, {"x": [1, 2]})
    assert sel.fetchall() == [("b", 2, None, None)]
    assert sel.fetchone() is None
    upd = run_one(pg, "UPDATE w SET n = n + 1 WHERE n > %(n)s", {"n": 5})
    assert upd.rowcount == 0
    total = run_one(pg, "SELECT sum(n) FROM w", {}).fetchall()
    assert total == [(decimal.Decimal(3),)] or total == [(3,)]


# -- prepared once per connection ---------------------------------------------------------------
def _prepared_here(dbapi) -> list[str]:
    return [r[0] for r in through_cursor(dbapi, "SELECT name FROM pg_prepared_statements WHERE name LIKE '\\_td\\_%'")]


def test_a_statement_is_prepared_once_per_connection_and_parameter_types(pg):
    before = len(_prepared_here(pg))
    for i in range(5):
        assert run_one(pg, "SELECT %(a)s::text || 'x'", {"a": f"v{i}"}).fetchall() == [(f"v{i}x",)]
    assert len(_prepared_here(pg)) == before + 1
    run_one(pg, "SELECT %(a)s::text || 'x'", {"a": 2**40})  # another parameter type: its own
    assert len(_prepared_here(pg)) == before + 2
    run_one(pg, "SELECT 'as is'", None)  # no parameters given: sent unnamed
    assert len(_prepared_here(pg)) == before + 2


def test_a_prepare_the_server_skipped_is_forgotten_and_sent_again(pg):
    """An error earlier in the pipeline makes the server skip a first-time prepare: the
    next send must prepare it again, or it would name a statement that does not exist."""
    wire = wire_of(pg)
    fresh = "SELECT %(a)s::int + 41"
    with pytest.raises(psycopg.errors.DivisionByZero):
        wire.run([("SELECT 1 / 0", {}, None), (fresh, {"a": 1}, Result())])
    assert run_one(pg, fresh, {"a": 1}).fetchall() == [(42,)]


# -- errors -------------------------------------------------------------------------------------
def test_the_first_error_of_a_batch_is_psycopgs_own_and_the_rest_is_skipped(store):
    conn = store.engine.raw_connection()
    dbapi = conn.driver_connection
    try:
        through_cursor(dbapi, "CREATE TEMP TABLE u (k int PRIMARY KEY)")
        wire = wire_of(dbapi)
        after = Result()
        with pytest.raises(psycopg.errors.UniqueViolation) as raised:
            wire.run([("INSERT INTO u VALUES (%(k)s)", {"k": 1}, None),
                      ("INSERT INTO u VALUES (%(k)s)", {"k": 1}, None),
                      ("INSERT INTO u VALUES (%(k)s)", {"k": 2}, after)])
        assert raised.value.sqlstate == "23505"
        assert after.rowcount == -1  # skipped by the server: never filled
        assert dbapi.pgconn.pipeline_status == 0  # out of pipeline mode
        assert dbapi.info.transaction_status == psycopg.pq.TransactionStatus.INERROR
        dbapi.rollback()
        assert through_cursor(dbapi, "SELECT 1") == [(1,)]  # usable, psycopg agrees
        assert run_one(dbapi, "SELECT %(a)s::int", {"a": 7}).fetchall() == [(7,)]
        dbapi.rollback()
    finally:
        conn.close()


# -- waits release the GIL ------------------------------------------------------------------------
def test_a_statement_waiting_on_the_server_lets_other_threads_run(store):
    """One thread's statement blocks on a lock held elsewhere; this thread must keep running
    (it is the one that sees the wait and releases the lock). Were the GIL held while the
    wire waits, this thread would never run again and the join would time out."""
    holder_conn = store.engine.raw_connection()
    waiter_conn = store.engine.raw_connection()
    holder, waiter = holder_conn.driver_connection, waiter_conn.driver_connection
    holder.autocommit = waiter.autocommit = True
    key = 7_466_133
    # Held GIL = this process hangs: a C-level watchdog (no GIL needed) ends it with the
    # stacks instead, so the suite fails rather than stalling.
    faulthandler.dump_traceback_later(60, exit=True)
    try:
        through_cursor(holder, "SELECT pg_advisory_lock(%s)", (key,))
        done = threading.Event()
        got: list[object] = []

        def wait_for_lock() -> None:
            got.append(run_one(waiter, "SELECT pg_advisory_lock(%(k)s), 'got it'", {"k": key}).fetchall())
            done.set()

        thread = threading.Thread(target=wait_for_lock, daemon=True)
        thread.start()
        pid = waiter.info.backend_pid
        # This loop runs Python between statements: it can only finish if the waiter's
        # wait lets it run. It ends when the server shows the waiter blocked on the lock.
        while not through_cursor(
            holder, "SELECT 1 FROM pg_locks WHERE pid = %s AND locktype = 'advisory' AND NOT granted", (pid,)
        ):
            assert not done.is_set()
        through_cursor(holder, "SELECT pg_advisory_unlock(%s)", (key,))
        thread.join(timeout=30)
        assert done.is_set() and got == [[("", "got it")]]
    finally:
        try:
            through_cursor(waiter, "SELECT pg_advisory_unlock_all()")
        finally:
            faulthandler.cancel_dump_traceback_later()
            holder.autocommit = waiter.autocommit = False
            holder_conn.close()
            waiter_conn.close()


def test_statements_prepared_by_the_wire_outlive_a_rollback_sent_through_psycopg(store):
    """psycopg deallocates ALL of a session's prepared statements after a ROLLBACK it runs,
    once it has prepared any itself (its ``prepare_threshold``). The store's connections
    never let it prepare, so the wire's statements survive the ``ROLLBACK`` of ``Tx.raw``."""
    conn = store.engine.raw_connection()
    dbapi = conn.driver_connection
    try:
        mine = "SELECT %(a)s::int * 2"
        assert run_one(dbapi, mine, {"a": 2}).fetchall() == [(4,)]
        for _ in range(8):  # more than psycopg's default threshold of 5
            through_cursor(dbapi, "SELECT count(*) FROM pg_class WHERE relname = %s", ("inbox",))
        through_cursor(dbapi, "ROLLBACK")
        through_cursor(dbapi, "SELECT 1")  # psycopg's maintenance would run before this
        assert run_one(dbapi, mine, {"a": 3}).fetchall() == [(6,)]
        dbapi.rollback()
    finally:
        conn.close()


def test_a_parameter_that_cannot_be_bound_raises_before_anything_is_sent(pg):
    """Conversion happens before the pipeline opens: the error leaves no half-sent
    pipeline behind, and the connection serves the next batch."""
    wire = wire_of(pg)
    with pytest.raises(psycopg.ProgrammingError):
        wire.run([("SELECT %(a)s::int", {"a": 1}, Result()), ("SELECT %(b)s", {"b": object()}, Result())])
    with pytest.raises(psycopg.ProgrammingError, match="missing"):
        wire.run([("SELECT %(a)s::int + %(c)s::int", {"a": 1}, Result())])
    assert pg.pgconn.pipeline_status == 0
    assert run_one(pg, "SELECT %(a)s::int", {"a": 5}).fetchall() == [(5,)]
    assert run_one(pg, "SELECT %(a)s::int + %(c)s::int", {"a": 1, "c": 2}).fetchall() == [(3,)]


def test_a_connections_wire_does_not_keep_it_alive(store):
    """The pool closes overflow and broken connections: each must be freed with its wire,
    or a long-running hub keeps every connection it ever opened."""
    import gc
    import weakref

    conn = psycopg.connect(store.url.replace("postgresql+psycopg://", "postgresql://"))
    run_one(conn, "SELECT %(a)s::int", {"a": 1})
    gone = weakref.ref(conn)
    conn.close()
    del conn
    gc.collect()
    assert gone() is None


def test_after_someone_deallocates_the_statements_the_next_batch_prepares_afresh(pg):
    """Were the session's prepared statements deallocated under the wire (a ``DEALLOCATE
    ALL`` or ``DISCARD ALL`` sent another way), the statement that finds one missing fails,
    and the wire forgets them all: the next batch prepares again instead of failing too."""
    mine = "SELECT %(a)s::int - 1"
    assert run_one(pg, mine, {"a": 5}).fetchall() == [(4,)]
    through_cursor(pg, "DEALLOCATE ALL")
    with pytest.raises(psycopg.errors.InvalidSqlStatementName):
        run_one(pg, mine, {"a": 5})
    assert run_one(pg, mine, {"a": 5}).fetchall() == [(4,)]
