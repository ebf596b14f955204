"""Apply on append (docs/decisions.md, "Ingest: apply on append"): the append transaction
applies the frames it stores, through the worker's one "apply a frame", when their bridge
has no older unprocessed frame.

* a frame is applied (or quarantined with its cause) in its append's one commit, its inbox
  row written once;
* receipt order is kept: behind an older unprocessed frame of the same bridge, new frames
  wait for the drain (another bridge is not held up), unless that frame is waiting out
  its backoff, which the drain passes too;
* a transient failure leaves the frame, and the rest of its request, to the worker;
* an apply step that breaks the transaction falls back to a plain append;
* over HTTP the 202 comes only after the commit.
"""

from __future__ import annotations

import json
import sqlite3
from collections import Counter

import pytest

from helpers import auth
from tidings.bridges.registry import create_bridge
from tidings.ingest.engine import Ingest
from tidings.ingest.inbox import Frame, append_frames
from tidings.store import inbox as inbox_store
from tidings.store.sql import Stmt

CODEC = "test.script"
INSERT_APPLIED = Stmt("INSERT INTO t_append_applied (frame, step) VALUES (:frame, :step)")


def transient() -> Exception:
    exc = sqlite3.OperationalError("database is locked")
    exc.sqlite_errorcode = 5
    return exc


class Script:
    """Payload ``{"id", "fail"?: n transient failures, "bad"?: true, "break"?: n}``."""

    def __init__(self) -> None:
        self.decodes: Counter[str] = Counter()
        self.left: dict[str, int] = {}
        self.order: list[str] = []

    def decode(self, codec, version, payload):
        doc = json.loads(payload)
        self.decodes[doc["id"]] += 1
        return [doc]

    def project(self, tx, ctx, events):
        doc = events[0]
        fid = doc["id"]
        tx.execute(INSERT_APPLIED, {"frame": fid, "step": "first"})  # written before any failure
        if self.left.setdefault(f"break:{fid}", doc.get("break", 0)) > 0:
            self.left[f"break:{fid}"] -= 1
            tx.raw("ROLLBACK")  # ends the append's transaction under it
            raise RuntimeError("scripted: the transaction is gone")
        if self.left.setdefault(fid, doc.get("fail", 0)) > 0:
            self.left[fid] -= 1
            raise transient()
        if doc.get("bad"):
            raise ValueError("scripted: projection refused the frame")
        tx.execute(INSERT_APPLIED, {"frame": fid, "step": "last"})
        tx.after_commit(lambda: self.order.append(fid))
        return True


@pytest.fixture
def rig(store, faults):
    with store.write() as tx:
        tx.raw("CREATE TABLE IF NOT EXISTS t_append_applied (frame TEXT NOT NULL, step TEXT NOT NULL)")
        tx.raw("DELETE FROM t_append_applied")
    script = Script()
    ingest = Ingest(store=store, faults=faults, decode=script.decode, project=script.project, validate=False,
                    sleep=lambda s: None)
    ingest.script = script
    yield ingest
    ingest.stop()


def frame(fid: str, key: str = "", **doc) -> Frame:
    return Frame(CODEC, 1, key, None, json.dumps({"id": fid, **doc}))


def state(store, inbox_id):
    with store.read() as tx:
        return inbox_store.frame_state(tx, inbox_id)


def steps(store, fid):
    with store.read() as tx:
        rows = tx.raw("SELECT step FROM t_append_applied WHERE frame = " + ("?" if store.dialect == "sqlite" else "%s"),
                      (fid,)).fetchall()
    return sorted(r[0] for r in rows)


def test_a_request_is_applied_in_its_own_commit_with_each_inbox_row_written_once(store, rig, clock):
    bridge = create_bridge(store, platform="signal", name="p")["id"]
    before = store.commits
    results = rig.append(bridge, [frame("a"), frame("b"), frame("c")])
    assert store.commits - before == 1
    assert [steps(store, f) for f in "abc"] == [["first", "last"]] * 3
    assert rig.script.order == ["a", "b", "c"]
    for r in results:
        s = state(store, r.inbox_id)
        assert (s["outcome"], s["processed_at_ms"], s["cause"]) == ("applied", clock.now_ms(), None)
    c = rig.counters.of(bridge).snapshot()
    assert (c["appended"], c["projected"], c["applied_on_append"], c["left_for_worker"]) == (3, 3, 3, 0)
    assert rig.worker.drain_if_due() is None  # nothing left: the worker was not woken


def test_new_frames_wait_behind_an_older_unprocessed_frame_of_their_bridge(store, rig, clock):
    bridge = create_bridge(store, platform="signal", name="p")["id"]
    other = create_bridge(store, platform="signal", name="q")["id"]
    with store.write() as tx:  # appended by a process that did not apply it
        [old] = append_frames(tx, bridge, [frame("old")], clock.now_ms())
    clock.advance(5)
    b, c = rig.append(bridge, [frame("b"), frame("c")])
    [d] = rig.append(other, [frame("d")])
    assert state(store, b.inbox_id)["outcome"] is None and state(store, c.inbox_id)["outcome"] is None
    # A request's frames are decoded before its first insert, so that one read brings the
    # rows they touch (D115); a frame found held up is never projected, only decoded.
    assert steps(store, "b") == [] and rig.script.decodes["b"] == 1
    assert state(store, d.inbox_id)["outcome"] == "applied"  # another bridge is not held up
    stats = rig.worker.drain_if_due()  # the append woke the worker
    assert stats is not None and stats.applied == 3
    assert rig.script.order == ["d", "old", "b", "c"]


def test_a_frame_waiting_out_its_backoff_does_not_hold_up_later_frames(store, rig, clock):
    """The drain passes a backed-off frame (D5); apply on append does the same, and only then."""
    bridge = create_bridge(store, platform="signal", name="p")["id"]
    [old] = rig.append(bridge, [frame("old", fail=5)])  # its append attempt, then 4 tries fail
    assert rig.worker.drain_if_due().deferred == 1
    clock.advance(10)
    [b] = rig.append(bridge, [frame("b")])
    assert state(store, b.inbox_id)["outcome"] == "applied"  # "old" is waiting: passed
    clock.advance(1_000)  # "old" is due again: the drain must take it first
    [c] = rig.append(bridge, [frame("c")])
    assert state(store, c.inbox_id)["outcome"] is None
    assert rig.worker.drain_if_due().applied == 2
    assert rig.script.order == ["b", "old", "c"]
    assert state(store, old.inbox_id)["outcome"] == "applied"


def test_a_transient_failure_leaves_the_frame_and_the_rest_of_its_request_to_the_worker(store, rig):
    bridge = create_bridge(store, platform="signal", name="p")["id"]
    a, b, c = rig.append(bridge, [frame("a"), frame("b", fail=1), frame("c")])
    assert state(store, a.inbox_id)["outcome"] == "applied"
    for r in (b, c):
        s = state(store, r.inbox_id)
        assert (s["outcome"], s["processed_at_ms"]) == (None, None)
    assert steps(store, "b") == []  # the failed attempt's rows were rolled back with it
    assert rig.script.decodes["c"] == 1  # decoded with its request (D115), never projected
    assert steps(store, "c") == []
    assert rig.counters.of(bridge).snapshot()["left_for_worker"] == 1
    assert rig.worker.drain_if_due().applied == 2
    assert rig.script.order == ["a", "b", "c"] and rig.script.decodes["b"] == 2
    assert steps(store, "b") == ["first", "last"]


def test_the_ingest_busy_fault_fails_an_append_attempt_like_any_other(store, rig, faults):
    bridge = create_bridge(store, platform="signal", name="p")["id"]
    faults.arm("ingest.busy", 1)
    [r] = rig.append(bridge, [frame("a")])
    assert state(store, r.inbox_id)["outcome"] is None
    assert rig.drain().applied == 1 and rig.script.decodes["a"] == 2


def test_a_deterministic_failure_is_quarantined_with_its_cause_in_the_append_commit(store, rig):
    bridge = create_bridge(store, platform="signal", name="p")["id"]
    before = store.commits
    a, bad, c = rig.append(bridge, [frame("a"), frame("bad", bad=True), frame("c")])
    assert store.commits - before == 1
    s = state(store, bad.inbox_id)
    assert s["outcome"] == "quarantined" and s["processed_at_ms"] is not None
    assert s["cause"] == "internal error (ValueError): scripted: projection refused the frame"
    assert steps(store, "bad") == []  # its projection was rolled back
    assert state(store, a.inbox_id)["outcome"] == state(store, c.inbox_id)["outcome"] == "applied"
    counters = rig.counters.of(bridge).snapshot()
    assert (counters["quarantined"], counters["projected"], counters["applied_on_append"]) == (1, 2, 3)
    with store.read() as tx:
        assert [q["inbox_id"] for q in inbox_store.quarantined(tx, bridge, 10)] == [bad.inbox_id]


def test_a_repeated_frame_is_a_replay_and_is_not_append_applied_again(store, rig):
    bridge = create_bridge(store, platform="signal", name="p")["id"]
    [first] = rig.append(bridge, [frame("a", key="k1")])
    [again] = rig.append(bridge, [frame("a", key="k1")])
    assert again.replay and again.inbox_id == first.inbox_id
    # Applied once; the repeat is decoded with its request (D115), then dropped.
    assert rig.script.decodes["a"] == 2
    assert steps(store, "a") == ["first", "last"]
    assert rig.counters.of(bridge).snapshot()["deduped"] == 1


def test_an_apply_step_that_breaks_the_transaction_falls_back_to_a_plain_append(store, rig):
    bridge = create_bridge(store, platform="signal", name="p")["id"]
    [r] = rig.append(bridge, [frame("a", key="k", **{"break": 1})])
    assert not r.replay
    s = state(store, r.inbox_id)
    assert s is not None and s["outcome"] is None  # stored, unprocessed: the worker applies it
    assert steps(store, "a") == []
    assert rig.drain().applied == 1 and steps(store, "a") == ["first", "last"]
    assert rig.counters.of(bridge).snapshot()["appended"] == 1


def test_without_apply_on_append_every_frame_waits_for_the_drain(store, faults):
    script = Script()
    with store.write() as tx:
        tx.raw("CREATE TABLE IF NOT EXISTS t_append_applied (frame TEXT NOT NULL, step TEXT NOT NULL)")
    ingest = Ingest(store=store, faults=faults, decode=script.decode, project=script.project, validate=False,
                    apply_on_append=False)
    try:
        bridge = create_bridge(store, platform="signal", name="p")["id"]
        [r] = ingest.append(bridge, [frame("a")])
        assert state(store, r.inbox_id)["outcome"] is None and script.decodes["a"] == 0
        assert ingest.worker.drain_if_due().applied == 1
    finally:
        ingest.stop()


# -- over HTTP --------------------------------------------------------------------------------------
def signal_frame(n: int) -> dict:
    from pathlib import Path

    payload = json.loads((Path(__file__).parent / "fixtures" / "signal_text_direct.json").read_text())
    return {"codec": "signal.jsonrpc", "codec_version": 1, "dedupe_key": f"k{n}", "payload": payload}


def make_bridge(client):
    r = client.post("/api/v1/bridges", json={"platform": "signal", "name": "phone"}, headers=client.admin)
    assert r.status_code == 201, r.text
    return r.json()


def test_http_202_means_committed_and_the_frame_is_already_applied(client, runtime):
    br = make_bridge(client)
    r = client.post(f"/api/v1/bridges/{br['id']}/frames", json=signal_frame(1), headers=auth(br["token"]))
    assert r.status_code == 202, r.text
    [res] = r.json()["results"]
    with runtime.store.read() as tx:  # another connection sees it the moment the answer arrived
        assert inbox_store.frame_state(tx, res["inbox_id"])["outcome"] == "applied"
        assert tx.raw("SELECT count(*) FROM bridge_messages").fetchone()[0] == 1


@pytest.mark.sqlite_only  # a commit-time failure is provoked with SQLite's deferred foreign keys
def test_http_no_202_when_the_append_commit_fails(client, runtime, backend_url):
    br = make_bridge(client)
    worker = runtime.ingest.worker

    def project_then_poison_the_commit(tx, ctx, events):
        tx.raw("PRAGMA defer_foreign_keys = ON")
        tx.raw("INSERT INTO read_cursors (conversation_id, bridge_id, last_read_message_id, "
               "last_read_message_at_ms, last_read_at_ms, updated_at_ms) VALUES ('nope', ?, 'nope', 1, 1, 1)",
               (ctx.bridge_id,))
        return True

    worker.applier.project = project_then_poison_the_commit  # the COMMIT itself will fail
    r = client.post(f"/api/v1/bridges/{br['id']}/frames", json=signal_frame(2), headers=auth(br["token"]))
    assert r.status_code == 500
    with runtime.store.read() as tx:
        assert inbox_store.backlog(tx) == 0 and tx.raw("SELECT count(*) FROM inbox").fetchone()[0] == 0
