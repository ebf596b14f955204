"""The session transport over HTTP (CONTRACT §2): SSE stream, ack, state, owed; and the
end-to-end scenarios of spec §5.11 (RIG-1641 cycles A and B) and the RIG-2490 HTTP leg
with ``TIDINGS_FAULTS=bus.drop_publish``, on a real uvicorn server."""

from __future__ import annotations

from delivery_world import ADMIN_TOKEN, FakeWaker

from helpers import auth, create_account, post_text
from helpers import create_channel as make_channel
from live import LiveServer, SSEStream
from tidings.api import create_app
from tidings.delivery.engine import Delivery
from tidings.runtime import Runtime

ADMIN = auth(ADMIN_TOKEN)


def make(http, kind, handle, **extra):
    return create_account(http, kind, handle, admin_token=ADMIN_TOKEN, **extra)


def post(http, token, channel_id, text):
    """The new message's id."""
    return post_text(http, token, channel_id, text)["id"]


def dispatches(stream, until_id):
    """Events of the stream up to and including the dispatch of ``until_id`` (a barrier)."""
    out = []
    while True:
        event, data = stream.next()
        assert event in ("deliver", "steer"), (event, data)
        assert data["type"] == event and data["channel_id"] == data["message"]["channel_id"]
        out.append((event, data["message"]["id"]))
        if data["message"]["id"] == until_id:
            return out


# -- plain API (TestClient) ------------------------------------------------------------------
def test_ack_validates_and_is_idempotent(client, runtime):
    alice = make(client, "human", "alice")
    bot = make(client, "agent", "bot", owner=alice["id"])
    other = make(client, "agent", "other", owner=alice["id"])
    ch = make_channel(client, alice["token"], "general", [bot["id"]])
    m = post(client, alice["token"], ch, "@bot hi")
    foreign = post(client, alice["token"], make_channel(client, alice["token"], "private"), "x")
    r = client.post("/api/v1/ack", json={"message_id": m}, headers=auth(alice["token"]))
    assert r.status_code == 403  # agents only
    for body, status in [({}, 400), ({"message_id": 5}, 400), ({"message_id": "msg_nope"}, 404),
                         ({"message_id": foreign}, 404)]:
        r = client.post("/api/v1/ack", json=body, headers=auth(bot["token"]))
        assert r.status_code == status, (body, r.text)
        assert set(r.json()) == {"error"}
    assert client.post("/api/v1/ack", json={"message_id": m}, headers=auth(other["token"])).status_code == 404
    for _ in range(2):
        r = client.post("/api/v1/ack", json={"message_id": m}, headers=auth(bot["token"]))
        assert r.status_code == 200 and r.json()["acked"] is True


def test_state_endpoint_validates_state_and_owner(client, runtime):
    alice = make(client, "human", "alice")
    bot = make(client, "agent", "bot", owner=alice["id"])
    other = make(client, "agent", "other", owner=alice["id"])
    session = runtime.delivery.connect(bot["id"])
    url = f"/api/v1/session/{session.session_id}/state"
    assert client.post(url, json={"state": "ready"}, headers=auth(bot["token"])).status_code == 200
    assert client.post(url, json={"state": "nap"}, headers=auth(bot["token"])).status_code == 400
    assert client.post(url, json={}, headers=auth(bot["token"])).status_code == 400
    assert client.post(url, json={"state": "ready"}, headers=auth(other["token"])).status_code == 404
    assert client.post("/api/v1/session/ses_nope/state", json={"state": "ready"}, headers=auth(bot["token"])).status_code == 404
    runtime.delivery.disconnect(session)
    assert client.post(url, json={"state": "ready"}, headers=auth(bot["token"])).status_code == 404


def test_owed_is_visible_to_admin_the_agent_and_its_owner_only(client, runtime):
    alice, bob = make(client, "human", "alice"), make(client, "human", "bob")
    bot = make(client, "agent", "bot", owner=alice["id"])
    stranger = make(client, "agent", "stranger", owner=bob["id"])
    ch = make_channel(client, alice["token"], "general", [bot["id"]])
    m = post(client, alice["token"], ch, "@bot you are owed")
    runtime.delivery.options.threaded = False
    runtime.delivery.start()
    runtime.delivery.pump()
    url = f"/api/v1/agents/{bot['id']}/owed"
    expected = {"owed": [{"message_id": m, "channel_id": ch, "seq": 1}]}
    for token in (ADMIN_TOKEN, bot["token"], alice["token"]):
        r = client.get(url, headers=auth(token))
        assert r.status_code == 200 and r.json() == expected
    for token in (bob["token"], stranger["token"]):
        r = client.get(url, headers=auth(token))
        assert r.status_code == 404 and m not in r.text
    assert client.get("/api/v1/agents/acc_nope/owed", headers=ADMIN).status_code == 404
    assert client.get(f"/api/v1/agents/{alice['id']}/owed", headers=ADMIN).status_code == 404  # not an agent
    status = client.get("/api/status", headers=ADMIN).json()["delivery"]
    assert status["owed_recorded"] == 1 and status["scans"] == 1


def test_session_stream_requires_an_agent_token(client):
    alice = make(client, "human", "alice")
    assert client.get("/api/v1/session").status_code == 401
    r = client.get("/api/v1/session", headers=auth(alice["token"]))
    assert r.status_code == 403 and r.json()["error"]["code"] == "agent_only"


# -- real server: SSE ---------------------------------------------------------------------------
def serve(backend_url, *, waker=None, faults=None, **options):
    rt = Runtime(backend_url, admin_token=ADMIN_TOKEN, faults=faults)
    if waker is not None:
        rt.delivery = Delivery(rt, waker=waker, **options)
    return rt, LiveServer(create_app(rt, manage_runtime=True))


def test_http_end_to_end_a_dropped_publish_is_recovered_after_a_restart(backend_url, monkeypatch):
    # RIG-2490 over HTTP: the post commits but its event is never published
    monkeypatch.setenv("TIDINGS_FAULTS", "bus.drop_publish")
    rt, server = serve(backend_url)
    with server, server.client() as http:
        alice = make(http, "human", "alice")
        gap = make(http, "agent", "gap", owner=alice["id"])
        ch = make_channel(http, alice["token"], "general", [gap["id"]])  # gap: member, unsubscribed
        m = post(http, alice["token"], ch, "@gap you were paged")
        rt.delivery.wait_idle()
        assert http.get(f"/api/v1/agents/{gap['id']}/owed", headers=ADMIN).json() == {"owed": []}
        assert rt.faults.fired["bus.drop_publish"] >= 1
    monkeypatch.delenv("TIDINGS_FAULTS")
    rt, server = serve(backend_url)
    with server, server.client() as http:
        rt.delivery.wait_idle()  # the start scan ran before anything else
        owed = http.get(f"/api/v1/agents/{gap['id']}/owed", headers=auth(gap["token"])).json()["owed"]
        assert [o["message_id"] for o in owed] == [m]
        with SSEStream(f"{server.url}/api/v1/session", auth(gap["token"])) as stream:
            event, data = stream.next()
            assert event == "session" and data["type"] == "session" and data["session_id"].startswith("ses_")
            event, data = stream.next()
            assert (event, data["message"]["id"], data["message"]["text"]) == ("steer", m, "@gap you were paged")
            r = http.post("/api/v1/ack", json={"message_id": m}, headers=auth(gap["token"]))
            assert r.status_code == 200 and r.json()["owed_cleared"] is True
        with SSEStream(f"{server.url}/api/v1/session", auth(gap["token"])) as stream:
            assert stream.next()[0] == "session"
            rt.delivery.wait_idle()
            barrier = post(http, alice["token"], gap["home_channel_id"], "barrier")
            assert dispatches(stream, barrier) == [("deliver", barrier)]  # nothing before it
        assert http.get(f"/api/v1/agents/{gap['id']}/owed", headers=ADMIN).json() == {"owed": []}
        status = http.get("/api/status", headers=ADMIN).json()["delivery"]
        assert status["steered"] == 1 and status["owed_cleared"] == 1 and status["scan_recovered"] >= 1


def test_rig1641_cycle_a_offline_gap_member_is_woken_owed_steered_once(backend_url):
    waker = FakeWaker()
    rt, server = serve(backend_url, waker=waker)
    with server, server.client() as http:
        alice = make(http, "human", "alice")
        gap = make(http, "agent", "gapmember", owner=alice["id"])
        sentinel = make(http, "agent", "sentinel", owner=alice["id"])
        ch = make_channel(http, alice["token"], "general", [gap["id"], sentinel["id"]])
        r = http.post(f"/api/v1/channels/{ch}/members", json={"subscribe": [sentinel["id"]]}, headers=auth(alice["token"]))
        assert r.status_code == 200
        m = post(http, alice["token"], ch, "@gapmember you were paged")
        rt.delivery.wait_idle()
        assert waker.wait_for(2)  # gapmember (mention) and the offline sentinel (message)
        assert waker.of(gap["id"]) == ["mention"]
        owed = http.get(f"/api/v1/agents/{gap['id']}/owed", headers=auth(alice["token"])).json()["owed"]
        assert owed == [{"message_id": m, "channel_id": ch, "seq": 1}]
        assert rt.delivery.status()["steered"] == 0 and rt.delivery.status()["delivered"] == 0
        with SSEStream(f"{server.url}/api/v1/session", auth(gap["token"])) as stream:
            assert stream.next()[0] == "session"
            rt.delivery.wait_idle()  # the start sweep ran: the barrier is a live dispatch
            barrier = post(http, alice["token"], gap["home_channel_id"], "barrier A")
            assert dispatches(stream, barrier) == [("steer", m), ("deliver", barrier)]
            for acked in (m, barrier):
                assert http.post("/api/v1/ack", json={"message_id": acked}, headers=auth(gap["token"])).status_code == 200
            assert http.get(f"/api/v1/agents/{gap['id']}/owed", headers=ADMIN).json() == {"owed": []}
        with SSEStream(f"{server.url}/api/v1/session", auth(gap["token"])) as gap_stream, \
                SSEStream(f"{server.url}/api/v1/session", auth(sentinel["token"])) as sentinel_stream:
            assert gap_stream.next()[0] == "session" and sentinel_stream.next()[0] == "session"
            rt.delivery.wait_idle()
            assert dispatches(sentinel_stream, m) == [("deliver", m)]  # via its cursor
            barrier = post(http, alice["token"], gap["home_channel_id"], "barrier B")
            assert dispatches(gap_stream, barrier) == [("deliver", barrier)]


def test_rig1641_cycle_b_offline_subscriber_is_woken_and_swept_once(backend_url):
    waker = FakeWaker()
    rt, server = serve(backend_url, waker=waker)
    with server, server.client() as http:
        alice = make(http, "human", "alice")
        sub = make(http, "agent", "sub", owner=alice["id"])
        ch = make_channel(http, alice["token"], "general")
        http.post(f"/api/v1/channels/{ch}/members", json={"subscribe": [sub["id"]]}, headers=auth(alice["token"]))
        m = post(http, alice["token"], ch, "plain news")
        rt.delivery.wait_idle()
        assert waker.wait_for(1) and waker.of(sub["id"]) == ["message"]
        assert http.get(f"/api/v1/agents/{sub['id']}/owed", headers=ADMIN).json() == {"owed": []}
        with SSEStream(f"{server.url}/api/v1/session", auth(sub["token"])) as stream:
            assert stream.next()[0] == "session"
            rt.delivery.wait_idle()
            barrier = post(http, alice["token"], sub["home_channel_id"], "barrier")
            assert dispatches(stream, barrier) == [("deliver", m), ("deliver", barrier)]


def test_a_second_stream_replaces_the_first_with_an_end_event(backend_url):
    rt, server = serve(backend_url, waker=FakeWaker())
    with server, server.client() as http:
        alice = make(http, "human", "alice")
        bot = make(http, "agent", "bot", owner=alice["id"])
        with SSEStream(f"{server.url}/api/v1/session", auth(bot["token"])) as first:
            first_id = first.next()[1]["session_id"]
            with SSEStream(f"{server.url}/api/v1/session", auth(bot["token"])) as second:
                second_id = second.next()[1]["session_id"]
                assert second_id != first_id
                assert first.next() == ("end", {"type": "end", "reason": "replaced"})
                assert first.next()[0] == "closed"
                m = post(http, alice["token"], bot["home_channel_id"], "to the live one")
                assert dispatches(second, m) == [("deliver", m)]
                r = http.post(f"/api/v1/session/{first_id}/state", json={"state": "ready"}, headers=auth(bot["token"]))
                assert r.status_code == 404
                r = http.post(f"/api/v1/session/{second_id}/state", json={"state": "ready"}, headers=auth(bot["token"]))
                assert r.status_code == 200
        rt.delivery.wait_idle()
        assert rt.delivery.status()["live_sessions"] in (0, 1)  # the close may still be in flight


def test_engine_shutdown_ends_open_streams_with_an_end_event(backend_url):
    # (uvicorn waits for open streams before the lifespan shutdown runs; the engine's own
    # stop is what ends them, so this drives it directly)
    rt, server = serve(backend_url, waker=FakeWaker())
    with server, server.client() as http:
        alice = make(http, "human", "alice")
        bot = make(http, "agent", "bot", owner=alice["id"])
        with SSEStream(f"{server.url}/api/v1/session", auth(bot["token"])) as stream:
            assert stream.next()[0] == "session"
            rt.delivery.stop()
            assert stream.next() == ("end", {"type": "end", "reason": "shutdown"})
            assert stream.next()[0] == "closed"


def test_an_idle_stream_sends_keep_alive_comments(backend_url):
    rt, server = serve(backend_url, waker=FakeWaker(), keepalive_s=0.05)
    with server, server.client() as http:
        alice = make(http, "human", "alice")
        bot = make(http, "agent", "bot", owner=alice["id"])
        with SSEStream(f"{server.url}/api/v1/session", auth(bot["token"]), comments=True) as stream:
            assert stream.next()[0] == "session"
            assert stream.next() == ("comment", "keep-alive")
            m = post(http, alice["token"], bot["home_channel_id"], "after the silence")
            while (event := stream.next())[0] == "comment":
                pass
            assert event[0] == "deliver" and event[1]["message"]["id"] == m
