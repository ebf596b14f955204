"""The search index catches up in batches (D95), both backends.

SQLite: a message write only queues the change (``*_fts_pending``, in the writing
transaction); a search first indexes what is pending, the hub's background pass does it
without a search, a batch never splits a row's changes, and a crash between the write and
the indexing loses nothing. PostgreSQL keeps its generated column: nothing is ever
pending, and the same searches find the same messages.
"""

from __future__ import annotations

import itertools

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from test_projection_support import World, delete, edit, msg, ref

from helpers import create_account, create_channel
from tidings.hub import channels as channels_hub
from tidings.hub import search as search_hub
from tidings.hub.search_indexer import SearchIndexer
from tidings.hub.tokens import Principal
from tidings.store import search_index
from tidings.store.engine import Store

ADMIN = "tdg_test_admin"
SIG = "signal:+15550100"


def is_sqlite(store: Store) -> bool:
    return store.dialect == "sqlite"


def pending(store: Store) -> int:
    with store.read() as tx:
        return search_index.pending_count(tx)


def index_has(store: Store, word: str) -> set[int]:
    """Rowids the hub-message index itself matches (SQLite), without any catch-up."""
    with store.read() as tx:
        rows = tx.raw("SELECT rowid FROM messages_fts WHERE messages_fts MATCH ?", (f'"{word}"*',)).fetchall()
    return {r[0] for r in rows}


def assert_index_exact(store: Store) -> None:
    """FTS5 checks the index against the content tables (SQLite)."""
    if is_sqlite(store):
        with store.read() as tx:
            tx.raw("INSERT INTO messages_fts (messages_fts, rank) VALUES ('integrity-check', 1)")
            tx.raw("INSERT INTO bridge_messages_fts (bridge_messages_fts, rank) VALUES ('integrity-check', 1)")


def admin(runtime) -> Principal:
    return Principal(scope="admin", account_id=runtime.system_account_id, kind="system")


def texts(runtime, query: str) -> list[str]:
    got = search_hub.search(runtime.store, admin(runtime), search_hub.parse_request(query, limit=100))
    return sorted(h["message"].get("text") or h["message"].get("body") for h in got["results"])


@pytest.fixture
def place(client, runtime):
    alice = create_account(client, "human", "alice", admin_token=ADMIN)
    kitchen = create_channel(client, alice["token"], "kitchen")
    return {"alice": alice["id"], "kitchen": kitchen}


def post(runtime, place, text: str) -> str:
    message, _ = runtime.posting.post(author_id=place["alice"], channel_id=place["kitchen"], text=text)
    return str(message["id"])


def test_a_write_only_queues_and_a_search_indexes_what_is_pending_first(runtime, place):
    store = runtime.store
    post(runtime, place, "rhubarb crumble")
    if is_sqlite(store):
        assert pending(store) == 1 and index_has(store, "rhubarb") == set()  # the write did not index
    assert texts(runtime, "rhubarb") == ["rhubarb crumble"]
    assert pending(store) == 0
    assert_index_exact(store)
    if is_sqlite(store):
        assert len(index_has(store, "rhubarb")) == 1


def test_edits_and_deletes_queued_together_reach_the_index_exactly(runtime, place):
    """Several changes of one row before any catch-up, and batches of one change: the index
    ends exact (FTS5's own check against the content), edits found by the new text only."""
    store = runtime.store
    w = World(store, "signal", owner_id=place["alice"])
    mom = ref("+15550100", "Mom", platform="signal")
    w.frame([msg(SIG, "m1", mom, body="apple one", at=1_000)])
    w.frame([msg(SIG, "m2", mom, body="apple two", at=1_100)])
    hub = post(runtime, place, "plum first")
    assert texts(runtime, "apple") == ["apple one", "apple two"]  # indexed: now change them
    w.frame([edit(SIG, "m1", "banana one", at=2_000)])
    w.frame([edit(SIG, "m1", "cherry one", at=3_000)])
    w.frame([delete(SIG, "m2", at=3_000)])
    w.frame([msg(SIG, "m3", mom, body="apple three", at=3_100)])
    w.frame([edit(SIG, "m3", "date three", at=3_200)])
    runtime.posting.edit(author_id=place["alice"], message_id=hub, blocks=[{"kind": "text", "text": "plum second"}])
    runtime.posting.edit(author_id=place["alice"], message_id=hub, blocks=[{"kind": "text", "text": "quince third"}])
    if is_sqlite(store):
        assert pending(store) == 7
        with store.write() as tx:  # a batch of one a table takes every change of its row
            assert search_index.catch_up(tx, batch=1) == 4  # the hub message's two edits, m1's two
        assert pending(store) == 3
    assert texts(runtime, "apple") == []
    assert texts(runtime, "banana") == []
    assert texts(runtime, "cherry") == ["cherry one"]
    assert texts(runtime, "date") == ["date three"]
    assert texts(runtime, "plum") == []
    assert texts(runtime, "quince") == ["quince third"]
    assert pending(store) == 0
    assert_index_exact(store)


def test_the_background_pass_indexes_without_a_search(runtime, place):
    store = runtime.store
    indexer = SearchIndexer(store, delay_ms=0, idle_ms=60_000)
    indexer.start()  # SQLite only: PostgreSQL's index needs no pass
    try:
        if is_sqlite(store):
            assert indexer.wait_for(lambda i: i.passes >= 1, timeout=10)  # the pass at start
            post(runtime, place, "fennel salad")  # its commit wakes the pass
            assert indexer.wait_for(lambda i: i.indexed >= 1, timeout=10)
            assert pending(store) == 0
            assert len(index_has(store, "fennel")) == 1
            assert indexer.status()["failures"] == 0
        else:
            post(runtime, place, "fennel salad")
            assert indexer.run_once() == 0  # nothing is ever pending on PostgreSQL
    finally:
        indexer.stop()
    assert texts(runtime, "fennel") == ["fennel salad"]
    assert_index_exact(store)


def test_a_failed_catch_up_keeps_the_queue_and_the_next_one_indexes(runtime, place, faults):
    store = runtime.store
    post(runtime, place, "kohlrabi soup")
    faults.arm(search_index.FAULT_CATCH_UP, 1)
    indexer = SearchIndexer(store)
    indexer.run_once()  # not started: one pass on this thread
    if is_sqlite(store):
        assert indexer.status()["failures"] == 1
        assert pending(store) == 1 and index_has(store, "kohlrabi") == set()  # rolled back whole
    assert texts(runtime, "kohlrabi") == ["kohlrabi soup"]
    assert_index_exact(store)


def test_a_crash_between_the_write_and_the_indexing_loses_nothing(backend_url, clock, faults):
    """The process ends after the commit, before any catch-up (no pass, no search): a new
    process over the same database finds the message, by its search and by its pass."""
    from tidings.runtime import Runtime

    first = Runtime(backend_url, clock=clock, faults=faults, admin_token=ADMIN)
    system = first.system_account_id
    channel = channels_hub.create_channel(first.store, admin(first), name="garden")["id"]
    first.posting.post(author_id=system, channel_id=channel, text="parsnip harvest")
    first.posting.post(author_id=system, channel_id=channel, text="parsnip soup")
    first.stop()  # nothing in memory survives; the queue is in the database
    again = Runtime(backend_url, clock=clock, faults=faults, admin_token=ADMIN)
    try:
        if is_sqlite(again.store):
            assert pending(again.store) == 2
        assert texts(again, "parsnip") == ["parsnip harvest", "parsnip soup"]
        assert pending(again.store) == 0
    finally:
        again.stop()
    third = Runtime(backend_url, clock=clock, faults=faults, admin_token=ADMIN)
    try:
        third.posting.post(author_id=system, channel_id=channel, text="parsnip cake")
        third.stop()
        fourth = Runtime(backend_url, clock=clock, faults=faults, admin_token=ADMIN)
        if is_sqlite(fourth.store):
            assert pending(fourth.store) == 1
        indexer = SearchIndexer(fourth.store)
        indexer.start()  # its first pass takes what the previous process left
        try:
            if is_sqlite(fourth.store):
                assert indexer.wait_for(lambda i: i.passes >= 1, timeout=10)
                assert pending(fourth.store) == 0
                assert len(index_has(fourth.store, "parsnip")) == 3
            assert texts(fourth, "parsnip") == ["parsnip cake", "parsnip harvest", "parsnip soup"]
        finally:
            indexer.stop()
            fourth.stop()
    finally:
        third.stop()


# -- the property: any interleaving of writes and partial catch-ups ------------------------------------
WORDS = ["alpha", "bravo", "charlie", "delta"]
OPS = st.lists(
    st.one_of(
        st.tuples(st.just("post"), st.sampled_from(WORDS)),
        st.tuples(st.just("edit"), st.integers(0, 5), st.sampled_from(WORDS)),
        st.tuples(st.just("remove"), st.integers(0, 5)),
        st.tuples(st.just("bridge"), st.sampled_from(WORDS)),
        st.tuples(st.just("bridge_edit"), st.integers(0, 5), st.sampled_from(WORDS)),
        st.tuples(st.just("bridge_delete"), st.integers(0, 5)),
        st.tuples(st.just("bridge_remove"), st.integers(0, 5)),
        st.tuples(st.just("catch_up"), st.integers(1, 3)),
    ),
    max_size=14,
)
_example = itertools.count()


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=OPS)
@example(ops=[("bridge", "alpha"), ("catch_up", 1), ("bridge_edit", 0, "bravo"), ("bridge_remove", 0),
              ("bridge", "charlie"), ("edit", 0, "delta"), ("catch_up", 1)])
@example(ops=[("bridge", "alpha"), ("catch_up", 1), ("bridge_edit", 0, "bravo"), ("bridge_edit", 0, "charlie"),
              ("catch_up", 1), ("bridge_edit", 0, "delta")])
def test_any_writes_and_partial_catch_ups_leave_the_index_exact(runtime, place, ops):
    """Posts, edits, row deletions (a bridge message's rowid may be reused) and catch-ups
    of any batch size, in any order: afterwards every word finds exactly the live rows that
    hold it now, and FTS5's own check of the index against the content holds."""
    store = runtime.store
    run = f"x{next(_example):06d}"  # this example's own word (fixed width: no prefix of another)
    w = World(store, "signal", owner_id=place["alice"])
    mom = ref("+15550100", "Mom", platform="signal")
    conv = f"signal:+1555{run[1:]}"
    hub: list[str] = []  # ids of this example's hub messages
    bridge: list[str] = []  # remote ids of its bridge messages
    live: dict[tuple[str, str], str] = {}  # (kind, id) -> current text
    at = itertools.count(10_000, 10)
    ph = "?" if is_sqlite(store) else "%s"
    for op in ops:
        kind = op[0]
        if kind == "post":
            hub.append(post(runtime, place, f"{op[1]} {run}"))
            live[("hub", hub[-1])] = op[1]
        elif kind == "edit" and hub:
            mid = hub[op[1] % len(hub)]
            if ("hub", mid) in live:
                runtime.posting.edit(author_id=place["alice"], message_id=mid,
                                     blocks=[{"kind": "text", "text": f"{op[2]} {run}"}])
                live[("hub", mid)] = op[2]
        elif kind == "remove" and hub:
            mid = hub[op[1] % len(hub)]
            with store.write() as tx:
                tx.raw(f"DELETE FROM messages WHERE id = {ph}", (mid,))
            live.pop(("hub", mid), None)
        elif kind == "bridge":
            rid = f"r{len(bridge)}"
            bridge.append(rid)
            w.frame([msg(conv, rid, mom, body=f"{op[1]} {run}", at=next(at))])
            live[("bridge", rid)] = op[1]
        elif kind == "bridge_edit" and bridge:
            rid = bridge[op[1] % len(bridge)]
            if live.get(("bridge", rid)):
                w.frame([edit(conv, rid, f"{op[2]} {run}", at=next(at))])
                live[("bridge", rid)] = op[2]
        elif kind == "bridge_delete" and bridge:
            rid = bridge[op[1] % len(bridge)]
            if live.get(("bridge", rid)):
                w.frame([delete(conv, rid, at=next(at))])
                live[("bridge", rid)] = ""  # deleted: body cleared, never found
        elif kind == "bridge_remove" and bridge:
            rid = bridge[op[1] % len(bridge)]
            if ("bridge", rid) in live:
                with store.write() as tx:
                    tx.raw(f"DELETE FROM bridge_messages WHERE id = {ph}", (w.msg_id(conv, rid),))
                live.pop(("bridge", rid))
        elif kind == "catch_up":
            with store.write() as tx:
                search_index.catch_up(tx, batch=op[1])
    for word in WORDS:
        want = sorted(f"{word} {run}" for text in live.values() if text == word)
        assert texts(runtime, f"{word} {run}") == want, (word, ops)
    assert pending(store) == 0
    assert_index_exact(store)
