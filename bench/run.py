"""Tidings benchmarks: everything side by side in one run, one table, one JSON file.

    uv run python bench/run.py [--quick | --smoke] [--backend sqlite|postgres|both]
                               [--json bench/results/latest.json]

Sections (issue 5, item 4), each next to its baseline and its target:

1. ingest frames/s over a synthetic corpus (``bench_ingest``): ours vs the raw
   ``executemany`` floor of the same final rows vs the naive per-frame "before"
   (``naive_ingest.py``), plus commits per frame, and ours again with a batching
   bridge's requests (100 frames a request);
2. post→steer latency p50/p99 at a fixed post rate with 10 agents connected
   (``bench_delivery.run_latency``); optionally the same over HTTP+SSE (``--http``);
3. fan-out throughput into N subscribed agents' queues (``bench_delivery.run_fanout``),
   each figure the median of ``fanout_rounds`` rounds with the backends taking turns;
4. recovery-scan rate and peak memory over a backlog of unrouted messages
   (``bench_delivery.run_recovery``);
5. stuck-backlog drain cost per later frame, and nothing unprocessed after a restart
   (``bench_stuck``, the replay harness's ``--stuck``).

Every run uses fresh databases (temporary SQLite files, throwaway PostgreSQL databases
that are dropped at the end) and wall-clock time. Exit code: 0 when every correctness
check held (nothing left unprocessed, no steer missing, the naive run wrote the same
rows), whether or not a speed target was met; 1 otherwise; 2 for a usage error.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
if str(BENCH_DIR) not in sys.path:
    sys.path.insert(0, str(BENCH_DIR))

from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

import benchlib  # noqa: E402

DEFAULT_JSON = BENCH_DIR / "results" / "latest.json"
SECTIONS = ("ingest", "latency", "fanout", "recovery", "stuck")
# Run only when named in --only (a 1M-message load takes minutes): bench_search.py.
OPTIONAL_SECTIONS = ("search",)

TARGETS = {
    "ingest_frames_per_s_sqlite": 5_000,
    # issue 12: PostgreSQL ingest, one frame a request (and ÷ SQLite's in the same run), and
    # 100 frames a request
    "ingest_frames_per_s_pg_one": 2_500,
    "ingest_pg_over_sqlite_one": 0.5,
    "ingest_frames_per_s_pg_batched": 5_000,
    "commits_per_frame": 1.0,
    "steer_p99_ms": 10.0,
    "recovery_msgs_per_s": 20_000,
    "recovery_memory_growth": 1.5,  # peak at the largest backlog / at the smallest ("flat")
    "stuck_ms_per_later_frame": 1.0,
    "fanout_vs_sqlite": 0.8,  # PostgreSQL msgs/s into a fan-out ÷ SQLite's, the median of paired rounds
}


@dataclass
class Sizes:
    frames: int = 30_000
    seed: int = 42
    rate: float = 500.0
    latency_s: float = 10.0
    warmup_s: float = 1.0
    latency_agents: int = 10
    fanout_agents: tuple[int, ...] = (10, 50)
    fanout_messages: int = 2_000
    # Also run the largest fan-out (and its 0-agent baseline) with this many posters,
    # like concurrent HTTP requests; 1 poster measures the post call's commit as much.
    fanout_posters: int = 4
    # Each fan-out figure is the median of this many rounds, SQLite and PostgreSQL taking
    # turns: one round's PostgreSQL ÷ SQLite into 50 queues moved between 0.56 and 0.97
    # within one run of the same tree.
    fanout_rounds: int = 5
    recovery_sizes: tuple[int, ...] = (10_000, 100_000)
    scan_batch: int = 1_000
    stuck: int = 20
    stuck_frames: int = 600
    stuck_pace_ms: int = 100  # 0: run the stuck backlog at corpus time only
    http_s: float = 5.0

    @classmethod
    def quick(cls) -> Sizes:
        return cls(frames=3_000, latency_s=3.0, warmup_s=0.5, fanout_messages=500, fanout_rounds=3,
                   recovery_sizes=(10_000, 30_000), http_s=2.0)

    @classmethod
    def smoke(cls) -> Sizes:
        return cls(frames=200, rate=200.0, latency_s=0.25, warmup_s=0.05, latency_agents=3, fanout_agents=(3,),
                   fanout_messages=30, fanout_rounds=2, recovery_sizes=(300, 1_200), scan_batch=1_000, stuck=2, stuck_frames=40,
                   stuck_pace_ms=0, http_s=0.5)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="bench/run.py", description=__doc__.split("\n\n")[0])
    size = p.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help="small sizes (~3k frames) for iterating")
    size.add_argument("--smoke", action="store_true", help="tiny sizes: the test suite's shape check")
    p.add_argument("--backend", default="both", choices=["sqlite", "postgres", "postgresql", "both"])
    p.add_argument("--json", default=str(DEFAULT_JSON), help=f"where to write the results (default {DEFAULT_JSON})")
    p.add_argument("--only", default="", help=f"comma-separated sections to run (default all: {','.join(SECTIONS)})")
    p.add_argument("--naive", default="same", help="backends for the naive baselines: same (as --backend), sqlite, none")
    p.add_argument("--frames", type=int, help="override the corpus size")
    p.add_argument("--rate", type=float, help="override the post rate (posts/s)")
    p.add_argument("--seconds", type=float, help="override the measured latency window (s)")
    p.add_argument("--http", action="store_true", help="also measure post→steer over HTTP+SSE (a `tidings serve` subprocess)")
    p.add_argument("--profile", metavar="DIR",
                   help="write pyinstrument profiles into DIR (our ingest run; the latency run's consumer thread "
                        "and poster); profiled figures are slower than unprofiled ones")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.add_argument("--pg-synchronous-commit", choices=["on", "off"], default="on",
                   help="diagnostic: 'off' sets synchronous_commit=off on every PostgreSQL bench database, "
                        "so a commit does not wait for its WAL flush (SQLite's synchronous=NORMAL durability: "
                        "survives a killed process, not a power cut); the hub never sets it")
    p.add_argument("--cluster", default="", metavar="1,2,3",
                   help="instead of the sections: N real nodes on one PostgreSQL database, per N (bench_cluster)")
    p.add_argument("--heartbeat-ms", type=int, help="--cluster: the nodes' heartbeat (default: theirs, 2000)")
    p.add_argument("--dead-after-ms", type=int, help="--cluster: the nodes' dead-after interval (default 10000)")
    p.add_argument("--search-messages", type=int, default=1_000_000,
                   help="messages loaded for the search section (--only search)")
    p.add_argument("--search-queries", type=int, default=10, help="queries per band and engine (search section)")
    return p.parse_args(argv)


@dataclass
class Run:
    args: argparse.Namespace
    sizes: Sizes
    backends: list[str]
    naive_on: list[str]
    results: dict[str, Any] = field(default_factory=dict)


def _backends(choice: str) -> list[str]:
    if choice == "both":
        return ["sqlite", "postgresql"]
    return ["postgresql" if choice in ("postgres", "postgresql") else "sqlite"]


def main(argv: list[str] | None = None, *, configure_logging: bool = True) -> int:
    """The command. ``configure_logging=False`` leaves the process's structlog setup alone
    (the test suite calls ``main`` in-process)."""
    args = parse_args(argv)
    # Wide enough for the table when stdout is a pipe or a file (Rich assumes 80 columns).
    width = None if sys.stdout.isatty() else int(os.environ.get("COLUMNS", "0") or 0) or 160
    console = Console(stderr=False, width=width)
    err = Console(stderr=True)
    sizes = Sizes.smoke() if args.smoke else Sizes.quick() if args.quick else Sizes()
    if args.frames:
        sizes.frames = args.frames
    if args.rate:
        sizes.rate = args.rate
    if args.seconds:
        sizes.latency_s = args.seconds
    only = [s.strip() for s in args.only.split(",") if s.strip()] or list(SECTIONS)
    unknown = set(only) - set(SECTIONS) - set(OPTIONAL_SECTIONS)
    if unknown:
        err.print(f"error: unknown sections {sorted(unknown)}; choose from {list(SECTIONS + OPTIONAL_SECTIONS)}",
                  markup=False)
        return 2
    backends = _backends(args.backend)
    if args.naive == "same":
        naive_on = list(backends)
    elif args.naive == "none":
        naive_on = []
    elif args.naive in ("sqlite", "postgresql", "postgres"):
        naive_on = [b for b in backends if b == _backends(args.naive)[0]]
    else:
        err.print("error: --naive must be same, sqlite, postgresql or none", markup=False)
        return 2
    if "postgresql" in backends:
        reason = benchlib.pg_reachable()
        if reason is not None:
            err.print(f"error: PostgreSQL is unreachable at {benchlib.PG_ADMIN_URL}: {reason}", markup=False)
            return 1
    if configure_logging:
        benchlib.configure_logs()
    if args.pg_synchronous_commit != "on":
        benchlib.Databases.pg_settings = {"synchronous_commit": args.pg_synchronous_commit}
    if args.cluster:
        return _cluster_main(args, sizes, console, err)
    # Imported once here, not inside a timed loop: ``store.engine.is_transient`` imports
    # psycopg on its first call (~60 ms, once per process), even on SQLite.
    import psycopg  # noqa: F401

    command = "uv run python bench/run.py " + " ".join(sys.argv[1:] if argv is None else argv)
    run = Run(args, sizes, backends, naive_on)
    run.results = {
        "meta": {
            "command": command.strip(),
            "started_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "mode": "smoke" if args.smoke else "quick" if args.quick else "full",
            "backends": backends,
            "naive_on": naive_on,
            "sections": only,
            "sizes": {k: list(v) if isinstance(v, tuple) else v for k, v in vars(sizes).items()},
            "machine": {**benchlib.machine(), "bench_pg_synchronous_commit": args.pg_synchronous_commit},
        },
        "targets": dict(TARGETS),
    }
    started = time.perf_counter()
    dbs = benchlib.Databases()
    try:
        with benchlib.Reporter(err, enabled=not args.no_progress and not args.smoke) as reporter:
            for section in only:
                t0 = time.perf_counter()
                load0 = _load()
                run.results[section] = SECTION_RUNNERS[section](run, dbs, reporter)
                run.results[section]["_section"] = {
                    "seconds": round(time.perf_counter() - t0, 2), "loadavg_before": load0, "loadavg_after": _load(),
                }
    finally:
        dbs.close()
    run.results["meta"]["seconds"] = round(time.perf_counter() - started, 1)
    run.results["checks"] = checks(run.results)
    rows = table_rows(run.results)
    run.results["table"] = rows
    print_table(console, rows, run.results)
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(json.dumps(run.results, indent=2, default=str) + "\n", encoding="utf-8")
    os.replace(tmp, out)
    console.print(f"results written to {out}", markup=False, highlight=False)
    if not run.results["checks"]["ok"]:
        err.print(f"correctness checks failed: {run.results['checks']['failed']}", markup=False)
        return 1
    return 0


def _cluster_main(args: argparse.Namespace, sizes: Sizes, console: Console, err: Console) -> int:
    """``--cluster 1,2,3``: each size on a fresh database, side by side in one table."""
    import bench_cluster

    try:
        counts = [int(x) for x in args.cluster.split(",") if x.strip()]
    except ValueError:
        err.print("error: --cluster takes node counts, e.g. 1,2,3", markup=False)
        return 2
    reason = benchlib.pg_reachable()
    if reason is not None:
        err.print(f"error: PostgreSQL is unreachable at {benchlib.PG_ADMIN_URL}: {reason}", markup=False)
        return 1
    rate = args.rate or 200.0
    seconds = args.seconds or 10.0
    dbs = benchlib.Databases()
    results: dict[str, Any] = {"meta": {"command": "uv run python bench/run.py " + " ".join(sys.argv[1:]),
                                        "machine": benchlib.machine(), "target_p99_ms": 25.0}, "runs": []}
    try:
        for n in counts:
            results["runs"].append(bench_cluster.run_cluster(
                n, dbs=dbs, rate=rate, seconds=seconds, heartbeat_ms=args.heartbeat_ms,
                dead_after_ms=args.dead_after_ms))
    finally:
        dbs.close()
    table = Table(title=f"cluster on PostgreSQL: post→steer at {rate:g} posts/s (post on node 0, session on the last)")
    for col in ("nodes", "p50 ms", "p99 ms", "p99 ≤ 25 ms", "missing", "posts/s accepted", "dead node detected s",
                "leader failover s"):
        table.add_column(col, justify="right")
    ok = True
    for r in results["runs"]:
        lat = r.get("post_to_steer") or {}
        p99 = lat.get("p99_ms")
        ok = ok and r.get("steers_missing", 1) == 0
        table.add_row(str(r["nodes"]), _fmt(lat.get("p50_ms"), 2), _fmt(p99, 2),
                      "" if p99 is None else ("yes" if p99 <= 25.0 else "no"), str(r.get("steers_missing")),
                      _fmt(r.get("posts_per_s_accepted")), _fmt(r.get("dead_node_detected_s"), 2),
                      _fmt(r.get("leader_failover_s"), 2))
    console.print(table)
    out = Path(args.json if args.json != str(DEFAULT_JSON) else BENCH_DIR / "results" / "cluster.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2, default=str) + "\n", encoding="utf-8")
    console.print(f"results written to {out}", markup=False, highlight=False)
    return 0 if ok else 1


def _load() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


# -- sections ----------------------------------------------------------------------------------
def _ingest(run: Run, dbs: benchlib.Databases, reporter: benchlib.Reporter) -> dict[str, Any]:
    import bench_ingest

    return bench_ingest.run(run.backends, run.sizes.frames, run.sizes.seed, dbs, reporter, run.naive_on,
                            run.args.profile)


def _latency(run: Run, dbs: benchlib.Databases, reporter: benchlib.Reporter) -> dict[str, Any]:
    import bench_delivery

    s = run.sizes
    out: dict[str, Any] = {}
    for backend in run.backends:
        url = dbs.fresh(backend, "latency")
        profile = f"{run.args.profile}/latency_consumer_{backend}.html" if run.args.profile else None
        out[backend] = bench_delivery.run_latency(
            url, rate=s.rate, seconds=s.latency_s, warmup_s=s.warmup_s, agents=s.latency_agents,
            reporter=reporter, label=backend, profile=profile,
        )
        dbs.drop(url)
        r = out[backend]
        reporter.note(
            f"latency [{backend}]: post→steer queued p50 {r['steer_queued']['p50_ms']} ms, p99 "
            f"{r['steer_queued']['p99_ms']} ms at {r['rate_achieved_per_s']} posts/s; post call p99 "
            f"{r['post_call']['p99_ms']} ms; missing {r['missing_steers']}"
        )
        if run.args.http:
            import bench_http

            url = dbs.fresh(backend, "latency_http")
            out[f"{backend}_http"] = bench_http.run_http_latency(
                url, rate=s.rate, seconds=s.http_s, warmup_s=s.warmup_s, agents=s.latency_agents,
                reporter=reporter, label=backend,
            )
            dbs.drop(url)
    return out


def _fanout(run: Run, dbs: benchlib.Databases, reporter: benchlib.Reporter) -> dict[str, Any]:
    """Every fan-out run ``fanout_rounds`` times, the backends taking turns within a round
    (the first backend alternates between rounds, so a drift of the machine's speed
    falls on both); ``fanout_summary`` keeps each figure's median round."""
    import bench_delivery

    s = run.sizes
    runs = [(agents, 1) for agents in (0, *s.fanout_agents)]
    if s.fanout_posters > 1:
        runs += [(0, s.fanout_posters), (max(s.fanout_agents), s.fanout_posters)]
    rounds: dict[str, dict[str, list[dict[str, Any]]]] = {backend: {} for backend in run.backends}
    for k in range(s.fanout_rounds):
        for backend in (run.backends if k % 2 == 0 else list(reversed(run.backends))):
            for agents, posters in runs:
                key = fanout_key(agents, posters)
                url = dbs.fresh(backend, f"fanout{agents}x{posters}r{k}")
                r = bench_delivery.run_fanout(
                    url, agents=agents, messages=s.fanout_messages, reporter=reporter, label=backend, posters=posters
                )
                dbs.drop(url)
                rounds[backend].setdefault(key, []).append(r)
                reporter.note(
                    f"fan-out [{backend}] round {k + 1}/{s.fanout_rounds}, {agents} agents, {posters} poster(s): "
                    f"{r['messages_per_s']:,.0f} msgs/s, {r['dispatches_per_s']:,.0f} dispatches/s, "
                    f"{r['round_trips_per_message']:.2f} round trips/msg, complete {r['complete']}"
                )
    return fanout_summary(rounds)


def fanout_summary(rounds: dict[str, dict[str, list[dict[str, Any]]]]) -> dict[str, Any]:
    """Per backend and fan-out: the run with the median msgs/s (the lower of the middle
    two for an even count), plus every round's msgs/s, ``complete`` only when every round
    was, and on PostgreSQL its msgs/s ÷ SQLite's paired round by round (each pair ran
    back to back), with their median: one noisy round moves neither figure."""
    out: dict[str, Any] = {}
    lite = rounds.get("sqlite", {})
    for backend, by_key in rounds.items():
        entry: dict[str, Any] = {}
        for key, runs in by_key.items():
            ordered = sorted(runs, key=lambda r: r["messages_per_s"])
            figure = dict(ordered[(len(ordered) - 1) // 2])
            figure["rounds"] = len(runs)
            figure["messages_per_s_rounds"] = [r["messages_per_s"] for r in runs]
            figure["complete"] = all(r["complete"] for r in runs)
            theirs = lite.get(key) if backend == "postgresql" else None
            if theirs:
                pairs = (benchlib.ratio(ours["messages_per_s"], other["messages_per_s"], 3)
                         for ours, other in zip(runs, theirs, strict=False))
                shares = [share for share in pairs if share is not None]
                if shares:
                    figure["vs_sqlite_rounds"] = shares
                    figure["vs_sqlite_median"] = round(statistics.median(shares), 3)
            entry[key] = figure
        out[backend] = entry
    return out


def fanout_key(agents: int, posters: int) -> str:
    """The results key of a fan-out run: "50" (one poster, as before), "50x4" (4 posters)."""
    return str(agents) if posters == 1 else f"{agents}x{posters}"


def _recovery(run: Run, dbs: benchlib.Databases, reporter: benchlib.Reporter) -> dict[str, Any]:
    import bench_delivery

    s = run.sizes
    out: dict[str, Any] = {}
    for backend in run.backends:
        url = dbs.fresh(backend, "recovery")
        out[backend] = bench_delivery.run_recovery(
            url, sizes=list(s.recovery_sizes), batch_note=s.scan_batch, reporter=reporter, label=backend
        )
        dbs.drop(url)
    return out


def _stuck(run: Run, dbs: benchlib.Databases, reporter: benchlib.Reporter) -> dict[str, Any]:
    import bench_stuck

    s = run.sizes
    return bench_stuck.run(run.backends, stuck=s.stuck, frames=s.stuck_frames, seed=s.seed, pace_ms=s.stuck_pace_ms,
                           naive_on=run.naive_on, dbs=dbs, reporter=reporter, harness_check=not run.args.smoke)


def _search(run: Run, dbs: benchlib.Databases, reporter: benchlib.Reporter) -> dict[str, Any]:
    import bench_search

    messages = 2_000 if run.args.smoke else run.args.search_messages
    return bench_search.run(run.backends, messages, run.args.search_queries, dbs)


SECTION_RUNNERS = {"ingest": _ingest, "latency": _latency, "fanout": _fanout, "recovery": _recovery, "stuck": _stuck,
                   "search": _search}


# -- checks (correctness, never speed) ---------------------------------------------------------------
def checks(results: dict[str, Any]) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for backend in ("sqlite", "postgresql"):
        ing = results.get("ingest", {}).get(backend)
        if ing:
            found[f"ingest.{backend}.ours.unprocessed"] = ing["ours"]["unprocessed"] == 0
            if "ours_batched" in ing:
                found[f"ingest.{backend}.batched.unprocessed"] = ing["ours_batched"]["unprocessed"] == 0
            for key, conc in ing.get("concurrent", {}).items():
                found[f"ingest.{backend}.concurrent_{key}.unprocessed"] = conc["unprocessed"] == 0
            for key, drain in ing.get("drain", {}).items():
                found[f"ingest.{backend}.drain_{key}.unprocessed"] = drain["unprocessed"] == 0
            drains = ing.get("drain", {})
            if len(drains) > 1:  # grouping changes transactions, never outcomes
                found[f"ingest.{backend}.drain.same_outcomes"] = len({repr(d["outcomes"]) for d in drains.values()}) == 1
            conc = ing.get("concurrent")
            if conc:  # both runs stored the same: grouping changes commits, never rows
                found[f"ingest.{backend}.concurrent.same_outcomes"] = (
                    conc["grouped"]["outcomes"] == conc["alone"]["outcomes"])
            if "naive" in ing:
                found[f"ingest.{backend}.naive.unprocessed"] = ing["naive"]["unprocessed"] == 0
                found[f"ingest.{backend}.naive.same_row_counts"] = ing["naive"]["rows_equal"]
                found[f"ingest.{backend}.naive.same_content"] = ing["naive"]["content_equal"]
        lat = results.get("latency", {}).get(backend)
        if lat:
            found[f"latency.{backend}.no_missing_steer"] = lat["missing_steers"] == 0
            found[f"latency.{backend}.steer_only"] = lat["mentioned_also_delivered"] == 0
        http = results.get("latency", {}).get(f"{backend}_http")
        if http:
            found[f"latency.{backend}_http.no_missing_steer"] = http["missing_steers"] == 0
        fan = results.get("fanout", {}).get(backend)
        if fan:
            for agents, r in fan.items():
                found[f"fanout.{backend}.{agents}.complete"] = r["complete"]
        rec = results.get("recovery", {}).get(backend)
        if rec:
            for size, r in rec["by_size"].items():
                found[f"recovery.{backend}.{size}.nothing_unrouted"] = r["unrouted_after"] == 0
        st = results.get("stuck", {}).get(backend)
        if st:
            for pace in ("corpus_time", "paced"):
                part = st.get(pace)
                if part is None:
                    continue
                found[f"stuck.{backend}.{pace}.ours.unprocessed_after_restart"] = part["ours"]["unprocessed_after_restart"] == 0
                found[f"stuck.{backend}.{pace}.no_stuck.unprocessed"] = part["no_stuck"]["unprocessed_after"] == 0
                if "naive" in part:
                    found[f"stuck.{backend}.{pace}.naive.unprocessed_after_restart"] = (
                        part["naive"]["unprocessed_after_restart"] == 0
                    )
            if "harness" in st:
                found[f"stuck.{backend}.harness.unprocessed_after_restart"] = st["harness"]["unprocessed_after_restart"] == 0
                found[f"stuck.{backend}.harness.same_stuck_decodes"] = st["harness"]["same_stuck_decodes"]
    failed = sorted(k for k, v in found.items() if not v)
    return {"ok": not failed, "failed": failed, "checked": found}


# -- the table -----------------------------------------------------------------------------------------
def _fmt(value: Any, digits: int = 0, suffix: str = "") -> str:
    if value is None:
        return "—"
    if isinstance(value, float) and digits:
        return f"{value:,.{digits}f}{suffix}"
    if isinstance(value, (int, float)):
        return f"{value:,.0f}{suffix}"
    return str(value)


def _met(ok: bool | None) -> str:
    return "—" if ok is None else ("yes" if ok else "NO")


def _cpu_rows(add: Any, backend: str, what: str, run: dict[str, Any], floor_run: dict[str, Any] | None,
              cores: int | None) -> None:
    """The server's CPU per frame (a local PostgreSQL), beside the raw floor's, and the
    client's and server's CPU together beside the wall time a frame took, and the frames/s
    that CPU allows with every core busy: the ceiling of any number of clients at that CPU a
    frame (D111)."""
    server = run.get("server_cpu_ms_per_frame")
    if server is None:
        return
    fps = run["frames_per_s"]
    wall_ms = round(1000 / fps, 3) if fps else None
    floor_server = (floor_run or {}).get("server_cpu_ms_per_frame")
    add("1 ingest", f"server CPU, ms/frame{what}", backend, server,
        "raw, one commit a frame" if floor_server is not None else "",
        floor_server, f"×{_ratio(server, floor_server)}" if floor_server else "", digits=3)
    both = round(run["client_cpu_ms_per_frame"] + server, 3)
    add("1 ingest", f"client + server CPU, ms/frame{what}", backend, both, "wall ms/frame", wall_ms,
        f"{both / wall_ms:.0%} of it" if wall_ms else "", digits=3)
    if both > 0 and cores:
        # However many clients send at once, at this CPU a frame the cores can do no more.
        add("1 ingest", f"frames/s with every core busy{what}", backend, round(cores * 1000 / both),
            f"ours, one client ({cores} cores ÷ that CPU)", fps)


def table_rows(results: dict[str, Any]) -> list[dict[str, Any]]:
    """The table as data (also written to the JSON): one row per figure."""
    rows: list[dict[str, Any]] = []
    T = results["targets"]

    def add(section: str, metric: str, backend: str, ours: Any, baseline: str = "", base_value: Any = None,
            ratio_text: str = "", target: str = "", met: bool | None = None, digits: int = 0) -> None:
        rows.append({
            "section": section, "metric": metric, "backend": backend,
            "ours": ours, "ours_text": _fmt(ours, digits), "baseline": baseline, "baseline_value": base_value,
            "baseline_text": _fmt(base_value, digits) if base_value is not None else "", "ratio": ratio_text,
            "target": target, "met": met,
        })

    for backend in ("sqlite", "postgresql"):
        ing = results.get("ingest", {}).get(backend)
        if not ing:
            continue
        ours, raw, naive = ing["ours"], ing["raw"], ing.get("naive")
        fps = ours["frames_per_s"]
        is_sqlite = backend == "sqlite"
        target = f"≥ {T['ingest_frames_per_s_sqlite']:,}" if is_sqlite else ""
        met = fps >= T["ingest_frames_per_s_sqlite"] if is_sqlite else None
        if naive:
            add("1 ingest", "frames/s", backend, fps, "naive per-frame", naive["frames_per_s"],
                f"×{ing['ratios']['ours_over_naive']}", target, met)
        add("1 ingest", "frames/s", backend, fps, "raw executemany", raw["frames_per_s"],
            f"×{ing['ratios']['ours_over_raw']}", target if not naive else "", met if not naive else None)
        lim = ing.get("floor")
        if lim:
            add("1 ingest", "a statement, µs (driver, no work)", backend, lim["round_trip_us"],
                "psycopg pipeline of 4, per statement" if "pipelined_us" in lim else "",
                lim.get("pipelined_us"), digits=1)
            add("1 ingest", "a commit, µs (the store's own durability)", backend, lim["commit_us"],
                "commits/s, one after another", lim["one_commit_a_frame_ceiling_per_s"], digits=0)
        rpf = ing.get("raw_per_frame")
        if rpf:
            add("1 ingest", "frames/s", backend, fps, "raw, one commit a frame", rpf["frames_per_s"],
                f"×{ing['ratios']['ours_over_raw_per_frame']}")
        if is_sqlite and ours.get("index_changes"):
            add("1 ingest", "frames/s, search index caught up too", backend, ours["frames_per_s_with_index"],
                "ours, index work left queued", fps)
        if "round_trips_per_frame" in ours:
            add("1 ingest", "round trips/frame", backend, ours["round_trips_per_frame"], "statements/frame",
                ours["statements_per_frame"], digits=2)
        if "client_cpu_ms_per_frame" in ours:
            add("1 ingest", "client CPU, ms/frame", backend, ours["client_cpu_ms_per_frame"],
                "wall ms/frame", round(1000 / fps, 3) if fps else None,
                f"{ours['client_cpu_share']:.0%} of it", digits=3)
        cores = results.get("meta", {}).get("machine", {}).get("cpus")
        _cpu_rows(add, backend, "", ours, rpf, cores)
        if backend == "postgresql":
            sq = results.get("ingest", {}).get("sqlite", {}).get("ours", {}).get("frames_per_s")
            add("1 ingest", "frames/s, 1 a request (issue 12)", backend, fps, "SQLite, same run", sq,
                f"×{_ratio(fps, sq)}" if sq else "",
                f"≥ {T['ingest_frames_per_s_pg_one']:,}, ≥ {T['ingest_pg_over_sqlite_one']}× SQLite",
                fps >= T["ingest_frames_per_s_pg_one"] and (sq is None or fps >= T["ingest_pg_over_sqlite_one"] * sq))
        batched = ing.get("ours_batched")
        if batched:
            pg = backend == "postgresql"
            add("1 ingest", f"frames/s, {batched['frames_per_request']} a request", backend,
                batched["frames_per_s"], "ours, 1 a request", fps, f"×{ing['ratios']['batched_over_ours']}",
                f"≥ {T['ingest_frames_per_s_pg_batched']:,}" if pg else "",
                batched["frames_per_s"] >= T["ingest_frames_per_s_pg_batched"] if pg else None)
            if "round_trips_per_frame" in batched:
                add("1 ingest", f"round trips/frame, {batched['frames_per_request']} a request", backend,
                    batched["round_trips_per_frame"], "statements/frame", batched["statements_per_frame"], digits=2)
            _cpu_rows(add, backend, f", {batched['frames_per_request']} a request", batched, None, cores)
        drains = ing.get("drain")
        if drains:
            one = drains["1"]
            for key, d in drains.items():
                if key == "1":
                    continue
                add("1 ingest", f"frames/s, the drain of a backlog, {key} a transaction", backend,
                    d["frames_per_s"], "the drain, 1 a transaction", one["frames_per_s"],
                    f"×{ing['ratios']['drain_grouped_over_one']}")
                add("1 ingest", f"round trips/frame, the drain, {key} a transaction", backend,
                    d["round_trips_per_frame"], "the drain, 1 a transaction", one["round_trips_per_frame"],
                    digits=2)
        conc = ing.get("concurrent")
        if conc:
            g, a = conc["grouped"], conc["alone"]
            add("1 ingest", f"frames/s, 1 a request, {g['clients']} clients at once", backend, g["frames_per_s"],
                "one commit a request", a["frames_per_s"], f"×{ing['ratios']['grouped_over_alone']}")
            add("1 ingest", f"appends per commit, {g['clients']} clients at once", backend,
                g["appends_per_commit"], "commits/frame", g["commits_per_frame"], digits=2)
        cpf = ours["commits_per_frame"]
        add("1 ingest", "commits/frame", backend, cpf, "naive per-frame" if naive else "raw (1 tx)",
            naive["commits_per_frame"] if naive else raw["commits_per_frame"],
            f"÷{ing['ratios']['commits_per_frame_naive_over_ours']}" if naive else "",
            f"≤ {T['commits_per_frame']:g}", cpf <= T["commits_per_frame"], digits=3)
    for backend in ("sqlite", "postgresql"):
        lat = results.get("latency", {}).get(backend)
        if not lat:
            continue
        rate = f"@{lat['rate_achieved_per_s']:,.0f}/s"
        q, post = lat["steer_queued"], lat["post_call"]
        add("2 post→steer", f"p50 ms {rate}", backend, q["p50_ms"], "post() call p50", post["p50_ms"],
            f"×{_ratio(q['p50_ms'], post['p50_ms'])}", "", None, digits=2)
        add("2 post→steer", f"p99 ms {rate}", backend, q["p99_ms"], "post() call p99", post["p99_ms"],
            f"×{_ratio(q['p99_ms'], post['p99_ms'])}", f"≤ {T['steer_p99_ms']:g}", q["p99_ms"] <= T["steer_p99_ms"],
            digits=2)
        r = lat["steer_read"]
        add("2 post→steer", "p99 ms read by the agent", backend, r["p99_ms"], "", None, "", "", None, digits=2)
        http = results.get("latency", {}).get(f"{backend}_http")
        if http:
            h = http["steer_sse"]
            add("2 post→steer", f"HTTP+SSE p50 / p99 ms @{http['rate_achieved_per_s']:,.0f}/s", backend,
                f"{h['p50_ms']} / {h['p99_ms']}", "HTTP POST p99", http["post_call"]["p99_ms"], "", "", None, digits=2)
    for backend in ("sqlite", "postgresql"):
        fan = results.get("fanout", {}).get(backend)
        if not fan:
            continue
        lite = results.get("fanout", {}).get("sqlite", {}) if backend == "postgresql" else {}
        for key, r in fan.items():
            agents, posters = r["agents"], r.get("posters", 1)
            if agents == 0:
                continue
            who = f"{agents} queues" + (f", {posters} posters" if posters > 1 else "")
            base = fan.get(fanout_key(0, posters), {}).get("messages_per_s")
            median_of = f" (median of {r['rounds']})" if r.get("rounds", 1) > 1 else ""
            add("3 fan-out", f"msgs/s into {who}{median_of}", backend, r["messages_per_s"], "0 agents (post+consume)",
                base, f"×{_ratio(r['messages_per_s'], base)}", "", None)
            add("3 fan-out", f"dispatches/s, {who}", backend, r["dispatches_per_s"], "", None, "", "", None)
            if "round_trips_per_message" in r:
                add("3 fan-out", f"round trips/message, {who}", backend, r["round_trips_per_message"],
                    "statements/message", r["statements_per_message"], digits=2)
            share, spread = r.get("vs_sqlite_median"), r.get("vs_sqlite_rounds", [])
            if share is not None:
                baseline = "SQLite msgs/s"
                if len(spread) > 1:
                    baseline = f"SQLite msgs/s; rounds {min(spread):.2f}–{max(spread):.2f}"
                add("3 fan-out", f"÷ SQLite, msgs/s into {who} (median of {len(spread)})", backend, round(share, 2),
                    baseline, lite.get(key, {}).get("messages_per_s"), "", f"≥ {T.get('fanout_vs_sqlite', 0.8):g}",
                    share >= T.get("fanout_vs_sqlite", 0.8), digits=2)
    for backend in ("sqlite", "postgresql"):
        rec = results.get("recovery", {}).get(backend)
        if not rec:
            continue
        sizes = sorted(rec["by_size"], key=int)
        big, small = rec["by_size"][sizes[-1]], rec["by_size"][sizes[0]]
        add("4 recovery scan", f"msgs/s over {int(sizes[-1]):,}", backend, big["messages_per_s"], "raw keyset walk",
            big["raw_messages_per_s"], f"×{big['ours_over_raw']}", f"≥ {T['recovery_msgs_per_s']:,}",
            big["messages_per_s"] >= T["recovery_msgs_per_s"])
        growth = rec["memory_growth_large_over_small"]
        add("4 recovery scan", f"tracemalloc peak KiB, {int(sizes[-1]):,} vs {int(sizes[0]):,}", backend,
            big["tracemalloc_peak_kb"], f"at {int(sizes[0]):,}", small["tracemalloc_peak_kb"], f"×{growth}",
            f"flat (≤ ×{T['recovery_memory_growth']:g})",
            growth is not None and growth <= T["recovery_memory_growth"])
        add("4 recovery scan", f"peak RSS growth KiB, {int(sizes[-1]):,} vs {int(sizes[0]):,}", backend,
            big["rss_peak_delta_kb"], f"at {int(sizes[0]):,}", small["rss_peak_delta_kb"], "", "", None)
    for backend in ("sqlite", "postgresql"):
        st = results.get("stuck", {}).get(backend)
        if not st:
            continue
        target = f"≤ {T['stuck_ms_per_later_frame']:g}"
        for pace in ("corpus_time", "paced"):
            part = st.get(pace)
            if part is None:
                continue
            ours, naive = part["ours"], part.get("naive")
            ms = ours["later_frame_drain_ms_avg"]
            where = "corpus time" if pace == "corpus_time" else f"{ours['pace_ms']} ms apart"
            label = f"ms/later frame, {ours['stuck_frames']} stuck, {where}"
            met = ms <= T["stuck_ms_per_later_frame"]
            if naive:
                add("5 stuck backlog", label, backend, ms, "naive (before)", naive["later_frame_drain_ms_avg"],
                    f"÷{part['ratios']['naive_over_ours']}", target, met, digits=3)
            add("5 stuck backlog", label, backend, ms, "no frame stuck", part["no_stuck"]["later_frame_drain_ms_avg"],
                f"×{part['ratios']['ours_over_no_stuck']}", "" if naive else target, None if naive else met, digits=3)
            if "later_frame_round_trips_avg" in ours:
                add("5 stuck backlog", f"round trips/later frame, {where}", backend,
                    ours["later_frame_round_trips_avg"], "no frame stuck",
                    part["no_stuck"].get("later_frame_round_trips_avg"), "", "", None, digits=2)
            if "later_frame_retry_rounds_avg" in ours:
                add("5 stuck backlog", f"retry rounds due/later frame, {where}", backend,
                    ours["later_frame_retry_rounds_avg"], "", None, "", "", None, digits=3)
            add("5 stuck backlog", f"retry sleeps asked, ms/later frame, {where}", backend,
                ours["later_frame_requested_sleep_ms_avg"], "naive (before)" if naive else "",
                naive["later_frame_requested_sleep_ms_avg"] if naive else None, "", "", None, digits=3)
            add("5 stuck backlog", f"stuck frames' decodes, {where}", backend, ours["stuck_decodes"],
                "naive (before)" if naive else "", naive["stuck_decodes"] if naive else None, "", "", None)
            add("5 stuck backlog", f"unprocessed after restart, {where}", backend, ours["unprocessed_after_restart"],
                "naive (before)" if naive else "", naive["unprocessed_after_restart"] if naive else None, "", "0",
                ours["unprocessed_after_restart"] == 0)
    search = results.get("search", {})
    for backend in ("sqlite", "postgresql"):
        part = search.get(backend)
        if not part:
            continue
        n = search["messages"]
        add("6 search", f"load rows/s with the index, {n:,} messages", backend, part["load_rows_per_s"])
        for band in ("rare", "medium", "common"):
            idx, like = part[band]["index"], part[band]["like"]
            add("6 search", f"queries/s, {band} word", backend, idx["queries_per_s"], "LIKE scan (before)",
                like["queries_per_s"], f"×{part[band]['speedup_qps']}", digits=1)
            add("6 search", f"p99 ms, {band} word", backend, idx["p99_ms"], "LIKE scan (before)", like["p99_ms"],
                _ratio(idx["p99_ms"], like["p99_ms"]), digits=1)
    return rows


def _ratio(a: Any, b: Any) -> str:
    r = benchlib.ratio(a, b)
    return "—" if r is None else f"{r:g}"


def print_table(console: Console, rows: list[dict[str, Any]], results: dict[str, Any]) -> None:
    meta = results["meta"]
    load = meta["machine"].get("loadavg_at_start")
    table = Table(
        title=f"Tidings benchmarks ({meta['mode']}, {meta['machine'].get('cpus')} cores, load at start {load}, "
              f"{meta.get('seconds', '?')} s"
              + (", PostgreSQL synchronous_commit=off: a diagnostic, not the hub's durability"
                 if meta["machine"].get("bench_pg_synchronous_commit") == "off" else "") + ")",
        title_justify="left",
    )
    for name, justify in (("section", "left"), ("metric", "left"), ("backend", "left"), ("ours", "right"),
                          ("baseline", "left"), ("baseline value", "right"), ("ours vs baseline", "right"),
                          ("target", "left"), ("met", "center")):
        table.add_column(name, justify=justify)  # type: ignore[arg-type]
    last = None
    for row in rows:
        if last is not None and row["section"] != last:
            table.add_section()
        last = row["section"]
        table.add_row(row["section"], row["metric"], row["backend"], row["ours_text"], row["baseline"],
                      row["baseline_text"], row["ratio"], row["target"], _met(row["met"]))
    console.print(table)
    console.print(
        "ours vs baseline: ×r means ours = r × the baseline's figure; ÷r means the baseline's figure = r × ours. "
        "Targets from issue 5. Speed depends on the machine's load (see the title and meta.machine in the JSON).",
        markup=False, highlight=False,
    )
    checks_ = results["checks"]
    console.print(
        f"correctness checks: {len(checks_['checked']) - len(checks_['failed'])}/{len(checks_['checked'])} held"
        + (f"; FAILED: {', '.join(checks_['failed'])}" if checks_["failed"] else ""),
        markup=False, highlight=False,
    )


if __name__ == "__main__":
    sys.exit(main())
