"""Network time (issue 15 item 3), both backends: a message posted from a network keeps
the time it was sent there (``occurred_at_ms``) beside the hub's commit time
(``at_unix_ms``); linked channels still order by hub sequence."""

from __future__ import annotations

from helpers import auth, post_text
from test_links import append, channel_messages, setup_linked, signal_frame, world  # noqa: F401 (fixture)

ADMIN = "tdg_test_admin"


def test_a_linked_message_keeps_its_network_time_and_the_channel_keeps_hub_order(world, client):  # noqa: F811
    alice, assistant, ch, bridge, _ = setup_linked(world)
    world.rt.clock.set(1_800_000_000_000)
    append(world, bridge, signal_frame(1_717_000_005_000, text="sent second, arrives first"))
    world.rt.clock.advance(60_000)
    append(world, bridge, signal_frame(1_717_000_001_000, text="sent first, arrives late"))
    rows = channel_messages(world, ch)
    assert [(m["text"], m["occurred_at_ms"]) for m in rows] == [
        ("Mom: sent second, arrives first", 1_717_000_005_000),
        ("Mom: sent first, arrives late", 1_717_000_001_000),
    ]
    assert [m["at_unix_ms"] for m in rows] == [1_800_000_000_000, 1_800_000_060_000]
    # the API shows both times; seq is the hub's order
    r = client.get(f"/api/v1/channels/{ch}/messages", headers=auth(ADMIN))
    assert r.status_code == 200, r.text
    api = r.json()["messages"]
    assert [(m["seq"], m["occurred_at_ms"], m["at_unix_ms"]) for m in api] == [
        (1, 1_717_000_005_000, 1_800_000_000_000), (2, 1_717_000_001_000, 1_800_000_060_000)]
    one = client.get(f"/api/v1/messages/{api[1]['id']}", headers=auth(ADMIN)).json()["message"]
    assert one["occurred_at_ms"] == 1_717_000_001_000


def test_a_message_written_in_the_hub_has_no_network_time(client):
    r = client.post("/api/v1/accounts", json={"kind": "human", "handle": "hana"}, headers=auth(ADMIN))
    hana = r.json()
    ch = client.post("/api/v1/channels", json={"name": "notes", "members": []}, headers=auth(hana["token"])).json()
    m = post_text(client, hana["token"], ch["id"], "plain hub message")
    assert "occurred_at_ms" not in m
    (listed,) = client.get(f"/api/v1/channels/{ch['id']}/messages", headers=auth(hana["token"])).json()["messages"]
    assert "occurred_at_ms" not in listed and listed["at_unix_ms"] == m["at_unix_ms"]
