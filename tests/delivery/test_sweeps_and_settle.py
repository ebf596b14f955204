"""Start-edge sweeps (spec §5.5, S1-S4), settle on session end (§5.7 R1-R3, adapted: our
"reap" is the end of the author's session, which is a settle edge), sessions."""

from __future__ import annotations

import pytest
from delivery_world import World, general_channel

from tidings.errors import BadRequest, NotFound


def setup(world, *agents, subscribed=None):
    return general_channel(world, agents, subscribed=agents if subscribed is None else subscribed, settle=world.pump)


def test_start_sweep_delivers_the_backlog_in_channel_order(world):
    # S1
    hu, ch, ids = setup(world, "recip")
    m1, m2 = world.post(hu, ch, "owed-1"), world.post(hu, ch, "owed-2")
    world.pump()
    assert world.waker.of(ids["recip"]) == ["message"]  # coalesced: one wake for both
    world.connect(ids["recip"])
    world.pump()
    assert world.got(ids["recip"]) == [("deliver", m1), ("deliver", m2)]


def test_an_acked_message_is_not_swept_again(world):
    # S2 (with a sentinel session as the barrier)
    hu, ch, ids = setup(world, "recip", "sentinel")
    m1 = world.post(hu, ch, "owed-1")
    world.pump()
    world.connect(ids["recip"])
    world.pump()
    assert world.got(ids["recip"]) == [("deliver", m1)]
    world.ack(ids["recip"], m1)
    world.disconnect(ids["recip"])
    world.connect(ids["recip"])
    world.connect(ids["sentinel"])
    world.pump()
    assert world.got(ids["sentinel"]) == [("deliver", m1)]
    assert world.got(ids["recip"]) == []


def test_cursor_sweep_comes_before_owed_steers_and_live_dispatches(world):
    # S3 + CONTRACT: "everything the cursors say is undelivered, then every owed mention"
    hu, ch, ids = setup(world, "aa")
    side = world.channel("side", hu, members=[ids["aa"]])
    steer_first = world.post(hu, side, "@aa owed")
    plain = world.post(hu, ch, "backlog")
    world.pump()
    world.connect(ids["aa"])
    early = world.post(hu, ch, "committed before the sweep read it")  # swept, then deduped live
    world.pump()
    late = world.post(hu, ch, "live")
    world.pump()
    assert world.got(ids["aa"]) == [("deliver", plain), ("deliver", early), ("steer", steer_first), ("deliver", late)]
    assert world.counters()["deliver_deduped"] == 1


def test_a_session_that_ended_before_its_start_edge_is_never_swept(world):
    # S4, adapted: the registry never hands out empty ids; a start edge that arrives for an
    # already-ended session sweeps nothing and does not make the agent live
    hu, ch, ids = setup(world, "aa")
    m = world.post(hu, ch, "backlog")
    world.pump()
    session = world.connect(ids["aa"])
    world.disconnect(ids["aa"])
    world.pump()
    assert [i.kind for i in session.drain()] == ["end"]
    assert world.d.consumer.live == {}
    world.connect(ids["aa"])
    world.pump()
    assert world.got(ids["aa"]) == [("deliver", m)]


def test_a_large_backlog_is_swept_in_pages_as_the_reader_drains(runtime):
    world = World(runtime, sweep_page=10, session_capacity=16, session_low_water=4)
    try:
        hu, ch, ids = setup(world, "aa")
        posted = [world.post(hu, ch, f"m{i}") for i in range(35)]
        world.pump()
        session = world.connect(ids["aa"])
        world.pump()
        assert session.pending() == 10
        seen: list[str] = []
        while True:
            got = world.got(ids["aa"])
            if not got:
                break
            seen += [m for _, m in got]
            world.pump()
        assert seen == posted
    finally:
        world.close()


def test_a_second_connect_replaces_the_first_cleanly(world):
    hu, ch, ids = setup(world, "aa")
    first = world.connect(ids["aa"])
    world.pump()
    second = world.connect(ids["aa"])
    m = world.post(hu, ch, "to the new one")
    world.pump()
    assert [getattr(i, "reason", None) for i in first.drain()] == ["replaced"]
    assert [(i.kind, i.message_id) for i in second.drain()] == [("deliver", m)]
    assert world.counters()["live_sessions"] == 1


# -- settle on end (reference "reap", fixed) ----------------------------------------------
def test_ending_a_session_fires_only_that_sessions_held_messages(world):
    # R1: holds for a dying session (m1, m2) and a live one (m3)
    hu, ch, ids = setup(world, "dying", "living", "recip")
    for h in ids:
        world.connect(ids[h])
    world.pump()
    m1 = world.post(ids["dying"], ch, "m1 @recip")
    m2 = world.post(ids["dying"], ch, "m2")
    m3 = world.post(ids["living"], ch, "m3")
    world.pump()
    assert world.got(ids["recip"]) == []
    world.disconnect(ids["dying"])
    world.pump()
    assert world.got(ids["recip"]) == [("steer", m1), ("deliver", m2)]
    assert world.d.consumer.held_ids == {m3} and not world.routed(m3)


def test_ending_a_session_that_holds_nothing_or_twice_is_a_no_op(world):
    # R2, R3
    hu, ch, ids = setup(world, "aa")
    session = world.connect(ids["aa"])
    world.pump()
    assert world.d.disconnect(session) is True
    assert world.d.disconnect(session) is False
    world.pump()
    assert world.counters()["sessions_ended"] == 1 and world.counters()["settled"] == 0


def test_negative_control_without_settle_on_end_a_dead_authors_mention_waits(runtime):
    # Reference flaw (README difference 3): with the end not a settle edge, the held
    # mention of a gap member is neither routed nor owed until a restart
    world = World(runtime, settle_on_end=False)
    try:
        hu, ch, ids = setup(world, "author", "gap", subscribed=("author",))
        world.connect(ids["author"])
        world.pump()
        m = world.post(ids["author"], ch, "@gap look")
        world.pump()
        world.disconnect(ids["author"])
        world.pump()
        assert world.owed() == [] and not world.routed(m)
        world.restart()  # the start scan owns it once nothing is held
        assert world.owed() == [(ids["gap"], m)]
    finally:
        world.close()


def test_settle_fires_held_messages_in_post_order(world):
    hu, ch, ids = setup(world, "author", "recip")
    world.connect(ids["author"])
    world.connect(ids["recip"])
    world.pump()
    posted = [world.post(ids["author"], ch, f"part {i}") for i in range(4)]
    world.pump()
    world.settle(ids["author"], "stopped")
    world.pump()
    assert world.got(ids["recip"]) == [("deliver", m) for m in posted]


def test_state_changes_are_validated(world):
    hu, ch, ids = setup(world, "aa", "bb")
    sa = world.connect(ids["aa"])
    world.pump()
    with pytest.raises(BadRequest):
        world.d.set_state(ids["aa"], sa.session_id, "sleeping")
    with pytest.raises(NotFound):
        world.d.set_state(ids["bb"], sa.session_id, "ready")  # not your session
    with pytest.raises(NotFound):
        world.d.set_state(ids["aa"], "ses_nope", "ready")
    world.settle(ids["aa"], "working")
    world.pump()
    with world.store.read() as tx:
        row = tx.raw(f"SELECT last_state, ended_at_ms FROM agent_sessions WHERE session_id = '{sa.session_id}'").fetchone()
    assert tuple(row) == ("working", None)


def test_session_rows_record_start_end_and_a_crash_closes_stale_ones(world):
    hu, ch, ids = setup(world, "aa", "bb")
    sa = world.connect(ids["aa"])
    sb = world.connect(ids["bb"])
    world.pump()
    world.disconnect(ids["aa"], "client_closed")
    world.pump()
    world.restart()
    with world.store.read() as tx:
        rows = dict(tx.raw("SELECT session_id, end_reason FROM agent_sessions").fetchall())
    assert rows == {sa.session_id: "client_closed", sb.session_id: "restart"}
