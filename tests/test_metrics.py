"""``GET /metrics`` (issue 14 item 6), both backends: admin only, Prometheus text with the
durable figures (backlog, quarantined, owed) equal to the store's, the process counters
and both latency histograms."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from helpers import auth, create_account, create_channel, post_text

FRAME = {"codec": "signal.jsonrpc", "codec_version": 1, "dedupe_key": "k1", "payload": {
    "jsonrpc": "2.0", "method": "receive", "params": {"account": "+14155550100", "envelope": {
        "source": "+14155550177", "sourceNumber": "+14155550177", "sourceName": "Sam",
        "timestamp": 1_717_000_000_000,
        "dataMessage": {"timestamp": 1_717_000_000_000, "message": "hello"}}}}}


def _samples(text: str) -> dict[tuple[str, tuple], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def test_metrics_are_admin_only_and_carry_durable_and_process_figures(client, runtime):
    runtime.start()
    admin = "tdg_test_admin"
    alice = create_account(client, "human", "alice", admin_token=admin)
    online = create_account(client, "agent", "online", admin_token=admin, owner=alice["id"])
    offline = create_account(client, "agent", "offline", admin_token=admin, owner=alice["id"])
    room = create_channel(client, alice["token"], "room", [online["id"], offline["id"]])
    session = runtime.delivery.connect(online["id"])
    runtime.delivery.wait_idle()
    post_text(client, alice["token"], room, "@online @offline look")
    runtime.delivery.wait_idle()
    bridge = client.post("/api/v1/bridges", json={"platform": "signal", "name": "p", "owner": alice["id"]},
                         headers=client.admin).json()
    r = client.post(f"/api/v1/bridges/{bridge['id']}/frames", json=FRAME, headers=auth(bridge["token"]))
    assert r.status_code == 202, r.text
    r = client.post(f"/api/v1/bridges/{bridge['id']}/frames",
                    json={**FRAME, "dedupe_key": "k2", "payload": {"jsonrpc": "2.0", "method": "receive", "params": 7}},
                    headers=auth(bridge["token"]))
    assert r.status_code == 202, r.text
    runtime.ingest.drain()

    assert client.get("/metrics").status_code == 401
    assert client.get("/metrics", headers=auth(alice["token"])).status_code == 403
    r = client.get("/metrics", headers=client.admin)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    s = _samples(r.text)
    assert s[("tidings_delivery_owed", ())] == 2  # both mentions, neither acked yet
    assert s[("tidings_ingest_quarantined", (("bridge_id", bridge["id"]),))] == 1
    assert ("tidings_ingest_backlog", (("bridge_id", bridge["id"]),)) not in s or \
        s[("tidings_ingest_backlog", (("bridge_id", bridge["id"]),))] == 0
    assert s[("tidings_delivery_steered_total", ())] >= 1
    assert s[("tidings_delivery_live_sessions", ())] == 1
    assert s[("tidings_post_to_dispatch_seconds_count", ())] >= 1
    assert s[("tidings_frame_apply_seconds_count", ())] >= 2
    assert s[("tidings_ingest_projected_total", (("bridge_id", bridge["id"]),))] >= 1
    runtime.delivery.disconnect(session, "client_closed")
