"""The inbox on both backends: append and dedupe, the paging cursor, the query plans.

Paging property (spec §2.3, ``TestUnprocessedAfterVisitsEveryUnprocessedFrameOnceProperty``
re-written): walking ``unprocessed_after`` from the zero cursor with random page sizes
visits every frame that is unprocessed when its page is listed exactly once, in
``(received_at_ms, inbox_id)`` order, with receipt-time ties, frames processed mid-walk
and frames appended mid-walk (ahead of the cursor: visited; behind it: left for the next
drain).
"""

from __future__ import annotations

import json
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tidings.bridges.registry import create_bridge
from tidings.errors import BadRequest, TooLarge
from tidings.ids import new_id
from tidings.ingest.engine import Ingest
from tidings.ingest.inbox import Frame, append_frames, parse_frame, payload_text
from tidings.store import inbox as inbox_store

PROPERTY = settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow]
)


def new_bridge(store, platform="signal", name="phone"):
    return create_bridge(store, platform=platform, name=name)["id"]


def frame(dedupe_key="", payload=None, codec="signal.jsonrpc", version=1):
    return Frame(codec, version, dedupe_key, None, payload_text(payload if payload is not None else {"n": 1}))


def insert_at(tx, bridge_id, received_at_ms, inbox_id=None):
    inbox_id = inbox_id or new_id("in")
    inbox_store.insert_frame(
        tx,
        inbox_id=inbox_id,
        bridge_id=bridge_id,
        dedupe_key="",
        codec="test.script",
        codec_version=1,
        received_at_ms=received_at_ms,
        client_received_at_ms=None,
        payload="{}",
    )
    return inbox_id


# -- append -----------------------------------------------------------------------------------
def test_append_stamps_server_time_and_keeps_client_time_apart(store, clock):
    bridge = new_bridge(store)
    raw = {"codec": "signal.jsonrpc", "codec_version": 1, "dedupe_key": "k1", "received_at_ms": 5, "payload": {"a": 1}}
    with store.write() as tx:
        [res] = append_frames(tx, bridge, [parse_frame(raw, 0)], clock.now_ms())
    assert res.replay is False and res.inbox_id.startswith("in_")
    with store.read() as tx:
        row = inbox_store.frame_state(tx, res.inbox_id)
    assert row["received_at_ms"] == clock.now_ms() and row["client_received_at_ms"] == 5
    assert row["processed_at_ms"] is None and row["outcome"] is None and row["cause"] is None


def test_duplicate_key_returns_the_stored_id_and_empty_key_is_never_deduped(store, clock):
    bridge = new_bridge(store)
    with store.write() as tx:
        first = append_frames(tx, bridge, [frame("k"), frame(""), frame("")], clock.now_ms())
    with store.write() as tx:
        again = append_frames(tx, bridge, [frame("k"), frame("k", {"n": 2}), frame("")], clock.now_ms())
    assert [r.replay for r in first] == [False, False, False]
    assert again[0].inbox_id == first[0].inbox_id and again[0].replay and not again[0].stale
    assert again[1].inbox_id == first[0].inbox_id and again[1].replay and again[1].stale
    assert not again[2].replay and again[2].inbox_id not in {r.inbox_id for r in first}
    with store.read() as tx:
        assert inbox_store.backlog(tx) == 4


def test_same_key_twice_in_one_batch_is_one_row(store, clock):
    bridge = new_bridge(store)
    with store.write() as tx:
        a, b = append_frames(tx, bridge, [frame("k"), frame("k")], clock.now_ms())
    assert a.inbox_id == b.inbox_id and not a.replay and b.replay


def test_frames_appended_in_one_millisecond_drain_in_append_order(store, clock):
    bridge = new_bridge(store)
    ids = []
    for _ in range(3):  # three requests in the same millisecond, the first a batch of 300
        with store.write() as tx:
            ids += [r.inbox_id for r in append_frames(tx, bridge, [frame() for _ in range(300 if not ids else 1)],
                                                      clock.now_ms())]
    with store.read() as tx:
        listed = [i for _, i in inbox_store.unprocessed_after(tx, 0, "", 1000)]
    assert listed == ids and len(set(ids)) == 302
    assert all(len(i) == len("in_") + 32 and i[3:].isalnum() for i in ids)


def test_dedupe_is_per_bridge(store, clock):
    one, two = new_bridge(store, name="one"), new_bridge(store, name="two")
    with store.write() as tx:
        [a] = append_frames(tx, one, [frame("k")], clock.now_ms())
        [b] = append_frames(tx, two, [frame("k")], clock.now_ms())
    assert a.inbox_id != b.inbox_id and not b.replay


def test_key_order_of_an_object_payload_is_not_a_stale_replay(store, clock):
    bridge = new_bridge(store)
    with store.write() as tx:
        append_frames(tx, bridge, [frame("k", {"a": 1, "b": 2})], clock.now_ms())
        [again] = append_frames(tx, bridge, [frame("k", {"b": 2, "a": 1})], clock.now_ms())
    assert again.replay and not again.stale


@pytest.mark.parametrize(
    "raw,why",
    [
        ([], "must be a JSON object"),
        ({"codec_version": 1, "dedupe_key": "", "payload": {}}, "codec"),
        ({"codec": "", "codec_version": 1, "dedupe_key": "", "payload": {}}, "codec"),
        ({"codec": "x", "codec_version": "1", "dedupe_key": "", "payload": {}}, "codec_version"),
        ({"codec": "x", "codec_version": True, "dedupe_key": "", "payload": {}}, "codec_version"),
        ({"codec": "x", "codec_version": 1, "payload": {}}, "dedupe_key is required"),
        ({"codec": "x", "codec_version": 1, "dedupe_key": "  ", "payload": {}}, "dedupe_key"),
        ({"codec": "x", "codec_version": 1, "dedupe_key": 7, "payload": {}}, "dedupe_key"),
        ({"codec": "x", "codec_version": 1, "dedupe_key": "", "payload": []}, "payload"),
        ({"codec": "x", "codec_version": 1, "dedupe_key": ""}, "payload is required"),
        ({"codec": "x", "codec_version": 1, "dedupe_key": "", "payload": "a\x00b"}, "NUL"),
        ({"codec": "x", "codec_version": 1, "dedupe_key": "", "payload": {}, "received_at_ms": -1}, "received_at_ms"),
        ({"codec": "x", "codec_version": 1, "dedupe_key": "", "payload": {}, "extra": 1}, "unknown fields"),
        ({"codec": "x", "codec_version": 1, "dedupe_key": "", "payload": {"n": float("nan")}}, "payload"),
        ({"codec": "google.json", "codec_version": 1, "dedupe_key": "", "payload": {}}, "signal bridge"),
    ],
)
def test_bad_frames_name_the_frame_and_the_reason(raw, why):
    from tidings.ingest.decoders import DECODERS

    platforms = {c: d.platform for c, d in DECODERS.items()}
    with pytest.raises(BadRequest) as err:
        parse_frame(raw, 3, platform="signal", codec_platforms=platforms)
    assert err.value.message.startswith("frame 3: ") and why in err.value.message


def test_frame_size_limit_counts_stored_payload_bytes():
    raw = {"codec": "x", "codec_version": 1, "dedupe_key": "", "payload": {"t": "é" * 600}}
    parse_frame(raw, 0, max_bytes=2000)
    with pytest.raises(TooLarge) as err:
        parse_frame(raw, 0, max_bytes=1000)
    assert err.value.status == 413 and "frame 0" in err.value.message


def test_string_payload_is_stored_as_sent_and_object_payload_as_json(store, clock):
    bridge = new_bridge(store)
    line = '{"jsonrpc":"2.0","method":"receive","params":{}}'
    with store.write() as tx:
        a, b = append_frames(
            tx, bridge, [parse_frame({"codec": "x", "codec_version": 1, "dedupe_key": "", "payload": p}, 0)
                         for p in (line, {"emoji": "👍", "n": [1, 2]})], clock.now_ms()
        )
    with store.read() as tx:
        pa = inbox_store.load_unprocessed(tx, a.inbox_id)[4]
        pb = inbox_store.load_unprocessed(tx, b.inbox_id)[4]
    assert pa == line
    assert json.loads(pb) == {"emoji": "👍", "n": [1, 2]}


def test_ingest_append_counts_appended_deduped_and_stale(store, clock):
    ingest = Ingest(store=store, project=lambda tx, ctx, events: False, apply_on_append=False)
    bridge = new_bridge(store)
    body = {"frames": [
        {"codec": "x", "codec_version": 1, "dedupe_key": "a", "payload": {"v": 1}},
        {"codec": "x", "codec_version": 1, "dedupe_key": "", "payload": {"v": 1}},
    ]}
    ingest.append_body(bridge, body)
    ingest.append_body(bridge, {"codec": "x", "codec_version": 1, "dedupe_key": "a", "payload": {"v": 2}})
    ingest.append_body(bridge, {"codec": "x", "codec_version": 1, "dedupe_key": "a", "payload": {"v": 1}})
    c = ingest.status()["per_bridge"][bridge]
    assert (c["appended"], c["deduped"], c["stale_replays"]) == (2, 2, 1)
    assert ingest.status()["backlog"] == 2


def test_a_bad_frame_in_a_batch_appends_nothing(store):
    ingest = Ingest(store=store, project=lambda tx, ctx, events: False)
    bridge = new_bridge(store)
    good = {"codec": "x", "codec_version": 1, "dedupe_key": "", "payload": {}}
    with pytest.raises(BadRequest) as err:
        ingest.append_body(bridge, {"frames": [good, good, {**good, "codec_version": -1}]})
    assert err.value.message.startswith("frame 2:")
    assert ingest.status()["backlog"] == 0


# -- paging -------------------------------------------------------------------------------------
def walk(tx_factory, page_size, between=None):
    """Walk the cursor; ``between(cursor)`` runs before each page is listed."""
    visited, listings = [], []
    after = (0, "")
    while True:
        if between is not None:
            between(after)
        with tx_factory() as tx:
            page = inbox_store.unprocessed_after(tx, after[0], after[1], page_size)
        listings.append([i for _, i in page])
        visited.extend((r, i) for r, i in page)
        if len(page) < page_size:
            return visited, listings
        after = page[-1]


def test_paging_visits_every_frame_once_in_order_with_ties(store):
    bridge = new_bridge(store)
    with store.write() as tx:
        ids = [(t, insert_at(tx, bridge, t)) for t in [5] * 300 + [6] * 5 + [7] * 300]
    visited, _ = walk(store.read, 256)
    assert visited == sorted(ids)


@PROPERTY
@given(
    data=st.data(),
    times=st.lists(st.integers(1, 6), min_size=0, max_size=40),
    page_size=st.integers(1, 7),
    seed=st.integers(0, 2**32),
)
def test_paging_property_with_processing_and_appends_mid_walk(store, data, times, page_size, seed):
    with store.write() as tx:
        tx.raw("DELETE FROM inbox")
    bridge = new_bridge(store, name=new_id("b"))
    rng = random.Random(seed)
    serial = iter(range(10**6))

    def fresh_id():  # random order within a millisecond, but reproducible for Hypothesis
        return f"in_{rng.getrandbits(48):012x}{next(serial):06d}"

    with store.write() as tx:
        initial = {insert_at(tx, bridge, t, fresh_id()): t for t in times}
    key_of = dict((i, (t, i)) for i, t in initial.items())
    processed: set[str] = set()
    appended_ahead: set[str] = set()
    appended_behind: set[str] = set()
    processed_at_listing: list[set[str]] = []

    def between(cursor):
        ops = data.draw(st.lists(st.sampled_from(["process", "append"]), max_size=3), label="ops")
        with store.write() as tx:
            for op in ops:
                if op == "process":
                    open_ids = sorted(set(key_of) - processed)
                    if open_ids:
                        victim = data.draw(st.sampled_from(open_ids), label="victim")
                        assert inbox_store.mark_applied(tx, victim, 99)
                        processed.add(victim)
                else:
                    t = data.draw(st.integers(1, 7), label="t")
                    new = insert_at(tx, bridge, t, fresh_id())
                    key_of[new] = (t, new)
                    (appended_ahead if (t, new) > cursor else appended_behind).add(new)
        processed_at_listing.append(set(processed))

    visited, listings = walk(store.read, page_size, between)
    ids = [i for _, i in visited]
    assert len(ids) == len(set(ids)), "a frame was visited twice"
    assert visited == sorted(visited), "visits out of (received_at_ms, inbox_id) order"
    for page, done in zip(listings, processed_at_listing):
        assert not set(page) & done, "a frame processed before its page was listed was visited"
    never_processed = set(key_of) - processed
    assert (set(initial) | appended_ahead) & never_processed <= set(ids)
    assert not appended_behind & set(ids), "a frame appended behind the cursor was visited"


# -- query plans --------------------------------------------------------------------------------
def _plan(store, stmt, params):
    sql, _ = stmt.compiled(store.dialect)
    with store.read() as tx:
        if store.dialect == "sqlite":
            rows = tx.raw("EXPLAIN QUERY PLAN " + sql, params).fetchall()
            return "\n".join(r[-1] for r in rows)
        rows = tx.raw("EXPLAIN " + sql, params).fetchall()
        return "\n".join(r[0] for r in rows)


def test_drain_queries_stay_on_their_indexes(store):
    bridge = new_bridge(store)
    rng = random.Random(7)
    with store.write() as tx:
        ids = [insert_at(tx, bridge, rng.randint(1, 10_000)) for _ in range(3000)]
        for inbox_id in ids[:1000]:  # a backlog of 2000 behind 1000 processed frames
            inbox_store.mark_applied(tx, inbox_id, 10_001)
    with store.write() as tx:
        tx.raw("ANALYZE")
    page = _plan(store, inbox_store.UNPROCESSED_AFTER, {"after_ms": 5000, "after_id": "in_", "limit": 256})
    load = _plan(store, inbox_store.LOAD_UNPROCESSED, {"inbox_id": ids[-1]})
    if store.dialect == "sqlite":
        assert page.strip() in (
            "SEARCH inbox USING INDEX inbox_unprocessed_idx ((received_at_ms,inbox_id)>(?,?))",
            "SEARCH inbox USING COVERING INDEX inbox_unprocessed_idx ((received_at_ms,inbox_id)>(?,?))",
        ), page
        assert load.strip() == "SEARCH inbox USING INDEX sqlite_autoindex_inbox_1 (inbox_id=?)", load
    else:
        assert "Scan using inbox_unprocessed_idx on inbox" in page, page
        assert "Index Cond: (ROW(received_at_ms, inbox_id) > ROW(" in page, page
        assert "Sort" not in page and "Seq Scan" not in page and "Filter" not in page, page
        assert "inbox_pkey" in load and "Seq Scan" not in load, load
