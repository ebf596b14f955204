"""Two nodes ingesting the same bridges concurrently end with the store a single-node
replay of the same corpus gives (``tidings replay compare``), modulo what a live run cannot
share with a replay: clock-derived times, inbox ids, tokens and accounts of the hub."""

from __future__ import annotations

import json
import subprocess
import threading

import psycopg
from cluster_harness import TIDINGS, Cluster, create_database, drop_database, until

from tidings.hub.tokens import issue_token
from tidings.replay.harness import create_bridges, replay_account_id
from tidings.store.engine import Store

CODEC_PLATFORM = {"google.json": "google", "signal.jsonrpc": "signal", "whatsapp.event": "whatsapp"}
TIME_COLUMNS = [
    f"{table}.{column}"
    for table in ("bridges", "bridge_messages", "conversations", "identities", "reactions", "reaction_fences",
                  "read_cursors", "conversation_participants", "channels", "topics", "messages", "bridge_links")
    for column in ("created_at_ms", "updated_at_ms")
] + ["reactions.source_seq_ms", "reactions.occurred_at_ms", "reaction_fences.source_seq_ms"]
NOT_SHARED = ["accounts", "api_tokens", "inbox", "schema_migrations", "cluster_nodes", "cluster_sessions"]


def _unprocessed(url: str) -> int:
    with psycopg.connect(url) as conn:
        return conn.execute("SELECT count(*) FROM inbox WHERE processed_at_ms IS NULL").fetchone()[0]


def _columns(url: str) -> set[str]:
    with psycopg.connect(url) as conn:
        return {f"{t}.{c}" for t, c in conn.execute(
            "SELECT table_name, column_name FROM information_schema.columns WHERE table_schema = 'public'")}


def test_two_nodes_ingesting_one_bridge_concurrently_equal_a_single_node_replay(cluster: Cluster, tmp_path):
    corpus = tmp_path / "corpus.jsonl"
    made = subprocess.run([str(TIDINGS), "corpus", "synth", "--frames", "200", "--seed", "3", "-o", str(corpus)],
                          capture_output=True, text=True, timeout=120)
    assert made.returncode == 0, made.stderr
    single = create_database()
    try:
        replayed = subprocess.run([str(TIDINGS), "replay", str(corpus), "--out", single, "--metrics",
                                   str(tmp_path / "metrics.json")], capture_output=True, text=True, timeout=300)
        assert replayed.returncode == 0, replayed.stderr
        store = Store(cluster.db_url)  # the replay's bridges (same derived ids), with tokens
        bridges = create_bridges(store)
        with store.write() as tx:
            tokens = {p: issue_token(tx, scope="bridge", account_id=replay_account_id(p), bridge_id=b,
                                     now=store.now_ms()) for p, b in bridges.items()}
        store.dispose()
        a, b = cluster.start(2)
        frames = [json.loads(line) for line in corpus.read_text().splitlines() if line.strip()]
        per_bridge: dict[str, list[dict]] = {}
        for frame in frames:
            per_bridge.setdefault(CODEC_PLATFORM.get(frame.get("codec"), "signal"), []).append(frame)
        failures: list[str] = []

        def feed(platform: str, items: list[dict]) -> None:
            # one bridge's frames in corpus order, alternately on each node
            for i, frame in enumerate(items):
                r = (a, b)[i % 2].http.post(f"/api/v1/bridges/{bridges[platform]}/frames", json=frame,
                                            headers={"Authorization": f"Bearer {tokens[platform]}"})
                if r.status_code != 202:
                    failures.append(f"{platform} {i}: {r.status_code} {r.text[:200]}")

        feeders = [threading.Thread(target=feed, args=item) for item in per_bridge.items()]
        for t in feeders:
            t.start()
        for t in feeders:
            t.join(120)
        assert failures == []
        until(lambda: _unprocessed(cluster.db_url) == 0, 60, what="every frame processed")
        ignore = [c for c in TIME_COLUMNS if c in _columns(single)] + NOT_SHARED
        args = [str(TIDINGS), "replay", "compare", single, cluster.db_url, "--report", str(tmp_path / "diff.json")]
        for item in ignore:
            args += ["--ignore", item]
        compared = subprocess.run(args, capture_output=True, text=True, timeout=300)
        assert compared.returncode == 0, compared.stdout[-3000:]
    finally:
        drop_database(single)
