"""The outbox over HTTP (issue 13 items 2 and 5), both backends: a bridge token drains only
its own outbox, reports are validated and idempotent, the long poll returns as soon as an
item is there, message reads carry their outbound state, the composer's destinations."""

from __future__ import annotations

import threading

import pytest

from bridgekit import link_signal_family
from helpers import auth
from tidings.bridges.registry import create_bridge
from tidings.hub import accounts as accounts_hub


@pytest.fixture
def linked(client, runtime):
    alice = accounts_hub.create_account(runtime.store, kind="human", handle="alice")
    bob = accounts_hub.create_account(runtime.store, kind="human", handle="bob")
    r = client.post("/api/v1/channels", headers=auth(alice.token), json={"name": "family"})
    ch = r.json()["id"]
    bridge, conversation_id = link_signal_family(runtime, alice.id, ch)
    other = create_bridge(runtime.store, platform="signal", name="Bob's phone", owner=bob.id)
    return {"alice": alice, "bob": bob, "ch": ch, "bridge": bridge, "other": other, "conv": conversation_id}


def post(client, who, ch, text):
    r = client.post(f"/api/v1/channels/{ch}/messages", headers=auth(who.token), json={"text": text})
    assert r.status_code == 201, r.text
    return r.json()["message"]


def pull(client, bridge, **params):
    return client.get(f"/api/v1/bridges/{bridge['id']}/outbox", headers=auth(bridge["token"]), params=params)


def test_a_bridge_drains_its_own_outbox_and_nobody_elses(client, linked):
    m = post(client, linked["alice"], linked["ch"], "on my way")
    r = pull(client, linked["bridge"])
    assert r.status_code == 200
    (item,) = r.json()["items"]
    assert (item["kind"], item["text"], item["message_id"]) == ("send", "on my way", m["id"])
    assert r.json()["next_after_seq"] == item["seq"]
    other = linked["other"]
    for path in (f"/api/v1/bridges/{linked['bridge']['id']}/outbox",
                 f"/api/v1/bridges/{linked['bridge']['id']}/outbox/{item['id']}"):
        for headers in (auth(other["token"]), auth(linked["alice"].token)):
            refused = client.get(path, headers=headers)
            assert refused.status_code == 403 and refused.json()["error"]["code"] == "not_this_bridge"
    refused = client.post(f"/api/v1/bridges/{linked['bridge']['id']}/outbox/{item['id']}",
                          headers=auth(other["token"]), json={"state": "sent", "remote_id": "1"})
    assert refused.status_code == 403
    # the other bridge's own outbox exists and is empty; an item of ours is unknown there
    assert pull(client, other).json()["items"] == []
    unknown = client.post(f"/api/v1/bridges/{other['id']}/outbox/{item['id']}", headers=auth(other["token"]),
                          json={"state": "sent", "remote_id": "1"})
    assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "unknown_item"
    assert client.get(f"/api/v1/bridges/{linked['bridge']['id']}/outbox", headers=client.admin).status_code == 200


@pytest.mark.parametrize("body", [
    {}, {"state": "done"}, {"state": "sent"}, {"state": "sent", "remote_id": ""}, {"state": "failed"},
    {"state": "failed", "cause": "x", "retryable": "yes"}, {"state": "failed", "cause": "x", "retry_after_ms": -1},
    {"state": "sent", "remote_id": "1", "extra": True},
])
def test_bad_reports_are_a_400_and_change_nothing(client, linked, body):
    post(client, linked["alice"], linked["ch"], "x")
    (item,) = pull(client, linked["bridge"]).json()["items"]
    r = client.post(f"/api/v1/bridges/{linked['bridge']['id']}/outbox/{item['id']}",
                    headers=auth(linked["bridge"]["token"]), json=body)
    assert r.status_code == 400 and r.json()["error"]["code"] in ("bad_report", "bad_request")
    assert pull(client, linked["bridge"]).json()["items"] == [item]


def test_bad_pull_parameters_are_a_400(client, linked):
    for params in ({"wait_ms": "-1"}, {"wait_ms": "999999"}, {"limit": "0"}, {"after_seq": "x"}):
        assert pull(client, linked["bridge"], **params).status_code == 400


def test_reports_over_http_are_idempotent_and_a_different_outcome_is_a_409(client, linked):
    post(client, linked["alice"], linked["ch"], "x")
    (item,) = pull(client, linked["bridge"]).json()["items"]
    url = f"/api/v1/bridges/{linked['bridge']['id']}/outbox/{item['id']}"
    headers = auth(linked["bridge"]["token"])
    first = client.post(url, headers=headers, json={"state": "sent", "remote_id": "1717"})
    again = client.post(url, headers=headers, json={"state": "sent", "remote_id": "1717"})
    assert first.status_code == again.status_code == 200 and first.json() == again.json()
    other = client.post(url, headers=headers, json={"state": "failed", "cause": "late"})
    assert other.status_code == 409 and other.json()["error"]["code"] == "already_reported"


def test_the_long_poll_answers_when_an_item_arrives(client, linked, runtime):
    assert pull(client, linked["bridge"], wait_ms="50").json()["items"] == []
    answered = threading.Event()
    got: list = []

    def poll():
        got.append(pull(client, linked["bridge"], wait_ms="20000").json())
        answered.set()

    t = threading.Thread(target=poll)
    t.start()
    post(client, linked["alice"], linked["ch"], "wake the poll")
    assert answered.wait(15)
    t.join()
    assert [i["text"] for i in got[0]["items"]] == ["wake the poll"]


def test_message_reads_carry_outbound_state_and_unlinked_ones_do_not(client, linked):
    m = post(client, linked["alice"], linked["ch"], "status please")
    (item,) = pull(client, linked["bridge"]).json()["items"]
    client.post(f"/api/v1/bridges/{linked['bridge']['id']}/outbox/{item['id']}",
                headers=auth(linked["bridge"]["token"]), json={"state": "failed", "cause": "UNREGISTERED_FAILURE"})
    listed = client.get(f"/api/v1/channels/{linked['ch']}/messages", headers=auth(linked["alice"].token)).json()
    (row,) = listed["messages"]
    assert row["outbound"] == [{"bridge_id": linked["bridge"]["id"], "conversation_id": linked["conv"],
                                "kind": "send", "state": "failed", "remote_id": None,
                                "cause": "UNREGISTERED_FAILURE", "attempts": 1}]
    one = client.get(f"/api/v1/messages/{m['id']}", headers=auth(linked["alice"].token)).json()["message"]
    assert one["outbound"] == row["outbound"]
    r = client.post("/api/v1/channels", headers=auth(linked["alice"].token), json={"name": "plain"})
    plain = post(client, linked["alice"], r.json()["id"], "no links here")
    assert "outbound" not in client.get(f"/api/v1/messages/{plain['id']}",
                                        headers=auth(linked["alice"].token)).json()["message"]


def test_the_composer_is_told_where_a_post_goes(client, linked):
    r = client.get(f"/api/v1/channels/{linked['ch']}/destinations", headers=auth(linked["alice"].token))
    assert r.status_code == 200
    (d,) = r.json()["destinations"]
    assert (d["bridge_id"], d["platform"], d["conversation_id"], d["kind"]) == (
        linked["bridge"]["id"], "signal", linked["conv"], "group")
    assert client.get(f"/api/v1/channels/{linked['ch']}/destinations",
                      headers=auth(linked["bob"].token)).status_code == 404


def test_the_connector_counters_endpoint_validates(client, linked):
    url = f"/api/v1/bridges/{linked['bridge']['id']}/connector"
    headers = auth(linked["bridge"]["token"])
    assert client.post(url, headers=headers, json={"counters": {"sent": "x"}}).status_code == 400
    assert client.post(url, headers=headers, json={"counters": {"sent": 3}, "state": "connected"}).status_code == 200
    status = client.get("/api/status", headers=client.admin).json()
    assert status["bridges"][linked["bridge"]["id"]]["connector"]["counters"] == {"sent": 3}


def test_a_reaction_on_a_bridged_message_queues_a_react(client, linked, runtime):
    ours = post(client, linked["alice"], linked["ch"], "pasta at 7")
    (item,) = pull(client, linked["bridge"]).json()["items"]
    headers = auth(linked["alice"].token)
    early = client.post(f"/api/v1/messages/{ours['id']}/reactions", headers=headers, json={"emoji": "👍"})
    assert early.status_code == 400 and early.json()["error"]["code"] == "not_bridged"  # not sent yet
    client.post(f"/api/v1/bridges/{linked['bridge']['id']}/outbox/{item['id']}",
                headers=auth(linked["bridge"]["token"]), json={"state": "sent", "remote_id": "1717"})
    r = client.post(f"/api/v1/messages/{ours['id']}/reactions", headers=headers, json={"emoji": "👍"})
    assert r.status_code == 202 and r.json() == {"queued": 1}
    # a network message the link posted: the reaction targets its Signal id
    from bridgekit import signal_envelope, signal_frame

    runtime.ingest.append_body(linked["bridge"]["id"], signal_frame(signal_envelope(3_000, "dinner?")))
    runtime.ingest.drain()
    listed = client.get(f"/api/v1/channels/{linked['ch']}/messages", headers=headers).json()["messages"]
    theirs = [m for m in listed if m["text"] == "Mom: dinner?"][0]
    assert client.post(f"/api/v1/messages/{theirs['id']}/reactions", headers=headers,
                       json={"emoji": "❤️"}).status_code == 202
    reacts = [(i["kind"], i["emoji"], i["target_remote_id"]) for i in pull(client, linked["bridge"]).json()["items"]]
    # the ACI: signal-cli takes it
    assert reacts == [("react", "👍", "1717"), ("react", "❤️", "7c0d7e44-1b6a-4c55-9d0e-1f2a3b4c5d6e:3000")]
    assert client.post(f"/api/v1/messages/{theirs['id']}/reactions", headers=headers,
                       json={"emoji": ""}).status_code == 400
    assert client.post(f"/api/v1/messages/{theirs['id']}/reactions", headers=auth(linked["bob"].token),
                       json={"emoji": "x"}).status_code == 404
