"""Cursors, acks and owed rows (spec §5.8, D1-D22; a few §5.9 reads), on ``channel_seq``."""

from __future__ import annotations

import threading

import pytest
from delivery_world import general_channel

from tidings.errors import NotFound
from tidings.store import cursors as cursors_store
from tidings.store import owed as owed_store
from tidings.store import sweep as sweep_store


def setup(world, *agents, subscribed=None):
    return general_channel(world, agents, subscribed=agents if subscribed is None else subscribed)


def swept(world, agent_id):
    """What a fresh session of the agent is swept (cursor and owed), then closed."""
    world.disconnect(agent_id)
    world.connect(agent_id)
    world.pump()
    got = world.got(agent_id)
    world.disconnect(agent_id)
    world.pump()
    return got


def test_ack_moves_the_cursor_once_and_a_repeat_changes_nothing(world):
    # D1
    hu, ch, ids = setup(world, "aa")
    m1 = world.post(hu, ch, "m1")
    world.ack(ids["aa"], m1)
    assert world.cursor(ids["aa"], ch) == (1, ())
    world.ack(ids["aa"], m1)
    assert world.cursor(ids["aa"], ch) == (1, ())
    assert world.counters()["acks"] == 2


def test_ack_of_an_unknown_or_foreign_message_is_404_and_changes_nothing(world):
    # D2: a fabricated id; a message in a channel the agent does not belong to
    hu, ch, ids = setup(world, "aa")
    other = world.channel("other", hu)
    foreign = world.post(hu, other, "not yours")
    for bad in ("msg_fabricated", foreign):
        with pytest.raises(NotFound):
            world.ack(ids["aa"], bad)
    assert world.cursor(ids["aa"], ch) == (0, ()) and world.cursor(ids["aa"], other) is None


def test_out_of_order_acks_fold_into_the_mark(world):
    # D3
    hu, ch, ids = setup(world, "aa")
    m1, m2, m3 = (world.post(hu, ch, t) for t in ("m1", "m2", "m3"))
    world.ack(ids["aa"], m3)
    assert world.cursor(ids["aa"], ch) == (0, (3,))
    world.ack(ids["aa"], m2)
    assert world.cursor(ids["aa"], ch) == (0, (2, 3))
    world.ack(ids["aa"], m1)
    assert world.cursor(ids["aa"], ch) == (3, ())


def test_the_advance_steps_over_self_authored_seqs(world):
    # D4
    hu, ch, ids = setup(world, "aa")
    a = world.post(hu, ch, "owed A")
    for i in range(3):
        world.post(ids["aa"], ch, f"self {i}")
    b = world.post(hu, ch, "owed B")
    world.ack(ids["aa"], b)
    assert world.cursor(ids["aa"], ch) == (0, (5,))
    world.ack(ids["aa"], a)
    assert world.cursor(ids["aa"], ch) == (5, ())


def test_a_channel_without_a_cursor_row_is_treated_as_caught_up(world):
    # D5
    hu, ch, ids = setup(world, "aa")
    world.post(hu, ch, "m")
    with world.store.write() as tx:
        tx.raw(f"DELETE FROM agent_cursors WHERE channel_id = '{ch}'")
    assert swept(world, ids["aa"]) == []


def test_seeds_home_on_creation_and_channels_on_subscribe_never_for_humans(world):
    # D6, D7 (seeded at the head: no history replay)
    hu, ch, ids = setup(world, "aa", subscribed=())
    assert world.cursor(ids["aa"], world.ids["aa.home"]) == (0, ())
    assert world.cursor(ids["aa"], ch) is None
    world.post(hu, ch, "before the subscribe")
    world.subscribe(ch, ids["aa"], hu)
    assert world.cursor(ids["aa"], ch) == (1, ()) and world.cursor(hu, ch) is None
    assert swept(world, ids["aa"]) == []


def test_sweep_skips_self_authored_and_acked_messages(world):
    # D8
    hu, ch, ids = setup(world, "aa")
    o1 = world.post(hu, ch, "o1")
    world.post(ids["aa"], ch, "self")
    o2 = world.post(hu, ch, "o2")
    o3 = world.post(hu, ch, "o3")
    world.ack(ids["aa"], o2)
    assert swept(world, ids["aa"]) == [("deliver", o1), ("deliver", o3)]


def test_the_cursor_survives_a_restart(world):
    # D9
    hu, ch, ids = setup(world, "aa")
    m1, m2 = world.post(hu, ch, "m1"), world.post(hu, ch, "m2")
    world.ack(ids["aa"], m1)
    world.ack(ids["aa"], m2)
    world.restart()
    assert world.cursor(ids["aa"], ch) == (2, ())
    assert swept(world, ids["aa"]) == []


def test_home_channel_is_swept_even_with_the_flag_off(world):
    # D10, D20, R-3, R-9: the sweep set is subscribed OR home OR mandatory, members only
    hu, ch, ids = setup(world, "aa", subscribed=())
    home = world.ids["aa.home"]
    with world.store.write() as tx:
        tx.raw(f"UPDATE channel_members SET subscribed = FALSE WHERE channel_id = '{home}'")
    m = world.post(hu, home, "to the home")
    assert swept(world, ids["aa"]) == [("deliver", m)]
    mandatory = world.channel("announce", hu, members=[ids["aa"]], mandatory=True)
    not_member = world.channel("elsewhere", hu, mandatory=True)
    with world.store.read() as tx:
        assert sweep_store.in_sweep_set(tx, ids["aa"], home)
        assert sweep_store.in_sweep_set(tx, ids["aa"], mandatory)
        assert not sweep_store.in_sweep_set(tx, ids["aa"], ch)
        assert not sweep_store.in_sweep_set(tx, ids["aa"], not_member)
        assert sweep_store.sweep_channels(tx, ids["aa"]) == sorted([home, mandatory])
    world.subscribe(ch, ids["aa"])
    with world.store.read() as tx:
        assert sweep_store.in_sweep_set(tx, ids["aa"], ch)
        flags = {a.id: a.in_sweep for a in sweep_store.channel_agents(tx, ch)}
    assert flags == {ids["aa"]: True}  # agents only: the human owner is not listed


def test_interleaved_channels_never_wedge_the_cursor(world):
    # D11, the reference's documented wedge, fixed: with channel_seq another channel's
    # messages cannot leave gaps, so the above-set stays empty
    hu, ch, ids = setup(world, "aa")
    side = world.channel("side", hu, subscribe=[ids["aa"]])
    a = world.post(hu, ch, "A")
    world.post(hu, side, "elsewhere")
    b = world.post(hu, ch, "B")
    world.ack(ids["aa"], a)
    world.ack(ids["aa"], b)
    assert world.cursor(ids["aa"], ch) == (2, ())
    c = world.post(hu, ch, "C")
    got = swept(world, ids["aa"])
    assert ("deliver", c) in got and ("deliver", a) not in got and ("deliver", b) not in got


def test_the_above_set_stays_small_with_many_interleaved_channels(world):
    hu, ch, ids = setup(world, "aa")
    channels = [ch] + [world.channel(f"c{i}", hu, subscribe=[ids["aa"]]) for i in range(3)]
    posted = []
    for i in range(40):
        target = channels[i % len(channels)]
        author = ids["aa"] if i % 7 == 0 else hu
        posted.append((author, world.post(author, target, f"m{i}")))
    for author, m in reversed(posted):  # newest first: the worst order for the mark
        if author == hu:
            world.ack(ids["aa"], m)
    for c in channels:
        acked, above = world.cursor(ids["aa"], c)
        assert above == () and acked == 10


def test_concurrent_acks_in_one_channel_are_both_kept(world):
    # D12 (PostgreSQL: SELECT ... FOR UPDATE; SQLite: the single writer)
    hu, ch, ids = setup(world, "aa")
    msgs = [world.post(hu, ch, f"m{i}") for i in range(40)]
    for round_ in range(20):
        pair = (msgs[2 * round_ + 1], msgs[2 * round_])  # the higher seq races the lower one
        barrier = threading.Barrier(2)
        errors = []

        def ack(m):
            try:
                barrier.wait(5)
                world.ack(ids["aa"], m)
            except Exception as exc:  # noqa: BLE001
                errors.append(exc)

        threads = [threading.Thread(target=ack, args=(m,)) for m in pair]
        for t in threads:
            t.start()
        for t in threads:
            t.join(10)
        assert not errors
        assert world.cursor(ids["aa"], ch) == (2 * round_ + 2, ())
    assert swept(world, ids["aa"]) == []


def test_resubscribing_keeps_the_cursor_and_replays_the_gap(world):
    # D13
    hu, ch, ids = setup(world, "aa")
    m1 = world.post(hu, ch, "M1")
    world.unsubscribe(ch, ids["aa"])
    m2 = world.post(hu, ch, "M2")
    world.subscribe(ch, ids["aa"])
    assert world.cursor(ids["aa"], ch) == (0, ())
    assert swept(world, ids["aa"]) == [("deliver", m1), ("deliver", m2)]


def test_owed_rows_record_once_clear_idempotently_and_count(world):
    # D14, D15, D21, D22
    hu, ch, ids = setup(world, "aa", "bb", subscribed=())
    m1, m2 = world.post(hu, ch, "x"), world.post(hu, ch, "y")
    now = world.clock.now_ms()
    with world.store.write() as tx:
        assert owed_store.count_owed(tx) == 0
        assert owed_store.record_owed(tx, ids["aa"], m1, ch, now) is True
        assert owed_store.record_owed(tx, ids["aa"], m1, ch, now) is False
        owed_store.record_owed(tx, ids["bb"], m2, ch, now)
        assert owed_store.count_owed(tx) == 2 and owed_store.count_owed(tx, ids["aa"]) == 1
        assert owed_store.owed_of(tx, ids["aa"]) == [{"message_id": m1, "channel_id": ch, "seq": 1}]
        assert owed_store.clear_owed(tx, ids["aa"], m1) is True
        assert owed_store.clear_owed(tx, ids["aa"], m1) is False
        assert owed_store.count_owed(tx) == 1


def test_ack_clears_the_owed_row_even_without_a_cursor(world):
    # D16, D17
    hu, ch, ids = setup(world, "aa", subscribed=())
    m = world.post(hu, ch, "@aa hi")
    unrelated = world.post(hu, ch, "unrelated")
    world.pump()
    assert world.cursor(ids["aa"], ch) is None and world.owed(ids["aa"]) == [m]
    world.ack(ids["aa"], unrelated)
    assert world.owed(ids["aa"]) == [m]
    assert world.ack(ids["aa"], m)["owed_cleared"] is True
    assert world.owed() == [] and world.counters()["owed_cleared"] == 1


def test_ack_clears_the_owed_row_at_or_above_the_mark(world):
    # D18 (seeded at the head = the owed seq: a duplicate-ack arm that still commits),
    # D19 (above the mark: cleared and advanced in one commit)
    hu, ch, ids = setup(world, "aa", subscribed=())
    m1 = world.post(hu, ch, "@aa one")
    world.pump()
    world.subscribe(ch, ids["aa"])  # seeded at head == seq of m1
    world.ack(ids["aa"], m1)
    assert world.owed() == [] and world.cursor(ids["aa"], ch) == (1, ())
    world.unsubscribe(ch, ids["aa"])
    m2 = world.post(hu, ch, "@aa two")
    world.pump()
    assert world.owed(ids["aa"]) == [m2]
    world.ack(ids["aa"], m2)
    assert world.owed() == [] and world.cursor(ids["aa"], ch) == (2, ())


def test_an_agent_removed_from_the_channel_can_still_ack_what_it_is_owed(world):
    hu, ch, ids = setup(world, "aa", subscribed=())
    m = world.post(hu, ch, "@aa before you go")
    world.pump()
    from tidings.hub import channels as channels_hub

    channels_hub.update_members(world.store, world.principal(hu), ch, {"remove": [ids["aa"]]})
    world.ack(ids["aa"], m)
    assert world.owed() == []
    assert world.ack(ids["aa"], m)["owed_cleared"] is False  # idempotent
    with pytest.raises(NotFound):
        world.ack(ids["aa"], world.post(hu, ch, "after you left"))  # never its to ack


def test_an_ack_before_the_mention_pass_commits_is_never_undone(world):
    # Nothing acked is owed again: the agent acks a steer whose owed row did not commit
    # (the flush failed); the recovery scan routes the message again and must not owe it
    from tidings.delivery import consumer as consumer_mod

    hu, ch, ids = setup(world, "gap", subscribed=())
    world.connect(ids["gap"])
    world.pump()
    world.faults.arm(consumer_mod.FLUSH_FAULT, 1)
    m = world.post(hu, ch, "@gap quick")
    world.pump()
    assert world.got(ids["gap"]) == [("steer", m)] and not world.routed(m)
    world.ack(ids["gap"], m)
    world.clock.advance(30_000)
    world.pump()
    assert world.routed(m) and world.owed() == []
    world.disconnect(ids["gap"])
    world.connect(ids["gap"])
    world.pump()
    assert world.got(ids["gap"]) == []


def test_a_gap_member_that_acks_a_held_message_before_it_settles_is_not_owed_it(world):
    hu, ch, ids = setup(world, "author", "gap", subscribed=("author",))
    world.connect(ids["author"])
    world.pump()
    m = world.post(ids["author"], ch, "@gap draft")
    world.pump()
    world.ack(ids["gap"], m)  # read from the channel listing, acked early
    world.settle(ids["author"])
    world.pump()
    assert world.routed(m) and world.owed() == []


def test_advance_is_pure_and_never_crosses_a_gap():
    assert cursors_store.advance(0, {1, 2, 4}, set()) == (2, [4])
    assert cursors_store.advance(0, {4}, {1, 2, 3}) == (4, [])
    assert cursors_store.advance(3, {5}, set()) == (3, [5])  # 4 is not visible yet: stop
