"""Section 1: ingest frames/s over a synthetic corpus, three ways, same final rows.

* **ours** — the real engine: ``Ingest.append_body`` (frame validation, the inbox insert
  and apply-on-append through the real decoders and projection) then the worker's
  ``drain_if_due`` for whatever was left, one frame at a time on this thread, exactly as
  the replay harness drives it but without its counting triggers.
* **raw** — the floor of writing those rows at all: every row ours left in the inbox and
  the projected tables, dumped and inserted into a fresh, migrated database of the same
  backend with plain DBAPI ``executemany`` in ONE transaction (foreign keys on, same
  indexes).
* **naive** — ``bench/naive_ingest.py``, the seed's "before".

Time: the store clock is pinned to each frame's ``received_at_ms`` (a ``FakeClock`` set
per frame, like the replay harness) so both ours and the naive write the very same rows
(the Google reaction fence is the receipt time); every duration is measured with the wall
clock (``perf_counter``). The corpus lines are parsed before the clock starts (a request
body reaches ``append_body`` already parsed), for all three.
"""

from __future__ import annotations

import json
import time
from typing import Any

from benchlib import (
    INGEST_TABLES,
    PROJECTED_TABLES,
    Databases,
    Reporter,
    RunCpu,
    feed,
    feed_batch,
    floor,
    inbox_outcomes,
    latency_ms,
    new_store,
    ratio,
    raw_connect,
    route,
    table_counts,
)
from tidings.ingest import grouping
from tidings.store.search import INDEX_COLUMNS

# A batching bridge's request size for the "frames a request" run (the HTTP edge takes up to 1,000).
BATCH = 100
# The drain's default group (frames a transaction, D119) beside one a transaction, for the
# backlog run.
DRAIN_GROUP = grouping.DRAIN_GROUP

# Content columns compared between ours and the naive run: everything a reader can see,
# minus the bookkeeping times (created/updated) and the few columns the naive statements
# legitimately rewrite (a reaction's occurred/seq on every snapshot, a message's
# mutated_at_ms on a repeated delete).
CONTENT_COLUMNS = {
    "identities": "id, bridge_id, kind, canonical, raw, display_name, is_self, metadata",
    "conversations": "id, bridge_id, remote_conversation_id, kind, title, remote_revision, last_message_at_ms",
    "conversation_participants": "conversation_id, identity_id, bridge_id, role, display_name, is_active",
    "bridge_messages": (
        "id, bridge_id, conversation_id, remote_message_id, sender_identity_id, direction, body, "
        "reply_to_remote_id, state, occurred_at_ms"
    ),
    "reactions": "message_id, reactor_key, bridge_id, conversation_id, reactor_identity_id, reactor_is_self, emoji, state",
    "reaction_fences": "message_id, bridge_id, source_seq_ms",
    "read_cursors": "conversation_id, bridge_id, last_read_message_id, last_read_message_at_ms, last_read_at_ms",
}
ORDER_KEYS = {
    "identities": "id",
    "conversations": "id",
    "conversation_participants": "conversation_id, identity_id",
    "bridge_messages": "id",
    "reactions": "message_id, reactor_key",
    "reaction_fences": "message_id",
    "read_cursors": "conversation_id",
}


def make_corpus(frames: int, seed: int) -> tuple[list[str], dict[str, Any]]:
    from tidings.replay.synth import synthesize

    corpus = synthesize(frames, seed)
    st = corpus.stats
    return corpus.lines, {
        "frames": st.frames,
        "seed": seed,
        "per_codec": st.per_codec,
        "malformed": st.malformed,
        "duplicates": st.duplicates,
        "out_of_order": st.out_of_order,
        "google_unchanged_snapshots": st.google_unchanged_snapshots,
    }


def parse_lines(lines: list[str]) -> list[dict[str, Any] | None]:
    out: list[dict[str, Any] | None] = []
    for line in lines:
        try:
            raw = json.loads(line)
        except ValueError:
            raw = None
        out.append(raw if isinstance(raw, dict) else None)
    return out


def _first_time(parsed: list[dict[str, Any] | None]) -> int:
    for raw in parsed:
        if raw is not None and type(raw.get("received_at_ms")) is int and raw["received_at_ms"] > 0:
            return raw["received_at_ms"]
    return 1_700_000_000_000


def _throughput(frames: int, wall: float, commits: int) -> dict[str, Any]:
    """The figures every ingest run reports: frames, wall time, frames/s, commits (per frame)."""
    return {"frames": frames, "wall_s": round(wall, 3), "frames_per_s": round(frames / wall, 1),
            "commits": commits, "commits_per_frame": round(commits / frames, 4)}


def _outcomes(url: str) -> dict[str, Any]:
    """The inbox's outcome counts after a run, and how many frames it left unprocessed."""
    outcomes = inbox_outcomes(url)
    return {"outcomes": outcomes, "unprocessed": outcomes["unprocessed"]}


# -- ours -----------------------------------------------------------------------------------------
def run_ours(url: str, parsed: list[dict[str, Any] | None], reporter: Reporter, label: str,
             profile: str | None = None, batch: int = 1) -> dict[str, Any]:
    """Every frame through ``Ingest.append_body`` then ``drain_if_due``, as a bridge's
    requests would arrive. ``batch`` > 1: what a batching bridge sends instead, the next
    ``batch`` frames of the corpus as one ``{"frames": [...]}`` request per platform (one
    transaction each, a savepoint per frame), each platform's frames in corpus order."""
    from tidings.ingest.engine import Ingest

    store, clock, bridges = new_store(url, _first_time(parsed))
    ingest = Ingest(store=store, faults=store.faults, clock=clock)
    platform_of = ingest.codec_platforms()
    total = len(parsed)
    per_frame: list[float] = []
    rejected = 0
    commits_before = store.commits
    meter_before = store.meter.snapshot()
    profiler = _profiler(profile)
    perf = time.perf_counter
    if batch > 1:
        return _run_batched(url, parsed, reporter, label, batch, store, clock, bridges, ingest, platform_of, meter_before)
    with reporter.step(f"ingest: ours on {label}", total) as update:
        if profiler is not None:
            profiler.start()
        cpu = RunCpu(url)
        started = perf()
        for index, raw in enumerate(parsed):
            t0 = perf()
            if raw is None:
                rejected += 1
            else:
                platform = route(raw, platform_of)
                if not feed(ingest, clock, bridges[platform], raw, platform):
                    rejected += 1
            per_frame.append(perf() - t0)
            if index % 256 == 0:
                update(index)
        wall = perf() - started
        cpu.stop()
        if profiler is not None:
            profiler.stop()
        update(total)
    commits = store.commits - commits_before
    sent = _sent(store, meter_before, total)
    index = _index_catch_up(store, total, wall)
    ingest.stop()
    store.dispose()
    result = {
        **_throughput(total, wall, commits),
        **sent,
        **cpu.split(wall, total),
        "per_frame": latency_ms(per_frame),
        "rejected_at_append": rejected,
        **index,
        **_outcomes(url),
        "rows": table_counts(url),
        "counters": {bridges[p]: ingest.counters.of(bridges[p]).snapshot() for p in sorted(bridges)},
    }
    if profiler is not None:
        result["profile"] = _save_profile(profiler, profile)
    return result


def _run_batched(url: str, parsed: list[dict[str, Any] | None], reporter: Reporter, label: str, batch: int,
                 store: Any, clock: Any, bridges: dict[str, str], ingest: Any,
                 platform_of: dict[str, str], meter_before: dict[str, int]) -> dict[str, Any]:
    total = len(parsed)
    rejected = requests = 0
    commits_before = store.commits
    perf = time.perf_counter
    with reporter.step(f"ingest: ours, {batch} frames a request, on {label}", total) as update:
        cpu = RunCpu(url)
        started = perf()
        for first in range(0, total, batch):
            raws = [raw for raw in parsed[first:first + batch] if raw is not None]
            rejected += min(batch, total - first) - len(raws)
            sent, refused = feed_batch(ingest, clock, bridges, raws, [route(raw, platform_of) for raw in raws])
            requests += sent
            rejected += refused
            update(min(first + batch, total))
        wall = perf() - started
        cpu.stop()
    commits = store.commits - commits_before
    sent = _sent(store, meter_before, total)
    index = _index_catch_up(store, total, wall)
    ingest.stop()
    store.dispose()
    return {
        **_throughput(total, wall, commits),
        "frames_per_request": batch,
        "requests": requests,
        **sent,
        **cpu.split(wall, total),
        "rejected_at_append": rejected,
        **index,
        **_outcomes(url),
    }


# -- the drain: a backlog applied by the worker ----------------------------------------------------
def run_drain(url: str, parsed: list[dict[str, Any] | None], reporter: Reporter, label: str,
              group: int = 1) -> dict[str, Any]:
    """A backlog drained: the corpus appended without apply on append (untimed, ``BATCH``
    frames a request), then one timed ``drain`` of the worker, ``group`` frames a
    transaction (``Worker.group_size``), as after an outage or a restart."""
    from tidings.errors import TidingsError
    from tidings.ingest.engine import Ingest

    store, clock, bridges = new_store(url, _first_time(parsed))
    ingest = Ingest(store=store, faults=store.faults, clock=clock, apply_on_append=False, group_size=group)
    platform_of = ingest.codec_platforms()
    total = len(parsed)
    groups: dict[str, list[dict[str, Any]]] = {}
    for raw in parsed:
        if raw is not None:
            groups.setdefault(route(raw, platform_of), []).append(raw)
    for platform, frames in groups.items():
        for first in range(0, len(frames), BATCH):
            try:
                ingest.append_body(bridges[platform], {"frames": frames[first:first + BATCH]}, platform)
            except TidingsError:
                pass
    meter_before = store.meter.snapshot()
    commits_before = store.commits
    with reporter.step(f"ingest: the drain, {group} a transaction, on {label}", total) as update:
        cpu = RunCpu(url)
        started = time.perf_counter()
        stats = ingest.drain()
        wall = time.perf_counter() - started
        cpu.stop()
        update(total)
    drained = stats.applied + stats.quarantined
    commits = store.commits - commits_before
    sent = _sent(store, meter_before, max(drained, 1))
    ingest.stop()
    store.dispose()
    return {
        "group": group,
        **_throughput(max(drained, 1), wall, commits),
        "applied": stats.applied,
        "quarantined": stats.quarantined,
        **sent,
        **cpu.split(wall, max(drained, 1)),
        **_outcomes(url),
    }


# -- concurrent clients, one frame a request (group commit) ----------------------------------------
CLIENTS = 4
GROUPED = 64  # the group-commit cap of the "grouped" run (the hub's default is 1: off)


def run_concurrent(url: str, parsed: list[dict[str, Any] | None], reporter: Reporter, label: str,
                   clients: int = CLIENTS, group_commit: int | None = None, frames: int | None = None,
                   ) -> dict[str, Any]:
    """``clients`` bridges' connectors at once, each sending one frame a request and
    waiting for its answer before the next, as a real connector does: client ``c`` sends
    the first ``frames`` frames of the corpus into its own three bridges (one per
    platform), on its own thread, in corpus order. ``group_commit``: the ingest's
    ``GroupCommit`` cap (None: the hub's default; 1: every request commits alone).
    The store runs on the system clock (the threads cannot share a pinned one), so only
    row counts and outcomes are checked, not content."""
    import threading

    from tidings.bridges.registry import create_bridge
    from tidings.errors import TidingsError
    from tidings.ingest.engine import Ingest
    from tidings.store.engine import Store

    work = parsed if frames is None else parsed[:frames]
    store = Store(url)
    ingest = Ingest(store=store, group_commit=group_commit)
    platform_of = ingest.codec_platforms()
    bridges = [
        {p: create_bridge(store, platform=p, name=f"client {c} {p}")["id"] for p in ("signal", "whatsapp", "google")}
        for c in range(clients)
    ]
    routes = [None if raw is None else route(raw, platform_of) for raw in work]
    rejected = [0] * clients
    total = clients * len(work)
    meter_before = store.meter.snapshot()
    commits_before = store.commits
    start = threading.Barrier(clients + 1)

    def client(c: int) -> None:
        mine = bridges[c]
        start.wait()
        for raw, platform in zip(work, routes, strict=True):
            if raw is None or platform not in mine:
                rejected[c] += 1
                continue
            try:
                ingest.append_body(mine[platform], raw, platform)
            except TidingsError:
                rejected[c] += 1

    what = "grouped" if group_commit != 1 else "one commit a request"
    with reporter.step(f"ingest: {clients} clients, 1 frame a request, {what}, on {label}", total) as update:
        threads = [threading.Thread(target=client, args=(c,), daemon=True) for c in range(clients)]
        for t in threads:
            t.start()
        start.wait()
        started = time.perf_counter()
        for t in threads:
            t.join()
        ingest.drain()  # whatever a request left to the worker (none, without faults)
        wall = time.perf_counter() - started
        update(total)
    commits = store.commits - commits_before
    sent = _sent(store, meter_before, total)
    group = ingest.group.stats()
    ingest.stop()
    store.dispose()
    return {
        "clients": clients,
        **_throughput(total, wall, commits),
        "group_commit": group_commit,
        "appends_per_commit": round(group["members"] / max(group["commits"], 1), 2),
        "largest_group": group["largest"],
        **sent,
        "rejected_at_append": sum(rejected),
        **_outcomes(url),
    }


# -- raw --------------------------------------------------------------------------------------------
def dump(url: str) -> dict[str, tuple[list[str], list[tuple]]]:
    """Every row of the ingest tables: {table: (columns, rows)}."""
    conn = raw_connect(url)
    try:
        out = {}
        for table in INGEST_TABLES:
            cur = conn.execute(f"SELECT * FROM {table}")
            columns = [d[0] for d in cur.description]
            rows = cur.fetchall()
            # the search index's generated column is written by the database, never by us
            keep = [i for i, c in enumerate(columns) if c not in INDEX_COLUMNS]
            out[table] = ([columns[i] for i in keep], [tuple(r[i] for i in keep) for r in rows])
        return out
    finally:
        conn.close()


def run_raw(url: str, rows: dict[str, tuple[list[str], list[tuple]]], frames: int, reporter: Reporter,
            label: str) -> dict[str, Any]:
    """Bulk-insert ``rows`` into a fresh migrated database at ``url``: one transaction."""
    from tidings.store.engine import Store

    Store(url).dispose()  # the same schema, indexes and constraints as ours
    total_rows = sum(len(r) for _, r in rows.values())
    conn = raw_connect(url)
    postgres = not isinstance(conn, __import__("sqlite3").Connection)
    with reporter.step(f"ingest: raw executemany on {label}", len(rows)) as update:
        started = time.perf_counter()
        if postgres:
            with conn.transaction():
                cur = conn.cursor()
                for i, (table, (columns, data)) in enumerate(rows.items()):
                    if data:
                        marks = ", ".join(["%s"] * len(columns))
                        cur.executemany(f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({marks})", data)
                    update(i + 1)
        else:
            conn.execute("BEGIN IMMEDIATE")
            for i, (table, (columns, data)) in enumerate(rows.items()):
                if data:
                    marks = ", ".join(["?"] * len(columns))
                    conn.executemany(f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({marks})", data)
                update(i + 1)
            conn.execute("COMMIT")
        wall = time.perf_counter() - started
    conn.close()
    return {
        "frames": frames,
        "rows_inserted": total_rows,
        "wall_s": round(wall, 4),
        "frames_per_s": round(frames / wall, 1),
        "rows_per_s": round(total_rows / wall, 1),
        "commits": 1,
        "commits_per_frame": round(1 / frames, 6),
    }


def run_raw_per_frame(url: str, rows: dict[str, tuple[list[str], list[tuple]]], frames: int, reporter: Reporter,
                      label: str) -> dict[str, Any]:
    """The floor of ONE FRAME A REQUEST: the same rows as ``run_raw``, inserted with plain
    DBAPI ``execute`` (a statement a row) in ``frames`` transactions, one commit each, as
    ``frames`` requests that each must be durable before their answer would be. On
    PostgreSQL this is one round trip a row plus one durable commit (WAL flush) a frame,
    with no decoding, no guards and no reads: no per-frame ingest can beat it."""
    from tidings.store.engine import Store

    Store(url).dispose()
    flat = [(table, columns, row) for table, (columns, data) in rows.items() for row in data]
    conn = raw_connect(url)
    postgres = not isinstance(conn, __import__("sqlite3").Connection)
    mark = "%s" if postgres else "?"
    sql = {table: f"INSERT INTO {table} ({', '.join(cols)}) VALUES ({', '.join([mark] * len(cols))})"
           for table, (cols, _data) in rows.items()}
    # Exactly ``frames`` transactions, the rows dealt out evenly (1 or 2 a frame here). Until
    # D111 the rows went 2 a frame, so fewer commits than frames, and the floor read high.
    bounds = [len(flat) * i // frames for i in range(frames + 1)]
    with reporter.step(f"ingest: raw, one commit a frame, on {label}", frames) as update:
        cpu = RunCpu(url)
        started = time.perf_counter()
        commits = 0
        for i in range(frames):
            chunk = flat[bounds[i]:bounds[i + 1]]
            if postgres:
                with conn.transaction():
                    for table, _cols, row in chunk:
                        conn.execute(sql[table], row)
            else:
                conn.execute("BEGIN IMMEDIATE")
                for table, _cols, row in chunk:
                    conn.execute(sql[table], row)
                conn.execute("COMMIT")
            commits += 1
            if commits % 256 == 0:
                update(commits)
        wall = time.perf_counter() - started
        cpu.stop()
        update(frames)
    conn.close()
    return {
        "frames": frames,
        "rows_inserted": len(flat),
        "rows_per_frame": round(len(flat) / frames, 2),
        "wall_s": round(wall, 4),
        "frames_per_s": round(frames / wall, 1),
        "commits": commits,
        **cpu.split(wall, frames),
    }


# -- naive ---------------------------------------------------------------------------------------------
def run_naive(url: str, parsed: list[dict[str, Any] | None], reporter: Reporter, label: str) -> dict[str, Any]:
    from naive_ingest import NaiveIngest

    store, _clock, bridges = new_store(url, _first_time(parsed))
    store.dispose()
    naive = NaiveIngest(url)
    from tidings.ingest.decoders import DECODERS

    platform_of = {codec: dec.platform for codec, dec in DECODERS.items()}
    total = len(parsed)
    per_frame: list[float] = []
    rejected = 0
    perf = time.perf_counter
    with reporter.step(f"ingest: naive on {label}", total) as update:
        started = perf()
        for index, raw in enumerate(parsed):
            t0 = perf()
            if raw is None:
                rejected += 1
            else:
                platform = route(raw, platform_of)
                naive.append(raw, bridges[platform], platform)
            per_frame.append(perf() - t0)
            if index % 256 == 0:
                update(index)
        wall = perf() - started
        update(total)
    result = {
        **_throughput(total, wall, naive.commits),
        "statements_per_frame": round(naive.statements / total, 2),
        "per_frame": latency_ms(per_frame),
        "rejected_at_append": rejected + naive.rejected,
    }
    naive.close()
    result.update({**_outcomes(url), "rows": table_counts(url)})
    return result


def content_diff(url_a: str, url_b: str) -> dict[str, int]:
    """Per table, how many content rows differ (symmetric difference) between two stores."""
    a, b = raw_connect(url_a), raw_connect(url_b)
    out = {}
    try:
        for table in PROJECTED_TABLES:
            sql = f"SELECT {CONTENT_COLUMNS[table]} FROM {table} ORDER BY {ORDER_KEYS[table]}"
            rows_a = {tuple(_norm(v) for v in r) for r in a.execute(sql).fetchall()}
            rows_b = {tuple(_norm(v) for v in r) for r in b.execute(sql).fetchall()}
            out[table] = len(rows_a ^ rows_b)
    finally:
        a.close()
        b.close()
    return out


def _norm(value: Any) -> Any:
    return int(value) if isinstance(value, bool) else value


# -- the section -----------------------------------------------------------------------------------------
def _index_catch_up(store: Any, frames: int, wall: float) -> dict[str, Any]:
    """SQLite: the search index work the frames queued (``store.search_index``), done after
    the timed run the way the hub's background pass does it, in batches, and timed on its
    own; ``frames_per_s_with_index`` charges it to the frames. Nothing on PostgreSQL,
    whose index is written by each frame's own statements."""
    from tidings.store.search_index import catch_up_all

    started = time.perf_counter()
    indexed = catch_up_all(store)
    spent = time.perf_counter() - started
    return {
        "index_changes": indexed,
        "index_catch_up_s": round(spent, 3),
        "frames_per_s_with_index": round(frames / (wall + spent), 1),
    }


def _sent(store: Any, before: dict[str, int], frames: int) -> dict[str, Any]:
    """Statements sent and round trips over a run (``Store.meter``), per frame too: the
    deterministic count beside the noisy frames/s."""
    after = store.meter.snapshot()
    statements = after["statements"] - before["statements"]
    round_trips = after["round_trips"] - before["round_trips"]
    return {
        "statements": statements,
        "statements_per_frame": round(statements / frames, 3),
        "round_trips": round_trips,
        "round_trips_per_frame": round(round_trips / frames, 3),
    }


def run(backends: list[str], frames: int, seed: int, dbs: Databases, reporter: Reporter,
        naive_on: list[str], profile_dir: str | None = None) -> dict[str, Any]:
    t0 = time.perf_counter()
    lines, corpus = make_corpus(frames, seed)
    parsed = parse_lines(lines)
    reporter.note(f"corpus: {frames:,} frames, seed {seed} ({time.perf_counter() - t0:.1f} s): {corpus['per_codec']}")
    section: dict[str, Any] = {"corpus": corpus}
    for backend in backends:
        label = backend
        ours_url = dbs.fresh(backend, "ingest_ours")
        limits = floor(ours_url)
        reporter.note(
            f"floor [{label}]: a statement {limits['round_trip_us']:.0f} µs, a durable commit "
            f"{limits['commit_us']:.0f} µs, so at most {limits['one_commit_a_frame_ceiling_per_s']:,.0f} "
            "commits/s one after another"
        )
        profile = f"{profile_dir}/ingest_ours_{backend}.html" if profile_dir else None
        ours = run_ours(ours_url, parsed, reporter, label, profile)
        reporter.note(
            f"ingest ours [{label}]: {ours['frames_per_s']:,.0f} frames/s, "
            f"{ours['round_trips_per_frame']:.2f} round trips/frame ({ours['statements_per_frame']:.2f} statements), "
            f"{ours['commits_per_frame']:.3f} commits/frame, unprocessed {ours['unprocessed']}"
        )
        batched_url = dbs.fresh(backend, "ingest_batched")
        batched = run_ours(batched_url, parsed, reporter, label, batch=BATCH)
        reporter.note(
            f"ingest ours, {BATCH} frames a request [{label}]: {batched['frames_per_s']:,.0f} frames/s, "
            f"{batched['round_trips_per_frame']:.2f} round trips/frame ({batched['statements_per_frame']:.2f} statements), "
            f"{batched['commits_per_frame']:.3f} commits/frame, unprocessed {batched['unprocessed']}"
        )
        dbs.drop(batched_url)
        concurrent: dict[str, Any] = {}
        for key, cap in (("grouped", GROUPED), ("alone", 1)):
            conc_url = dbs.fresh(backend, f"ingest_concurrent_{key}")
            concurrent[key] = run_concurrent(conc_url, parsed, reporter, label, group_commit=cap,
                                             frames=max(1, frames // CLIENTS))
            dbs.drop(conc_url)
        reporter.note(
            f"ingest, {CLIENTS} clients, 1 frame a request [{label}]: grouped "
            f"{concurrent['grouped']['frames_per_s']:,.0f} frames/s "
            f"({concurrent['grouped']['appends_per_commit']:.2f} appends a commit), one commit a request "
            f"{concurrent['alone']['frames_per_s']:,.0f} frames/s"
        )
        drains: dict[str, Any] = {}
        for group in (1, DRAIN_GROUP):
            drain_url = dbs.fresh(backend, f"ingest_drain_{group}")
            drains[str(group)] = run_drain(drain_url, parsed, reporter, label, group)
            dbs.drop(drain_url)
        reporter.note(
            f"ingest, the drain of a backlog [{label}]: {drains['1']['frames_per_s']:,.0f} frames/s one a "
            f"transaction, {drains[str(DRAIN_GROUP)]['frames_per_s']:,.0f} frames/s {DRAIN_GROUP} a transaction"
        )
        rows = dump(ours_url)
        raw_url = dbs.fresh(backend, "ingest_raw")
        raw = run_raw(raw_url, rows, frames, reporter, label)
        raw_frames_url = dbs.fresh(backend, "ingest_raw_per_frame")
        raw_per_frame = run_raw_per_frame(raw_frames_url, rows, frames, reporter, label)
        reporter.note(f"ingest raw, one commit a frame [{label}]: {raw_per_frame['frames_per_s']:,.0f} frames/s")
        dbs.drop(raw_frames_url)
        del rows
        reporter.note(f"ingest raw [{label}]: {raw['frames_per_s']:,.0f} frames/s ({raw['rows_inserted']:,} rows)")
        dbs.drop(raw_url)
        entry: dict[str, Any] = {"ours": ours, "ours_batched": batched, "raw": raw, "raw_per_frame": raw_per_frame,
                                 "concurrent": concurrent, "drain": drains, "floor": limits}
        if backend in naive_on:
            naive_url = dbs.fresh(backend, "ingest_naive")
            naive = run_naive(naive_url, parsed, reporter, label)
            diff = content_diff(ours_url, naive_url)
            naive["rows_equal"] = naive["rows"] == ours["rows"]
            naive["content_rows_differing"] = diff
            naive["content_equal"] = not any(diff.values())
            entry["naive"] = naive
            reporter.note(
                f"ingest naive [{label}]: {naive['frames_per_s']:,.0f} frames/s, "
                f"{naive['commits_per_frame']:.2f} commits/frame; same rows: {naive['rows_equal']}, "
                f"same content: {naive['content_equal']}"
            )
            dbs.drop(naive_url)
            if not naive["rows_equal"]:
                raise AssertionError(
                    f"naive and ours differ in row counts on {backend}: ours {ours['rows']} naive {naive['rows']}"
                )
        dbs.drop(ours_url)
        entry["ratios"] = {
            "ours_over_naive": ratio(ours["frames_per_s"], entry.get("naive", {}).get("frames_per_s")),
            "ours_over_raw": ratio(ours["frames_per_s"], raw["frames_per_s"], 3),
            "ours_over_raw_per_frame": ratio(ours["frames_per_s"], raw_per_frame["frames_per_s"], 3),
            "batched_over_ours": ratio(batched["frames_per_s"], ours["frames_per_s"]),
            "grouped_over_alone": ratio(concurrent["grouped"]["frames_per_s"], concurrent["alone"]["frames_per_s"]),
            "drain_grouped_over_one": ratio(drains[str(DRAIN_GROUP)]["frames_per_s"], drains["1"]["frames_per_s"]),
            "commits_per_frame_naive_over_ours": ratio(
                entry.get("naive", {}).get("commits_per_frame"), ours["commits_per_frame"]
            ),
        }
        section[backend] = entry
    return section


# -- profiling -------------------------------------------------------------------------------------------
def _profiler(path: str | None) -> Any:
    if not path:
        return None
    from pyinstrument import Profiler

    return Profiler(interval=0.0005)


def _save_profile(profiler: Any, path: str) -> dict[str, Any]:
    from pathlib import Path

    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(profiler.output_html(), encoding="utf-8")
    text_path = str(Path(path).with_suffix(".txt"))
    Path(text_path).write_text(profiler.output_text(unicode=False, color=False, show_all=False), encoding="utf-8")
    return {"html": path, "text": text_path}
