"""Offline mentions and owed rows (spec §5.4, O-1..O-9), plus the refused-steer fix (O1)."""

from __future__ import annotations

from delivery_world import World, general_channel

from tidings.store import messages as messages_store


def setup(world, *agents, subscribed=(), live=()):
    return general_channel(world, agents, subscribed=subscribed, live=live, settle=world.pump)


def test_offline_member_outside_the_sweep_set_gets_an_owed_row_and_a_wake(world):
    # O-1
    hu, ch, ids = setup(world, "aa")
    m = world.post(hu, ch, "@aa ping")
    world.pump()
    assert world.owed(ids["aa"]) == [m]
    assert world.waker.of(ids["aa"]) == ["mention"]
    c = world.counters()
    assert c["owed_recorded"] == 1 and c["delivered"] == 0 and c["steered"] == 0 and c["woken"] == 1
    assert world.routed(m)


def test_offline_member_inside_the_sweep_set_is_woken_only(world):
    # O-2
    hu, ch, ids = setup(world, "aa", subscribed=("aa",))
    world.post(hu, ch, "@aa ping")
    world.pump()
    assert world.owed() == [] and world.waker.of(ids["aa"]) == ["mention"]


def test_offline_unmentioned_subscriber_is_woken_for_the_deliver(world):
    # O-3
    hu, ch, ids = setup(world, "aa", subscribed=("aa",))
    world.post(hu, ch, "plain")
    world.pump()
    assert world.owed() == [] and world.waker.of(ids["aa"]) == ["message"]


def test_agents_ping_owes_only_the_members_outside_their_sweep_set(world):
    # O-4; the home channel and a mandatory channel are in the sweep set too
    hu, ch, ids = setup(world, "aa", "bb", subscribed=("bb",))
    m = world.post(hu, ch, "@agents standup")
    world.pump()
    assert world.owed() == [(ids["aa"], m)]
    assert world.waker.of(ids["aa"]) == ["mention"] and world.waker.of(ids["bb"]) == ["mention"]
    mandatory = world.channel("announce", hu, members=[ids["aa"]], mandatory=True)
    home = world.ids["aa.home"]
    world.post(hu, mandatory, "@aa mandatory")
    world.post(hu, home, "@aa home")
    world.pump()
    assert world.owed() == [(ids["aa"], m)]


def test_start_steers_each_owed_mention_once_and_an_ack_stops_it(world):
    # O-5, O-6
    hu, ch, ids = setup(world, "recip")
    m = world.post(hu, ch, "@recip owed-1")
    world.pump()
    world.connect(ids["recip"])
    world.pump()
    assert world.got(ids["recip"]) == [("steer", m)]
    assert world.ack(ids["recip"], m)["owed_cleared"] is True
    world.disconnect(ids["recip"])
    world.connect(ids["recip"])
    world.pump()
    assert world.got(ids["recip"]) == []
    assert world.counters()["steered"] == 1


def test_an_owed_row_for_a_deleted_message_is_cleared_not_steered(world):
    # O-7 (messages are deleted softly here, so the row itself survives the delete)
    hu, ch, ids = setup(world, "recip")
    m = world.post(hu, ch, "@recip soon gone")
    world.pump()
    with world.store.write() as tx:
        messages_store.mark_deleted(tx, m, world.clock.now_ms())
    for _ in range(2):
        world.connect(ids["recip"])
        world.pump()
        assert world.got(ids["recip"]) == []
        assert world.owed() == []


def test_a_session_that_starts_while_the_mention_is_recorded_gets_one_steer(world):
    # O-9: the agent connects right after its owed row commits; its start sweep steers it
    # exactly once (no live-arm steer can race ahead of the sweep in this design)
    hu, ch, ids = setup(world, "aa")
    world.d.consumer.after_owed_recorded = lambda: world.connect(ids["aa"])
    m = world.post(hu, ch, "@aa ping")
    world.pump()
    assert world.got(ids["aa"]) == [("steer", m)]
    assert world.owed(ids["aa"]) == [m]
    assert world.counters()["steered"] == 1


def test_owed_rows_are_idempotent_across_re_routing(world):
    hu, ch, ids = setup(world, "aa")
    m = world.post(hu, ch, "@aa @aa ping")
    world.pump()
    with world.store.write() as tx:  # force a second pass over the same message
        tx.raw("UPDATE messages SET mentions_routed_at = NULL")
    world.d.consumer.scan()
    assert world.owed() == [(ids["aa"], m)]
    assert world.counters()["owed_recorded"] == 1


def _full_world(runtime, **opts):
    return World(runtime, session_capacity=1, session_low_water=0, **opts)


def test_a_refused_steer_to_a_live_member_outside_the_sweep_set_is_owed(runtime):
    # Reference flaw O1, fixed: the mention is recorded, and the session's catch-up steers
    # it once the queue drains
    world = _full_world(runtime)
    try:
        hu, ch, ids = setup(world, "gap", subscribed=("gap",), live=("gap",))
        other = world.channel("side", hu, members=[ids["gap"]])
        world.post(hu, ch, "fills the queue")
        m = world.post(hu, other, "@gap are you there")
        world.pump()
        assert world.counters()["dispatch_refused"] == 1
        assert world.owed(ids["gap"]) == [m]
        world.got(ids["gap"])
        world.pump()
        assert world.got(ids["gap"]) == [("steer", m)]
    finally:
        world.close()


def test_negative_control_without_the_fix_a_refused_steer_is_lost(runtime):
    world = _full_world(runtime, owe_live_gap=False)
    try:
        hu, ch, ids = setup(world, "gap", subscribed=("gap",), live=("gap",))
        other = world.channel("side", hu, members=[ids["gap"]])
        world.post(hu, ch, "fills the queue")
        m = world.post(hu, other, "@gap are you there")
        world.pump()
        assert world.counters()["dispatch_refused"] == 1 and world.routed(m)
        assert world.owed(ids["gap"]) == []
        world.got(ids["gap"])
        world.pump()
        assert ("steer", m) not in world.got(ids["gap"])
    finally:
        world.close()


def test_a_steer_refused_because_the_session_just_ended_is_owed_and_the_agent_woken(world):
    hu, ch, ids = setup(world, "gap", live=("gap",))
    m = world.post(hu, ch, "@gap ping")
    world.disconnect(ids["gap"])  # the stream dies before the consumer handled the post
    world.pump()
    assert world.counters()["dispatch_refused"] == 1
    assert world.owed(ids["gap"]) == [m]
    assert world.waker.of(ids["gap"]) == ["mention"]


def test_a_live_gap_member_that_never_acks_is_steered_again_next_session(world):
    # O1, the other half: the steer went out, the agent's session died before it acted;
    # the owed row (recorded for live gap members too) carries it to the next session
    hu, ch, ids = setup(world, "gap", live=("gap",))
    m = world.post(hu, ch, "@gap now")
    world.pump()
    assert world.got(ids["gap"]) == [("steer", m)]
    assert world.owed(ids["gap"]) == [m]  # owed until acked, live or not
    world.disconnect(ids["gap"])
    world.connect(ids["gap"])
    world.pump()
    assert world.got(ids["gap"]) == [("steer", m)]
    world.ack(ids["gap"], m)
    assert world.owed() == []


def test_members_inside_the_sweep_set_never_get_owed_rows_live_or_not(world):
    hu, ch, ids = setup(world, "live_sub", "off_sub", subscribed=("live_sub", "off_sub"), live=("live_sub",))
    world.post(hu, ch, "@live_sub @off_sub hi")
    world.pump()
    assert world.owed() == []
