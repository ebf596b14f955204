"""A request stores its inbox rows in one statement (D113, D115), both backends.

Apply on append reads the frames stored under the request's dedupe keys once, in the
first frame's round trip, and sends every new frame's row, with its outcome, in one insert
after the projection's writes (PostgreSQL: behind, with the ``COMMIT``; SQLite: bound once
a row, one call). The answers and the rows are what one-row inserts give:
a replay returns the stored id (stale when it differs), a key repeated inside the request
is a replay of its first frame, a quarantined frame keeps its cause, and nothing is lost
when another append stores one of the keys while the request runs.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from tidings.bridges.registry import create_bridge
from tidings.ingest import on_append
from tidings.ingest.engine import Ingest
from tidings.store import inbox as inbox_store
from tidings.store.engine import Tx, _ahead_key
from tidings.store.sql import Stmt

FIXTURES = Path(__file__).parent / "fixtures"
PG = "postgresql"


def text_frame(n: int, key: str, words: str | None = None) -> dict:
    payload = json.loads((FIXTURES / "signal_text_direct.json").read_text())
    env = payload["params"]["envelope"]
    env["timestamp"] += n
    env["dataMessage"]["timestamp"] += n
    env["dataMessage"]["message"] = words if words is not None else f"message {n}"
    return {"codec": "signal.jsonrpc", "codec_version": 1, "dedupe_key": key, "payload": payload}


def broken_frame(key: str) -> dict:
    """Accepted at append, refused by the decoder: quarantined with its cause."""
    return {"codec": "signal.jsonrpc", "codec_version": 1, "dedupe_key": key,
            "payload": {"jsonrpc": "2.0", "method": "receive", "params": {}}}


@pytest.fixture
def ingest(store, faults):
    ing = Ingest(store=store, faults=faults)
    yield ing
    ing.stop()


@pytest.fixture
def bridge(store):
    return create_bridge(store, platform="signal", name="phone")["id"]


@pytest.fixture
def sent(monkeypatch):
    """The names of the statements the store is asked to run (at once, read ahead or behind)."""
    names: list[str] = []
    real_execute, real_later, real_ahead, real_many = Tx.execute, Tx.later, Tx._queue_ahead, Tx.execute_many

    def execute(tx, stmt, params=None):
        if _ahead_key(stmt, params) not in tx._ahead:  # a read announced ahead was counted then
            names.append(stmt.name)
        return real_execute(tx, stmt, params)

    def later(tx, stmt, params=None):
        if tx.write_behind:  # otherwise it runs now, through ``execute``
            names.append(stmt.name)
        return real_later(tx, stmt, params)

    def ahead(tx, stmt, params):
        if tx.dialect == PG:
            names.append(stmt.name)
        return real_ahead(tx, stmt, params)

    def many(tx, stmt, rows):
        names.append(stmt.name)
        return real_many(tx, stmt, rows)

    monkeypatch.setattr(Tx, "execute", execute)
    monkeypatch.setattr(Tx, "later", later)
    monkeypatch.setattr(Tx, "_queue_ahead", ahead)
    monkeypatch.setattr(Tx, "execute_many", many)
    return names


INBOX_ROWS = Stmt(
    "SELECT inbox_id, dedupe_key, codec, codec_version, received_at_ms, client_received_at_ms, payload, "
    "processed_at_ms, outcome, cause FROM inbox WHERE bridge_id = :b"
)


def inbox_rows(store, bridge) -> dict[str, tuple]:
    with store.read() as tx:
        rows = tx.all(INBOX_ROWS, {"b": bridge})
    return {r[0]: tuple(r[1:]) for r in rows}


def messages(store) -> list[str]:
    with store.read() as tx:
        return sorted(r[0] for r in tx.raw("SELECT body FROM bridge_messages").fetchall())


def test_a_request_of_several_frames_answers_and_stores_what_one_row_inserts_do(store, ingest, bridge, sent):
    [old] = ingest.append_body(bridge, text_frame(0, "old"), "signal")
    del sent[:]
    commits = store.meter.snapshot()["commits"]
    request = [
        text_frame(1, "a"),
        text_frame(0, "old"),  # a replay of the stored frame
        text_frame(2, "old", "not what was stored"),  # a stale replay of it
        text_frame(1, "a"),  # the key this request took two frames ago: a replay of that frame
        text_frame(3, "a", "changed"),  # ... a stale one
        text_frame(4, ""),  # no dedupe key: always new
        text_frame(5, ""),
        broken_frame("bad"),
        text_frame(6, "b", "naïve \U0001f44b done"),  # stored as sent, outside ASCII too
    ]
    with capture_logs() as logs:
        results = ingest.append_body(bridge, {"frames": request}, "signal")
    assert store.meter.snapshot()["commits"] == commits + 1
    assert not [e for e in logs if "appending without it" in e["event"]]  # one try: not appended again
    replay = [r.replay for r in results]
    assert replay == [False, True, True, True, True, False, False, False, False]
    assert results[1].inbox_id == results[2].inbox_id == old.inbox_id
    assert results[3].inbox_id == results[4].inbox_id == results[0].inbox_id
    assert [r.stale for r in results] == [False, False, True, False, True, False, False, False, False]
    rows = inbox_rows(store, bridge)
    new = [r.inbox_id for r in results if not r.replay]
    assert sorted(rows) == sorted([old.inbox_id, *new])
    now = store.now_ms()
    for r, raw in zip(results, request, strict=True):
        if r.replay:
            continue
        key, codec, version, received, client, payload, processed, outcome, cause = rows[r.inbox_id]
        assert (key, codec, version, received, client) == (raw["dedupe_key"], raw["codec"], 1, now, None)
        assert json.loads(payload) == raw["payload"] and processed == now
        if raw["dedupe_key"] == "bad":
            assert outcome == "quarantined" and cause.startswith("decode: signal.jsonrpc")
        else:
            assert (outcome, cause) == ("applied", None)
    assert messages(store) == ["message 0", "message 1", "message 4", "message 5", "naïve \U0001f44b done"]
    counters = ingest.counters.of(bridge).snapshot()
    assert (counters["appended"], counters["deduped"], counters["stale_replays"]) == (6, 4, 2)
    # One read of the stored keys, one insert of the new rows; no row inserted alone.
    assert sent.count("inbox.stored_by_dedupe_keys") == 1 and sent.count("inbox.insert_frames") == 1
    assert "inbox.insert_frame" not in sent and "inbox.frame_by_dedupe" not in sent


def test_a_request_whose_rows_outgrow_one_statement_sends_them_in_several(store, ingest, bridge, sent, monkeypatch):
    monkeypatch.setattr(on_append, "ROWS_BYTES", 1)  # every row fills a statement
    results = ingest.append_body(bridge, {"frames": [text_frame(n, f"k{n}") for n in range(4)]}, "signal")
    assert [r.replay for r in results] == [False] * 4
    assert {row[7] for row in inbox_rows(store, bridge).values()} == {"applied"}
    assert messages(store) == [f"message {n}" for n in range(4)]
    assert sent.count("inbox.insert_frames") == 4


@pytest.mark.parametrize("cap", ["one insert", "an insert a row"])
def test_a_key_another_append_stored_meanwhile_sends_the_request_again_the_plain_way(store, ingest, bridge,
                                                                                     monkeypatch, cap):
    # The race: the request's read of its keys ran before another append (one that does not
    # take the bridge's append lock) committed a frame under one of them. The insert then
    # meets the unique index, the transaction is lost whole, and the request is appended
    # again without apply on append: the key is a replay, nothing is applied twice. With an
    # insert a row, the failing one goes out early, in the next frame's round trip: it must
    # still lose the transaction, not pass for that frame's own failure.
    if cap == "an insert a row":
        monkeypatch.setattr(on_append, "ROWS_BYTES", 1)
    [stored] = ingest.append_body(bridge, text_frame(0, "k0"), "signal")
    real = inbox_store.stored_by_dedupe_keys
    missed: list[str] = []

    def blind(tx, bridge_id, keys_json):
        missed.append(keys_json)
        return {}

    monkeypatch.setattr(inbox_store, "stored_by_dedupe_keys", blind)
    with capture_logs() as logs:
        results = ingest.append_body(bridge, {"frames": [text_frame(0, "k0"), text_frame(1, "k1")]}, "signal")
    monkeypatch.setattr(inbox_store, "stored_by_dedupe_keys", real)
    assert [(r.inbox_id == stored.inbox_id, r.replay) for r in results] == [(True, True), (False, False)]
    rows = inbox_rows(store, bridge)
    assert len(rows) == 2
    ingest.drain()  # the plain append left its new frame to the worker
    assert {row[7] for row in inbox_rows(store, bridge).values()} == {"applied"}
    assert messages(store) == ["message 0", "message 1"]
    again = [e for e in logs if "appending without it" in e["event"]]
    assert missed  # the request read its keys, and lost the transaction to the race:
    assert len(again) == 1
    assert ("UniqueViolation" if store.dialect == PG else "IntegrityError") in again[0]["error"]
