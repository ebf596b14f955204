"""Issue 16 in the delivery engine, both backends: the pin sweep (reference P1-P3, P3 in
our stricter form), live pin notices, and answers to asks with the owed-mention no-loss
rule (offline, crash between commit and dispatch, restart)."""

from __future__ import annotations

from typing import Any

from delivery_world import World, general_channel

from tidings.delivery.asks import AnswerDispatch
from tidings.delivery.pins import PinNotice
from tidings.delivery.sessions import Dispatch, Session, SessionEnd
from tidings.hub import asks as asks_hub
from tidings.hub import pins as pins_hub


def items(session: Session) -> list[tuple[Any, ...]]:
    """Drain a session: ("deliver"/"steer", id, pinned), ("pin", id, pinned),
    ("answer", id, ask_id), ("end", reason)."""
    out: list[tuple[Any, ...]] = []
    for item in session.drain():
        if isinstance(item, Dispatch):
            out.append((item.kind, item.message_id, item.pinned))
        elif isinstance(item, PinNotice):
            out.append(("pin", item.message_id, item.pinned))
        elif isinstance(item, AnswerDispatch):
            out.append(("answer", item.message_id, item.ask_id))
        else:
            assert isinstance(item, SessionEnd)
            out.append(("end", item.reason))
    return out


def pin(world: World, by: str, channel_id: str, message_id: str) -> None:
    pins_hub.pin(world.store, world.rt.bus, world.principal(by), channel_id, message_id)


def start(world: World, agent_id: str) -> list[tuple[Any, ...]]:
    session = world.connect(agent_id)
    world.pump()
    return items(session)


# -- the pin sweep ------------------------------------------------------------------------------
def test_p1_a_pin_is_delivered_at_start_though_the_cursor_owes_nothing(world):
    hu = world.human("hu")
    bot = world.agent("bot", owner=hu)
    ch = world.channel("general", hu, members=[bot])
    rule = world.post(hu, ch, "always answer in English")
    pin(world, hu, ch, rule)
    world.subscribe(ch, bot)  # the cursor is seeded at the head: it owes nothing
    assert start(world, bot) == [("deliver", rule, True)]
    world.disconnect(bot)
    assert start(world, bot) == [("deliver", rule, True)]  # every start, whatever the cursor


def test_p2_a_live_post_of_a_pinned_message_is_delivered_once_and_the_pin_is_a_notice(world):
    hu, ch, ids = general_channel(world, ("bot",), subscribed=("bot",), live=("bot",), settle=world.pump)
    session = world.sessions[ids["bot"]]
    assert items(session) == []
    m = world.post(hu, ch, "edit-2")
    pin(world, hu, ch, m)
    world.pump()
    assert items(session) == [("deliver", m, False), ("pin", m, True)]
    pins_hub.unpin(world.store, world.rt.bus, world.principal(hu), ch, m)
    world.pump()
    assert items(session) == [("pin", m, False)]


def test_p3_stricter_a_message_both_owed_and_pinned_is_sent_once_with_both_flags(world):
    hu, ch, ids = general_channel(world, ("bot",), subscribed=("bot",))
    dup = world.post(hu, ch, "dup-1")
    pin(world, hu, ch, dup)
    world.pump()
    assert start(world, ids["bot"]) == [("deliver", dup, True)]


def test_the_start_sweep_runs_cursors_then_pins_in_position_order_then_owed_mentions(world):
    hu, ch, ids = general_channel(world, ("bot",), subscribed=("bot",))
    bot = ids["bot"]
    side = world.channel("side", hu, members=[bot])  # a member, not subscribed: outside the sweep set
    first = world.post(hu, ch, "first rule")
    second = world.post(hu, ch, "second rule")
    world.pump()
    assert [k for k, *_ in start(world, bot)] == ["deliver", "deliver"]
    world.ack(bot, first)
    world.ack(bot, second)
    world.disconnect(bot)
    pin(world, hu, ch, second)
    pin(world, hu, ch, first)
    side_pin = world.post(hu, side, "a pin outside the sweep set")
    pin(world, hu, side, side_pin)
    fresh = world.post(hu, ch, "news")
    mention = world.post(hu, side, "@bot look here")
    world.pump()
    assert start(world, bot) == [
        ("deliver", fresh, False),  # the cursor sweep
        ("deliver", second, True),  # the pins, in position order
        ("deliver", first, True),
        ("steer", mention, False),  # then the owed mentions
    ]
    # A catch-up (overrun) re-sweep runs the cursors (and unacked owed mentions) again,
    # never the pins.
    world.d.consumer.sweeper.sweep_all_live()
    world.pump()
    assert items(world.sessions[bot]) == [("steer", mention, False)]


def test_a_deleted_pinned_message_is_not_swept(world):
    hu, ch, ids = general_channel(world, ("bot",), subscribed=())
    keep = world.post(hu, ch, "keep")
    gone = world.post(hu, ch, "gone")
    pin(world, hu, ch, gone)
    pin(world, hu, ch, keep)
    with world.store.write() as tx:
        from tidings.store import messages as messages_store

        messages_store.mark_deleted(tx, gone, world.clock.now_ms())
    world.subscribe(ch, ids["bot"])
    assert start(world, ids["bot"]) == [("deliver", keep, True)]


def test_pins_that_do_not_fit_the_queue_follow_on_refill_once_each(runtime):
    world = World(runtime, session_capacity=2, session_low_water=0)
    try:
        hu, ch, ids = general_channel(world, ("bot",), subscribed=())
        rules = [world.post(hu, ch, f"rule {i}") for i in range(4)]
        for m in rules:
            pin(world, hu, ch, m)
        world.subscribe(ch, ids["bot"])
        session = world.connect(ids["bot"])
        got: list[tuple[Any, ...]] = []
        for _ in range(10):
            world.pump()
            batch = items(session)
            if not batch:
                break
            got += batch
        assert got == [("deliver", m, True) for m in rules]
    finally:
        world.close()


# -- answers to asks -----------------------------------------------------------------------------
ASK = {"kind": "ask", "ask": {"questions": [{"id": "go", "text": "Deploy to prod?", "options": ["yes", "no"]}]}}


def ask(world: World, author: str, channel_id: str, question: str = "Deploy to prod?") -> tuple[str, str]:
    block = {"kind": "ask", "ask": {"questions": [{"id": "go", "text": question, "options": ["yes", "no"]}]}}
    row, _ = world.rt.posting.post(author_id=author, channel_id=channel_id, blocks=[block])
    return row["id"], row["blocks"][0]["ask"]["ask_id"]


def answer(world: World, who: str, message_id: str, ask_id: str, value: str = "yes") -> dict[str, Any]:
    return asks_hub.answer(world.store, world.rt.bus, world.principal(who), message_id, ask_id, {"go": value})


def owed_answers(world: World) -> list[tuple[str, str]]:
    with world.store.read() as tx:
        return [tuple(r) for r in tx.raw(
            "SELECT asker_id, ask_id FROM ask_answers WHERE acked_at_ms IS NULL").fetchall()]


def test_a_live_asker_gets_the_answer_as_its_own_event_until_it_acks(world):
    hu, ch, ids = general_channel(world, ("bot",), subscribed=("bot",), live=("bot",), settle=world.pump)
    bot = ids["bot"]
    mid, ask_id = ask(world, bot, ch)
    world.settle(bot)
    world.pump()
    assert items(world.sessions[bot]) == []
    result = answer(world, hu, mid, ask_id)
    assert result["ask"]["answered_by"] == hu
    world.pump()
    session = world.sessions[bot]
    queued = session.drain()
    assert [(i.kind, i.message_id) for i in queued] == [("answer", mid)]
    payload = queued[0].payload()
    assert payload["answers"] == {"go": "yes"} and payload["answered_by"] == hu
    assert payload["message"]["blocks"][0]["ask"]["answered"] is True
    assert world.waker.of(bot) == []
    assert owed_answers(world) == [(bot, ask_id)]
    world.d.ack(bot, mid, ask_id)
    assert owed_answers(world) == []
    world.disconnect(bot)
    assert start(world, bot) == []


def test_an_answer_to_an_offline_agent_is_owed_and_woken_then_sent_once_at_start(world):
    hu, ch, ids = general_channel(world, ("bot",), subscribed=("bot",))
    bot = ids["bot"]
    mid, ask_id = ask(world, bot, ch)
    world.pump()
    answer(world, hu, mid, ask_id, "no")
    world.pump()
    assert world.waker.of(bot) == ["answer"]
    assert owed_answers(world) == [(bot, ask_id)]
    assert start(world, bot) == [("answer", mid, ask_id)]
    world.pump()
    assert items(world.sessions[bot]) == []
    world.disconnect(bot)
    assert start(world, bot) == [("answer", mid, ask_id)]  # not acked: still owed
    world.d.ack(bot, mid, ask_id)
    world.disconnect(bot)
    assert start(world, bot) == []


def test_an_answer_whose_dispatch_a_crash_lost_reaches_the_offline_agent_exactly_once(world):
    hu, ch, ids = general_channel(world, ("bot",), subscribed=("bot",))
    bot = ids["bot"]
    mid, ask_id = ask(world, bot, ch)
    world.pump()
    world.faults.arm("bus.drop_publish", 1)  # committed, never published: the crash window
    answer(world, hu, mid, ask_id)
    world.pump()
    assert world.waker.of(bot) == []  # nothing dispatched it
    world.restart()  # the start scan finds the undispatched answer
    world.pump()
    assert world.waker.of(bot) == ["answer"]
    assert world.counters()["answers_recovered"] == 1
    got = start(world, bot)
    world.pump()
    got += items(world.sessions[bot])
    assert got == [("answer", mid, ask_id)]
    world.d.ack(bot, mid, ask_id)
    world.restart()
    world.pump()
    assert start(world, bot) == [] and world.waker.of(bot) == ["answer"]


def test_an_answer_racing_the_askers_start_is_sent_once(world):
    hu, ch, ids = general_channel(world, ("bot",), subscribed=("bot",))
    bot = ids["bot"]
    mid, ask_id = ask(world, bot, ch)
    world.pump()
    session = world.connect(bot)  # the start edge is queued before the answer's event
    answer(world, hu, mid, ask_id)
    world.pump()
    world.d.consumer.scan()
    world.pump()
    assert items(session) == [("answer", mid, ask_id)]


def test_the_mention_grammar_never_reads_ask_questions(world):
    hu = world.human("hu")
    bot = world.agent("bot", owner=hu)
    ch = world.channel("general", hu, members=[bot])  # a member outside its sweep set
    world.connect(bot)
    world.pump()
    quiet, _ = ask(world, hu, ch, "Should @bot deploy? @everyone")
    world.pump()
    assert items(world.sessions[bot]) == [] and world.owed(bot) == []
    # The recovery scan reads the stored blocks the same way.
    world.faults.arm("bus.drop_publish", 1)
    also_quiet, _ = ask(world, hu, ch, "Ask @bot again?")
    world.pump()
    world.d.consumer.scan()
    world.pump()
    assert items(world.sessions[bot]) == [] and world.owed(bot) == [] and world.routed(also_quiet)
    # Control: the same words in a text block do mention.
    loud = world.post(hu, ch, "Should @bot deploy?")
    world.pump()
    assert items(world.sessions[bot]) == [("steer", loud, False)]
