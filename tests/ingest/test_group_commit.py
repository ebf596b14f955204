"""Group commit (``tidings.ingest.group_commit``): appends that arrive while another
append's transaction runs share the next transaction and its one commit, each in its own
savepoint; a failure inside a shared transaction costs nobody else anything.

Determinism: the first append's transaction is held (``on_lead``) until the others have
queued (``on_queue``), so the second transaction is known to hold exactly them. No sleeps.
"""

from __future__ import annotations

import threading

import pytest
from test_apply_on_append import Script, frame, state, steps

from tidings.bridges.registry import create_bridge
from tidings.ingest.engine import Ingest
from tidings.ingest.group_commit import FAULT_SHARED_COMMIT, GroupCommit


@pytest.fixture
def rig(store, faults):
    """``test_apply_on_append``'s scripted ingest, with group commit on (64 appends a group)."""
    with store.write() as tx:
        tx.raw("CREATE TABLE IF NOT EXISTS t_append_applied (frame TEXT NOT NULL, step TEXT NOT NULL)")
        tx.raw("DELETE FROM t_append_applied")
    script = Script()
    ingest = Ingest(store=store, faults=faults, decode=script.decode, project=script.project, validate=False,
                    sleep=lambda s: None, group_commit=64)
    ingest.script = script
    yield ingest
    ingest.stop()


def _held_first_group(group: GroupCommit, others: int) -> None:
    """Hold the first group's leader until ``others`` more appends have queued."""
    queued = threading.Event()
    first = [True]

    def on_queue(n: int) -> None:
        if n >= others and not first[0]:
            queued.set()

    def on_lead(_size: int) -> None:
        if first[0]:
            first[0] = False
            assert queued.wait(30), "the other appends never queued"

    group.on_queue = on_queue
    group.on_lead = on_lead


def _append_concurrently(ingest: Ingest, requests: list[tuple[str, list]]) -> list:
    """The first request starts alone; the rest arrive while its transaction runs."""
    results: list = [None] * len(requests)
    errors: list = []

    def send(i: int) -> None:
        try:
            results[i] = ingest.append(*requests[i])
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)

    _held_first_group(ingest.group, len(requests) - 1)
    first = threading.Thread(target=send, args=(0,))
    first.start()
    threads = [threading.Thread(target=send, args=(i,)) for i in range(1, len(requests))]
    for t in threads:
        t.start()
    for t in [first, *threads]:
        t.join(60)
    assert not errors, errors
    return results


def test_appends_that_arrive_during_a_commit_share_the_next_one(store, rig):
    bridges = [create_bridge(store, platform="signal", name=f"p{i}")["id"] for i in range(4)]
    before = store.commits
    results = _append_concurrently(rig, [(b, [frame(f"f{i}")]) for i, b in enumerate(bridges)])
    # The first append committed alone; the three that queued behind it share one commit.
    assert store.commits - before == 2
    assert rig.group.stats()["largest"] == 3
    for i, [r] in enumerate(results):
        assert state(store, r.inbox_id)["outcome"] == "applied"
        assert steps(store, f"f{i}") == ["first", "last"]
    for b in bridges:
        c = rig.counters.of(b).snapshot()
        assert (c["appended"], c["projected"], c["applied_on_append"]) == (1, 1, 1)


def test_a_lone_append_commits_at_once_without_a_savepoint_of_its_own(store, rig):
    bridge = create_bridge(store, platform="signal", name="p")["id"]
    before = store.meter.snapshot()
    rig.append(bridge, [frame("a")])
    plain = Ingest(store=store, faults=store.faults, decode=rig.script.decode, project=rig.script.project,
                   validate=False, sleep=lambda s: None, group_commit=1)
    middle = store.meter.snapshot()
    plain.append(bridge, [frame("b")])
    after = store.meter.snapshot()
    plain.stop()
    grouped = {k: middle[k] - before[k] for k in before}
    alone = {k: after[k] - middle[k] for k in before}
    assert grouped == alone  # the same statements, round trips and one commit
    assert grouped["commits"] == 1


def test_a_member_that_fails_inside_a_shared_transaction_runs_again_alone(store, rig):
    bridges = [create_bridge(store, platform="signal", name=f"p{i}")["id"] for i in range(4)]
    # The third request's frame breaks its transaction once (``ROLLBACK`` under it): in the
    # shared transaction that takes the second request's work with it.
    requests = [(bridges[0], [frame("a")]), (bridges[1], [frame("b")]),
                (bridges[2], [frame("c", **{"break": 1})]), (bridges[3], [frame("d")])]
    results = _append_concurrently(rig, requests)
    for fid, [r] in zip("abcd", results, strict=True):
        s = state(store, r.inbox_id)
        assert s is not None, fid
        assert steps(store, fid) == ["first", "last"] or s["outcome"] is None, fid
    # Every frame is stored exactly once; the broken one is applied by now or left to the drain.
    rig.drain()
    assert [steps(store, f) for f in "abcd"] == [["first", "last"]] * 4
    assert rig.group.stats()["reruns"] >= 1
    for b in bridges:
        assert rig.counters.of(b).snapshot()["appended"] == 1


def test_a_deterministic_failure_of_one_member_leaves_the_others_committed(store, rig):
    bridges = [create_bridge(store, platform="signal", name=f"p{i}")["id"] for i in range(3)]
    requests = [(bridges[0], [frame("a")]), (bridges[1], [frame("b", bad=True)]), (bridges[2], [frame("c")])]
    before = store.commits
    results = _append_concurrently(rig, requests)
    assert store.commits - before == 2  # b's quarantine is stored inside its own savepoint
    assert state(store, results[1][0].inbox_id)["outcome"] == "quarantined"
    assert steps(store, "a") == ["first", "last"] and steps(store, "c") == ["first", "last"]
    assert steps(store, "b") == []


def test_a_shared_transaction_that_fails_runs_every_member_again_alone(store, rig, faults):
    bridges = [create_bridge(store, platform="signal", name=f"p{i}")["id"] for i in range(4)]
    faults.arm(FAULT_SHARED_COMMIT, 1)
    before = store.commits
    results = _append_concurrently(rig, [(b, [frame(f"g{i}")]) for i, b in enumerate(bridges)])
    # First alone (1), the shared one failed (0), then each of the three alone (3).
    assert store.commits - before == 4
    assert rig.group.stats()["reruns"] == 3
    for i, [r] in enumerate(results):
        assert state(store, r.inbox_id)["outcome"] == "applied"
        assert steps(store, f"g{i}") == ["first", "last"]  # once each: nothing kept twice
    assert rig.script.order.count("g1") == 1  # after_commit ran once, for the commit that held it


def test_appends_of_one_bridge_in_one_group_are_applied_in_the_order_they_arrived(store, rig):
    bridge = create_bridge(store, platform="signal", name="p")["id"]
    arrived: list[str] = []
    fids = [f"o{i}" for i in range(6)]
    results: dict[str, list] = {}

    def send(fid: str) -> None:
        results[fid] = rig.append(bridge, [frame(fid)])

    _held_first_group(rig.group, len(fids) - 1)
    held = rig.group.on_queue

    def on_queue(n: int) -> None:
        arrived.append(threading.current_thread().name)  # who joined the queue, in order
        held(n)

    rig.group.on_queue = on_queue
    threads = [threading.Thread(target=send, args=(fid,), name=fid) for fid in fids]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sorted(arrived) == sorted(fids) and len(results) == len(fids)
    assert rig.group.stats()["largest"] == len(fids) - 1
    assert rig.script.order == arrived  # applied, and so received, in the order they queued
    fid_of = {r[0].inbox_id: fid for fid, r in results.items()}
    with store.read() as tx:
        receipt = [fid_of[row[0]] for row in tx.raw("SELECT inbox_id FROM inbox ORDER BY received_at_ms, inbox_id")]
    assert receipt == arrived


@pytest.mark.parametrize("members", [0, -1])
def test_a_group_takes_at_least_one_member(store, members):
    with pytest.raises(ValueError):
        GroupCommit(store.write, max_members=members)


def _run_concurrently(group: GroupCommit, works: list) -> list:
    """Like ``_append_concurrently``, straight on a ``GroupCommit``: (value or error) each."""
    out: list = [None] * len(works)

    def call(i: int) -> None:
        try:
            out[i] = ("value", group.run(works[i]))
        except Exception as exc:  # noqa: BLE001 - the caller's answer
            out[i] = ("error", exc)

    _held_first_group(group, len(works) - 1)
    threads = [threading.Thread(target=call, args=(i,)) for i in range(len(works))]
    threads[0].start()
    for t in threads[1:]:
        t.start()
    for t in threads:
        t.join(60)
    return out


def test_a_member_that_raises_leaves_nothing_behind_and_gets_its_own_error(store):
    with store.write() as tx:
        tx.raw("CREATE TABLE IF NOT EXISTS t_group (name TEXT NOT NULL)")
    insert = "INSERT INTO t_group (name) VALUES (" + ("?" if store.dialect == "sqlite" else "%s") + ")"

    def writes(name: str, fail: bool = False):
        def work(tx):
            tx.raw(insert, (name,))
            if fail:
                raise ValueError(f"{name} refused")
            return name
        return work

    group = GroupCommit(store.write)
    before = store.commits
    out = _run_concurrently(group, [writes("a"), writes("b"), writes("c", fail=True), writes("d")])
    assert [o[0] for o in out] == ["value", "value", "error", "value"]
    assert str(out[2][1]) == "c refused"  # its own error, from its run alone
    with store.read() as tx:
        names = sorted(r[0] for r in tx.raw("SELECT name FROM t_group").fetchall())
    assert names == ["a", "b", "d"]  # c's write inside the shared transaction was taken back
    assert store.commits - before == 2  # a alone, then b and d together (c's rerun rolled back)
    assert group.stats() == {"commits": 2, "members": 3, "reruns": 1, "largest": 3}
