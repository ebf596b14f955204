"""The web page's server side: the page and its assets, ``GET /api/v1/agents`` and the page's
event stream ``GET /api/v1/events`` (who sees what, lag, ticks), on both backends."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from helpers import auth, create_account
from helpers import create_channel as make_channel
from helpers import post_text as post
from live import LiveServer, SSEStream
from tidings.api import create_app
from tidings.runtime import Runtime

ADMIN_TOKEN = "tdg_test_admin"  # the root conftest's runtime fixture
ADMIN = auth(ADMIN_TOKEN)
WEB = Path(__file__).resolve().parents[2] / "src" / "tidings" / "web"


def make(http, kind, handle, **extra):
    return create_account(http, kind, handle, admin_token=ADMIN_TOKEN, **extra)


def make_bridge(http):
    r = http.post("/api/v1/bridges", json={"platform": "signal", "name": "phone"}, headers=ADMIN)
    assert r.status_code == 201, r.text
    return r.json()


# -- the page and its assets --------------------------------------------------------------------
def test_the_page_and_its_assets_are_served_with_a_strict_policy(client):
    r = client.get("/")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    csp = r.headers["content-security-policy"]
    assert "script-src 'self'" in csp and "connect-src 'self'" in csp and "unsafe-inline" not in csp
    assert r.headers["x-content-type-options"] == "nosniff"
    assert 'src="/static/app.js"' in r.text and 'href="/static/style.css"' in r.text
    for name in ("app.js", "search.js"):
        js = client.get(f"/static/{name}")
        assert js.status_code == 200 and js.headers["content-type"].startswith("text/javascript")
    css = client.get("/static/style.css")
    assert css.status_code == 200 and css.headers["content-type"].startswith("text/css")
    for path in ("/static/index.html", "/static/../api.py", "/static/nope.js"):
        assert client.get(path).status_code == 404, path


def test_the_page_never_builds_markup_from_strings():
    """Escaping rule: user text reaches the page only as text nodes; no inline script."""
    for name in ("app.js", "search.js"):
        js = (WEB / name).read_text()
        for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(", "new Function"):
            assert sink not in js, (name, sink)
    html = (WEB / "index.html").read_text()
    assert re.findall(r"<script\b[^>]*>", html) == ['<script src="/static/search.js" defer>',
                                                    '<script src="/static/app.js" defer>']
    assert not re.search(r"<[^>]*\son[a-z]+\s*=", html), "inline event handler"


# -- GET /api/v1/agents --------------------------------------------------------------------------
def test_agents_overview_shows_live_flag_and_owed_count(client, runtime):
    alice = make(client, "human", "alice")
    bot = make(client, "agent", "bot", owner=alice["id"], display_name="Bot")
    helper = make(client, "agent", "helper", owner=alice["id"])
    ch = make_channel(client, alice["token"], "general", [bot["id"], helper["id"]])
    post(client, alice["token"], ch, "@bot and @helper, please look")
    post(client, alice["token"], ch, "@bot again")
    runtime.delivery.options.threaded = False
    runtime.delivery.start()
    runtime.delivery.pump()
    session = runtime.delivery.connect(helper["id"])
    try:
        r = client.get("/api/v1/agents", headers=ADMIN)
        assert r.status_code == 200
        by_handle = {a["handle"]: a for a in r.json()["agents"]}
        assert set(by_handle) == {"bot", "helper"}
        assert by_handle["bot"] == {
            "id": bot["id"], "kind": "agent", "handle": "bot", "display_name": "Bot", "owner": alice["id"],
            "owner_handle": "alice", "home_channel_id": bot["home_channel_id"], "live": False, "owed": 2,
        }
        assert by_handle["helper"]["live"] is True
        assert by_handle["helper"]["owed"] == 1
    finally:
        runtime.delivery.disconnect(session)
    agents = client.get("/api/v1/agents", headers=ADMIN).json()["agents"]
    assert {a["handle"]: a["live"] for a in agents} == {"bot": False, "helper": False}


def test_agents_overview_follows_the_owed_visibility_rule(client, runtime):
    alice, bob = make(client, "human", "alice"), make(client, "human", "bob")
    bot = make(client, "agent", "bot", owner=alice["id"])
    scout = make(client, "agent", "scout", owner=bob["id"])
    bridge = make_bridge(client)
    tokens = {"admin": ADMIN_TOKEN, "alice": alice["token"], "bob": bob["token"], "bot": bot["token"],
              "scout": scout["token"]}
    expected = {"admin": {"bot", "scout"}, "alice": {"bot"}, "bob": {"scout"}, "bot": {"bot"}, "scout": {"scout"}}
    ids = {"bot": bot["id"], "scout": scout["id"]}
    for who, token in tokens.items():
        r = client.get("/api/v1/agents", headers=auth(token))
        assert r.status_code == 200, (who, r.text)
        listed = {a["handle"] for a in r.json()["agents"]}
        assert listed == expected[who], who
        # The same rule as GET /api/v1/agents/{id}/owed: listed exactly when that answers 200.
        for handle, agent_id in ids.items():
            owed = client.get(f"/api/v1/agents/{agent_id}/owed", headers=auth(token))
            assert (owed.status_code == 200) == (handle in listed), (who, handle)
    r = client.get("/api/v1/agents", headers=auth(bridge["token"]))
    assert r.status_code == 403 and set(r.json()) == {"error"}
    for headers in ({}, auth("tdg_nope")):
        r = client.get("/api/v1/agents", headers=headers)
        assert r.status_code == 401 and set(r.json()) == {"error"} and "bot" not in r.text


# -- GET /api/v1/events ----------------------------------------------------------------------------
@pytest.fixture
def hub(backend_url):
    """A real server over a started runtime: ``(runtime, server, http)``; ticks every 30 s
    (so they never interleave with the events a test waits for) unless a test changes it."""
    rt = Runtime(backend_url, admin_token=ADMIN_TOKEN)
    app = create_app(rt, manage_runtime=True)
    app.state.web_tick_s = 30.0
    with LiveServer(app) as server, server.client() as http:
        yield rt, server, http


def events(server, token):
    return SSEStream(server.url + "/api/v1/events", auth(token))


def next_of(stream, kinds=("message", "resync", "closed", "http_error")):
    """The next event of one of ``kinds`` (ticks and other kinds are stepped over)."""
    while True:
        event, data = stream.next()
        if event in kinds:
            return event, data


def test_events_need_an_account_or_admin_token(hub):
    rt, server, http = hub
    bridge = make_bridge(http)
    for headers, status in (({}, 401), (auth("tdg_nope"), 401), (auth("Basic x"), 401), (auth(bridge["token"]), 403)):
        with SSEStream(server.url + "/api/v1/events", headers) as stream:
            event, data = stream.next()
            assert event == "http_error" and data["status"] == status, (headers, data)
            assert set(data["body"]) == {"error"}


def test_events_carry_messages_of_visible_channels_only(hub):
    rt, server, http = hub
    alice, bob = make(http, "human", "alice"), make(http, "human", "bob")
    bot = make(http, "agent", "bot", owner=alice["id"])
    shared = make_channel(http, alice["token"], "shared", [bob["id"], bot["id"]])
    private = make_channel(http, alice["token"], "private")
    streams = {name: events(server, token) for name, token in
               (("admin", ADMIN_TOKEN), ("alice", alice["token"]), ("bob", bob["token"]), ("bot", bot["token"]))}
    for name, stream in streams.items():
        stream.__enter__()
        event, hello = stream.next()
        assert event == "hello" and hello["type"] == "hello", name
        assert hello["scope"] == ("admin" if name == "admin" else "account") and hello["tick_ms"] == 30_000
    try:
        secret = post(http, alice["token"], private, "secret: only alice may read this")
        public = post(http, alice["token"], shared, "hello <b>everyone</b>")
        for name in ("admin", "alice"):  # both messages, in order
            seen = [next_of(streams[name])[1] for _ in range(2)]
            assert [d["message"]["id"] for d in seen] == [secret["id"], public["id"]], name
            assert seen[1] == {"type": "message", "event": "posted", "channel_id": shared,
                               "message": public, "bus_seq": seen[1]["bus_seq"]}
        for name in ("bob", "bot"):  # the private post was published first, and never reaches them
            event, data = next_of(streams[name])
            assert event == "message" and data["message"]["id"] == public["id"], name
        r = http.patch(f"/api/v1/messages/{secret['id']}", json={"blocks": [{"kind": "text", "text": "secret v2"}]},
                       headers=auth(alice["token"]))
        assert r.status_code == 200
        r = http.patch(f"/api/v1/messages/{public['id']}", json={"blocks": [{"kind": "text", "text": "changed"}]},
                       headers=auth(alice["token"]))
        assert r.status_code == 200
        event, data = next_of(streams["bob"])
        assert (event, data["event"], data["message"]["id"], data["message"]["text"]) == (
            "message", "updated", public["id"], "changed")
        assert "secret" not in str(data)
        event, data = next_of(streams["alice"])
        assert (data["event"], data["message"]["text"]) == ("updated", "secret v2")
    finally:
        for stream in streams.values():
            stream.close()


def test_a_new_membership_is_seen_by_the_next_event(hub):
    rt, server, http = hub
    alice, bob = make(http, "human", "alice"), make(http, "human", "bob")
    ch = make_channel(http, alice["token"], "later")
    with events(server, bob["token"]) as stream:
        assert stream.next()[0] == "hello"
        before = post(http, alice["token"], ch, "before bob joined")
        r = http.post(f"/api/v1/channels/{ch}/members", json={"add": [bob["id"]]}, headers=auth(alice["token"]))
        assert r.status_code == 200
        after = post(http, alice["token"], ch, "after bob joined")
        # Visibility is checked when the stream handles an event, so a stream running
        # behind may also pass on the earlier post (bob may read it now); the post made
        # after he joined always arrives.
        seen = []
        while not seen or seen[-1] != after["id"]:
            event, data = next_of(stream)
            assert event == "message", (event, data)
            seen.append(data["message"]["id"])
        assert seen in ([after["id"]], [before["id"], after["id"]])


def test_an_overrun_stream_is_told_to_resync_and_stays_live(hub):
    rt, server, http = hub
    alice = make(http, "human", "alice")
    ch = make_channel(http, alice["token"], "busy")
    with events(server, alice["token"]) as stream:
        assert stream.next()[0] == "hello"
        rt.faults.arm("bus.overrun", 1)
        lost = post(http, alice["token"], ch, "published while the stream was overrun")
        event, data = next_of(stream)
        assert event == "resync" and data["reason"] == "lagged"
        # The hint was lost; the durable API has it (what the page re-reads on resync).
        listed = http.get(f"/api/v1/channels/{ch}/messages", headers=auth(alice["token"])).json()["messages"]
        assert [m["id"] for m in listed] == [lost["id"]]
        after = post(http, alice["token"], ch, "after the resync")
        event, data = next_of(stream)
        assert event == "message" and data["message"]["id"] == after["id"]
    assert rt.bus.overruns >= 1


def test_ticks_arrive_between_events(hub):
    rt, server, http = hub
    server.server.config.app.state.web_tick_s = 0.05
    with events(server, ADMIN_TOKEN) as stream:
        assert stream.next()[0] == "hello"
        for _ in range(3):
            event, data = next_of(stream, ("tick",))
            assert set(data) == {"type", "at_ms", "bus_head_seq"}
