"""The replay harness (issue 5 items 2, 3, 6): a small synthetic corpus through the real
ingest on both backends, the metrics file's shape (CONTRACT §6), nothing left unprocessed,
the stuck-backlog run and its restart, and the table-by-table comparison.

Speed is never asserted here; the counts are (they are deterministic).
"""

from __future__ import annotations

import io
import json
import os
import secrets
import sqlite3
from pathlib import Path

import pytest
from rich.console import Console

from tidings.replay.cli import run_replay
from tidings.replay.synth import synthesize

pytestmark = pytest.mark.slow

FRAMES = 2000
SEED = 7
CONTRACT_KEYS = {
    "frames", "wall_ms", "per_codec", "row_writes", "row_writes_total", "commits", "wal_bytes",
    "unprocessed_after", "quarantined", "counters",
}
STUCK_KEYS = {"stuck_frames", "stuck_decodes", "later_frame_drain_ms_avg", "unprocessed_after_restart"}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("corpus") / "c2k.jsonl"
    path.write_text("\n".join(synthesize(FRAMES, SEED).lines) + "\n", encoding="utf-8")
    return path


def run(*args: str, **options) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = run_replay(
        list(args), out=Console(file=out, width=200), err=Console(file=err, width=200), **options
    )
    return code, out.getvalue(), err.getvalue()


PG_ADMIN_URL = os.environ.get("TIDINGS_TEST_PG", "postgresql://postgres@127.0.0.1:5432/postgres")


def _pg_admin():
    import psycopg

    return psycopg.connect(PG_ADMIN_URL, autocommit=True, connect_timeout=5)


@pytest.fixture
def fresh_pg():
    """A new, empty PostgreSQL database (the replay refuses a non-empty one); dropped after."""
    names = []

    def make() -> str:
        name = f"tidings_replay_{secrets.token_hex(4)}"
        with _pg_admin() as admin:
            admin.execute(f'CREATE DATABASE "{name}"')
        names.append(name)
        return f"{PG_ADMIN_URL.rsplit('/', 1)[0]}/{name}"

    yield make
    if names:
        with _pg_admin() as admin:
            for name in names:
                admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s", (name,))
                admin.execute(f'DROP DATABASE IF EXISTS "{name}"')


@pytest.fixture(params=["sqlite", "postgres"])
def target(request, tmp_path, fresh_pg):
    """Where a replay writes: a new SQLite path or a new PostgreSQL database."""
    if request.param == "sqlite":
        return lambda name="store.db": str(tmp_path / name)
    return lambda name=None: fresh_pg()


def check_shape(m: dict, frames: int) -> None:
    assert CONTRACT_KEYS <= set(m), CONTRACT_KEYS - set(m)
    assert m["frames"] == frames
    assert isinstance(m["wall_ms"], float) and m["wall_ms"] > 0
    assert sum(c["frames"] for c in m["per_codec"].values()) == frames - m["rejected"]
    for codec, c in m["per_codec"].items():
        assert set(c) >= {"frames", "p50_ms", "p95_ms", "max_ms"}, codec
        assert 0 <= c["p50_ms"] <= c["p95_ms"] <= c["max_ms"]
    for table, ops in m["row_writes"].items():
        assert set(ops) == {"insert", "update", "delete"}, table
        assert all(isinstance(n, int) and n >= 0 for n in ops.values())
    assert m["row_writes_total"] == sum(sum(ops.values()) for ops in m["row_writes"].values())
    assert isinstance(m["commits"], int) and isinstance(m["wal_bytes"], int) and m["wal_bytes"] > 0
    if m["backend"] == "postgresql":  # this database's records, within the cluster's WAL
        assert m["wal_bytes"] <= m["wal_bytes_cluster"]
    assert isinstance(m["counters"], dict) and set(m["counters"]) == set(m["bridges"].values())
    assert {"projected", "quarantined", "appended"} <= set(next(iter(m["counters"].values())))


# -- the replay --------------------------------------------------------------------------------
def test_replay_writes_the_contract_metrics_and_leaves_nothing_unprocessed(corpus, target, tmp_path):
    metrics = tmp_path / "m.json"
    code, out, err = run(str(corpus), out_store=target(), metrics=metrics)
    assert code == 0, err
    m = json.loads(metrics.read_text())
    check_shape(m, FRAMES)
    assert m["unprocessed_after"] == 0
    # Every frame is stored once: applied, quarantined (the corpus's malformed frames and
    # unknown codecs), or a duplicate of a stored dedupe key; none is rejected at the edge.
    assert m["rejected"] == 0 and m["quarantined"] > 0
    assert m["applied"] + m["quarantined"] + m["deduplicated"] == FRAMES
    assert m["row_writes"]["inbox"]["insert"] == m["applied"] + m["quarantined"]
    # Apply on append: one commit per stored frame, the inbox row written once.
    assert m["commits"] == FRAMES and m["row_writes"]["inbox"]["update"] == 0
    # The minimal-write oracle: every row write changed something.
    assert m["wasted_row_writes"] == 0 and m["writes_over_minimal"] == 1.0, m["write_oracle"]
    assert "frames/s" in out and "per codec" in out


def test_worker_only_replay_writes_the_same_rows_with_two_commits_per_frame(corpus, tmp_path):
    """The pure worker path is the reference for apply on append: same rows, more commits."""
    fast, slow = tmp_path / "fast.db", tmp_path / "slow.db"
    assert run(str(corpus), out_store=str(fast), metrics=tmp_path / "f.json")[0] == 0
    code, _, err = run(str(corpus), out_store=str(slow), metrics=tmp_path / "s.json", apply_on_append=False)
    assert code == 0, err
    m = json.loads((tmp_path / "s.json").read_text())
    stored = m["applied"] + m["quarantined"]
    assert m["commits"] == FRAMES + stored  # the append, then the drain's commit per stored frame
    assert m["row_writes"]["inbox"]["update"] == stored and m["writes_over_minimal"] == 1.0
    code, out, _ = run("compare", str(fast), str(slow))
    assert code == 0, out
    assert "identical" in out


def test_stuck_frames_cost_later_frames_little_and_nothing_stays_after_restart(corpus, target, tmp_path):
    metrics = tmp_path / "stuck.json"
    code, out, err = run(str(corpus), out_store=target(), metrics=metrics, stuck=3, limit=600)
    assert code == 0, err
    m = json.loads(metrics.read_text())
    check_shape(m, 600)
    assert STUCK_KEYS <= set(m)
    assert m["stuck_frames"] == 3 and m["unprocessed_after"] == 3
    assert m["unprocessed_after_restart"] == 0 and m["restart_applied"] == 3
    # A stuck frame fails once on append (then the drain takes it), unless an older frame
    # held its bridge up; then its first failing round is 4 attempts (ATTEMPTS), 5/10/20 ms
    # apart, and every later round (a retry of a backed-off frame) one attempt, no sleep;
    # each attempt decodes once. The backoff keeps the rounds far fewer than one per stuck
    # frame per later frame (the cost without it).
    google = m["counters"][m["bridges"]["google"]]
    rounds = google["deferred"]
    assert 1 <= google["left_for_worker"] <= 3
    assert m["stuck_decodes"] == 4 * 3 + (rounds - 3) + google["left_for_worker"]
    assert 3 <= rounds < 3 * m["later_frames"] / 5
    assert m["later_frames"] == 600 - 1 - max(m["stuck_lines"])
    assert m["retry_sleeps"]["requested_ms"] == pytest.approx(35.0 * 3)
    # The worker is pumped as its thread is woken: a retry timer due by a frame's time fires
    # before that frame is appended, so no later frame waits behind a stuck frame's retry
    # round: every Google frame that applied was applied on append.
    assert google["projected"] == google["applied_on_append"] > 0
    assert "unprocessed after restart" in out


def test_beside_the_stuck_fault_a_frame_that_is_not_stuck_costs_what_it_costs_without_it(store, clock, faults):
    """The stuck fault wraps the real projection, so a frame it does not fail is projected
    in the request's batch as in production (the seam's ``batches``): the same statements
    and round trips as with no fault; a stuck frame is left for the drain, counted."""
    from bridgekit import signal_envelope, signal_frame
    from tidings.bridges.registry import create_bridge
    from tidings.ingest.engine import Ingest
    from tidings.replay.harness import Contention, ReplayInboxIds, StuckFault

    def body(n: int) -> dict:
        return signal_frame(signal_envelope(1_700_000_000_000 + n, f"message {n}"))

    contention = Contention(store)
    fault = StuckFault(contention)
    ids = ReplayInboxIds()
    stuck_next = []
    ids.minted = lambda inbox_id: fault.ids.add(inbox_id) if stuck_next else None
    faulted = Ingest(store=store, faults=faults, clock=clock, project=fault, inbox_ids=ids, sleep=lambda _s: None)
    plain = Ingest(store=store, faults=faults, clock=clock)
    try:
        costs = {}
        for name, ingest in (("plain", plain), ("faulted", faulted)):
            bridge = create_bridge(store, platform="signal", name=name)["id"]
            ingest.append_body(bridge, body(0), "signal")  # first sighting: reads the bridge, mints rows
            before = store.meter.snapshot()
            [res] = ingest.append_body(bridge, body(1), "signal")
            after = store.meter.snapshot()
            assert not res.replay
            costs[name] = {k: after[k] - before[k] for k in after}
        assert costs["faulted"] == costs["plain"]
        if store.dialect == "postgresql":
            assert costs["plain"]["round_trips"] == 2
        # A stuck frame still fails on every attempt with a real transient error: apply on
        # append leaves it for the drain (counted), whose attempts fail it too.
        stuck_next.append(True)
        [res] = faulted.append_body(bridge, body(2), "signal")
        assert res.inbox_id in fault.ids and fault.decodes == 1
        counters = faulted.counters.of(bridge).snapshot()
        assert counters["left_for_worker"] == 1 and counters["projected"] == 2
        faulted.worker.drain_if_due()
        assert fault.decodes == 5 and len(faulted.worker.retries) == 1
    finally:
        faulted.stop()
        plain.stop()
        contention.close()


def test_stuck_frames_may_fail_after_their_whole_projection(corpus, tmp_path):
    """``--stuck-at projected``: each attempt projects, then fails; the restart still
    leaves nothing unprocessed, and no stuck frame's rows were committed before it."""
    db = tmp_path / "p.db"
    code, _, err = run(str(corpus), out_store=str(db), metrics=tmp_path / "p.json", stuck=2, limit=300,
                       stuck_at="projected")
    assert code == 0, err
    m = json.loads((tmp_path / "p.json").read_text())
    assert m["stuck_at"] == "projected" and m["unprocessed_after_restart"] == 0
    google = m["counters"][m["bridges"]["google"]]
    assert m["stuck_decodes"] == 4 * 2 + (google["deferred"] - 2) + google["left_for_worker"]
    # Before the restart (when the metrics were taken) only the other frames had committed.
    assert m["unprocessed_after"] == 2 and m["restart_applied"] == 2
    assert google["projected"] == m["applied"] - sum(
        c["projected"] for b, c in m["counters"].items() if b != m["bridges"]["google"]
    )


# -- compare ------------------------------------------------------------------------------------
def test_compare_reports_rows_only_in_one_store_and_differing_cells(corpus, tmp_path):
    a, b, c = tmp_path / "a.db", tmp_path / "b.db", tmp_path / "c.db"
    for path, limit in ((a, 400), (b, 400), (c, 390)):
        assert run(str(corpus), out_store=str(path), metrics=tmp_path / f"{path.stem}.json", limit=limit)[0] == 0
    code, out, _ = run("compare", str(a), str(b), report=tmp_path / "same.json")
    assert code == 0 and json.loads((tmp_path / "same.json").read_text())["identical"] is True

    code, out, _ = run("compare", str(a), str(c), report=tmp_path / "fewer.json")
    report = json.loads((tmp_path / "fewer.json").read_text())
    assert code == 1 and report["identical"] is False
    assert report["tables"]["inbox"]["only_a"] > 0 and report["tables"]["inbox"]["only_b"] == 0

    # One changed cell and one newer timestamp in B.
    with sqlite3.connect(b) as conn:
        conn.execute("UPDATE bridge_messages SET body = body || '!' WHERE id = (SELECT min(id) FROM bridge_messages)")
        conn.execute("UPDATE identities SET updated_at_ms = updated_at_ms + 5 WHERE id = (SELECT min(id) FROM identities)")
    code, out, _ = run("compare", str(a), str(b), report=tmp_path / "cell.json")
    report = json.loads((tmp_path / "cell.json").read_text())
    assert code == 1
    assert report["tables"]["bridge_messages"]["differing_cells"] == {"body": 1}
    assert report["tables"]["identities"]["differing_cells"] == {"updated_at_ms": 1}
    example = report["tables"]["bridge_messages"]["examples"][0]
    assert example["a_b"]["body"][1] == example["a_b"]["body"][0] + "!"
    # Ignored columns leave the verdict but are tallied (equal / b_older / b_newer / other).
    code, out, _ = run("compare", str(a), str(b), ignore=["bridge_messages.body", "identities.updated_at_ms"],
                       report=tmp_path / "ign.json")
    report = json.loads((tmp_path / "ign.json").read_text())
    assert code == 0 and report["identical"] is True
    tally = report["tables"]["identities"]["ignored"]["updated_at_ms"]
    assert tally["b_newer"] == 1 and tally["b_older"] == 0 and tally["equal"] == report["tables"]["identities"]["rows_a"] - 1
    assert report["tables"]["bridge_messages"]["ignored"]["body"]["other"] == 1


def test_sqlite_and_postgres_replays_of_one_corpus_are_identical(corpus, tmp_path, fresh_pg):
    db, url = tmp_path / "s.db", fresh_pg()
    assert run(str(corpus), out_store=str(db), metrics=tmp_path / "s.json", limit=500)[0] == 0
    assert run(str(corpus), out_store=url, metrics=tmp_path / "p.json", limit=500)[0] == 0
    code, out, _ = run("compare", str(db), url, ignore=["schema_migrations.checksum"])
    assert code == 0, out


# -- refusals -----------------------------------------------------------------------------------
def test_replay_refuses_an_existing_store_and_bad_usage(corpus, tmp_path, fresh_pg):
    existing = tmp_path / "there.db"
    existing.write_bytes(b"")
    code, _, err = run(str(corpus), out_store=str(existing), metrics=tmp_path / "m.json")
    assert code == 1 and "already exists" in err
    url = fresh_pg()
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE TABLE something (x int)")
    code, _, err = run(str(corpus), out_store=url, metrics=tmp_path / "m.json")
    assert code == 1 and "not empty" in err
    assert run(str(corpus), metrics=tmp_path / "m.json")[0] == 2  # no --out
    assert run(str(tmp_path / "missing.jsonl"), out_store=str(tmp_path / "x.db"), metrics=tmp_path / "m.json")[0] == 2
    assert run("compare", str(existing))[0] == 2
    assert run("compare", "a", "b", stuck=2)[0] == 2
    assert run(str(corpus), out_store=str(tmp_path / "y.db"), metrics=tmp_path / "m.json", ignore=["t.c"])[0] == 2
    code, _, err = run("compare", str(tmp_path / "nope.db"), str(existing))
    assert code == 1 and "no store" in err


def test_the_tidings_replay_command_runs_both_forms(corpus, tmp_path):
    """The console script's wiring: ``tidings replay CORPUS ...`` and ``tidings replay compare A B``."""
    import subprocess
    import sys

    def tidings(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-c", "from tidings.cli import main; main()", *args],
                              capture_output=True, text=True, timeout=120)

    for name in ("a", "b"):
        done = tidings("replay", str(corpus), "--out", str(tmp_path / f"{name}.db"),
                       "--metrics", str(tmp_path / f"{name}.json"), "--limit", "100")
        assert done.returncode == 0, done.stderr
    assert json.loads((tmp_path / "a.json").read_text())["frames"] == 100
    done = tidings("replay", "compare", str(tmp_path / "a.db"), str(tmp_path / "b.db"),
                   "--ignore", "inbox.processed_at_ms", "--report", str(tmp_path / "r.json"))
    assert done.returncode == 0, done.stdout + done.stderr
    assert json.loads((tmp_path / "r.json").read_text())["ignored"] == ["inbox.processed_at_ms"]
    done = tidings("replay", "compare", str(tmp_path / "a.db"))
    assert done.returncode == 2 and done.stderr.startswith("error: usage")
