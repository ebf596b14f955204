"""Indexed search (issue 15 item 2), both backends: ``GET /api/v1/search`` over hub and
bridge messages, only what the caller may read, ranked, with a marked snippet and filters;
the index follows inserts, edits and deletes in the writing transaction."""

from __future__ import annotations

import pytest
from test_projection_support import World, delete, edit, msg, ref

from helpers import auth, create_account, create_channel, post_text
from tidings.hub import search as search_hub
from tidings.hub.tokens import Principal
from tidings.store import messages as messages_store
from tidings.store import search as search_store

ADMIN = "tdg_test_admin"
SIG = "signal:+15550100"


@pytest.fixture
def scene(client, runtime):
    """alice (with her agent and a Signal bridge) and bob, each with a channel; plus a
    shared channel; a few messages everywhere."""
    alice = create_account(client, "human", "alice", admin_token=ADMIN)
    bob = create_account(client, "human", "bob", admin_token=ADMIN)
    agent = create_account(client, "agent", "helper", admin_token=ADMIN, owner=alice["id"])
    kitchen = create_channel(client, alice["token"], "kitchen", [agent["id"]])
    secret = create_channel(client, bob["token"], "bobs-secret")
    shared = create_channel(client, alice["token"], "shared", [bob["id"]])
    m = {}
    for key, token, channel, text in (
        ("soup", alice["token"], kitchen, "Pumpkin soup tonight"),
        ("pasta", alice["token"], kitchen, "pumpkin pasta, pumpkin bread, pumpkin pie"),
        ("secret", bob["token"], secret, "my secret pumpkin recipe"),
        ("shared", bob["token"], shared, "who brings the pumpkins?"),
    ):
        runtime.clock.advance(1_000)
        m[key] = post_text(client, token, channel, text)
    w = World(runtime.store, "signal", owner_id=alice["id"])
    mom = ref("+15550100", "Mom", platform="signal")
    w.frame([msg(SIG, "mom:1", mom, body="Pumpkin carving on Sunday?", at=1_000)])
    w.frame([msg(SIG, "mom:2", mom, body="bring the big knife", at=2_000)])
    other = World(runtime.store, "signal", owner_id=bob["id"])
    other.frame([msg(SIG, "x:1", ref("+15550100", "Mom", platform="signal"), body="pumpkin for bob", at=1_500)])
    return {"alice": alice, "bob": bob, "agent": agent, "kitchen": kitchen, "secret": secret, "shared": shared,
            "m": m, "w": w, "other": other, "mom": mom}


def search(client, token, **params):
    r = client.get("/api/v1/search", params=params, headers=auth(token))
    assert r.status_code == 200, r.text
    return r.json()["results"]


def found(results):
    return [(h["kind"], h["message"].get("text") or h["message"].get("body")) for h in results]


def test_search_finds_exactly_what_the_caller_may_read(client, scene):
    s = scene
    alice = found(search(client, s["alice"]["token"], q="pumpkin"))
    assert sorted(alice) == sorted([
        ("channel_message", "Pumpkin soup tonight"),
        ("channel_message", "pumpkin pasta, pumpkin bread, pumpkin pie"),
        ("channel_message", "who brings the pumpkins?"),
        ("bridge_message", "Pumpkin carving on Sunday?"),
    ])
    bob = found(search(client, s["bob"]["token"], q="pumpkin"))
    assert sorted(bob) == sorted([
        ("channel_message", "my secret pumpkin recipe"),
        ("channel_message", "who brings the pumpkins?"),
        ("bridge_message", "pumpkin for bob"),
    ])
    # the agent: its channels, and its owner's bridge
    agent = found(search(client, s["agent"]["token"], q="pumpkin"))
    assert sorted(agent) == sorted([
        ("channel_message", "Pumpkin soup tonight"),
        ("channel_message", "pumpkin pasta, pumpkin bread, pumpkin pie"),
        ("bridge_message", "Pumpkin carving on Sunday?"),
    ])
    assert len(search(client, ADMIN, q="pumpkin")) == 6  # the admin reads everything
    assert search(client, s["alice"]["token"], q="zucchini") == []


def test_results_are_ranked_and_the_snippet_marks_the_match(client, scene):
    hits = search(client, scene["alice"]["token"], q="pumpkin", channel_id=scene["kitchen"])
    # three pumpkins in one short message outrank one
    assert [h["message"]["id"] for h in hits] == [scene["m"]["pasta"]["id"], scene["m"]["soup"]["id"]]
    assert hits[0]["score"] > hits[1]["score"]
    assert "<mark>Pumpkin</mark> soup tonight" == hits[1]["snippet"]
    # every word must start a word of the text; case-insensitive; prefix
    (hit,) = search(client, scene["alice"]["token"], q="PUMP  bre")
    assert hit["message"]["id"] == scene["m"]["pasta"]["id"]
    assert "<mark>pumpkin</mark>" in hit["snippet"] and "<mark>bread</mark>" in hit["snippet"]


def test_the_snippet_is_escaped_html(client, scene):
    post_text(client, scene["alice"]["token"], scene["kitchen"], "<script>x</script> zucchini & co")
    (hit,) = search(client, scene["alice"]["token"], q="zucchini")
    assert "<script>" not in hit["snippet"] and "<mark>zucchini</mark>" in hit["snippet"]
    assert "script&gt;x&lt;/script&gt; <mark>zucchini</mark> &amp; co" in hit["snippet"]  # kept, as text


def test_filters_channel_conversation_author_and_time(client, scene, runtime):
    s = scene
    token = s["alice"]["token"]
    only_shared = found(search(client, token, q="pumpkin", channel_id=s["shared"]))
    assert only_shared == [("channel_message", "who brings the pumpkins?")]
    conv = s["w"].conv_id(SIG)
    assert found(search(client, token, q="pumpkin", conversation_id=conv)) == [
        ("bridge_message", "Pumpkin carving on Sunday?")]
    by_bob = found(search(client, token, q="pumpkin", author=s["bob"]["id"]))
    assert by_bob == [("channel_message", "who brings the pumpkins?")]
    mom_id = s["w"].ident_id("+15550100")
    assert found(search(client, token, q="pumpkin", author=mom_id)) == [
        ("bridge_message", "Pumpkin carving on Sunday?")]
    # time bounds (exclusive) on the shown time: the network time for bridge messages
    assert found(search(client, token, q="pumpkin", conversation_id=conv, before_ms=1_000)) == []
    assert len(search(client, token, q="pumpkin", conversation_id=conv, before_ms=1_001)) == 1
    assert search(client, token, q="pumpkin", conversation_id=conv, after_ms=1_000) == []
    soup_at = s["m"]["soup"]["at_unix_ms"]
    later = found(search(client, token, q="pumpkin", channel_id=s["kitchen"], after_ms=soup_at))
    assert later == [("channel_message", "pumpkin pasta, pumpkin bread, pumpkin pie")]
    # a channel or conversation the caller cannot read: 404, as if it did not exist
    r = client.get("/api/v1/search", params={"q": "pumpkin", "channel_id": s["secret"]}, headers=auth(token))
    assert r.status_code == 404 and r.json()["error"]["code"] == "unknown_channel"
    r = client.get("/api/v1/search", params={"q": "pumpkin", "conversation_id": s["other"].conv_id(SIG)},
                   headers=auth(token))
    assert r.status_code == 404 and r.json()["error"]["code"] == "unknown_conversation"


def test_the_index_follows_edits_and_deletes(client, scene, runtime):
    s = scene
    token = s["alice"]["token"]
    soup = s["m"]["soup"]["id"]
    r = client.patch(f"/api/v1/messages/{soup}", json={"blocks": [{"kind": "text", "text": "leek soup tonight"}]},
                     headers=auth(token))
    assert r.status_code == 200, r.text
    assert soup not in [h["message"]["id"] for h in search(client, token, q="pumpkin")]
    assert [h["message"]["id"] for h in search(client, token, q="leek")] == [soup]
    with runtime.store.write() as tx:
        messages_store.mark_deleted(tx, soup, 5)
    assert search(client, token, q="leek") == []
    # bridge messages: an edit re-indexes, a delete removes
    s["w"].frame([edit(SIG, "mom:2", "bring the big pumpkin knife", at=3_000)])
    assert ("bridge_message", "bring the big pumpkin knife") in found(search(client, token, q="knife pump"))
    assert search(client, token, q="big", conversation_id=s["w"].conv_id(SIG))
    s["w"].frame([delete(SIG, "mom:2", at=4_000)])
    assert search(client, token, q="knife") == []


def test_a_rolled_back_write_is_never_found(runtime, scene):
    store = runtime.store

    class Boom(Exception):
        pass

    with pytest.raises(Boom):
        with store.write() as tx:
            runtime.posting.post(author_id=scene["alice"]["id"], channel_id=scene["kitchen"],
                                 text="rhubarb crumble", tx=tx)
            raise Boom
    admin = Principal(scope="admin", account_id=runtime.system_account_id, kind="system")
    req = search_hub.parse_request("rhubarb")
    assert search_hub.search(store, admin, req)["results"] == []
    runtime.posting.post(author_id=scene["alice"]["id"], channel_id=scene["kitchen"], text="rhubarb crumble")
    assert len(search_hub.search(store, admin, req)["results"]) == 1


@pytest.mark.parametrize(
    "params, code",
    [
        ({}, "bad_query"),
        ({"q": "   "}, "bad_query"),
        ({"q": "?!"}, "bad_query"),
        ({"q": "x" * 201}, "bad_query"),
        ({"q": "a", "limit": "0"}, "bad_request"),
        ({"q": "a", "limit": "many"}, "bad_request"),
        ({"q": "a", "before_ms": "-1"}, "bad_request"),
        ({"q": "a", "author": "x" * 201}, "bad_request"),
    ],
)
def test_bad_search_requests_are_400(client, params, code):
    r = client.get("/api/v1/search", params=params, headers=client.admin)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["code"] == code


def test_a_bridge_token_may_not_search(client, runtime, scene):
    from tidings.hub.tokens import issue_token

    with runtime.store.write() as tx:
        account = tx.raw("SELECT account_id FROM bridges WHERE id = " + ("?" if runtime.store.dialect == "sqlite"
                         else "%s"), (scene["w"].bridge_id,)).fetchone()[0]
        token = issue_token(tx, scope="bridge", account_id=account, bridge_id=scene["w"].bridge_id, now=1)
    r = client.get("/api/v1/search", params={"q": "pumpkin"}, headers=auth(token))
    assert r.status_code == 403


def test_query_words_and_the_match_rule():
    assert search_store.query_words("Pump-kin  PASTA pasta, 100%_x") == ["pump", "kin", "pasta", "100", "x"]
    assert search_store.text_matches(["pump", "past"], "Pumpkin pasta!")
    assert not search_store.text_matches(["umpkin"], "Pumpkin")


def test_ranking_looks_at_the_newest_matches_only(client, scene, runtime, monkeypatch):
    """RANK_WINDOW: a very common word is ranked among its newest readable uses; a rarer
    word (fewer matches than the window) is found however old it is."""
    token = scene["alice"]["token"]
    kitchen = scene["kitchen"]
    old = post_text(client, token, kitchen, "quince quince quince quince")  # the best match, but old
    newer = []
    for i in range(4):
        runtime.clock.advance(1_000)
        newer.append(post_text(client, token, kitchen, f"quince number {i} with many other words around it")["id"])
    monkeypatch.setattr(search_store, "RANK_WINDOW", 3)
    hits = [h["message"]["id"] for h in search(client, token, q="quince")]
    assert sorted(hits) == sorted(newer[-3:])  # the three newest readable matches, ranked
    assert search(client, token, q="quince", channel_id=scene["shared"]) == []
    monkeypatch.setattr(search_store, "RANK_WINDOW", 300)
    hits = [h["message"]["id"] for h in search(client, token, q="quince")]
    assert hits[0] == old["id"] and len(hits) == 5
