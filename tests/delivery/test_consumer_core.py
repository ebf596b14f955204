"""The consumer core (spec §5.2, C1-C15), adapted to our session registry.

Every test drives the engine synchronously (``world.pump()``), on both backends.
"""

from __future__ import annotations

import pytest
from delivery_world import World, general_channel

from tidings.delivery.engine import Delivery
from tidings.delivery.wakers import SystemWaker
from tidings.hub.events import MessagePosted
from tidings.store import delivery as delivery_store


def setup(world: World, *agents: str, subscribed: tuple[str, ...] | None = None) -> tuple[str, str, dict[str, str]]:
    return general_channel(world, agents, subscribed=agents if subscribed is None else subscribed)


def test_human_post_is_delivered_to_every_live_subscriber_but_not_the_author(world):
    # C1
    hu, ch, ids = setup(world, "aa", "bb")
    world.subscribe(ch, hu)  # the human author is "subscribed" too; it is never dispatched to
    for a in ids.values():
        world.connect(a)
    world.pump()
    m1 = world.post(hu, ch, "m1")
    world.pump()
    assert world.got(ids["aa"]) == [("deliver", m1)]
    assert world.got(ids["bb"]) == [("deliver", m1)]
    assert world.counters()["delivered"] == 2


def test_dispatch_order_follows_post_order(world):
    # C2
    hu, ch, ids = setup(world, "aa")
    world.connect(ids["aa"])
    world.pump()
    m1, m2 = world.post(hu, ch, "m1"), world.post(hu, ch, "m2")
    world.pump()
    assert world.got(ids["aa"]) == [("deliver", m1), ("deliver", m2)]


def test_live_member_outside_the_sweep_set_gets_no_deliver(world):
    # C3
    hu, ch, ids = setup(world, "aa", "bb", subscribed=("aa",))
    world.connect(ids["aa"])
    world.connect(ids["bb"])
    world.pump()
    m = world.post(hu, ch, "plain")
    world.pump()
    assert world.got(ids["aa"]) == [("deliver", m)]
    assert world.got(ids["bb"]) == []


def test_human_post_is_delivered_at_once_without_any_settle(world):
    # C4
    hu, ch, ids = setup(world, "aa")
    world.connect(ids["aa"])
    world.pump()
    m = world.post(hu, ch, "now")
    world.pump()
    assert world.got(ids["aa"]) == [("deliver", m)]
    assert world.counters()["held"] == 0


@pytest.mark.parametrize("edge", ["ready", "stopped", "session_end"])
def test_live_agent_authors_post_is_held_then_fired_from_the_store_at_its_settle_edge(world, edge):
    # C5 (ready), C6 (the errored/ended variants: stopped, and the session's end)
    hu, ch, ids = setup(world, "author", "recip")
    world.connect(ids["author"])
    world.connect(ids["recip"])
    world.pump()
    m = world.post(ids["author"], ch, "initial body")
    world.pump()
    assert world.got(ids["recip"]) == []
    assert world.counters()["held"] == 1 and m in world.d.consumer.held_ids
    world.edit(ids["author"], m, "settled body")
    if edge == "session_end":
        world.disconnect(ids["author"])
    else:
        world.settle(ids["author"], edge)
    world.pump()
    items = world.sessions[ids["recip"]].drain()
    assert [(i.kind, i.message["text"]) for i in items] == [("deliver", "settled body")]
    assert world.counters()["settled"] == 1 and not world.d.consumer.held_ids


def test_working_state_is_not_a_settle_edge(world):
    # C7: a non-settling state, then another session's ready as a barrier
    hu, ch, ids = setup(world, "author", "other", "recip")
    for a in ids.values():
        world.connect(a)
    world.pump()
    m = world.post(ids["author"], ch, "streaming")
    world.pump()
    world.settle(ids["author"], "working")
    world.settle(ids["other"], "ready")
    world.pump()
    assert world.got(ids["recip"]) == []
    assert m in world.d.consumer.held_ids


def test_offline_agent_authors_post_is_delivered_at_once_from_the_store(world):
    # C8, C9: the dead-author path re-reads the row, so an edit made before the consumer
    # saw the event is what goes out
    hu, ch, ids = setup(world, "author", "recip")
    world.connect(ids["recip"])
    world.pump()
    m = world.post(ids["author"], ch, "posted partial body")
    world.edit(ids["author"], m, "stored grown body")
    world.pump()
    items = world.sessions[ids["recip"]].drain()
    assert [(i.kind, i.message["id"], i.message["text"]) for i in items] == [("deliver", m, "stored grown body")]
    assert world.counters()["held"] == 0


def test_start_sweep_comes_before_live_dispatches_to_the_same_session(world):
    # C10 / S3: a paged start sweep (3 pages) and a live post made after the connect; the
    # live message queues behind the sweep and is sent exactly once
    world.d.consumer.options.sweep_page = 2
    hu, ch, ids = setup(world, "recip")
    backlog = [world.post(hu, ch, f"swept-{i}") for i in range(5)]
    world.pump()
    world.connect(ids["recip"])
    live = world.post(hu, ch, "live-1")
    world.pump()
    seen = world.got(ids["recip"])
    for _ in range(5):  # each drain below the low-water mark asks for the next page
        world.pump()
        seen += world.got(ids["recip"])
    assert seen == [("deliver", m) for m in [*backlog, live]]


def test_overrun_sweeps_every_live_session_and_later_posts_flow_live(world):
    # C11, C13: the overrun drops the event; the re-subscribe + sweep delivers it anyway
    hu, ch, ids = setup(world, "swept")
    world.connect(ids["swept"])
    world.pump()
    world.faults.arm("bus.overrun", 1)
    dropped = world.post(hu, ch, "swept-only")
    world.pump()
    assert world.counters()["overruns_handled"] == 1
    assert world.got(ids["swept"]) == [("deliver", dropped)]
    after = world.post(hu, ch, "after the re-subscribe")
    world.pump()
    assert world.got(ids["swept"]) == [("deliver", after)]
    assert world.rt.bus.overruns == 1


def test_overrun_subscribes_before_sweeping_so_a_post_during_the_sweep_is_not_lost(world, monkeypatch):
    # C14: a message committed and published after the sweep's store read is delivered live
    hu, ch, ids = setup(world, "owed_nothing")
    world.connect(ids["owed_nothing"])
    world.pump()
    real_page = delivery_store.channel_page_for
    posted: list[str] = []

    def page_then_post(tx, agent_id, channel_id, *args, **kwargs):
        rows = real_page(tx, agent_id, channel_id, *args, **kwargs)
        if channel_id == ch and not posted:
            posted.append(world.post(hu, ch, "window-m"))
        return rows

    monkeypatch.setattr(delivery_store, "channel_page_for", page_then_post)
    world.faults.arm("bus.overrun", 1)
    trigger = world.post(hu, ch, "trigger")
    world.pump()
    assert world.got(ids["owed_nothing"]) == [("deliver", trigger), ("deliver", posted[0])]


def test_a_refused_dispatch_does_not_stop_other_recipients_and_is_swept_once_drained(runtime):
    # C12: a full queue refuses; nothing durable is recorded for a deliver; the loop goes
    # on; the refused session catches up from its cursor when it drains
    world = World(runtime, session_capacity=2, session_low_water=0)
    try:
        hu, ch, ids = setup(world, "refused", "other")
        world.connect(ids["refused"])
        world.connect(ids["other"])
        world.pump()
        first = [world.post(hu, ch, f"fill-{i}") for i in range(2)]
        world.pump()
        assert world.got(ids["other"]) == [("deliver", m) for m in first]
        m = world.post(hu, ch, "refused")
        world.pump()
        assert world.got(ids["other"]) == [("deliver", m)]
        assert world.counters()["dispatch_refused"] == 1 and world.owed() == []
        assert world.got(ids["refused"]) == [("deliver", x) for x in first]
        world.pump()  # the drain reached the low-water mark: the catch-up sweep runs
        got = world.got(ids["refused"])
        assert ("deliver", m) in got and got.count(("deliver", m)) == 1
        later = world.post(hu, ch, "later")
        world.pump()
        assert world.got(ids["refused"]) == [("deliver", later)]
    finally:
        world.close()


def test_without_a_configured_wake_routing_works_and_the_wake_is_skipped(runtime):
    # C15, O-8: the production waker with no wake setting does nothing, and routing does
    # not care
    world = World(runtime, waker=SystemWaker())
    try:
        hu, ch, ids = setup(world, "gap", "sub", subscribed=("sub",))
        world.connect(ids["sub"])
        world.pump()
        m = world.post(hu, ch, "@gap ping")
        world.pump()
        assert world.got(ids["sub"]) == [("deliver", m)]
        assert world.owed(ids["gap"]) == [m]
        c = world.counters()
        assert c["woken"] == 0 and c["wakes_skipped"] >= 1 and c["wake_failures"] == 0
    finally:
        world.close()


def test_events_other_than_message_posted_are_ignored(world):
    hu, ch, ids = setup(world, "aa")
    world.connect(ids["aa"])
    world.pump()
    m = world.post(hu, ch, "v1")
    world.pump()
    world.got(ids["aa"])
    world.edit(hu, m, "v2 @aa")  # publishes MessageUpdated: not a trigger
    world.pump()
    assert world.got(ids["aa"]) == []


def test_a_posted_event_for_a_missing_message_is_harmless(world):
    hu, ch, ids = setup(world, "aa")
    world.connect(ids["aa"])
    world.pump()
    world.rt.bus.publish(MessagePosted("msg_nope", ch, hu, 99, 99))
    world.pump()
    assert world.got(ids["aa"]) == []
    m = world.post(hu, ch, "still alive")
    world.pump()
    assert world.got(ids["aa"]) == [("deliver", m)]


def test_construction_has_no_side_effects(runtime):
    before = runtime.bus.subscriber_count
    d = Delivery(runtime)
    assert runtime.bus.subscriber_count == before and not d.started
    assert set(d.status()) >= {
        "delivered", "steered", "owed_recorded", "owed_cleared", "woken", "held", "settled", "scan_recovered", "acks",
    }
