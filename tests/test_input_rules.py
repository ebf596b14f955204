"""The four causes of the probe's 500s (issue 14 item 1), each a 400 in the one envelope on
both backends alike, and nothing stored."""

from __future__ import annotations

import pytest

from helpers import auth, create_account, create_channel

DEEP = ("[" * 1000 + "]" * 1000).encode()


@pytest.fixture
def room(client):
    alice = create_account(client, "human", "alice", admin_token="tdg_test_admin")
    return alice, create_channel(client, alice["token"], "room")


def _is_400(r, code=None):
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert set(error) == {"code", "message"}
    if code:
        assert error["code"] == code, error


@pytest.mark.parametrize("body, code", [
    (b'{"text": ' + DEEP + b"}", "bad_json"),
    (b'{"text": "a\\ud800b"}', "bad_text"),
    (b'{"text": "a\\u0000b"}', "bad_text"),
    (b'{"text": "ok", "client_request_id": "\\u0000"}', "bad_text"),
    (b'{"text": "ok", "topic": 9223372036854775808}', "bad_number"),
    (b'{"text": "\xed\xa0\x80"}', "bad_json"),
    (b'{"text": NaN}', "bad_json"),
])
def test_bad_bodies_are_400_and_nothing_is_stored(client, room, body, code):
    alice, channel = room
    r = client.post(f"/api/v1/channels/{channel}/messages", content=body,
                    headers={**auth(alice["token"]), "content-type": "application/json"})
    _is_400(r, code)
    assert client.get(f"/api/v1/channels/{channel}/messages", headers=auth(alice["token"])).json()["messages"] == []


def test_every_body_route_refuses_deep_json_and_nul_alike(client, room):
    alice, channel = room
    for path in ("/api/v1/accounts", "/api/v1/channels", f"/api/v1/channels/{channel}/members", "/api/v1/bridges",
                 "/api/v1/ack", "/api/v1/messages/msg_x"):
        for body in (DEEP, b'{"name": "a\\u0000"}'):
            method = "PATCH" if "/messages/" in path else "POST"
            r = client.request(method, path, content=body, headers=client.admin)
            _is_400(r)


def test_query_and_path_limits(client, room):
    alice, channel = room
    url = f"/api/v1/channels/{channel}/messages"
    _is_400(client.get(url, params={"after_seq": str(2**63)}, headers=auth(alice["token"])))
    assert client.get(url, params={"after_seq": str(2**63 - 1)}, headers=auth(alice["token"])).status_code == 200
    _is_400(client.get(url, params={"after_seq": "1\x00"}, headers=auth(alice["token"])), "bad_text")
    _is_400(client.get("/api/v1/channels/ch_%00x/messages", headers=auth(alice["token"])), "bad_text")
    _is_400(client.get("/api/v1/messages/msg_%00", headers=auth(alice["token"])), "bad_text")


def test_frames_keep_their_codec_rules(client):
    """A frame's NUL is the codec's business: the guard only bounds depth and UTF-8."""
    alice = create_account(client, "human", "alice2", admin_token="tdg_test_admin")
    bridge = client.post("/api/v1/bridges", json={"platform": "signal", "name": "p", "owner": alice["id"]},
                         headers=client.admin).json()
    frame = b'{"codec": "signal.jsonrpc", "codec_version": 1, "dedupe_key": "k\\u0000", "payload": {}}'
    r = client.post(f"/api/v1/bridges/{bridge['id']}/frames", content=frame,
                    headers={**auth(bridge["token"]), "content-type": "application/json"})
    assert r.status_code == 400 and "dedupe_key" in r.json()["error"]["message"]  # the inbox's own rule
    r = client.post(f"/api/v1/bridges/{bridge['id']}/frames", content=DEEP, headers=auth(bridge["token"]))
    _is_400(r, "bad_json")
