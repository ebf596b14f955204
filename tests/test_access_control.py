"""Access control (issue 6 item 4), both backends: every forbidden path answers the right
401/403/404 and its body carries the error envelope and nothing else — no names, no texts,
no ids of what the caller may not see.

Rules: 401 without a valid token; 403 when the caller is known but its kind of token may
never do this (a bridge reading channels, a human opening an agent session); 404 when the
thing exists but is not visible to this caller (so existence never leaks).
"""

from __future__ import annotations

import json

import pytest

from helpers import auth

SECRETS = ("TOPSECRET-channel-text", "hidden-room", "PRIVATE-signal-body", "Secret Sam")


def account(client, kind, handle, owner=None):
    body = {"kind": kind, "handle": handle, **({"owner": owner} if owner else {})}
    r = client.post("/api/v1/accounts", json=body, headers=client.admin)
    assert r.status_code == 201, r.text
    return r.json()


@pytest.fixture
def world(client, runtime):
    alice = account(client, "human", "alice")
    bob = account(client, "human", "bob")
    agent_a = account(client, "agent", "agent-a", owner=alice["id"])
    agent_b = account(client, "agent", "agent-b", owner=bob["id"])
    room = client.post("/api/v1/channels", json={"name": "hidden-room", "members": [agent_a["id"]]},
                       headers=auth(alice["token"])).json()
    msg = client.post(f"/api/v1/channels/{room['id']}/messages", json={"text": "TOPSECRET-channel-text"},
                      headers=auth(alice["token"])).json()["message"]
    bridge = client.post("/api/v1/bridges", json={"platform": "signal", "name": "alice-phone", "owner": alice["id"]},
                         headers=client.admin).json()
    other = client.post("/api/v1/bridges", json={"platform": "signal", "name": "bob-phone", "owner": bob["id"]},
                        headers=client.admin).json()
    frame = {"codec": "signal.jsonrpc", "codec_version": 1, "dedupe_key": "k1", "payload": {
        "jsonrpc": "2.0", "method": "receive", "params": {"account": "+14155550100", "envelope": {
            "source": "+14155550177", "sourceNumber": "+14155550177", "sourceName": "Secret Sam",
            "timestamp": 1_717_000_000_000,
            "dataMessage": {"timestamp": 1_717_000_000_000, "message": "PRIVATE-signal-body"}}}}}
    r = client.post(f"/api/v1/bridges/{bridge['id']}/frames", json=frame, headers=auth(bridge["token"]))
    assert r.status_code == 202, r.text
    runtime.ingest.drain()
    conv = client.get(f"/api/v1/bridges/{bridge['id']}/conversations", headers=auth(alice["token"])).json()
    (conversation,) = conv["conversations"]
    tokens = {
        "none": {},
        "bad": auth("tdg_not-a-real-token"),
        "admin": client.admin,
        "alice": auth(alice["token"]),
        "bob": auth(bob["token"]),
        "agent_a": auth(agent_a["token"]),
        "agent_b": auth(agent_b["token"]),
        "bridge": auth(bridge["token"]),
        "other_bridge": auth(other["token"]),
    }
    ids = {"room": room["id"], "msg": msg["id"], "bridge": bridge["id"], "conv": conversation["id"],
           "agent_a": agent_a["id"], "alice": alice["id"], "bob": bob["id"]}
    return tokens, ids


# (who, method, path, body, status). Paths use {room} {msg} {bridge} {conv} {agent_a} {bob}.
CASES = [
    # admin-only surfaces
    *[(who, "GET", "/api/status", None, st) for who, st in
      [("none", 401), ("bad", 401), ("alice", 403), ("agent_a", 403), ("bridge", 403)]],
    *[(who, "POST", "/api/v1/accounts", {"kind": "human", "handle": "mallory"}, st) for who, st in
      [("none", 401), ("alice", 403), ("agent_a", 403), ("bridge", 403)]],
    *[(who, "GET", "/api/v1/accounts", None, st) for who, st in [("alice", 403), ("agent_b", 403), ("bridge", 403)]],
    *[(who, "POST", "/api/v1/bridges", {"platform": "signal", "name": "x"}, st) for who, st in
      [("alice", 403), ("agent_a", 403), ("bridge", 403)]],
    *[(who, m, "/api/v1/bridges/{bridge}/links", b, st) for who, st in
      [("none", 401), ("alice", 403), ("agent_a", 403), ("bridge", 403)]
      for m, b in [("GET", None), ("POST", {"conversation_id": "{conv}", "channel_id": "{room}"})]],
    # a bridge token may only append its own frames
    *[("bridge", m, p, b, 403) for m, p, b in [
        ("GET", "/api/v1/channels", None), ("POST", "/api/v1/channels", {"name": "x"}),
        ("GET", "/api/v1/channels/{room}/messages", None),
        ("POST", "/api/v1/channels/{room}/messages", {"text": "hi"}),
        ("GET", "/api/v1/channels/{room}/members", None),
        ("POST", "/api/v1/channels/{room}/members", {"add": ["{bob}"]}),
        ("GET", "/api/v1/messages/{msg}", None),
        ("PATCH", "/api/v1/messages/{msg}", {"blocks": [{"kind": "text", "text": "x"}]}),
        ("GET", "/api/v1/session", None), ("POST", "/api/v1/ack", {"message_id": "{msg}"}),
        ("GET", "/api/v1/agents/{agent_a}/owed", None), ("GET", "/api/v1/agents", None),
        ("GET", "/api/v1/events", None)]],
    # channels and messages are visible to members only: strangers get 404
    *[(who, m, p, b, 404) for who in ("bob", "agent_b") for m, p, b in [
        ("GET", "/api/v1/channels/{room}/messages", None),
        ("POST", "/api/v1/channels/{room}/messages", {"text": "let me in"}),
        ("GET", "/api/v1/channels/{room}/members", None),
        ("POST", "/api/v1/channels/{room}/members", {"subscribe": ["{bob}"]}),
        ("GET", "/api/v1/messages/{msg}", None),
        ("PATCH", "/api/v1/messages/{msg}", {"blocks": [{"kind": "text", "text": "x"}]})]],
    # a member who is not the author may not edit
    ("agent_a", "PATCH", "/api/v1/messages/{msg}", {"blocks": [{"kind": "text", "text": "x"}]}, 403),
    # agent sessions are for agent tokens; acks only for messages the agent can see
    *[(who, "GET", "/api/v1/session", None, st) for who, st in [("none", 401), ("alice", 403), ("admin", 403)]],
    *[(who, "POST", "/api/v1/ack", {"message_id": "{msg}"}, st) for who, st in [("alice", 403), ("agent_b", 404)]],
    ("agent_b", "POST", "/api/v1/session/ses_nope/state", {"state": "ready"}, 404),
    ("alice", "POST", "/api/v1/session/ses_nope/state", {"state": "ready"}, 403),
    # owed mentions: the admin, the agent itself, or its owner
    *[(who, "GET", "/api/v1/agents/{agent_a}/owed", None, st) for who, st in [("bob", 404), ("agent_b", 404)]],
    # bridges: frames only with that bridge's own token; reads for admin, owner (and owner's agents)
    *[(who, "POST", "/api/v1/bridges/{bridge}/frames",
       {"codec": "signal.jsonrpc", "codec_version": 1, "dedupe_key": "", "payload": {}}, st) for who, st in
      [("none", 401), ("admin", 403), ("alice", 403), ("agent_a", 403), ("other_bridge", 404)]],
    *[(who, "GET", p, None, 404) for who in ("bob", "agent_b") for p in [
        "/api/v1/bridges/{bridge}", "/api/v1/bridges/{bridge}/quarantine",
        "/api/v1/bridges/{bridge}/conversations", "/api/v1/conversations/{conv}/messages"]],
    *[(who, "GET", p, None, 403) for who in ("bridge", "other_bridge") for p in [
        "/api/v1/bridges/{bridge}", "/api/v1/bridges/{bridge}/quarantine",
        "/api/v1/bridges/{bridge}/conversations", "/api/v1/conversations/{conv}/messages"]],
    # the web page's stream and MCP
    *[(who, "GET", "/api/v1/events", None, 401) for who in ("none", "bad")],
    *[(who, "POST", "/mcp", {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {}}, st) for who, st in
      [("none", 401), ("bad", 401), ("alice", 403), ("admin", 403), ("bridge", 403)]],
]


def _fill(value, ids):
    text = json.dumps(value) if not isinstance(value, str) else value
    for key, val in ids.items():
        text = text.replace("{" + key + "}", val)
    return json.loads(text) if not isinstance(value, str) else text


@pytest.mark.parametrize("who,method,path,body,status", CASES,
                         ids=[f"{c[0]}-{c[1]}-{c[2]}" for c in CASES])
def test_forbidden_paths_answer_the_right_status_and_no_data(client, world, who, method, path, body, status):
    tokens, ids = world
    headers = dict(tokens[who])
    if path == "/mcp":
        headers["Accept"] = "application/json, text/event-stream"
    r = client.request(method, _fill(path, ids), json=None if body is None else _fill(body, ids), headers=headers)
    assert r.status_code == status, (r.status_code, r.text)
    data = r.json()
    if path == "/mcp":  # a JSON-RPC error the MCP client shows (D56)
        assert set(data) == {"jsonrpc", "id", "error"} and set(data["error"]) == {"code", "message", "data"}, data
    else:
        assert set(data) == {"error"} and set(data["error"]) == {"code", "message"}, data
    for secret in SECRETS:
        assert secret not in r.text


def test_lists_show_only_what_the_caller_may_see(client, world):
    tokens, ids = world
    names = lambda who: [c["name"] for c in client.get("/api/v1/channels", headers=tokens[who]).json()["channels"]]
    assert "hidden-room" in names("alice") and "hidden-room" in names("agent_a")
    assert "hidden-room" not in names("bob") and "hidden-room" not in names("agent_b")
    bridges = lambda who: [b["id"] for b in client.get("/api/v1/bridges", headers=tokens[who]).json()["bridges"]]
    assert ids["bridge"] in bridges("alice") and ids["bridge"] not in bridges("bob")
    agents = lambda who: [a["id"] for a in client.get("/api/v1/agents", headers=tokens[who]).json()["agents"]]
    assert ids["agent_a"] in agents("alice") and ids["agent_a"] not in agents("bob")


def test_the_allowed_readers_do_read(client, world):
    tokens, ids = world
    for who in ("admin", "alice", "agent_a"):
        r = client.get(f"/api/v1/conversations/{ids['conv']}/messages", headers=tokens[who])
        assert r.status_code == 200 and "PRIVATE-signal-body" in r.text, who
    for who in ("admin", "alice", "agent_a"):
        assert client.get(f"/api/v1/agents/{ids['agent_a']}/owed", headers=tokens[who]).status_code == 200, who


def test_tokens_are_stored_hashed(runtime, world):
    tokens, _ = world
    with runtime.store.read() as tx:
        stored = {r[0] for r in tx.raw("SELECT token_hash FROM api_tokens").fetchall()}
    for headers in tokens.values():
        secret = headers.get("Authorization", " ").split(" ", 1)[1]
        assert secret not in stored


def test_the_server_binds_to_loopback_by_default():
    from typer.testing import CliRunner

    from tidings.cli import app

    result = CliRunner().invoke(app, ["serve", "--help"])
    assert "127.0.0.1" in result.output
