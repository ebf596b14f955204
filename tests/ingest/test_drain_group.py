"""The drain applies a group of ready frames in one transaction, one batch a bridge (D118),
both backends:

* a group commits once, whatever the number of its frames and of their bridges, and a frame
  that fails deterministically is quarantined with its cause in that same commit;
* a transient error inside a frame's savepoint (the link hook's) ends the group there: the
  frames before it stay committed, that frame and the ones after it go through the one-frame
  path, that first try counted, and none is lost or applied twice;
* a transient error outside any savepoint (the batch's writes) loses the group whole: every
  frame goes through the one-frame path, in receipt order, and none is lost or applied twice.
"""

from __future__ import annotations

import sqlite3
from typing import Any

import pytest
from test_batch import CODEC, conversation, decode, frame, outcomes, wire_log

from tidings.bridges.registry import create_bridge
from tidings.ingest.batch import Batch
from tidings.ingest.engine import Ingest
from tidings.store import inbox as inbox_store
from tidings.store.engine import Tx

GROUP = 8


def transient() -> Exception:
    exc = sqlite3.OperationalError("database is locked")
    exc.sqlite_errorcode = 5  # type: ignore[attr-defined]
    return exc


def drained(store, **options: Any) -> Ingest:
    return Ingest(store=store, apply_on_append=False, decode=decode, codec_platforms={CODEC: "signal"},
                  group_size=GROUP, **options)


def bodies(store) -> list[str]:
    with store.read() as tx:
        return [r[0] for r in tx.raw("SELECT body FROM bridge_messages ORDER BY body").fetchall()]


def drain(store, ingest: Ingest) -> tuple[Any, int]:
    """One drain of the worker: its stats and the commits it made."""
    before = store.meter.snapshot()["commits"]
    stats = ingest.worker.drain_if_due()
    return stats, store.meter.snapshot()["commits"] - before


def drain_appended(store, conversation_id: str, count: int, **options: Any) -> tuple[Ingest, str, Any, int]:
    """Bridge p with ``count`` frames of Bob's, one a request (``m<n>`` with the body
    ``b<n>``, n from 1), drained once by a ``drained(store, **options)`` engine, stopped
    after: the engine, the bridge, the drain's stats and its commits."""
    ingest = drained(store, **options)
    try:
        bridge = create_bridge(store, platform="signal", name="p")["id"]
        for n in range(1, count + 1):
            ingest.append_body(bridge, frame(str(n), [conversation_id, f"m{n}", "+15550100", "Bob", f"b{n}",
                                                      1_000 + n]), "signal")
        stats, commits = drain(store, ingest)
    finally:
        ingest.stop()
    return ingest, bridge, stats, commits


def two_bridges(store, ingest: Ingest) -> tuple[str, str]:
    """Bridges p and q, with a first frame each (bodies p1, q1) left for the drain."""
    p = create_bridge(store, platform="signal", name="p")["id"]
    q = create_bridge(store, platform="signal", name="q")["id"]
    ingest.append_body(p, frame("1", ["signal:a", "m1", "+15550100", "Bob", "p1", 1_000]), "signal")
    ingest.append_body(q, frame("1", ["signal:a", "m1", "+15550111", "Ann", "q1", 1_001]), "signal")
    return p, q


def test_a_group_of_two_bridges_commits_once_with_its_quarantined_frame(store):
    ingest = drained(store)
    try:
        p, q = two_bridges(store, ingest)
        ingest.append_body(p, frame("2", ["signal:a", "m2", "anon:👍", "", "boo", 1_002]), "signal")
        ingest.append_body(q, frame("2", ["signal:b", "m2", "+15550100", "Bob", "q2", 1_003]), "signal")
        ingest.append_body(p, frame("3", ["signal:a", "m3", "+15550100", "Bob", "p3", 1_004]), "signal")
        stats, commits = drain(store, ingest)
    finally:
        ingest.stop()
    assert stats is not None and (stats.applied, stats.quarantined) == (4, 1)
    assert commits == 1
    assert outcomes(store, p) == ["applied", "quarantined", "applied"]
    assert outcomes(store, q) == ["applied", "applied"]
    assert bodies(store) == ["p1", "p3", "q1", "q2"]
    assert conversation(store, p, "signal:a")["last_message_at_ms"] == 1_004
    with store.read() as tx:
        assert inbox_store.backlog(tx) == 0
        [cause] = [r[0] for r in tx.raw("SELECT cause FROM inbox WHERE outcome = 'quarantined'").fetchall()]
    assert cause


class FlakyHook:
    """The link hook of conversation ``signal:h``: raises a transient error the first time
    it sees each message of ``flaky``, and writes to the store as the real hook posts."""

    def __init__(self, store, flaky: set[str]) -> None:
        self.ph = "?" if store.dialect == "sqlite" else "%s"
        self.flaky = set(flaky)
        self.seen: list[str] = []

    def acts_on(self, tx: Tx, conversation_id: str) -> bool:
        return True

    def __call__(self, tx: Tx, change: Any) -> None:
        self.seen.append(change.remote_message_id)
        tx.raw(f"UPDATE bridge_messages SET body = body || ' (posted)' WHERE id = {self.ph}", (change.message_id,))
        if change.remote_message_id in self.flaky:
            self.flaky.discard(change.remote_message_id)
            raise transient()


def test_a_transient_error_in_a_frames_savepoint_ends_the_group_there(store):
    hook = FlakyHook(store, {"m3"})
    ingest, bridge, stats, commits = drain_appended(store, "signal:h", 5, on_message=hook)
    assert stats is not None and stats.applied == 5
    # m1, m2 in the group; m3 failed in it, then alone (again), m4, m5 alone
    assert hook.seen == ["m1", "m2", "m3", "m3", "m4", "m5"]
    assert commits == 1 + 3
    assert bodies(store) == [f"b{n} (posted)" for n in range(1, 6)]  # each posted once
    assert ingest.counters.of(bridge).snapshot()["transient_retries"] == 1
    assert outcomes(store, bridge) == ["applied"] * 5


def test_a_transient_error_outside_any_savepoint_runs_every_frame_of_the_group_alone(store, monkeypatch):
    real_flush = Batch.flush
    failed: list[int] = []

    def flush(self: Batch) -> None:
        if not failed:  # the group's flush: no frame of it may call the hook
            failed.append(1)
            raise transient()
        real_flush(self)

    monkeypatch.setattr(Batch, "flush", flush)
    _ingest, bridge, stats, commits = drain_appended(store, "signal:a", 4)
    assert failed == [1]
    assert stats is not None and stats.applied == 4
    assert commits == 4  # the group stored nothing; each frame then alone
    assert bodies(store) == ["b1", "b2", "b3", "b4"]
    assert conversation(store, bridge, "signal:a")["last_message_at_ms"] == 1_004
    assert outcomes(store, bridge) == ["applied"] * 4


@pytest.mark.postgres_only
def test_a_group_locks_each_of_its_bridges_before_it_reads_their_rows(store, monkeypatch):
    sent = wire_log()
    ingest = drained(store)
    try:
        p, q = two_bridges(store, ingest)
        sent.start(monkeypatch)
        stats = ingest.worker.drain_if_due()
    finally:
        ingest.stop()
    assert stats is not None and stats.applied == 2
    first_read = next(i for i, sql in enumerate(sent) if "FROM identities" in sql)
    locks = [i for i, sql in enumerate(sent) if "pg_advisory_xact_lock(hashtextextended" in sql]
    assert len(locks) == 2 and max(locks) < first_read


def test_a_backlog_drains_in_groups_by_default_and_the_setting_changes_it(store, monkeypatch):
    from tidings.ingest.grouping import DRAIN_GROUP

    monkeypatch.delenv("TIDINGS_INGEST_GROUP", raising=False)
    commits = {}
    for setting in ("", "1"):
        if setting:
            monkeypatch.setenv("TIDINGS_INGEST_GROUP", setting)
        ingest = Ingest(store=store, apply_on_append=False, decode=decode, codec_platforms={CODEC: "signal"})
        try:
            bridge = create_bridge(store, platform="signal", name=f"p{setting}")["id"]
            ingest.append_body(bridge, {"frames": [
                frame(str(n), ["signal:a", f"m{n}", "+15550100", "Bob", "hi", 1_000 + n])
                for n in range(DRAIN_GROUP + 8)]}, "signal")
            stats, commits[setting] = drain(store, ingest)
        finally:
            ingest.stop()
        assert stats is not None and stats.applied == DRAIN_GROUP + 8
    assert commits == {"": 2, "1": DRAIN_GROUP + 8}  # a group of DRAIN_GROUP, then the 8 left
