"""The RIG-2490 recovery scan (spec §5.12 T1-T4) and the fixes around it: marks only after
success (O4), a periodic scan, per-message and batch faults, bounded batches."""

from __future__ import annotations

from delivery_world import World, general_channel

from tidings.delivery import consumer as consumer_mod
from tidings.store import delivery as delivery_store
from tidings.store import owed as owed_store
from tidings.store import sweep as sweep_store


def setup(world, *agents, subscribed=(), live=()):
    return general_channel(world, agents, subscribed=subscribed, live=live, settle=world.pump)


# -- T1: the store reads ---------------------------------------------------------------------
def test_unrouted_reads_are_ascending_bounded_and_exclude_marked_rows(world):
    hu, ch, ids = setup(world, "aa")
    other = world.channel("other", hu)
    posted = [world.post(hu, ch if i % 2 else other, f"m{i}") for i in range(5)]  # not pumped: NULL
    with world.store.read() as tx:
        rows = delivery_store.unrouted_page(tx, 0, 10)
        assert [r["id"] for r in rows] == posted
        assert [r["channel_id"] for r in rows] == [ch if i % 2 else other for i in range(5)]
        first = delivery_store.unrouted_page(tx, 0, 2)
        rest = delivery_store.unrouted_page(tx, first[-1]["seq"], 10)
    assert [r["id"] for r in first + rest] == posted
    seqs = [r["seq"] for r in first]
    with world.store.write() as tx:
        assert owed_store.mark_routed(tx, seqs, 111) == 2
    with world.store.write() as tx:
        assert owed_store.mark_routed(tx, seqs, 222) == 0  # the first mark stays
    with world.store.read() as tx:
        assert [r["id"] for r in delivery_store.unrouted_page(tx, 0, 10)] == posted[2:]
        assert tx.raw(f"SELECT mentions_routed_at FROM messages WHERE id = '{posted[0]}'").fetchone()[0] == 111


# -- T2: the scan over the shared routing ----------------------------------------------------
def test_scan_routes_an_unmarked_mention_of_an_offline_gap_member(world):
    hu, ch, ids = setup(world, "gap")
    world.faults.arm("bus.drop_publish", 1)
    m = world.post(hu, ch, "@gap hello")
    world.pump()
    assert world.owed() == [] and not world.routed(m)
    assert world.d.consumer.scan() == 1
    world.pump()
    assert world.owed(ids["gap"]) == [m] and world.routed(m)
    assert world.waker.of(ids["gap"]) == ["mention"]
    assert world.counters()["scan_recovered"] == 1


def test_scan_skips_a_message_held_right_now_and_leaves_it_unmarked(world):
    hu, ch, ids = setup(world, "author", "gap", subscribed=("author",), live=("author",))
    world.d.consumer.options.scan_batch = 1  # the floor must step past the held row
    held = world.post(ids["author"], ch, "@gap streaming")
    world.faults.arm("bus.drop_publish", 1)
    loose = world.post(hu, ch, "@gap unrelated")
    world.pump()
    world.d.consumer.scan()
    assert not world.routed(held) and world.routed(loose)
    assert world.owed(ids["gap"]) == [loose]
    world.settle(ids["author"])
    world.pump()
    assert world.routed(held) and world.owed(ids["gap"]) == [held, loose]


def test_scan_steers_a_live_gap_member_whose_event_was_dropped(world):
    hu, ch, ids = setup(world, "gap", live=("gap",))
    world.faults.arm("bus.drop_publish", 1)
    m = world.post(hu, ch, "@gap now")
    world.pump()
    assert world.got(ids["gap"]) == []
    world.d.consumer.scan()
    assert world.got(ids["gap"]) == [("steer", m)]
    assert world.owed() == [(ids["gap"], m)]  # until the agent acks it


def test_a_fault_on_one_message_leaves_it_unmarked_and_the_scan_goes_on(world):
    hu, ch, ids = setup(world, "gap")
    world.faults.arm("bus.drop_publish", 3)
    posted = [world.post(hu, ch, f"@gap m{i}") for i in range(3)]
    world.faults.arm(consumer_mod.ROUTE_FAULT, 1)
    world.d.consumer.scan()
    assert [world.routed(m) for m in posted] == [False, True, True]
    assert sorted(world.owed(ids["gap"])) == sorted(posted[1:])
    world.d.consumer.scan()
    assert world.routed(posted[0]) and sorted(world.owed(ids["gap"])) == sorted(posted)


def test_a_failed_batch_read_ends_that_scan_and_the_consumer_carries_on(world):
    hu, ch, ids = setup(world, "gap")
    world.faults.arm("bus.drop_publish", 1)
    m = world.post(hu, ch, "@gap hi")
    world.faults.arm(consumer_mod.SCAN_READ_FAULT, 1)
    assert world.d.consumer.scan() == 0
    assert world.counters()["scan_failures"] == 1 and not world.routed(m)
    live = world.post(hu, ch, "@gap still routing live")
    world.pump()
    assert world.owed(ids["gap"]) == [live]
    world.d.consumer.scan()
    assert sorted(world.owed(ids["gap"])) == sorted([m, live])


def test_a_failed_flush_retries_each_message_alone(world):
    hu, ch, ids = setup(world, "gap")
    world.faults.arm("bus.drop_publish", 2)
    posted = [world.post(hu, ch, f"@gap m{i}") for i in range(2)]
    world.faults.arm(consumer_mod.FLUSH_FAULT, 1)
    assert world.d.consumer.scan() == 2
    assert world.counters()["flush_failures"] == 1
    assert sorted(world.owed(ids["gap"])) == sorted(posted)


def test_scan_reads_in_bounded_batches_whatever_the_backlog(world, monkeypatch):
    # "memory flat": the scan never asks for more than one batch at a time
    hu, ch, ids = setup(world, "gap")
    world.faults.arm("bus.drop_publish", 23)
    for i in range(23):
        world.post(hu, ch, f"@gap m{i}" if i % 5 == 0 else f"plain {i}")
    world.d.consumer.options.scan_batch = 5
    calls = []
    real = delivery_store.unrouted_page

    def spy(tx, after_seq, limit):
        rows = real(tx, after_seq, limit)
        calls.append((after_seq, limit, len(rows)))
        return rows

    monkeypatch.setattr(delivery_store, "unrouted_page", spy)
    assert world.d.consumer.scan() == 23
    assert [c[1] for c in calls] == [5] * 5 and max(c[2] for c in calls) == 5
    assert [c[0] for c in calls] == sorted(c[0] for c in calls)  # the scan-local floor only rises
    assert len(world.owed(ids["gap"])) == 5


def test_the_live_pass_marks_so_a_later_scan_processes_nothing(world):
    # T3
    hu, ch, ids = setup(world, "gap")
    m = world.post(hu, ch, "@gap live")
    world.pump()
    assert world.routed(m)
    assert world.d.consumer.scan() == 0


def test_a_periodic_scan_recovers_a_failed_pass_without_a_restart(world):
    # O4 fixed + the clock's recovery point
    hu, ch, ids = setup(world, "gap")
    world.faults.arm(consumer_mod.ROUTE_FAULT, 1)
    m = world.post(hu, ch, "@gap flaky")
    world.pump()
    assert not world.routed(m) and world.owed() == []
    world.clock.advance(30_000)
    world.pump()
    assert world.routed(m) and world.owed(ids["gap"]) == [m]


def test_a_periodic_scan_that_finds_unseen_posts_pushes_them_to_live_subscribers(world):
    # A post committed where this consumer never saw its event (another process, e.g. an
    # MCP stdio agent; or a dropped publish) reaches a live subscriber at the next periodic
    # scan, not only at its next reconnect.
    hu, ch, ids = setup(world, "sub", subscribed=("sub",), live=("sub",))
    world.faults.arm("bus.drop_publish", 1)
    m = world.post(hu, ch, "posted where nobody published it")
    world.pump()
    assert world.got(ids["sub"]) == []
    world.clock.advance(30_000)
    world.pump()
    assert world.got(ids["sub"]) == [("deliver", m)]


def test_negative_control_marking_after_a_failed_pass_loses_the_mention(runtime):
    # The reference's O4: mark even though routing failed; no scan ever sees it again
    world = World(runtime, mark_on_route_failure=True)
    try:
        hu, ch, ids = setup(world, "gap")
        world.faults.arm(consumer_mod.ROUTE_FAULT, 1)
        m = world.post(hu, ch, "@gap flaky")
        world.pump()
        world.clock.advance(30_000)
        world.pump()
        world.restart(mark_on_route_failure=True)
        assert world.routed(m) and world.owed() == []
    finally:
        world.close()


# -- T3/T4: the recovery points end to end (engine level) -------------------------------------
def test_crash_leg_a_fresh_bus_that_never_saw_the_publish(world):
    hu, ch, ids = setup(world, "gap")
    m = world.post(hu, ch, "@gap you were paged")  # committed; the consumer never ran
    world.restart()  # fresh bus + fresh consumer over the same database: start scan
    assert world.owed(ids["gap"]) == [m]
    world.connect(ids["gap"])
    world.pump()
    assert world.got(ids["gap"]) == [("steer", m)]
    world.ack(ids["gap"], m)
    assert world.owed() == []
    world.disconnect(ids["gap"])
    world.connect(ids["gap"])
    world.pump()
    assert world.got(ids["gap"]) == []


def test_crash_leg_negative_control_with_the_scan_disabled_nothing_is_owed(world):
    hu, ch, ids = setup(world, "gap")
    world.post(hu, ch, "@gap you were paged")
    world.restart(scan_enabled=False)
    world.pump()
    assert world.owed() == []
    world.connect(ids["gap"])
    world.pump()
    assert world.got(ids["gap"]) == []


def test_agent_authored_leg_held_then_a_restart_before_settle(world):
    hu, ch, ids = setup(world, "author", "gap", subscribed=("author",), live=("author",))
    m = world.post(ids["author"], ch, "@gap please review")
    world.pump()
    assert m in world.d.consumer.held_ids and world.owed() == []
    world.restart()
    assert world.owed(ids["gap"]) == [m] and world.routed(m)


def test_lagged_overrun_leg_the_mention_in_the_dropped_window_is_owed(world):
    hu, ch, ids = setup(world, "gap")
    world.faults.arm("bus.overrun", 1)
    m = world.post(hu, ch, "@gap in the dropped window")
    world.pump()
    assert world.counters()["overruns_handled"] == 1
    assert world.owed(ids["gap"]) == [m]


def test_overrun_of_a_live_authors_post_is_scanned_not_left_for_a_settle_that_never_comes(world):
    # RD-3: the skip is held-membership, not author liveness
    hu, ch, ids = setup(world, "author", "gap", subscribed=("author",), live=("author",))
    world.faults.arm("bus.overrun", 1)
    m = world.post(ids["author"], ch, "@gap dropped while my session is live")
    world.pump()
    assert m not in world.d.consumer.held_ids
    assert world.owed(ids["gap"]) == [m]


def test_the_start_scan_runs_before_the_replay_is_drained(world):
    # a message in the ring of the same bus: scanned (routed, owed) at open, then the replay
    # sees it already routed and does not route it a second time
    hu, ch, ids = setup(world, "gap")
    world.faults.arm(consumer_mod.ROUTE_FAULT, 1)
    m = world.post(hu, ch, "@gap ring")
    world.pump()
    assert not world.routed(m)
    from tidings.delivery.engine import Delivery

    fresh = Delivery(world.rt, threaded=False, waker=world.waker)  # same bus: the ring replays
    fresh.start()
    fresh.pump()
    assert world.owed(ids["gap"]) == [m]
    assert fresh.status()["owed_recorded"] == 1 and fresh.status()["scan_recovered"] == 1
    fresh.stop()


def test_a_failed_start_sweep_is_swept_again_at_the_next_periodic_scan(world, monkeypatch):
    # A session edge that fails (here: its start sweep cannot read the cursors) asks for a
    # resweep of every live session; the next periodic scan runs it even though the scan
    # itself recovers nothing (D85: the one failure path sets the request).
    hu, ch, ids = setup(world, "sub", subscribed=("sub",))
    m = world.post(hu, ch, "before the session")
    world.pump()
    real = sweep_store.sweep_cursors
    calls = {"n": 0}

    def flaky(tx, agent_id):
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("injected: the start sweep fails")
        return real(tx, agent_id)

    monkeypatch.setattr(sweep_store, "sweep_cursors", flaky)
    world.connect(ids["sub"])
    world.pump()
    assert world.got(ids["sub"]) == []
    world.clock.advance(30_000)
    world.pump()
    assert world.got(ids["sub"]) == [("deliver", m)]
