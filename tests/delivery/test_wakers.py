"""Wakers: coalesced per agent, off the consumer thread, never delaying delivery."""

from __future__ import annotations

import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest
from delivery_world import FakeWaker, World, general_channel

from tidings.delivery.wakers import SystemWaker


def setup(world, *agents, subscribed=(), live=()):
    return general_channel(world, agents, subscribed=subscribed, live=live, settle=world.pump)


def test_wakes_are_coalesced_per_agent_by_the_clock(world):
    hu, ch, ids = setup(world, "aa", "bb")
    for i in range(3):
        world.post(hu, ch, f"@aa ping {i}")
    world.pump()
    assert world.waker.of(ids["aa"]) == ["mention"]
    world.post(hu, ch, "@bb other agent, own window")
    world.clock.advance(4_999)
    world.post(hu, ch, "@aa still inside the window")
    world.pump()
    assert world.waker.of(ids["aa"]) == ["mention"] and world.waker.of(ids["bb"]) == ["mention"]
    world.clock.advance(1)
    world.post(hu, ch, "@aa window over")
    world.pump()
    assert world.waker.of(ids["aa"]) == ["mention", "mention"]
    # the three first mentions shared one flush (one request); the fourth hit the window
    assert world.counters()["wakes_coalesced"] == 1 and world.counters()["woken"] == 3


def test_a_live_agent_is_not_woken(world):
    hu, ch, ids = setup(world, "aa", subscribed=("aa",), live=("aa",))
    world.post(hu, ch, "hello")
    world.pump()
    assert world.waker.calls == []


def test_a_broken_waker_is_counted_and_delivery_goes_on(runtime):
    world = World(runtime, waker=FakeWaker(fail=True))
    try:
        hu, ch, ids = setup(world, "gap", "live", subscribed=("live",), live=("live",))
        m = world.post(hu, ch, "@gap and everyone else")
        world.pump()
        assert world.got(ids["live"]) == [("deliver", m)]
        assert world.owed(ids["gap"]) == [m]
        assert world.counters()["wake_failures"] == 1 and world.counters()["woken"] == 0
    finally:
        world.close()


def test_a_hanging_waker_never_delays_delivery(runtime):
    release = threading.Event()
    waker = FakeWaker(block=release)
    world = World(runtime, waker=waker, threaded=True, wake_threads=1)
    try:
        hu, ch, ids = setup(world, "gap", "live", subscribed=("live",))
        session = world.connect(ids["live"])
        world.d.wait_idle()
        world.post(hu, ch, "@gap wake up")  # the wake blocks the (only) waker thread
        assert waker.started.wait(10)
        m = world.post(hu, ch, "for the live one")
        items = [session.get(timeout=10), session.get(timeout=10)]
        assert [i.message["text"] for i in items] == ["@gap wake up", "for the live one"]
        assert items[1].message_id == m and not release.is_set()
        release.set()
        assert waker.wait_for(1)
    finally:
        release.set()
        world.close()


class _Hook(BaseHTTPRequestHandler):
    bodies: list = []
    status = 204

    def do_POST(self):  # noqa: N802 - http.server naming
        length = int(self.headers["Content-Length"])
        type(self).bodies.append(json.loads(self.rfile.read(length)))
        self.send_response(type(self).status)
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture
def webhook():
    handler = type("Hook", (_Hook,), {"bodies": [], "status": 204})
    server = HTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/wake", handler
    finally:
        server.shutdown()
        server.server_close()


def test_webhook_wake_posts_agent_and_reason(webhook):
    url, handler = webhook
    waker = SystemWaker(timeout_s=5)
    try:
        assert waker.wake("acc_1", {"webhook": url}, "mention") is True
        handler.status = 500
        assert waker.wake("acc_1", {"webhook": url}, "message") is False
    finally:
        waker.close()
    assert handler.bodies == [{"agent_id": "acc_1", "reason": "mention"}, {"agent_id": "acc_1", "reason": "message"}]


def test_command_wake_runs_detached_with_the_agent_id(tmp_path):
    out = tmp_path / "woken"
    script = "import os, sys; open(sys.argv[1], 'w').write(os.environ['TIDINGS_AGENT_ID'])"
    waker = SystemWaker()
    assert waker.wake("acc_7", {"command": [sys.executable, "-c", script, str(out)]}, "mention") is True
    assert waker._children[-1].wait(10) == 0  # only the test waits; delivery never does
    assert out.read_text() == "acc_7"
    assert waker.wake("acc_7", None, "mention") is None


def test_agent_wake_setting_reaches_the_waker_through_the_engine(runtime, webhook):
    url, handler = webhook
    world = World(runtime, waker=SystemWaker(timeout_s=5))
    try:
        hu = world.human("hu")
        bot = world.agent("bot", owner=hu, wake={"webhook": url})
        ch = world.channel("general", hu, members=[bot])
        world.post(hu, ch, "@bot you there?")
        world.pump()
        assert handler.bodies == [{"agent_id": bot, "reason": "mention"}]
        assert world.counters()["woken"] == 1
    finally:
        world.close()
