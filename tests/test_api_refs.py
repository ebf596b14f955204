"""An API you can use without guessing (issue 15, D55), both backends: ``@handle`` and
``#name`` wherever ids are expected, lookups by handle and name, 403 ``not_a_member`` for a
channel you can see but are not in, offline docs at ``/docs``, and the README's "The API in
ten calls" run call by call against a live hub."""

from __future__ import annotations

import re
from pathlib import Path

from helpers import auth
from live import LiveServer, SSEStream
from tidings.api import create_app


def _human(client, handle):
    r = client.post("/api/v1/accounts", json={"kind": "human", "handle": handle}, headers=client.admin)
    assert r.status_code == 201, r.text
    return r.json()


def _error(r):
    body = r.json()
    assert set(body) == {"error"}, body
    return body["error"]["code"]


def test_handles_and_names_work_wherever_ids_do(client):
    alice = _human(client, "alice")
    bob = _human(client, "bob")
    # owner by @handle (case-folded)
    r = client.post("/api/v1/accounts", json={"kind": "agent", "handle": "mybot", "owner": "@Alice"},
                    headers=client.admin)
    assert r.status_code == 201, r.text
    r = client.get("/api/v1/accounts", params={"handle": "@mybot"}, headers=client.admin)
    assert r.json()["accounts"][0]["owner"] == alice["id"]
    # members by @handle; the channel by #name (%23 in a path) or by its bare name
    r = client.post("/api/v1/channels", json={"name": "general", "members": ["@bob"]}, headers=auth(alice["token"]))
    assert r.status_code == 201, r.text
    general = r.json()["id"]
    r = client.post("/api/v1/channels/%23general/members", json={"subscribe": ["@mybot"]},
                    headers=auth(alice["token"]))
    assert r.status_code == 200, r.text
    assert {m["handle"]: m["subscribed"] for m in r.json()["members"]}["mybot"] is True
    for ref in ("%23general", "general", general):
        r = client.post(f"/api/v1/channels/{ref}/messages", json={"text": f"via {ref}"}, headers=auth(bob["token"]))
        assert r.status_code == 201, r.text
        assert r.json()["message"]["channel_id"] == general
    r = client.get("/api/v1/channels/general/messages", headers=auth(alice["token"]))
    assert [m["text"] for m in r.json()["messages"]] == ["via %23general", "via general", f"via {general}"]
    assert client.get("/api/v1/channels/%23general/members", headers=auth(bob["token"])).status_code == 200
    # unknown references are the usual 404s
    r = client.post("/api/v1/accounts", json={"kind": "agent", "handle": "x", "owner": "@nobody"}, headers=client.admin)
    assert (r.status_code, _error(r)) == (404, "unknown_account")
    r = client.get("/api/v1/channels/%23nowhere/messages", headers=auth(bob["token"]))
    assert (r.status_code, _error(r)) == (404, "unknown_channel")


def test_a_name_shared_by_two_visible_channels_is_a_409_naming_their_ids(client):
    alice = _human(client, "alice")
    ids = [client.post("/api/v1/channels", json={"name": "dup"}, headers=auth(alice["token"])).json()["id"]
           for _ in range(2)]
    r = client.get("/api/v1/channels/%23dup/messages", headers=auth(alice["token"]))
    assert (r.status_code, _error(r)) == (409, "ambiguous_channel")
    assert all(i in r.json()["error"]["message"] for i in ids)
    # another person sees neither: for it the name is simply unknown (no existence leak)
    bob = _human(client, "bob")
    r = client.get("/api/v1/channels/%23dup/messages", headers=auth(bob["token"]))
    assert (r.status_code, _error(r)) == (404, "unknown_channel")


def test_lookups_by_handle_and_by_name(client):
    alice = _human(client, "alice")
    _human(client, "bob")
    r = client.get("/api/v1/accounts", params={"handle": "@alice"}, headers=client.admin)
    assert [a["id"] for a in r.json()["accounts"]] == [alice["id"]]
    r = client.get("/api/v1/accounts", params={"handle": "carol"}, headers=client.admin)
    assert r.json()["accounts"] == []
    general = client.post("/api/v1/channels", json={"name": "general"}, headers=auth(alice["token"])).json()["id"]
    client.post("/api/v1/channels", json={"name": "other"}, headers=auth(alice["token"]))
    for name in ("general", "#general"):
        r = client.get("/api/v1/channels", params={"name": name}, headers=auth(alice["token"]))
        assert [c["id"] for c in r.json()["channels"]] == [general]


def test_not_a_member_is_403_when_you_can_see_the_channel_and_404_when_you_cannot(client):
    alice = _human(client, "alice")
    bob = _human(client, "bob")
    bot = client.post("/api/v1/accounts", json={"kind": "agent", "handle": "bot", "owner": alice["id"]},
                      headers=client.admin).json()
    # bob's room has alice's agent in it, not alice: alice can see it (through her agent)
    room = client.post("/api/v1/channels", json={"name": "bobs-room", "members": []},
                       headers=auth(bob["token"])).json()["id"]
    # (an agent joins a channel only through its owner or the admin: agent consent, D42)
    assert client.post(f"/api/v1/channels/{room}/members", json={"add": [bot["id"]]},
                       headers=client.admin).status_code == 200
    client.post(f"/api/v1/channels/{room}/messages", json={"text": "hello bot"}, headers=auth(bob["token"]))
    r = client.post(f"/api/v1/channels/{room}/messages", json={"text": "let me in"}, headers=auth(alice["token"]))
    assert (r.status_code, _error(r)) == (403, "not_a_member")
    r = client.post(f"/api/v1/channels/{room}/members", json={"add": [alice["id"]]}, headers=auth(alice["token"]))
    assert (r.status_code, _error(r)) == (403, "not_a_member")
    r = client.get(f"/api/v1/channels/{room}/messages", headers=auth(alice["token"]))
    assert r.status_code == 200 and [m["text"] for m in r.json()["messages"]] == ["hello bot"]
    # the owner may still manage its own agent's subscription there
    r = client.post(f"/api/v1/channels/{room}/members", json={"subscribe": ["@bot"]}, headers=auth(alice["token"]))
    assert r.status_code == 200, r.text
    # carol can see nothing of it: the same 404 as a channel that does not exist
    carol = _human(client, "carol")
    for path in (f"/api/v1/channels/{room}/messages", "/api/v1/channels/ch_nope/messages"):
        r = client.post(path, json={"text": "hi"}, headers=auth(carol["token"]))
        assert (r.status_code, _error(r)) == (404, "unknown_channel")
    # the admin sees every channel; posting needs membership
    r = client.post(f"/api/v1/channels/{room}/messages", json={"text": "admin"}, headers=client.admin)
    assert (r.status_code, _error(r)) == (403, "not_a_member")


def test_docs_are_served_from_the_installed_package_with_no_cdn(client):
    r = client.get("/docs")
    assert r.status_code == 200 and "text/html" in r.headers["content-type"]
    html = r.text
    assert "cdn" not in html.lower() and "https://" not in html.replace("https://fastapi.tiangolo.com", "")
    assets = re.findall(r"""(?:src|href)=["']([^"']+)["']""", html)
    assert {a.rsplit("/", 1)[-1] for a in assets} >= {"swagger-ui-bundle.js", "swagger-ui.css"}
    for asset in assets:
        assert asset.startswith("/docs/assets/"), asset
        got = client.get(asset)
        assert got.status_code == 200 and len(got.content) > 500, asset
    schema = client.get("/openapi.json").json()
    assert "/api/v1/channels/{channel_id}/messages" in schema["paths"]
    assert client.get("/api/docs").status_code == 200


def _ten_calls_from_readme() -> list[str]:
    """The curl lines of the README section "The API in ten calls", in order."""
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    section = readme.split("## The API in ten calls", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"^curl .*$", section.replace("\\\n", " "), flags=re.M)


def test_the_api_in_ten_calls(runtime):
    """The README's ten calls, in its order, with its bodies: find ids, create an agent, add
    it to a channel, create a bridge and link it, post, open a session, ack."""
    calls = _ten_calls_from_readme()
    assert len(calls) == 10, calls
    admin = {"Authorization": "Bearer tdg_test_admin"}
    with LiveServer(create_app(runtime, manage_runtime=True)) as server, server.client() as http:
        alice = http.post("/api/v1/accounts", json={"kind": "human", "handle": "alice"}, headers=admin).json()
        assert http.post("/api/v1/channels", json={"name": "general"}, headers=auth(alice["token"])).status_code == 201
        # 1-2: find ids
        r = http.get("/api/v1/accounts", params={"handle": "alice"}, headers=admin)
        assert r.json()["accounts"][0]["id"] == alice["id"]
        r = http.get("/api/v1/channels", params={"name": "general"}, headers=auth(alice["token"]))
        general = r.json()["channels"][0]["id"]
        # 3: create an agent (owner by handle); its token is shown once
        r = http.post("/api/v1/accounts", json={"kind": "agent", "handle": "mybot", "owner": "@alice"}, headers=admin)
        assert r.status_code == 201, r.text
        bot = r.json()
        # 4: add it to #general, subscribed
        r = http.post("/api/v1/channels/%23general/members", json={"subscribe": ["@mybot"]},
                      headers=auth(alice["token"]))
        assert r.status_code == 200, r.text
        # 5-7: create a bridge, push a frame, link its conversation into #general
        r = http.post("/api/v1/bridges", json={"platform": "signal", "name": "alice-phone", "owner": "@alice"},
                      headers=admin)
        assert r.status_code == 201, r.text
        bridge = r.json()
        frame = {"codec": "signal.jsonrpc", "codec_version": 1, "dedupe_key": "k1", "payload": {
            "jsonrpc": "2.0", "method": "receive", "params": {"account": "+14155550100", "envelope": {
                "source": "+14155550177", "sourceNumber": "+14155550177", "sourceName": "Sam",
                "timestamp": 1_717_000_000_000,
                "dataMessage": {"timestamp": 1_717_000_000_000, "message": "hello from signal"}}}}}
        r = http.post(f"/api/v1/bridges/{bridge['id']}/frames", json=frame, headers=auth(bridge["token"]))
        assert r.status_code == 202, r.text
        r = http.get(f"/api/v1/bridges/{bridge['id']}/conversations", headers=auth(alice["token"]))
        (conversation,) = r.json()["conversations"]
        r = http.post(f"/api/v1/bridges/{bridge['id']}/links",
                      json={"conversation_id": conversation["id"], "channel_id": "#general"}, headers=admin)
        assert r.status_code == 200 and r.json()["channel_id"] == general, r.text
        # 8: post a mention
        r = http.post("/api/v1/channels/%23general/messages", json={"text": "@mybot what is new?"},
                      headers=auth(alice["token"]))
        assert r.status_code == 201, r.text
        ask = r.json()["message"]["id"]
        # 9: open the agent's session: the missed mention is a steer (D54)
        with SSEStream(f"{server.url}/api/v1/session", auth(bot["token"])) as stream:
            assert stream.next()[0] == "session"
            event, data = stream.next()
            assert (event, data["message"]["id"], data["mentions_you"]) == ("steer", ask, True)
            # 10: ack it
            r = http.post("/api/v1/ack", json={"message_id": ask}, headers=auth(bot["token"]))
            assert r.status_code == 200, r.text
    paths = [re.search(r":7860(/api/v1/[^'\"?]*)", c).group(1).strip() for c in calls]
    assert paths == ["/api/v1/accounts", "/api/v1/channels", "/api/v1/accounts", "/api/v1/channels/%23general/members",
                     "/api/v1/bridges", "/api/v1/bridges/<bridge id>/conversations", "/api/v1/bridges/<bridge id>/links",
                     "/api/v1/channels/%23general/messages", "/api/v1/session", "/api/v1/ack"], paths
