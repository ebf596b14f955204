"""The conversation read endpoints (CONTRACT §2 Bridges) over projected data, both backends:
shapes, ordering, paging, and who may read (admin, the bridge's owner, the owner's agents;
everyone else gets 404 with no data)."""

from __future__ import annotations

import pytest
from test_projection_support import World, conv, delete, edit, gmsg, member, msg, react, ref

from helpers import auth
from tidings.hub.tokens import issue_token
from tidings.ingest.events import IdentityRef
from tidings.store import bridge_messages

SIG = "signal:+15550100"


def make_account(client, kind, handle, owner=None):
    body = {"kind": kind, "handle": handle}
    if owner:
        body["owner"] = owner
    r = client.post("/api/v1/accounts", json=body, headers=client.admin)
    assert r.status_code == 201, r.text
    return r.json()


def bridge_token(store, bridge_id):
    with store.write() as tx:
        account = tx.raw("SELECT account_id FROM bridges WHERE id = " +
                         ("?" if store.dialect == "sqlite" else "%s"), (bridge_id,)).fetchone()[0]
        return issue_token(tx, scope="bridge", account_id=account, bridge_id=bridge_id, now=1)


@pytest.fixture
def world(client, runtime):
    """An owner with an agent and a Signal bridge carrying a little traffic; strangers."""
    owner = make_account(client, "human", "owner")
    agent = make_account(client, "agent", "owners-agent", owner=owner["id"])
    stranger = make_account(client, "human", "stranger")
    strangers_agent = make_account(client, "agent", "strangers-agent", owner=stranger["id"])
    w = World(runtime.store, "signal", owner_id=owner["id"])
    bob = ref("+15550100", "Bob", platform="signal")
    alice = ref("+15550111", "Alice", platform="signal")
    me = ref("+15559999", "Me", self_=True, platform="signal")
    w.frame([msg(SIG, "bob:1", bob, body="hello there", at=1_000)])
    w.frame([msg(SIG, "self:2", me, body="hi Bob", at=2_000)])
    w.frame([msg(SIG, "bob:3", bob, body="lunch?", at=3_000), msg("signal-group:g1", "alice:4", alice, body="meeting",
                                                                   at=4_000)])
    w.frame([react(SIG, "bob:1", alice, "👍", at=5_000), react(SIG, "bob:1", me, "❤️", at=5_001),
             react(SIG, "bob:3", alice, "😂", at=5_002)])
    w.frame([react(SIG, "bob:3", alice, "", action="remove", at=6_000)])
    w.frame([edit(SIG, "bob:3", "lunch at 1?", at=7_000), delete(SIG, "self:2", at=7_100)])
    other = World(runtime.store, "google", owner_id=stranger["id"])
    other.frame([conv("x1", [member("+15550100", "Bob")], title="Other")])
    return {
        "w": w, "other": other, "owner": owner, "agent": agent, "stranger": stranger,
        "strangers_agent": strangers_agent,
        "own_bridge_token": bridge_token(runtime.store, w.bridge_id),
        "other_bridge_token": bridge_token(runtime.store, other.bridge_id),
    }


def test_conversations_of_a_bridge(client, world):
    w = world["w"]
    r = client.get(f"/api/v1/bridges/{w.bridge_id}/conversations", headers=auth(world["owner"]["token"]))
    assert r.status_code == 200, r.text
    convs = r.json()["conversations"]
    assert [c["remote_id"] for c in convs] == ["signal-group:g1", SIG]  # most recent message first
    group, direct = convs
    assert group["kind"] == "group" and direct["kind"] == "direct" and direct["id"] == w.conv_id(SIG)
    assert direct["last_message_at_ms"] == 3_000 and direct["title"] == ""
    assert [(p["raw"], p["name"], p["role"], p["is_active"], p["is_self"]) for p in direct["participants"]] == [
        ("+15550100", "Bob", "member", True, False)]
    assert {"id", "remote_id", "kind", "title", "participants", "last_message_at_ms"} <= set(direct)
    # paging
    page = client.get(f"/api/v1/bridges/{w.bridge_id}/conversations?limit=1&before_ms=4000",
                      headers=auth(world["owner"]["token"])).json()["conversations"]
    assert [c["remote_id"] for c in page] == [SIG] and page[0]["participants"]


def test_messages_of_a_conversation(client, world):
    w = world["w"]
    cid = w.conv_id(SIG)
    r = client.get(f"/api/v1/conversations/{cid}/messages", headers=auth(world["owner"]["token"]))
    assert r.status_code == 200, r.text
    msgs = r.json()["messages"]
    assert [(m["remote_message_id"], m["state"], m["body"]) for m in msgs] == [
        ("bob:3", "edited", "lunch at 1?"), ("self:2", "deleted", ""), ("bob:1", "active", "hello there")]
    first = msgs[-1]
    assert first["sender"] == {"identity_id": w.ident_id("+15550100"), "raw": "+15550100", "name": "Bob",
                               "is_self": False}
    assert first["direction"] == "incoming" and first["occurred_at_ms"] == 1_000 and first["id"] == w.msg_id(SIG, "bob:1")
    assert sorted((x["emoji"], x["reactor"]["name"], x["reactor"]["is_self"]) for x in first["reactions"]) == [
        ("❤️", "Me", True), ("👍", "Alice", False)]
    assert msgs[0]["reactions"] == []  # removed reactions are not shown
    assert msgs[1]["sender"]["is_self"] is True and msgs[1]["direction"] == "outgoing"
    assert {"id", "remote_message_id", "sender", "direction", "body", "state", "occurred_at_ms", "reactions"} <= set(
        first)
    # newest first, limit and before_ms (strictly older)
    page = client.get(f"/api/v1/conversations/{cid}/messages?limit=1&before_ms=3000",
                      headers=auth(world["owner"]["token"])).json()["messages"]
    assert [m["remote_message_id"] for m in page] == ["self:2"]
    page = client.get(f"/api/v1/conversations/{cid}/messages?before_ms=2000",
                      headers=auth(world["owner"]["token"])).json()["messages"]
    assert [m["remote_message_id"] for m in page] == ["bob:1"] and len(page[0]["reactions"]) == 2


def _walk(client, path, key, token, limit):
    """Page newest first with the answer's own cursor until it says there is no more."""
    seen, query, pages = [], f"limit={limit}", 0
    while True:
        body = client.get(f"{path}?{query}", headers=auth(token)).json()
        seen += body[key]
        pages += 1
        assert pages < 50, "paging never ended"
        if body["next_before_ms"] is None:
            assert body["next_before_id"] is None
            return seen
        assert len(body[key]) == limit
        query = f"limit={limit}&before_ms={body['next_before_ms']}&before_id={body['next_before_id']}"


def test_paging_with_the_answers_cursor_sees_every_message_once_through_equal_times(client, world):
    """Several messages share a millisecond across page boundaries: ``before_ms`` alone
    (strictly older) would skip the rest of a tie; the answer's ``next_before_ms`` and
    ``next_before_id`` resume exactly after the last row shown, (time, id) descending."""
    w = world["w"]
    bob = ref("+15550100", "Bob", platform="signal")
    w.frame([msg(SIG, f"bob:t{i}", bob, body=f"tie {i}", at=8_000) for i in range(5)])
    w.frame([msg(f"signal-group:tie{i}", f"bob:g{i}", bob, at=9_000) for i in range(4)])
    token = world["owner"]["token"]
    cid = w.conv_id(SIG)
    everything = client.get(f"/api/v1/conversations/{cid}/messages", headers=auth(token)).json()
    assert everything["next_before_ms"] is None and len(everything["messages"]) == 8
    for limit in (1, 2, 3):
        walked = _walk(client, f"/api/v1/conversations/{cid}/messages", "messages", token, limit)
        assert [m["id"] for m in walked] == [m["id"] for m in everything["messages"]], limit
    convs = client.get(f"/api/v1/bridges/{w.bridge_id}/conversations", headers=auth(token)).json()
    assert len(convs["conversations"]) == 6
    for limit in (1, 2, 4):
        walked = _walk(client, f"/api/v1/bridges/{w.bridge_id}/conversations", "conversations", token, limit)
        assert [c["id"] for c in walked] == [c["id"] for c in convs["conversations"]], limit
    # before_ms alone keeps its contract meaning: strictly older
    older = client.get(f"/api/v1/conversations/{cid}/messages?before_ms=8000", headers=auth(token)).json()
    assert [m["remote_message_id"] for m in older["messages"]] == ["bob:3", "self:2", "bob:1"]
    bad = client.get(f"/api/v1/conversations/{cid}/messages?before_id=x", headers=auth(token))
    assert bad.status_code == 400 and "before_ms" in bad.json()["error"]["message"]
    long = client.get(f"/api/v1/bridges/{w.bridge_id}/conversations?before_ms=1&before_id={'x' * 201}",
                      headers=auth(token))
    assert long.status_code == 400 and "before_id must be 1 to 200" in long.json()["error"]["message"]


@pytest.mark.parametrize("reader", ["admin", "owner", "agent"])
def test_admin_owner_and_owners_agent_may_read(client, world, reader):
    headers = client.admin if reader == "admin" else auth(world[reader]["token"])
    w = world["w"]
    assert client.get(f"/api/v1/bridges/{w.bridge_id}/conversations", headers=headers).status_code == 200
    r = client.get(f"/api/v1/conversations/{w.conv_id(SIG)}/messages", headers=headers)
    assert r.status_code == 200 and len(r.json()["messages"]) == 3


@pytest.mark.parametrize(
    "reader,status",
    [("stranger", 404), ("strangers_agent", 404), ("own_bridge_token", 403), ("other_bridge_token", 403)],
)
def test_everyone_else_gets_404_or_a_bridge_token_403_with_no_data(client, world, reader, status):
    # People and agents who may not read get the 404 of an unknown id; a bridge token is
    # refused for what it is (it may only append its own frames), whichever bridge it names.
    token = world[reader] if reader.endswith("token") else world[reader]["token"]
    w = world["w"]
    for path in (f"/api/v1/bridges/{w.bridge_id}/conversations", f"/api/v1/conversations/{w.conv_id(SIG)}/messages"):
        r = client.get(path, headers=auth(token))
        assert r.status_code == status, (path, r.text)
        assert set(r.json()) == {"error"}
    # the same answer as for ids that do not exist
    assert client.get("/api/v1/bridges/br_nope/conversations", headers=auth(world["owner"]["token"])).status_code == 404
    assert client.get("/api/v1/conversations/conv_nope/messages", headers=client.admin).status_code == 404


def test_the_stranger_reads_their_own_bridge(client, world):
    other = world["other"]
    r = client.get(f"/api/v1/bridges/{other.bridge_id}/conversations", headers=auth(world["strangers_agent"]["token"]))
    assert r.status_code == 200 and [c["title"] for c in r.json()["conversations"]] == ["Other"]


def test_missing_token_is_401(client, world):
    assert client.get(f"/api/v1/bridges/{world['w'].bridge_id}/conversations").status_code == 401


@pytest.mark.parametrize("query", ["limit=0", "limit=1001", "limit=x", "before_ms=-1", "before_ms=1e3",
                                   "before_ms=99999999999999999999"])
def test_bad_paging_parameters_are_400(client, world, query):
    w = world["w"]
    for path in (f"/api/v1/bridges/{w.bridge_id}/conversations", f"/api/v1/conversations/{w.conv_id(SIG)}/messages"):
        r = client.get(f"{path}?{query}", headers=client.admin)
        assert r.status_code == 400, (path, query, r.text)


def test_limit_1000_is_accepted(client, world):
    r = client.get(f"/api/v1/conversations/{world['w'].conv_id(SIG)}/messages?limit=1000", headers=client.admin)
    assert r.status_code == 200 and len(r.json()["messages"]) == 3


def test_google_anonymous_reactor_is_shown(client, runtime):
    owner = make_account(client, "human", "gowner")
    w = World(runtime.store, "google", owner_id=owner["id"])
    anon = IdentityRef(raw="anon:🎉", kind="anonymous", canonical="anon:🎉")
    w.frame([gmsg("c1", "m1", ref("+15550100", "Bob"), at=1_000), react("c1", "m1", anon, "🎉")])
    r = client.get(f"/api/v1/conversations/{w.conv_id('c1')}/messages", headers=auth(owner["token"]))
    assert r.json()["messages"][0]["reactions"] == [
        {"emoji": "🎉", "reactor": {"identity_id": None, "raw": "anon:🎉", "name": "", "is_self": False}}]


def test_store_search_over_bridge_messages(runtime, world):
    w, owner = world["w"], world["owner"]
    with runtime.store.read() as tx:
        everything = bridge_messages.search(tx, "LUNCH")  # case-insensitive
        scoped = bridge_messages.search(tx, "lunch", owner_id=owner["id"])
        strangers = bridge_messages.search(tx, "lunch", owner_id=world["stranger"]["id"])
        wildcard = bridge_messages.search(tx, "%")
        deleted = bridge_messages.search(tx, "hi Bob")
        one_bridge = bridge_messages.search(tx, "e", bridge_id=w.bridge_id, limit=2)
    assert [m["remote_message_id"] for m in everything] == ["bob:3"] and everything[0]["body"] == "lunch at 1?"
    assert everything[0]["remote_conversation_id"] == SIG
    assert [m["remote_message_id"] for m in scoped] == ["bob:3"] and strangers == []
    assert wildcard == [] and deleted == []
    assert [m["remote_message_id"] for m in one_bridge] == ["alice:4", "bob:1"]
