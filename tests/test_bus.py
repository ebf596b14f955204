"""Event bus tests: the reference scenarios B1-B20 (spec §5.1) plus Tidings extras.

No sleeps: ordering comes from the bus lock itself, from ``threading.Event`` / barriers the
test controls, and from ``loop.call_soon`` callbacks that only run once a coroutine parks.
Timeouts appear only as safety nets so a bug fails the test instead of hanging it.
"""

from __future__ import annotations

import asyncio
import sys
import threading
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidings.bus import BufferUnderflow, Bus, Stamped, Subscription
from tidings.clock import FakeClock
from tidings.faults import Faults

SAFETY = 10.0  # seconds; only ever reached when something is broken


def publish_many(bus: Bus, n: int) -> list[int]:
    return [bus.publish(f"event-{i}") for i in range(n)]


def drain(sub: Subscription) -> list[Stamped]:
    """Everything currently buffered on the live tail, without waiting."""
    out = []
    while (event := sub.get_nowait()) is not None:
        out.append(event)
    return out


def seqs(events) -> list[int]:
    return [e.seq for e in events]


def run_thread(target, *args) -> threading.Thread:
    t = threading.Thread(target=target, args=args, daemon=True)
    t.start()
    return t


# --- B1-B3: numbering and replay ----------------------------------------------------------


def test_seqs_start_at_one_and_replay_is_in_order():
    # B1: N publishes get seqs 1..N, monotonic; replay is in seq order.
    bus = Bus()
    assert bus.head_seq == 0
    assert publish_many(bus, 5) == [1, 2, 3, 4, 5]
    assert bus.head_seq == 5
    assert seqs(bus.subscribe().replay) == [1, 2, 3, 4, 5]


def test_subscribe_from_cursor_replays_only_later_events():
    # B2: Subscribe(k) replays only seq > k.
    bus = Bus()
    publish_many(bus, 6)
    for k in range(0, 7):
        sub = bus.subscribe(k, bus.epoch)
        assert seqs(sub.replay) == list(range(k + 1, 7))


def test_subscribe_from_zero_replays_everything_retained():
    # B3: 7 events, Subscribe(0, 0) replays 1..7 with their payloads.
    bus = Bus()
    publish_many(bus, 7)
    sub = bus.subscribe(0, 0)
    assert seqs(sub.replay) == list(range(1, 8))
    assert [e.payload for e in sub.replay] == [f"event-{i}" for i in range(7)]


# --- B4-B5: eviction --------------------------------------------------------------------


def test_cursor_into_evicted_span_underflows():
    # B4: 1034 publishes evict 1..10; Subscribe(5) underflows, Subscribe(10) still works.
    bus = Bus()
    publish_many(bus, 1034)
    with pytest.raises(BufferUnderflow, match="evicted"):
        bus.subscribe(5, bus.epoch)
    with pytest.raises(BufferUnderflow):
        bus.subscribe(9, bus.epoch)
    assert seqs(bus.subscribe(10, bus.epoch).replay) == list(range(11, 1035))


def test_cursor_just_before_oldest_retained_is_gap_free():
    # B5: 1025 publishes evict seq 1; Subscribe(1) succeeds with replay 2..1025.
    bus = Bus()
    publish_many(bus, 1025)
    sub = bus.subscribe(1, bus.epoch)
    assert seqs(sub.replay) == list(range(2, 1026))
    assert seqs(bus.subscribe(0).replay) == list(range(2, 1026))


# --- B6-B7: live tail and stamping ------------------------------------------------------


def test_publish_after_subscribe_arrives_live_not_in_replay():
    # B6: an event published after Subscribe arrives on the live tail.
    bus = Bus()
    bus.publish("before")
    sub = bus.subscribe()
    seq = bus.publish("after")
    assert seqs(sub.replay) == [1]
    event = sub.get(timeout=SAFETY)
    assert event is not None and event.seq == seq == 2 and event.payload == "after"
    assert sub.get_nowait() is None


@dataclass(frozen=True)
class Posted:
    message_id: str


@dataclass(frozen=True)
class Updated:
    message_id: str
    text: str


def test_events_carry_clock_time_and_keep_their_payload_variant():
    # B7: every event is stamped with the clock's time and its payload type survives.
    clock = FakeClock(start_ms=1_000)
    bus = Bus(clock=clock)
    sub = bus.subscribe()
    posted = Posted("msg_1")
    bus.publish(posted)
    clock.advance(250)
    bus.publish(Updated("msg_1", "edited"))
    first, second = sub.get(SAFETY), sub.get(SAFETY)
    assert (first.at_ms, second.at_ms) == (1_000, 1_250)
    assert first.payload is posted
    assert isinstance(second.payload, Updated) and second.payload.text == "edited"
    assert [e.at_ms for e in bus.subscribe().replay] == [1_000, 1_250]


def test_stamped_is_frozen():
    # B7 (shape): a stamped event cannot be altered by a subscriber.
    event = Stamped(seq=1, at_ms=2, epoch=3, payload=None)
    with pytest.raises(AttributeError):
        event.seq = 9  # type: ignore[misc]


# --- B8-B9: cursors at and past the head --------------------------------------------------


def test_cursor_past_head_underflows_and_cursor_at_head_is_empty():
    # B8: after 3 publishes Subscribe(4) and Subscribe(999) underflow; Subscribe(3) is empty.
    bus = Bus()
    publish_many(bus, 3)
    for k in (4, 999):
        with pytest.raises(BufferUnderflow, match="ahead"):
            bus.subscribe(k, bus.epoch)
    sub = bus.subscribe(3, bus.epoch)
    assert sub.replay == [] and not sub.closed
    bus.publish("next")
    assert sub.get(SAFETY).seq == 4


def test_empty_bus_rejects_positive_cursor_and_accepts_zero():
    # B9: on an empty bus Subscribe(1) underflows, Subscribe(0) succeeds with nothing.
    bus = Bus()
    with pytest.raises(BufferUnderflow):
        bus.subscribe(1, bus.epoch)
    sub = bus.subscribe(0)
    assert sub.replay == [] and sub.head_seq == 0 and not sub.closed


def test_negative_cursor_is_a_usage_error():
    bus = Bus()
    with pytest.raises(ValueError):
        bus.subscribe(-1)


# --- B10-B14: epochs --------------------------------------------------------------------


def test_positioned_cursor_with_wrong_or_zero_epoch_underflows():
    # B10: a positive cursor with another epoch, or no epoch, underflows.
    bus = Bus()
    publish_many(bus, 3)
    other = Bus()
    assert other.epoch != bus.epoch
    with pytest.raises(BufferUnderflow, match="epoch"):
        bus.subscribe(2, other.epoch)
    with pytest.raises(BufferUnderflow, match="epoch"):
        bus.subscribe(2, 0)


def test_matching_epoch_resumes_gap_free():
    # B11: a cursor with the matching epoch continues with no gap across replay and live.
    bus = Bus()
    publish_many(bus, 4)
    sub = bus.subscribe(2, bus.epoch)
    publish_many(bus, 3)
    assert seqs(sub.replay) + seqs(drain(sub)) == [3, 4, 5, 6, 7]


def test_zero_cursor_ignores_epoch():
    # B12: since=0 is accepted with any epoch.
    bus = Bus()
    publish_many(bus, 2)
    for epoch in (0, bus.epoch, bus.epoch + 1, 12345):
        assert seqs(bus.subscribe(0, epoch).replay) == [1, 2]


def test_every_event_carries_the_bus_epoch():
    # B13: replayed and live events both carry the bus epoch, a non-zero 63-bit number.
    bus = Bus()
    assert 0 < bus.epoch < 2**63
    publish_many(bus, 2)
    sub = bus.subscribe()
    bus.publish("live")
    assert {e.epoch for e in sub.replay + drain(sub)} == {bus.epoch}
    assert len({Bus().epoch for _ in range(20)}) == 20


def test_bus_carries_any_payload_type():
    # B14: the bus is generic over its payload; anything goes through untouched.
    bus = Bus()
    sub = bus.subscribe()
    payloads = ["text", 42, None, {"k": [1, 2]}, Posted("m"), b"\x00"]
    for p in payloads:
        bus.publish(p)
    received = [e.payload for e in drain(sub)]
    assert received == payloads
    assert all(a is b for a, b in zip(received, payloads))


# --- B15-B16: overrun and close -------------------------------------------------------------


def test_overrun_closes_with_lagged_after_buffered_events_drain():
    # B15: a subscriber that does not drain is overrun: closed, lagged, dropped; what it
    # had buffered is still delivered before the close is seen. Others are unaffected.
    bus = Bus(buffer=4)
    slow = bus.subscribe()
    fast = bus.subscribe()
    for i in range(4):
        bus.publish(i)
        assert fast.get(SAFETY).seq == i + 1
    assert not slow.closed
    bus.publish(4)  # slow's buffer is full: overrun
    assert slow.closed and slow.lagged
    assert bus.overruns == 1 and bus.subscriber_count == 1
    assert seqs([slow.get(SAFETY) for _ in range(4)]) == [1, 2, 3, 4]
    assert slow.get(SAFETY) is None and slow.get_nowait() is None
    assert fast.get(SAFETY).seq == 5 and not fast.lagged
    bus.publish(5)
    assert slow.get_nowait() is None  # dropped: nothing more arrives
    assert fast.get(SAFETY).seq == 6


def test_close_ends_every_subscription_cleanly():
    # B16: Close closes every live tail with lagged False and wakes blocked readers.
    bus = Bus()
    idle = bus.subscribe()
    blocked = bus.subscribe()
    bus.publish("kept")
    assert blocked.get(SAFETY).payload == "kept"
    got: list = []
    waiting = run_thread(lambda: got.append(blocked.get()))
    bus.close()
    waiting.join(SAFETY)
    assert not waiting.is_alive() and got == [None]
    assert bus.closed
    for sub in (idle, blocked):
        assert sub.closed and not sub.lagged
    assert idle.get(SAFETY).payload == "kept"  # buffered before close: still delivered
    assert idle.get(SAFETY) is None
    bus.close()  # idempotent
    assert bus.overruns == 0


# --- B17: head -----------------------------------------------------------------------------


def test_head_seq_is_the_ring_head_at_subscribe_time():
    # B17: HeadSeq equals the head at subscribe time and does not move afterwards.
    bus = Bus(capacity=4)
    assert bus.subscribe().head_seq == 0
    publish_many(bus, 6)
    sub = bus.subscribe()
    assert sub.head_seq == bus.head_seq == 6
    assert seqs(sub.replay) == [3, 4, 5, 6]
    bus.publish("later")
    assert sub.head_seq == 6 and bus.head_seq == 7


# --- B18: cancel ---------------------------------------------------------------------------


def test_cancel_closes_without_lagged_and_stops_delivery():
    # B18 (:463): Cancel closes the live tail with lagged False and removes the subscriber.
    bus = Bus()
    sub = bus.subscribe()
    other = bus.subscribe()
    assert bus.subscriber_count == 2
    sub.cancel()
    assert sub.closed and not sub.lagged and bus.subscriber_count == 1
    bus.publish("after cancel")
    assert sub.get(SAFETY) is None
    assert other.get(SAFETY).payload == "after cancel"
    assert bus.overruns == 0


def test_cancel_is_idempotent():
    # B18 (:497): a second Cancel is a no-op.
    bus = Bus()
    sub = bus.subscribe()
    sub.cancel()
    sub.cancel()
    assert sub.closed and not sub.lagged and bus.subscriber_count == 0


def test_cancel_after_overrun_or_close_is_safe():
    # B18 (:523): Cancel after an overrun keeps the latch; after Close it stays clean.
    bus = Bus(buffer=1)
    sub = bus.subscribe()
    publish_many(bus, 2)
    assert sub.lagged
    sub.cancel()
    assert sub.lagged and sub.closed
    survivor = bus.subscribe()
    bus.close()
    survivor.cancel()
    assert survivor.closed and not survivor.lagged


def test_cancel_wakes_a_blocked_reader():
    # B18: a reader blocked in get() returns None when its subscription is cancelled.
    bus = Bus()
    sub = bus.subscribe()
    got: list = []
    reader = run_thread(lambda: got.append(sub.get()))
    sub.cancel()
    reader.join(SAFETY)
    assert got == [None] and not sub.lagged


def test_subscription_context_manager_cancels_on_exit():
    bus = Bus()
    with bus.subscribe() as sub:
        assert bus.subscriber_count == 1
    assert sub.closed and not sub.lagged and bus.subscriber_count == 0


def test_iterating_a_subscription_yields_live_events_until_closed():
    bus = Bus()
    sub = bus.subscribe()
    publish_many(bus, 3)
    bus.close()
    assert seqs(list(sub)) == [1, 2, 3]


# --- B19: closed bus --------------------------------------------------------------------


@pytest.mark.parametrize("since_seq,epoch", [(0, 0), (1, 0), (3, None), (999, None), (2, 7), (-5, 0)])
def test_closed_bus_gives_terminal_subscriptions_never_underflow(since_seq, epoch):
    # B19: after Close, Subscribe (even with invalid cursors) returns a terminal stream.
    bus = Bus()
    publish_many(bus, 3)
    bus.close()
    sub = bus.subscribe(since_seq, bus.epoch if epoch is None else epoch)
    assert sub.closed and not sub.lagged and sub.replay == []
    assert sub.get(SAFETY) is None and sub.get_nowait() is None
    sub.cancel()


def test_publish_after_close_is_numbered_but_heard_by_nobody():
    bus = Bus()
    bus.close()
    assert bus.publish("late") == 1
    assert bus.head_seq == 1 and bus.subscribe().closed


# --- B20: concurrent handoff --------------------------------------------------------------


@pytest.fixture
def busy_switching():
    """Make the interpreter switch threads very often, so racing threads really interleave."""
    previous = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    try:
        yield
    finally:
        sys.setswitchinterval(previous)


def test_concurrent_publish_and_subscribe_hand_off_exactly_once(busy_switching):
    # B20: with several publishers and subscribers racing, every subscription sees each
    # event after its cursor exactly once, in order, split between replay and live.
    publishers, per_publisher = 4, 500
    total = publishers * per_publisher
    bus = Bus(capacity=total, buffer=total)
    start = threading.Barrier(publishers + 2)
    subs: list[tuple[int, Subscription]] = []
    subs_lock = threading.Lock()

    def publisher(pid: int) -> None:
        start.wait(SAFETY)
        for i in range(per_publisher):
            bus.publish((pid, i))

    def subscriber(use_cursor: bool) -> None:
        start.wait(SAFETY)
        for _ in range(100):
            since = bus.head_seq if use_cursor else 0
            sub = bus.subscribe(since, bus.epoch)
            with subs_lock:
                subs.append((since, sub))

    threads = [run_thread(publisher, p) for p in range(publishers)]
    threads += [run_thread(subscriber, False), run_thread(subscriber, True)]
    for t in threads:
        t.join(SAFETY)
        assert not t.is_alive()
    assert bus.head_seq == total
    bus.close()

    assert len(subs) == 200
    streams = []
    for since, sub in subs:
        live = list(sub)  # drains the buffer, stops at the clean close
        streams.append((since, sub.replay + live))
        assert not sub.lagged
        assert seqs(sub.replay) + seqs(live) == list(range(since + 1, total + 1))
        assert all(e.seq <= sub.head_seq for e in sub.replay)
        assert all(e.seq > sub.head_seq for e in live)
    # Seq order follows each publisher's own publish order.
    stream = [e.payload for e in next(events for since, events in streams if since == 0)]
    assert len(stream) == total
    for pid in range(publishers):
        assert [i for p, i in stream if p == pid] == list(range(per_publisher))


# --- Fault point -------------------------------------------------------------------------


def test_overrun_fault_overruns_every_subscriber_once():
    # CONTRACT §1: bus.overrun makes the next publish overrun every subscriber.
    faults = Faults("bus.overrun")
    bus = Bus(faults=faults)
    subs = [bus.subscribe() for _ in range(3)]
    seq = bus.publish("forced")
    assert all(s.closed and s.lagged for s in subs)
    assert all(s.get(SAFETY) is None for s in subs)  # the forced event was not delivered
    assert bus.overruns == 3 and bus.subscriber_count == 0
    assert faults.fired == {"bus.overrun": 1}
    # The event is retained, and a fresh subscription works normally afterwards.
    fresh = bus.subscribe(seq - 1, bus.epoch)
    assert [e.payload for e in fresh.replay] == ["forced"]
    bus.publish("normal")
    assert fresh.get(SAFETY).payload == "normal" and not fresh.lagged
    assert bus.overruns == 3


def test_overrun_fault_armed_for_several_publishes():
    faults = Faults()
    bus = Bus(faults=faults)
    faults.arm("bus.overrun", 2)
    first = bus.subscribe()
    bus.publish(1)
    second = bus.subscribe()
    bus.publish(2)
    third = bus.subscribe()
    bus.publish(3)
    assert first.lagged and second.lagged and not third.lagged
    assert third.get(SAFETY).seq == 3 and bus.overruns == 2


# --- Blocking and async readers --------------------------------------------------------------


def test_get_times_out_while_open():
    bus = Bus()
    sub = bus.subscribe()
    assert sub.get(timeout=0.01) is None
    assert not sub.closed
    assert sub.get(timeout=0) is None


def test_blocked_get_is_woken_by_a_publish_on_another_thread():
    bus = Bus()
    sub = bus.subscribe()
    got: list = []
    reader = run_thread(lambda: got.extend(sub.get(SAFETY) for _ in range(50)))
    publish_many(bus, 50)
    reader.join(SAFETY)
    assert seqs(got) == list(range(1, 51))


def test_aget_receives_publishes_from_another_thread():
    bus = Bus()
    sub = bus.subscribe()
    parked = threading.Event()
    burst = threading.Event()

    def producer() -> None:
        assert parked.wait(SAFETY)  # the consumer is suspended inside aget()
        bus.publish("wake-up")
        assert burst.wait(SAFETY)
        publish_many(bus, 200)
        bus.close()

    async def consume() -> list[Stamped]:
        loop = asyncio.get_running_loop()
        # call_soon callbacks run only once this task suspends, i.e. after aget() parks.
        loop.call_soon(parked.set)
        first = await sub.aget()
        loop.call_soon(burst.set)
        events = [first]
        while (event := await sub.aget()) is not None:
            events.append(event)
        return events

    thread = run_thread(producer)
    events = asyncio.run(asyncio.wait_for(consume(), SAFETY))
    thread.join(SAFETY)
    assert events[0].payload == "wake-up"
    assert seqs(events) == list(range(1, 202))
    assert sub.closed and not sub.lagged


def test_aget_sees_lagged_after_draining_and_cancellation_loses_nothing():
    bus = Bus(buffer=2)

    async def scenario() -> None:
        sub = bus.subscribe()
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(sub.aget(), 0.01)
        assert not sub._async_waiters  # the cancelled wait left nothing behind
        thread = run_thread(publish_many, bus, 3)  # third publish overruns
        thread.join(SAFETY)
        assert (await sub.aget()).seq == 1
        assert (await sub.aget()).seq == 2
        assert await sub.aget() is None
        assert sub.lagged

    asyncio.run(asyncio.wait_for(scenario(), SAFETY))


# --- Property: replay and underflow rules ----------------------------------------------------

ops = st.lists(
    st.one_of(
        st.tuples(st.just("pub"), st.integers(1, 4)),
        st.tuples(st.just("sub"), st.integers(0, 14), st.sampled_from(["right", "zero", "wrong"])),
    ),
    max_size=40,
)


@settings(max_examples=150, deadline=None)
@given(capacity=st.integers(1, 6), script=ops)
def test_replay_and_underflow_follow_the_rules(capacity, script):
    bus = Bus(capacity=capacity, buffer=500)
    head = 0
    opened: list[tuple[int, Subscription]] = []
    for op in script:
        if op[0] == "pub":
            for _ in range(op[1]):
                head += 1
                assert bus.publish(head) == head
            continue
        _, k, which = op
        epoch = {"right": bus.epoch, "zero": 0, "wrong": bus.epoch ^ 1}[which]
        oldest = max(1, head - capacity + 1) if head else None
        should_fail = k > 0 and (
            epoch != bus.epoch or k > head or (oldest is not None and oldest > k + 1)
        )
        if should_fail:
            with pytest.raises(BufferUnderflow):
                bus.subscribe(k, epoch)
            continue
        sub = bus.subscribe(k, epoch)
        retained = list(range(oldest, head + 1)) if oldest else []
        assert seqs(sub.replay) == [s for s in retained if s > k]
        assert sub.head_seq == head
        # Since 0 starts at the oldest retained event; a cursor resumes right after itself.
        first = (oldest or head + 1) if k == 0 else k + 1
        opened.append((first, sub))
    bus.close()
    # Handoff: replay + live is every event from the start point on, once, in order.
    for first, sub in opened:
        assert seqs(sub.replay) + seqs(list(sub)) == list(range(first, head + 1))
        assert not sub.lagged


def test_overrun_all_latches_lagged_on_every_subscriber_and_keeps_the_ring():
    """A cluster node's lost LISTEN link (D71): every subscriber must rebuild from the store."""
    from tidings.bus import Bus

    bus = Bus()
    bus.publish("a")
    first, second = bus.subscribe(0), bus.subscribe(0)
    assert bus.overrun_all() == 2
    assert first.lagged and first.closed and second.lagged
    assert bus.overruns == 2 and bus.subscriber_count == 0
    fresh = bus.subscribe(0)
    assert [e.payload for e in fresh.replay] == ["a"] and not fresh.lagged
