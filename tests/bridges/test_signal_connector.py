"""`tidings bridge signal` against the protocol-faithful fake daemon (issue 13 item 4), both
backends, both transports: inbound fixtures reach the hub, a post in the linked channel
reaches the daemon, its echo is suppressed, failures end as the result types say, rate
limits hold sends, the connection comes back after the daemon is killed."""

from __future__ import annotations

import threading

import pytest
from delivery_world import World

from bridgekit import GROUP, channel_texts, signal_envelope, signal_frame
from live import LiveServer
from signal_daemon import FakeSignalDaemon, fixture_notifications
from tidings.api import create_app
from tidings.bridges import outbox as outbox_hub
from tidings.bridges.connectors.signal import Options, RpcError, SignalConnector, classify, request_for
from tidings.bridges.registry import create_bridge
from tidings.hub.tokens import Principal

ACCOUNT = "+14155550100"


def wait_for(predicate, timeout: float = 15.0) -> bool:
    """Poll ``predicate`` on a condition variable woken every 20 ms (no sleeps)."""
    done = threading.Event()
    deadline = threading.Event()
    timer = threading.Timer(timeout, deadline.set)
    timer.start()
    try:
        while not deadline.is_set():
            if predicate():
                return True
            done.wait(0.02)
        return predicate()
    finally:
        timer.cancel()


@pytest.fixture
def hub(runtime):
    """A live hub (threaded delivery and ingest) with alice, an assistant and a Signal
    bridge whose Family group is linked into #family."""
    ingest = runtime.ingest
    world = World(runtime, threaded=True)
    runtime.ingest = ingest
    ingest.start()
    alice = world.human("alice")
    assistant = world.agent("assistant", owner=alice)
    ch = world.channel("family", alice, members=[assistant])
    bridge = create_bridge(runtime.store, platform="signal", name="Alice's phone", owner=alice)
    ingest.append_body(bridge["id"], signal_frame(signal_envelope(1_000, "hello family")))
    assert wait_for(lambda: _conversation(runtime, bridge["id"]) is not None)
    admin = Principal(scope="admin", account_id=runtime.system_account_id, kind="system")
    runtime.links.link(admin, bridge["id"], {"conversation_id": _conversation(runtime, bridge["id"]),
                                             "channel_id": ch})
    server = LiveServer(create_app(runtime))
    with server:
        yield {"rt": runtime, "world": world, "alice": alice, "assistant": assistant, "ch": ch,
               "bridge": bridge, "url": server.url}
    world.close()


def _conversation(rt, bridge_id):
    with rt.store.read() as tx:
        row = tx.raw("SELECT id FROM conversations WHERE bridge_id = " + ("?" if tx.dialect == "sqlite" else "%s"),
                     (bridge_id,)).fetchone()
    return None if row is None else row[0]


@pytest.fixture
def daemon():
    d = FakeSignalDaemon(ACCOUNT).start()
    yield d
    d.kill()


def connector(hub, daemon, *, transport="tcp", lines=None, **kw) -> SignalConnector:
    rpc = daemon.tcp_url if transport == "tcp" else daemon.http_url
    said = lines if lines is not None else []
    c = SignalConnector(Options(rpc=rpc, account=ACCOUNT, url=hub["url"], token=hub["bridge"]["token"],
                                pull_wait_ms=200, clock=hub["rt"].clock, say=said.append, **kw))
    return c.start()


def items(hub):
    with hub["rt"].store.read() as tx:
        rows = tx.raw("SELECT id FROM outbox ORDER BY seq").fetchall()
    box = outbox_hub.Outbox(hub["rt"].store)
    return [box.one(hub["bridge"]["id"], r[0]) for r in rows]


@pytest.mark.parametrize("transport", ["tcp", "http"])
def test_a_post_reaches_the_daemon_once_and_its_echo_is_not_posted_again(hub, daemon, transport):
    c = connector(hub, daemon, transport=transport)
    try:
        assert daemon.wait_listeners(1)
        hub["world"].post(hub["alice"], hub["ch"], "pasta at 7")
        (send,) = daemon.wait_requests(1)
        assert send["params"] == {"account": ACCOUNT, "groupId": GROUP, "message": "pasta at 7"}
        assert isinstance(send["id"], int)
        assert wait_for(lambda: [i["state"] for i in items(hub)] == ["sent"])
        assert wait_for(lambda: items(hub)[0]["echoed"])
        (item,) = items(hub)
        assert item["remote_id"] == "1717200000000" and item["attempts"] == 1
        assert channel_texts(hub["rt"].store, hub["ch"]) == ["pasta at 7"]
        assert daemon.pipelined == 0
    finally:
        c.stop()


@pytest.mark.parametrize("transport", ["tcp", "http"])
def test_every_fixture_notification_is_appended_as_a_frame(hub, daemon, transport):
    c = connector(hub, daemon, transport=transport)
    try:
        assert daemon.wait_listeners(1)
        notes = fixture_notifications()
        for n in notes:
            daemon.push(n)
        assert wait_for(lambda: c.counters.get("frames_appended") == len(notes))
        with hub["rt"].store.read() as tx:
            frames = tx.raw("SELECT count(*) FROM inbox WHERE codec = 'signal.jsonrpc'").fetchone()[0]
        assert frames == len(notes) + 1  # plus the scene's first frame
    finally:
        c.stop()


def test_manual_receive_mode_subscribes_on_every_connect(hub):
    daemon = FakeSignalDaemon(ACCOUNT, mode="manual").start()
    c = connector(hub, daemon, receive_mode="manual")
    try:
        assert daemon.wait_listeners(1)
        assert [r["method"] for r in daemon.sends(None)][:2] == ["listAccounts", "subscribeReceive"]
        daemon.push({"jsonrpc": "2.0", "method": "receive",
                     "params": {"envelope": signal_envelope(5_000, "manual hello"), "account": ACCOUNT}})
        assert wait_for(lambda: "Mom: manual hello" in channel_texts(hub["rt"].store, hub["ch"]))
        daemon.restart()
        assert daemon.wait_listeners(1)
        assert [r["method"] for r in daemon.sends(None)].count("subscribeReceive") == 2
    finally:
        c.stop()
        daemon.kill()


def test_reconnects_after_the_daemon_is_killed_and_restarted(hub, daemon):
    lines: list[str] = []
    c = connector(hub, daemon, lines=lines)
    try:
        assert daemon.wait_listeners(1)
        daemon.kill()
        assert wait_for(lambda: c.counters.get("disconnects") == 1)
        hub["world"].post(hub["alice"], hub["ch"], "sent while the daemon was down")
        daemon.start(daemon.tcp_port, daemon.http_port)
        assert daemon.wait_listeners(1)
        assert wait_for(lambda: [i["state"] for i in items(hub)] == ["sent"])
        assert [line.split(" ")[0] for line in lines] == ["connected", "disconnected", "connected"]
    finally:
        c.stop()


def test_an_account_the_daemon_does_not_have_stops_with_one_clear_reason(hub):
    daemon = FakeSignalDaemon("+19995550000").start()
    c = connector(hub, daemon)
    try:
        assert wait_for(lambda: c.fatal is not None)
        assert ACCOUNT in c.fatal and "no registered account" in c.fatal
    finally:
        c.stop()
        daemon.kill()


def test_a_rate_limited_send_waits_at_least_retry_after(hub, daemon):
    clock = hub["rt"].clock
    daemon.fail_next(-5, "Failed to send message due to rate limiting", "RATE_LIMIT_FAILURE", retry_after_s=30)
    c = connector(hub, daemon)
    try:
        assert daemon.wait_listeners(1)
        hub["world"].post(hub["alice"], hub["ch"], "first")
        daemon.wait_requests(1)
        assert wait_for(lambda: items(hub)[0]["attempts"] == 1)
        (item,) = items(hub)
        assert (item["state"], item["cause"], item["not_before_ms"]) == ("pending", "RATE_LIMIT_FAILURE",
                                                                          clock.now_ms() + 30_000)
        hub["world"].post(hub["alice"], hub["ch"], "second")  # held too: the gate is per connector
        clock.advance(29_999)
        assert not wait_for(lambda: len(daemon.sends("send")) > 1, timeout=0.5)
        clock.advance(1)
        sends = daemon.wait_requests(3)
        assert [s["params"]["message"] for s in sends] == ["first", "second", "first"] or \
            [s["params"]["message"] for s in sends] == ["first", "first", "second"]
        assert wait_for(lambda: [i["state"] for i in items(hub)] == ["sent", "sent"])
    finally:
        c.stop()


@pytest.mark.parametrize("code,kind,cause", [
    (-1, "UNREGISTERED_FAILURE", "UNREGISTERED_FAILURE"),
    (-4, "IDENTITY_FAILURE", "IDENTITY_FAILURE"),
])
def test_permanent_failures_end_failed_with_their_cause(hub, daemon, code, kind, cause):
    daemon.fail_next(code, "Failed to send message", kind)
    c = connector(hub, daemon)
    try:
        assert daemon.wait_listeners(1)
        hub["world"].post(hub["alice"], hub["ch"], "to nobody")
        assert wait_for(lambda: [i["state"] for i in items(hub)] == ["failed"])
        assert items(hub)[0]["cause"] == cause
    finally:
        c.stop()


def test_a_network_failure_is_retried_until_sent(hub, daemon):
    clock = hub["rt"].clock
    daemon.fail_next(-3, "Failed to send message", "NETWORK_FAILURE")
    c = connector(hub, daemon)
    try:
        assert daemon.wait_listeners(1)
        hub["world"].post(hub["alice"], hub["ch"], "flaky")
        assert wait_for(lambda: items(hub)[0]["attempts"] == 1)
        clock.advance(outbox_hub.backoff_ms(0))
        assert wait_for(lambda: [i["state"] for i in items(hub)] == ["sent"])
        assert items(hub)[0]["attempts"] == 2
    finally:
        c.stop()


def test_counters_reach_the_hub_status(hub, daemon):
    c = connector(hub, daemon, publish_every_s=0.05)
    try:
        assert daemon.wait_listeners(1)
        assert wait_for(lambda: hub["bridge"]["id"] in hub["rt"].status().get("bridges", {})
                        and "connector" in hub["rt"].status()["bridges"][hub["bridge"]["id"]])
        section = hub["rt"].status()["bridges"][hub["bridge"]["id"]]["connector"]
        assert section["state"] == "connected" and section["counters"]["connects"] == 1
    finally:
        c.stop()


# -- the mapping, without a daemon --------------------------------------------------------------
def item(kind, remote="signal-group:" + GROUP, **kw):
    return {"id": "out_1", "kind": kind, "remote_conversation_id": remote, "text": "hi", "emoji": "👍",
            "target_remote_id": None, **kw}


def test_requests_for_each_kind():
    assert request_for(item("send", remote="signal:+14155550133"), ACCOUNT) == (
        "send", {"account": ACCOUNT, "recipient": ["+14155550133"], "message": "hi"})
    assert request_for(item("reply", target_remote_id="+14155550133:1717"), ACCOUNT)[1] == {
        "account": ACCOUNT, "groupId": GROUP, "message": "hi", "quoteAuthor": "+14155550133", "quoteTimestamp": 1717}
    assert request_for(item("edit", target_remote_id="1717"), ACCOUNT)[1]["editTimestamp"] == 1717
    assert request_for(item("react", target_remote_id="self:1717"), ACCOUNT) == (
        "sendReaction", {"account": ACCOUNT, "groupId": GROUP, "emoji": "👍", "targetAuthor": ACCOUNT,
                         "targetTimestamp": 1717})
    assert request_for(item("delete", target_remote_id="1717"), ACCOUNT) == (
        "remoteDelete", {"account": ACCOUNT, "groupId": GROUP, "targetTimestamp": 1717})


def test_classification_follows_signal_cli_result_types():
    ok = {"timestamp": 5, "results": [{"type": "SUCCESS"}, {"type": "UNREGISTERED_FAILURE"}]}
    assert classify(result=ok).report() == {"state": "sent", "remote_id": "5"}
    limited = RpcError(-5, "rate", {"response": {"timestamp": 6, "results": [
        {"type": "RATE_LIMIT_FAILURE", "retryAfterSeconds": 7}]}})
    assert classify(error=limited).report() == {"state": "failed", "cause": "RATE_LIMIT_FAILURE", "retryable": True,
                                                "retry_after_ms": 7000}
    assert classify(error=RpcError(-32602, "Specified account does not exist")).retryable is False
    assert classify(error=RpcError(-3, "io")).retryable is True


def test_typing_while_an_agent_works_on_the_linked_channel_and_stop_at_settle(hub, daemon):
    c = connector(hub, daemon)
    try:
        assert daemon.wait_listeners(1)
        world = hub["world"]
        world.connect(hub["assistant"])
        world.settle(hub["assistant"], "working")
        typing = daemon.wait_requests(1, "sendTyping")
        assert typing[0]["params"] == {"account": ACCOUNT, "groupId": GROUP}
        world.settle(hub["assistant"], "ready")
        stops = daemon.wait_requests(2, "sendTyping")
        assert stops[1]["params"] == {"account": ACCOUNT, "groupId": GROUP, "stop": True}
    finally:
        c.stop()
