"""A reader's keep-alive timer (``Session.next``): one timer outlives the waits, and every
wait still ends at its own deadline. Driven on an event loop whose clock the test sets, so
no test here sleeps."""

from __future__ import annotations

import asyncio

from tidings.delivery.sessions import Dispatch, Session


class SetClockLoop(asyncio.SelectorEventLoop):
    """An event loop whose ``time()`` is what the test says; it counts ``call_at``."""

    def __init__(self) -> None:
        super().__init__()
        self.now = 0.0
        self.armed: list[float] = []

    def time(self) -> float:
        return self.now

    def call_at(self, when, callback, *args, context=None):  # type: ignore[override]
        self.armed.append(when)
        return super().call_at(when, callback, *args, context=context)


def _run(test) -> None:
    loop = SetClockLoop()
    try:
        loop.run_until_complete(test(loop))
    finally:
        loop.close()


async def _spin(times: int = 5) -> None:
    for _ in range(times):
        await asyncio.sleep(0)


def _item(i: int) -> Dispatch:
    return Dispatch("deliver", {"id": f"msg{i}", "channel_id": "ch", "seq": i}, "ch")


def _session() -> Session:
    return Session("ses", "acc", capacity=1000, low_water=0)


async def _ended_by_an_item(loop: SetClockLoop, s: Session, timeout: float | None, at: float, i: int) -> str:
    """A wait of ``timeout`` that is still waiting, then ended by an item offered at
    ``at``: the item's message id."""
    wait = asyncio.ensure_future(s.next(timeout))
    await _spin()
    assert not wait.done()
    loop.now = at
    s.offer(_item(i))
    await _spin()
    assert wait.done()
    return wait.result().message_id


def test_a_reader_woken_for_every_item_arms_one_timer_not_one_per_wait():
    async def test(loop: SetClockLoop) -> None:
        s = _session()
        for i in range(50):
            assert await _ended_by_an_item(loop, s, 10, loop.now + 0.01, i) == f"msg{i}"
        assert loop.armed == [10.0]

    _run(test)


def test_each_wait_still_ends_at_its_own_deadline():
    async def test(loop: SetClockLoop) -> None:
        s = _session()
        assert await _ended_by_an_item(loop, s, 10, 4.0, 1) == "msg1"  # the timer: at 10
        second = asyncio.ensure_future(s.next(10))  # its deadline: 14; the timer stays at 10
        await _spin()
        loop.now = 10.0
        await _spin()
        assert not second.done(), "a timer armed for an earlier wait ended a later one early"
        loop.now = 13.9
        await _spin()
        assert not second.done()
        loop.now = 14.0
        await _spin()
        assert second.done() and second.result() is None
        assert loop.armed == [10.0, 14.0]

        # A wait whose deadline comes before the armed timer arms its own.
        assert await _ended_by_an_item(loop, s, 10, 15.0, 2) == "msg2"  # the timer: at 24
        fourth = asyncio.ensure_future(s.next(2))  # its deadline: 17, before 24
        await _spin()
        loop.now = 17.0
        await _spin()
        assert fourth.done() and fourth.result() is None, "a shorter wait waited for the longer one's timer"
        loop.now = 24.0
        await _spin()  # the timer at 24 is no longer the live one: it fires and does nothing
        assert loop.armed == [10.0, 14.0, 24.0, 17.0]

        # A wait without a timeout is never ended by a timer left armed.
        assert await _ended_by_an_item(loop, s, 5, 24.0, 3) == "msg3"  # the timer: at 29
        sixth = asyncio.ensure_future(s.next(None))
        await _spin()
        loop.now = 100.0
        await _spin()
        assert not sixth.done()  # the timer at 29 fired and ended nothing
        s.offer(_item(4))
        await _spin()
        assert sixth.result().message_id == "msg4"

    _run(test)


def test_the_end_and_a_closed_session_are_still_taken_while_a_timer_is_armed():
    async def test(loop: SetClockLoop) -> None:
        s = _session()
        wait = asyncio.ensure_future(s.next(10))
        await _spin()
        s.close("shutdown")
        await _spin()
        assert wait.result().reason == "shutdown"
        assert await s.next(10) is None  # the end was taken: no wait
        loop.now = 10.0
        await _spin()  # the timer fires with nobody waiting

    _run(test)


def test_a_reader_on_a_new_loop_gets_its_own_timer():
    """A session read on one loop, then on another: the timer left on the first loop (which
    never runs again) does not keep the second loop's waits from their deadline."""
    s = _session()

    async def on_the_first(loop: SetClockLoop) -> None:
        assert await _ended_by_an_item(loop, s, 10, 1.0, 1) == "msg1"  # its timer: at 10, never fired

    async def on_the_second(loop: SetClockLoop) -> None:
        wait = asyncio.ensure_future(s.next(10))
        await _spin()
        loop.now = 10.0
        await _spin()
        assert wait.done() and wait.result() is None, "the wait counted on the first loop's timer"
        assert loop.armed == [10.0]

    _run(on_the_first)
    _run(on_the_second)
