"""Bridge HTTP routes on both backends (CONTRACT §2 Bridges, §4): every error class is a 4xx."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers import auth
from tidings.store import inbox as inbox_store

SAMPLE = Path(__file__).parent / "fixtures" / "signal_sample.jsonl"


def error_of(r):
    body = r.json()
    assert set(body) == {"error"} and {"code", "message"} <= set(body["error"]), body
    return body["error"]["code"]


def make_human(client, handle):
    r = client.post("/api/v1/accounts", json={"kind": "human", "handle": handle}, headers=client.admin)
    assert r.status_code == 201, r.text
    return r.json()


def make_bridge(client, platform="signal", name="Alice's phone", owner=None):
    body = {"platform": platform, "name": name}
    if owner is not None:
        body["owner"] = owner
    r = client.post("/api/v1/bridges", json=body, headers=client.admin)
    assert r.status_code == 201, r.text
    return r.json()


def frame(n=0, key=None, codec="signal.jsonrpc", payload=None):
    return {
        "codec": codec,
        "codec_version": 1,
        "dedupe_key": f"k{n}" if key is None else key,
        "payload": payload if payload is not None else {"n": n},
    }


def backlog(runtime):
    with runtime.store.read() as tx:
        return inbox_store.backlog(tx)


# -- create ---------------------------------------------------------------------------------------
def test_admin_creates_a_bridge_with_its_account_and_a_hashed_token(client, runtime):
    alice = make_human(client, "alice")
    body = make_bridge(client, owner=alice["id"])
    assert body["id"].startswith("br_") and body["token"].startswith("tdg_")
    assert body["platform"] == "signal" and body["owner"] == alice["id"]
    assert body["handle"] == "signal-alice-s-phone"
    with runtime.store.read() as tx:
        hashes = [r[0] for r in tx.raw("SELECT token_hash FROM api_tokens WHERE scope = 'bridge'").fetchall()]
        kind = tx.raw(
            "SELECT kind FROM accounts WHERE id = " + ("?" if runtime.store.dialect == "sqlite" else "%s"),
            (body["account_id"],),
        ).fetchone()[0]
    assert body["token"] not in hashes and len(hashes) == 1 and kind == "system"
    me = client.get("/api/v1/me", headers=auth(body["token"])).json()
    assert me["scope"] == "bridge" and me["bridge_id"] == body["id"]


def test_bridge_handles_are_valid_and_unique(client):
    a = make_bridge(client, name="Phone")
    b = make_bridge(client, name="phone")
    c = make_bridge(client, platform="google", name="😀 !!")
    assert (a["handle"], b["handle"], c["handle"]) == ("signal-phone", "signal-phone-2", "google-bridge")


@pytest.mark.parametrize(
    "body,status,code",
    [
        ({"platform": "telegram", "name": "x"}, 400, "bad_platform"),
        ({"platform": "signal"}, 400, "bad_name"),
        ({"platform": "signal", "name": "   "}, 400, "bad_name"),
        ({"platform": "signal", "name": "x", "owner": "acc_nope"}, 404, "unknown_owner"),
        ({"platform": "signal", "name": "x", "owner": 5}, 400, "bad_owner"),
        ({"platform": "signal", "name": "x", "colour": "red"}, 400, "bad_request"),
    ],
)
def test_bad_bridge_requests(client, body, status, code):
    r = client.post("/api/v1/bridges", json=body, headers=client.admin)
    assert r.status_code == status and error_of(r) == code


def test_only_admin_creates_bridges_and_owner_must_be_human(client):
    alice = make_human(client, "alice")
    r = client.post("/api/v1/bridges", json={"platform": "signal", "name": "x"}, headers=auth(alice["token"]))
    assert r.status_code == 403
    agent = client.post(
        "/api/v1/accounts", json={"kind": "agent", "handle": "bot", "owner": alice["id"]}, headers=client.admin
    ).json()
    r = client.post("/api/v1/bridges", json={"platform": "signal", "name": "x", "owner": agent["id"]}, headers=client.admin)
    assert r.status_code == 400 and error_of(r) == "bad_owner"


# -- frames ---------------------------------------------------------------------------------------
def test_frames_are_committed_before_202_and_duplicates_replay(client, runtime):
    runtime.ingest.apply_on_append = False  # the pure worker path: frames wait in the inbox
    br = make_bridge(client)
    r = client.post(f"/api/v1/bridges/{br['id']}/frames", json=frame(1), headers=auth(br["token"]))
    assert r.status_code == 202, r.text
    [res] = r.json()["results"]
    assert res["replay"] is False
    with runtime.store.read() as tx:  # durable the moment the answer arrived
        assert inbox_store.frame_state(tx, res["inbox_id"])["bridge_id"] == br["id"]
    r = client.post(
        f"/api/v1/bridges/{br['id']}/frames",
        json={"frames": [frame(1), frame(2), frame(3, key=""), frame(1, payload={"n": "changed"})]},
        headers=auth(br["token"]),
    )
    assert r.status_code == 202
    results = r.json()["results"]
    assert results[0] == {"inbox_id": res["inbox_id"], "replay": True}
    assert results[1]["replay"] is False and results[2]["replay"] is False
    assert results[3] == {"inbox_id": res["inbox_id"], "replay": True}
    counters = runtime.ingest.status()["per_bridge"][br["id"]]
    assert (counters["appended"], counters["deduped"], counters["stale_replays"]) == (3, 2, 1)
    assert backlog(runtime) == 3


def test_frames_need_this_bridges_own_token(client):
    alice = make_human(client, "alice")
    one, two = make_bridge(client, name="one"), make_bridge(client, name="two")
    url = f"/api/v1/bridges/{one['id']}/frames"
    assert client.post(url, json=frame()).status_code == 401
    r = client.post(url, json=frame(), headers=auth(two["token"]))
    unknown = client.post("/api/v1/bridges/br_nope/frames", json=frame(), headers=auth(two["token"]))
    # A foreign bridge looks exactly like one that does not exist.
    assert r.status_code == unknown.status_code == 404
    assert r.json()["error"]["message"].replace(one["id"], "br_nope") == unknown.json()["error"]["message"]
    for token in (alice["token"], "tdg_test_admin"):
        r = client.post(url, json=frame(), headers=auth(token))
        assert r.status_code == 403 and error_of(r) == "bridge_only"


@pytest.mark.parametrize(
    "body,needle",
    [
        ({"frames": [frame(0), {"codec": "signal.jsonrpc", "codec_version": 1, "payload": {}}]}, "frame 1: dedupe_key"),
        ({"frames": []}, "non-empty"),
        ({"frames": [frame(0)], "extra": 1}, "only"),
        ({"frames": [frame(0), 7]}, "frame 1: must be a JSON object"),
        ({"frames": [frame(0, codec="google.json")]}, "frame 0: codec 'google.json' carries google frames"),
        (frame(0) | {"codec_version": "1"}, "frame 0: codec_version"),
        ([frame(0)], "frame object"),
    ],
)
def test_malformed_frames_are_400_and_append_nothing(client, runtime, body, needle):
    br = make_bridge(client)
    r = client.post(f"/api/v1/bridges/{br['id']}/frames", json=body, headers=auth(br["token"]))
    assert r.status_code == 400, r.text
    assert needle in r.json()["error"]["message"]
    assert backlog(runtime) == 0


@pytest.mark.parametrize(
    "raw",
    [b"", b"{nope", b"[" * 100_000, b"\xff\xfe", "\"\ud800\"".encode("utf-8", "surrogatepass"),
     b'{"codec": "signal.jsonrpc", "codec_version": 1, "dedupe_key": "", "payload": "\\ud800"}'],
)
def test_unparseable_bodies_are_400(client, raw):
    br = make_bridge(client)
    r = client.post(
        f"/api/v1/bridges/{br['id']}/frames", content=raw,
        headers={**auth(br["token"]), "Content-Type": "application/json"},
    )
    assert r.status_code == 400 and error_of(r) in ("bad_json", "bad_frame")


def test_oversized_frames_are_413(client, runtime):
    br = make_bridge(client)
    url = f"/api/v1/bridges/{br['id']}/frames"
    big = frame(0, payload={"blob": "x" * (1024 * 1024 + 10)})
    r = client.post(url, json=big, headers=auth(br["token"]))
    assert r.status_code == 413 and error_of(r) == "too_large"
    runtime.ingest.max_frame_bytes = 1000
    r = client.post(url, json={"frames": [frame(0), frame(1, payload={"blob": "y" * 2000})]}, headers=auth(br["token"]))
    assert r.status_code == 413 and error_of(r) == "frame_too_large" and "frame 1" in r.text
    assert backlog(runtime) == 0


# -- quarantine, listing, status ---------------------------------------------------------------------
def test_quarantine_lists_frames_with_their_cause_to_admin_and_owner_only(client, runtime):
    alice, bob = make_human(client, "alice"), make_human(client, "bob")
    br = make_bridge(client, owner=alice["id"])
    r = client.post(
        f"/api/v1/bridges/{br['id']}/frames",
        json={"frames": [frame(0, codec="signal.future"), frame(1, payload={"not": "signal-cli"})]},
        headers=auth(br["token"]),
    )
    assert r.status_code == 202
    ids = [x["inbox_id"] for x in r.json()["results"]]
    runtime.ingest.drain()
    url = f"/api/v1/bridges/{br['id']}/quarantine"
    for token in ("tdg_test_admin", alice["token"]):
        r = client.get(url, headers=auth(token))
        assert r.status_code == 200, r.text
        frames = r.json()["frames"]
        assert sorted(f["inbox_id"] for f in frames) == sorted(ids)
        assert {f["codec"] for f in frames} == {"signal.future", "signal.jsonrpc"}
        assert all(f["cause"] and f["received_at_ms"] > 0 for f in frames)
        assert any("unknown codec" in f["cause"] for f in frames)
    assert client.get(url, headers=auth(bob["token"])).status_code == 404
    assert client.get(url, headers=auth(br["token"])).status_code == 403
    assert client.get(url + "?limit=0", headers=client.admin).status_code == 400
    assert runtime.ingest.status()["per_bridge"][br["id"]]["quarantined"] == 2


def test_listing_bridges_by_role(client):
    alice, bob = make_human(client, "alice"), make_human(client, "bob")
    mine = make_bridge(client, owner=alice["id"])
    make_bridge(client, platform="whatsapp", name="ops")
    r = client.get("/api/v1/bridges", headers=client.admin)
    assert r.status_code == 200 and len(r.json()["bridges"]) == 2
    assert "counters" in r.json()["bridges"][0] and "token" not in r.json()["bridges"][0]
    assert [b["id"] for b in client.get("/api/v1/bridges", headers=auth(alice["token"])).json()["bridges"]] == [mine["id"]]
    assert client.get("/api/v1/bridges", headers=auth(bob["token"])).json()["bridges"] == []
    assert client.get(f"/api/v1/bridges/{mine['id']}", headers=auth(bob["token"])).status_code == 404
    assert client.get(f"/api/v1/bridges/{mine['id']}", headers=auth(alice["token"])).json()["id"] == mine["id"]


def test_status_carries_the_ingest_section(client, runtime):
    runtime.ingest.apply_on_append = False  # the pure worker path: the frame waits in the inbox
    br = make_bridge(client)
    client.post(f"/api/v1/bridges/{br['id']}/frames", json=frame(0), headers=auth(br["token"]))
    status = client.get("/api/status", headers=client.admin).json()["ingest"]
    assert status["backlog"] == 1 and status["deferred_now"] == 0
    counters = status["per_bridge"][br["id"]]
    for name in ("appended", "deduped", "decoded_events", "projected", "quarantined", "deferred", "stale_replays",
                 "reactions_applied", "reactions_removed", "reactions_orphaned", "mutations"):
        assert name in counters
    assert counters["appended"] == 1


def test_running_hub_applies_frames_posted_over_http(client, runtime):
    br = make_bridge(client)
    frames = [json.loads(line) for line in SAMPLE.read_text().splitlines() if line.strip()]
    runtime.start()
    r = client.post(f"/api/v1/bridges/{br['id']}/frames", json={"frames": frames}, headers=auth(br["token"]))
    assert r.status_code == 202
    assert runtime.ingest.worker.wait_for(lambda: backlog(runtime) == 0)
    counters = client.get("/api/status", headers=client.admin).json()["ingest"]["per_bridge"][br["id"]]
    assert counters["projected"] + counters["quarantined"] == len(frames)
    assert counters["quarantined"] == 0, client.get(f"/api/v1/bridges/{br['id']}/quarantine", headers=client.admin).json()


def test_a_restarted_hub_drains_what_the_previous_one_accepted(client, runtime, backend_url, clock, faults):
    from tidings.runtime import Runtime

    runtime.ingest.apply_on_append = False  # the pure worker path: the batch waits in the inbox
    br = make_bridge(client)
    frames = [json.loads(line) for line in SAMPLE.read_text().splitlines() if line.strip()]
    r = client.post(f"/api/v1/bridges/{br['id']}/frames", json={"frames": frames}, headers=auth(br["token"]))
    assert r.status_code == 202 and backlog(runtime) == len(frames)
    runtime.stop()  # "crash" with the whole batch accepted (202) and nothing applied
    again = Runtime(backend_url, clock=clock, faults=faults, admin_token="tdg_test_admin")
    try:
        again.start()
        assert again.ingest.worker.wait_for(lambda: backlog(again) == 0)
        assert again.ingest.status()["per_bridge"][br["id"]]["projected"] == len(frames)
    finally:
        again.stop()


def test_demo_seeds_alices_signal_bridge_and_its_frames_apply(client, runtime):
    from tidings.demo import seed_demo
    from tidings.ingest.demo import DEMO_BRIDGE_TOKEN

    seed_demo(runtime, "http://127.0.0.1:7860")
    [bridge] = client.get("/api/v1/bridges", headers=client.admin).json()["bridges"]
    alice = client.get("/api/v1/me", headers=auth("tdg_demo_alice")).json()["account"]
    assert bridge["platform"] == "signal" and bridge["owner"] == alice["id"]
    runtime.start()
    assert runtime.ingest.worker.wait_for(lambda: backlog(runtime) == 0)
    counters = runtime.ingest.status()["per_bridge"][bridge["id"]]
    assert counters["projected"] == counters["appended"] > 5 and counters["quarantined"] == 0
    assert counters["mutations"] == 1 and counters["reactions_applied"] == 2
    r = client.post(f"/api/v1/bridges/{bridge['id']}/frames", json=frame(99), headers=auth(DEMO_BRIDGE_TOKEN))
    assert r.status_code == 202
