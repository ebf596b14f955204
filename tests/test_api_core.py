"""HTTP API of the foundation (CONTRACT §2) on both backends: every bad input is a 4xx."""

from __future__ import annotations

import pytest

from helpers import auth
from tidings.hub.events import MessagePosted


def make_human(client, handle="alice"):
    r = client.post("/api/v1/accounts", json={"kind": "human", "handle": handle}, headers=client.admin)
    assert r.status_code == 201, r.text
    return r.json()


def make_agent(client, handle, owner):
    r = client.post(
        "/api/v1/accounts", json={"kind": "agent", "handle": handle, "owner": owner}, headers=client.admin
    )
    assert r.status_code == 201, r.text
    return r.json()


def make_channel(client, token, name="general", members=()):
    r = client.post("/api/v1/channels", json={"name": name, "members": list(members)}, headers=auth(token))
    assert r.status_code == 201, r.text
    return r.json()


def error_of(r):
    body = r.json()
    assert set(body) == {"error"} and {"code", "message"} <= set(body["error"]), body
    return body["error"]["code"]


def test_healthz_needs_no_token(client):
    r = client.get("/healthz")
    assert r.status_code == 200 and r.json() == {"ok": True}


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer nope"}, {"Authorization": "Basic abc"}])
def test_missing_or_bad_token_is_401(client, headers):
    r = client.get("/api/v1/channels", headers=headers)
    assert r.status_code == 401
    error_of(r)


def test_create_human_returns_token_once_and_stores_only_its_hash(client, runtime):
    body = make_human(client)
    assert body["kind"] == "human" and body["handle"] == "alice" and body["token"].startswith("tdg_")
    with runtime.store.read() as tx:
        stored = [r[0] for r in tx.raw("SELECT token_hash FROM api_tokens").fetchall()]
    assert body["token"] not in stored
    assert client.get("/api/v1/me", headers=auth(body["token"])).json()["account"]["handle"] == "alice"


@pytest.mark.parametrize(
    "handle,code",
    [("Alice", "bad_handle"), ("-x", "bad_handle"), ("a b", "bad_handle"), ("", "bad_handle"),
     (None, "bad_handle"), (12, "bad_handle"), ("everyone", "reserved_handle"), ("agents", "reserved_handle"),
     ("users", "reserved_handle"), ("tidings", "reserved_handle")],
)
def test_bad_or_reserved_handle_is_400(client, handle, code):
    r = client.post("/api/v1/accounts", json={"kind": "human", "handle": handle}, headers=client.admin)
    assert r.status_code == 400 and error_of(r) == code


def test_taken_handle_is_409(client):
    make_human(client, "alice")
    r = client.post("/api/v1/accounts", json={"kind": "human", "handle": "alice"}, headers=client.admin)
    assert r.status_code == 409 and error_of(r) == "handle_taken"


def test_only_admin_creates_accounts(client):
    alice = make_human(client)
    r = client.post("/api/v1/accounts", json={"kind": "human", "handle": "mallory"}, headers=auth(alice["token"]))
    assert r.status_code == 403 and error_of(r) == "admin_only"


def test_agent_gets_home_channel_with_owner_unsubscribed_and_seeded_cursor(client, runtime):
    alice = make_human(client)
    bot = make_agent(client, "helper", alice["id"])
    home = bot["home_channel_id"]
    members = client.get(f"/api/v1/channels/{home}/members", headers=auth(bot["token"])).json()["members"]
    flags = {m["handle"]: m["subscribed"] for m in members}
    assert flags == {"alice": False, "helper": True}
    with runtime.store.read() as tx:
        rows = tx.raw("SELECT agent_id, channel_id, acked_seq FROM agent_cursors").fetchall()
    assert [tuple(r) for r in rows] == [(bot["id"], home, 0)]


def test_unknown_owner_is_404_and_agent_owner_is_400(client):
    r = client.post("/api/v1/accounts", json={"kind": "agent", "handle": "x", "owner": "acc_nope"}, headers=client.admin)
    assert r.status_code == 404
    alice = make_human(client)
    bot = make_agent(client, "bot", alice["id"])
    r = client.post("/api/v1/accounts", json={"kind": "agent", "handle": "y", "owner": bot["id"]}, headers=client.admin)
    assert r.status_code == 400


def test_bad_wake_setting_is_400(client):
    alice = make_human(client)
    for wake in ({"webhook": "ftp://x"}, {"command": []}, {"pager": 1}, "now"):
        r = client.post(
            "/api/v1/accounts",
            json={"kind": "agent", "handle": "w", "owner": alice["id"], "wake": wake},
            headers=client.admin,
        )
        assert r.status_code == 400, wake


@pytest.mark.parametrize(
    "raw,code",
    [(b"{not json", "bad_json"), (b"[1,2]", "bad_json"), (b"", "bad_json"), (b"\xff\xfe", "bad_json")],
)
def test_malformed_json_is_400(client, raw, code):
    r = client.post("/api/v1/accounts", content=raw, headers={**client.admin, "Content-Type": "application/json"})
    assert r.status_code == 400 and error_of(r) == code


def test_oversized_body_is_413(client):
    big = b'{"text": "' + b"x" * (1024 * 1024 + 10) + b'"}'
    r = client.post("/api/v1/accounts", content=big, headers={**client.admin, "Content-Type": "application/json"})
    assert r.status_code == 413 and error_of(r) == "too_large"


def test_unknown_channel_is_404(client):
    alice = make_human(client)
    r = client.post("/api/v1/channels/ch_nope/messages", json={"text": "hi"}, headers=auth(alice["token"]))
    assert r.status_code == 404 and error_of(r) == "unknown_channel"
    r = client.get("/api/v1/channels/ch_nope/messages", headers=auth(alice["token"]))
    assert r.status_code == 404


def test_non_member_cannot_post_or_read_and_learns_nothing(client):
    alice, bob = make_human(client, "alice"), make_human(client, "bob")
    ch = make_channel(client, alice["token"])
    client.post(f"/api/v1/channels/{ch['id']}/messages", json={"text": "secret"}, headers=auth(alice["token"]))
    r = client.post(f"/api/v1/channels/{ch['id']}/messages", json={"text": "hi"}, headers=auth(bob["token"]))
    assert r.status_code == 404 and "secret" not in r.text
    r = client.get(f"/api/v1/channels/{ch['id']}/messages", headers=auth(bob["token"]))
    assert r.status_code == 404 and "secret" not in r.text


def test_post_and_list_messages(client):
    alice = make_human(client)
    ch = make_channel(client, alice["token"])
    for i in range(3):
        r = client.post(f"/api/v1/channels/{ch['id']}/messages", json={"text": f"m{i}"}, headers=auth(alice["token"]))
        assert r.status_code == 201 and r.json()["inserted"] is True
        msg = r.json()["message"]
        assert set(msg) >= {"id", "seq", "channel_id", "topic_id", "author_account_id", "at_unix_ms", "blocks", "text"}
        assert msg["seq"] == i + 1 and msg["blocks"] == [{"kind": "text", "text": f"m{i}"}]
    r = client.get(f"/api/v1/channels/{ch['id']}/messages?after_seq=1&limit=5", headers=auth(alice["token"]))
    assert [m["text"] for m in r.json()["messages"]] == ["m1", "m2"]
    r = client.get(f"/api/v1/channels/{ch['id']}/messages?limit=0", headers=auth(alice["token"]))
    assert r.status_code == 400
    r = client.get(f"/api/v1/channels/{ch['id']}/messages?after_seq=x", headers=auth(alice["token"]))
    assert r.status_code == 400


@pytest.mark.parametrize(
    "body",
    [{}, {"text": ""}, {"text": "   "}, {"text": 5}, {"blocks": []}, {"blocks": [{"kind": "image"}]},
     {"text": "a", "blocks": [{"kind": "text", "text": "b"}]}, {"text": "a", "topic": ""}, {"text": "a", "bogus": 1},
     {"text": "a", "client_request_id": 7}],
)
def test_bad_post_bodies_are_400(client, body):
    alice = make_human(client)
    ch = make_channel(client, alice["token"])
    r = client.post(f"/api/v1/channels/{ch['id']}/messages", json=body, headers=auth(alice["token"]))
    assert r.status_code == 400, r.text
    error_of(r)


def test_idempotent_post_one_row_inserted_false_no_second_bus_event(client, runtime):
    alice = make_human(client)
    ch = make_channel(client, alice["token"])
    sub = runtime.bus.subscribe(0)
    url = f"/api/v1/channels/{ch['id']}/messages"
    body = {"text": "once", "client_request_id": "req-1"}
    first = client.post(url, json=body, headers=auth(alice["token"]))
    second = client.post(url, json=body, headers=auth(alice["token"]))
    assert first.status_code == 201 and first.json()["inserted"] is True
    assert second.status_code == 200 and second.json()["inserted"] is False
    assert second.json()["message"]["id"] == first.json()["message"]["id"]
    with runtime.store.read() as tx:
        assert tx.raw("SELECT COUNT(*) FROM messages").fetchone()[0] == 1
    posted = [ev for ev in sub.replay if isinstance(ev.payload, MessagePosted)]
    while (ev := sub.get_nowait()) is not None:
        posted.append(ev)
    assert [e.payload.message_id for e in posted] == [first.json()["message"]["id"]]
    # The negative control: a different request id is a second message and a second event.
    third = client.post(url, json={"text": "once", "client_request_id": "req-2"}, headers=auth(alice["token"]))
    assert third.status_code == 201 and sub.get_nowait() is not None


def test_client_request_id_is_per_author_and_bound_to_its_channel(client, runtime):
    """Idempotency is keyed on (author, client_request_id): another author's identical id is
    a new message, and reusing an id in another channel is a 400 ``crid_reused`` that stores
    nothing (never the first channel's message handed back as if it were this post)."""
    alice, bob = make_human(client, "alice"), make_human(client, "bob")
    one = make_channel(client, alice["token"], name="one", members=[bob["id"]])
    two = make_channel(client, alice["token"], name="two")
    body = {"text": "hi", "client_request_id": "req-1"}
    first = client.post(f"/api/v1/channels/{one['id']}/messages", json=body, headers=auth(alice["token"]))
    by_bob = client.post(f"/api/v1/channels/{one['id']}/messages", json=body, headers=auth(bob["token"]))
    assert first.status_code == 201 and by_bob.status_code == 201, (first.text, by_bob.text)
    assert by_bob.json()["inserted"] is True
    assert by_bob.json()["message"]["id"] != first.json()["message"]["id"]
    assert by_bob.json()["message"]["author_account_id"] == bob["id"]
    elsewhere = client.post(f"/api/v1/channels/{two['id']}/messages", json=body, headers=auth(alice["token"]))
    assert elsewhere.status_code == 400 and error_of(elsewhere) == "crid_reused", elsewhere.text
    with runtime.store.read() as tx:
        assert tx.raw("SELECT COUNT(*) FROM messages").fetchone()[0] == 2
    listed = client.get(f"/api/v1/channels/{two['id']}/messages", headers=auth(alice["token"]))
    assert listed.status_code == 200 and listed.json()["messages"] == []


def test_edit_is_author_only(client):
    alice, bob, carol = make_human(client, "alice"), make_human(client, "bob"), make_human(client, "carol")
    ch = make_channel(client, alice["token"], members=[bob["id"]])
    msg = client.post(
        f"/api/v1/channels/{ch['id']}/messages", json={"text": "v1"}, headers=auth(alice["token"])
    ).json()["message"]
    new = {"blocks": [{"kind": "text", "text": "v2"}]}
    assert client.patch(f"/api/v1/messages/{msg['id']}", json=new, headers=auth(bob["token"])).status_code == 403
    assert client.patch(f"/api/v1/messages/{msg['id']}", json=new, headers=auth(carol["token"])).status_code == 404
    r = client.patch(f"/api/v1/messages/{msg['id']}", json=new, headers=auth(alice["token"]))
    assert r.status_code == 200 and r.json()["message"]["text"] == "v2"
    assert client.patch("/api/v1/messages/msg_nope", json=new, headers=auth(alice["token"])).status_code == 404


def test_subscribe_adds_member_and_seeds_cursor_at_head_add_keeps_subscription(client, runtime):
    alice = make_human(client)
    bot = make_agent(client, "bot", alice["id"])
    ch = make_channel(client, alice["token"])
    for i in range(2):
        client.post(f"/api/v1/channels/{ch['id']}/messages", json={"text": f"old{i}"}, headers=auth(alice["token"]))
    r = client.post(f"/api/v1/channels/{ch['id']}/members", json={"subscribe": [bot["id"]]}, headers=auth(alice["token"]))
    assert r.status_code == 200
    with runtime.store.read() as tx:
        acked = tx.raw(
            f"SELECT acked_seq FROM agent_cursors WHERE channel_id = '{ch['id']}'"
        ).fetchone()[0]
    assert acked == 2  # seeded at the head: no history replay
    r = client.post(f"/api/v1/channels/{ch['id']}/members", json={"add": [bot["id"]]}, headers=auth(alice["token"]))
    flags = {m["handle"]: m["subscribed"] for m in r.json()["members"]}
    assert flags["bot"] is True  # add never flips an existing subscription off


def test_member_changes_bad_input(client):
    alice, bob = make_human(client, "alice"), make_human(client, "bob")
    ch = make_channel(client, alice["token"])
    url = f"/api/v1/channels/{ch['id']}/members"
    assert client.post(url, json={}, headers=auth(alice["token"])).status_code == 400
    assert client.post(url, json={"add": "x"}, headers=auth(alice["token"])).status_code == 400
    assert client.post(url, json={"add": ["acc_nope"]}, headers=auth(alice["token"])).status_code == 404
    assert client.post(url, json={"add": [bob["id"]]}, headers=auth(bob["token"])).status_code == 404


def test_mandatory_channel_refuses_unsubscribe(client):
    alice = make_human(client)
    bot = make_agent(client, "bot", alice["id"])
    r = client.post(
        "/api/v1/channels",
        json={"name": "announce", "members": [bot["id"]], "mandatory_subscription": True},
        headers=auth(alice["token"]),
    )
    ch = r.json()
    r = client.post(f"/api/v1/channels/{ch['id']}/members", json={"unsubscribe": [bot["id"]]}, headers=auth(alice["token"]))
    assert r.status_code == 400 and error_of(r) == "mandatory_channel"


def test_status_is_admin_only_and_has_the_contract_sections(client):
    alice = make_human(client)
    assert client.get("/api/status", headers=auth(alice["token"])).status_code == 403
    body = client.get("/api/status", headers=client.admin).json()
    assert {"ingest", "delivery", "bus"} <= set(body)
    assert {"head_seq", "overruns"} <= set(body["bus"])
    assert {"per_bridge", "backlog", "deferred_now"} <= set(body["ingest"])
