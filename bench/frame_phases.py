"""Where a lone frame's time goes: wall time a frame in each phase of apply on append.

    uv run python bench/frame_phases.py --backend sqlite --frames 5000
    uv run python bench/frame_phases.py --backend postgresql --frames 5000 --json out.json
    uv run python bench/frame_phases.py --backend postgresql --frames 10000 --batch 100

Drives the engine like ``bench_ingest.run_ours`` (one frame a request through
``Ingest.append_body``, then ``drain_if_due``, the clock pinned to each frame's receipt time;
with ``--batch N``, N frames at a time as one request a platform, as its batched run does)
with a timer around each phase's function, and counts the statements a frame sends by kind.
Phases nest (``append_frames`` holds most of the others), so each is shown twice:
``self``, its own time with every nested phase taken out, and ``nested``, with them. The
database is a phase of its own, so ``self`` of the others is Python:
on SQLite a statement (``Tx._send``; ``BEGIN`` and ``COMMIT`` stay in the append's own
time), on PostgreSQL a round trip (``Wire.run``: sending, the server's work, the wait, and
the ``COMMIT``'s WAL flush; the batch's reads ride with the dedupe read, the writes with
the ``COMMIT``).

A second pass on a fresh database (skipped with ``--no-calls``) counts the Python function
calls (a generator's resume counts as one) and builtin calls a frame makes
(``sys.setprofile``): counts, unlike times, are the same on every run, so two trees compare
without noise.

With ``--cprofile N``, a third pass on another fresh database runs under ``cProfile`` and
prints the N functions with the most time of their own, a frame: the profiler inflates
Python's time, much less the time inside C calls such as ``sqlite3``'s ``execute``, so it
shows what the database calls themselves take.

Functions a tree does not have are left out, so the same command measures an older tree
(``PYTHONPATH=<worktree>/src``) beside this one. The timers cost about 0.5 µs a call; the
frames/s printed is with them on.
"""

from __future__ import annotations

import argparse
import collections
import functools
import importlib
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchlib import Databases, feed, feed_batch, new_store, route  # noqa: E402

#: (module, qualified name, what it is), outermost first.
PHASES = [
    ("tidings.ingest.engine", "Ingest.append_body", "the whole append: parse, transaction, commit"),
    ("tidings.ingest.engine", "Ingest.parse", "the request's frames checked and their payload text made"),
    ("tidings.ingest.engine", "append_frames", "the transaction's body (no BEGIN or COMMIT)"),
    ("tidings.ingest.on_append", "AppendApplier.begin", "decode, make the batch, ask for its keys"),
    ("tidings.ingest.apply", "FrameApplier.decode_ahead", "decode and validate"),
    ("tidings.ingest.apply", "FrameApplier.batch", "make the batch and ask for its keys (want_rows)"),
    ("tidings.ingest.on_append", "held_up", "the order check"),
    ("tidings.ingest.on_append", "insert_applied", "dedupe check, the batch's read, the projection"),
    ("tidings.ingest.on_append", "RequestRows.stored", "the dedupe read"),
    ("tidings.ingest.batch", "Batch.announce", "the batch's reads built (sent ahead on PostgreSQL)"),
    ("tidings.ingest.batch", "Batch.read", "the batch's reads run and taken"),
    ("tidings.ingest.apply", "FrameApplier.apply", "one frame's apply (projection included)"),
    ("tidings.ingest.projection", "project_frame", "the rules (in memory with a batch)"),
    ("tidings.ingest.on_append", "AppendApplier.finish", "the batch's writes and the inbox row"),
    ("tidings.ingest.batch", "Batch.flush", "the batch's writes"),
    ("tidings.ingest.on_append", "RequestRows.send", "the inbox row"),
]

#: The database, timed like a phase (so that no other phase's ``self`` holds it).
DATABASE = [
    ("tidings.store.engine", "Tx._send", "SQLite: one statement run (PostgreSQL: the Python that queues it)"),
    ("tidings.store.pg_wire", "Wire.run", "PostgreSQL: one round trip, server and wait included"),
]


def kind_of(sql: str) -> str:
    """``VERB table``: the first table a statement names after its verb's keyword
    (``SELECT conversations``, ``INSERT inbox``); a function for a ``SELECT`` of none."""
    words = sql.split()
    if not words:
        return "?"
    verb = words[0].upper()
    marker = {"SELECT": "FROM", "INSERT": "INTO", "DELETE": "FROM", "UPDATE": "UPDATE"}.get(verb)
    for i, word in enumerate(words[:-1]):
        if word.upper() == marker and words[i + 1].isidentifier():
            return f"{verb} {words[i + 1]}"
    if verb == "SELECT" and len(words) > 1:
        return f"SELECT {words[1].split('(')[0]}()"  # a lock, say
    return verb


class Probes:
    """Timers around each phase's function and a count of statements by kind, installed by
    ``with Probes():`` and taken out again at its end (so a test process is left as it was)."""

    def __init__(self) -> None:
        self.seconds: collections.defaultdict[str, float] = collections.defaultdict(float)
        self.own: collections.defaultdict[str, float] = collections.defaultdict(float)  # nested phases taken out
        self.calls: collections.Counter[str] = collections.Counter()
        self._nested: list[float] = []  # per open phase: the time its nested phases took
        self.kinds: collections.Counter[str] = collections.Counter()
        self.found: list[tuple[str, str]] = []
        self._undo: list[tuple[Any, str, Any]] = []

    def __enter__(self) -> Probes:
        self._count()  # (first, so that a statement's timer holds its count)
        for module, qualname, what in PHASES + DATABASE:
            self._time(module, qualname, what)
        return self

    def __exit__(self, *_exc: object) -> None:
        for owner, name, original in reversed(self._undo):
            setattr(owner, name, original)
        self._undo.clear()

    def clear(self) -> None:
        self.seconds.clear()
        self.own.clear()
        self.calls.clear()
        self.kinds.clear()

    def _patch(self, owner: Any, name: str, replacement: Any) -> None:
        self._undo.append((owner, name, getattr(owner, name)))
        setattr(owner, name, replacement)

    def _time(self, module: str, qualname: str, what: str) -> None:
        try:
            owner: Any = importlib.import_module(module)
            *path, name = qualname.split(".")
            for part in path:
                owner = getattr(owner, part)
            fn = getattr(owner, name)
        except (ImportError, AttributeError):
            return  # not in this tree
        seconds, own, calls, nested, clock = self.seconds, self.own, self.calls, self._nested, time.perf_counter

        @functools.wraps(fn)
        def timed(*args: Any, **kwargs: Any) -> Any:
            nested.append(0.0)
            t0 = clock()
            try:
                return fn(*args, **kwargs)
            finally:
                took = clock() - t0
                inner = nested.pop()
                if nested:
                    nested[-1] += took
                seconds[qualname] += took
                own[qualname] += took - inner
                calls[qualname] += 1

        self._patch(owner, name, timed)
        self.found.append((qualname, what))

    def _count(self) -> None:
        from tidings.store import engine, pg_wire

        kinds = self.kinds
        send, savepoint, run = engine.Tx._send, engine.Tx.savepoint, pg_wire.Wire.run
        many = getattr(engine.Tx, "execute_many", None)

        def counted_send(tx: Any, sql: str, params: Any) -> Any:
            if tx.dialect != "postgresql":  # (PostgreSQL's go out through ``Wire.run``)
                kinds[kind_of(sql)] += 1
            return send(tx, sql, params)

        def counted_savepoint(tx: Any) -> Any:
            if tx.dialect != "postgresql":
                kinds["SAVEPOINT (its RELEASE or ROLLBACK TO not counted)"] += 1
            return savepoint(tx)

        def counted_run(wire: Any, batch: Any) -> None:
            for entry in batch:
                kinds[kind_of(entry[0])] += 1
            run(wire, batch)

        def counted_many(tx: Any, stmt: Any, rows: Any) -> int:  # SQLite: one statement, many rows
            kinds[kind_of(stmt.compiled(tx.dialect)[0])] += 1
            return many(tx, stmt, rows)

        self._patch(engine.Tx, "_send", counted_send)
        if many is not None:
            self._patch(engine.Tx, "execute_many", counted_many)
        self._patch(engine.Tx, "savepoint", counted_savepoint)
        self._patch(pg_wire.Wire, "run", counted_run)


def corpus(frames: int, seed: int) -> list[dict[str, Any]]:
    """The synthetic corpus's requests, parsed (its malformed lines left out: they never
    reach ``append_body``)."""
    from tidings.replay.synth import synthesize

    out = []
    for line in synthesize(frames, seed).lines:
        try:
            raw = json.loads(line)
        except ValueError:
            continue
        if isinstance(raw, dict):
            out.append(raw)
    return out


class Hub:
    """The engine on a fresh database of ``backend``, driven as ``bench_ingest.run_ours``
    drives it (``benchlib.new_store``, ``route``, and ``feed`` one frame a request or
    ``feed_batch`` with ``batch`` frames at a time)."""

    def __init__(self, dbs: Databases, backend: str, requests: list[dict[str, Any]], name: str,
                 batch: int = 1) -> None:
        from tidings.ingest.engine import Ingest

        self.requests = requests
        self.batch = batch
        self.store, self.clock, self.bridges = new_store(dbs.fresh(backend, name), requests[0]["received_at_ms"])
        self.ingest = Ingest(store=self.store, faults=self.store.faults, clock=self.clock)
        platform_of = self.ingest.codec_platforms()
        self.platforms = [route(raw, platform_of) for raw in requests]  # (routed here, outside what is measured)

    def drive(self) -> None:
        clock, ingest, bridges, batch = self.clock, self.ingest, self.bridges, self.batch
        if batch == 1:
            for raw, platform in zip(self.requests, self.platforms, strict=True):
                feed(ingest, clock, bridges[platform], raw, platform)
            return
        for first in range(0, len(self.requests), batch):
            feed_batch(ingest, clock, bridges, self.requests[first:first + batch], self.platforms[first:first + batch])

    def close(self) -> None:
        self.ingest.stop()
        self.store.dispose()


def count_calls(fn: Any) -> tuple[int, int]:
    """(Python function calls, builtin calls) made while ``fn()`` runs on this thread."""
    counts = {"call": 0, "c_call": 0}

    def profile(_frame: Any, event: str, _arg: Any) -> None:
        if event in counts:
            counts[event] += 1

    sys.setprofile(profile)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return counts["call"], counts["c_call"]


def profile_top(fn: Any, n: int, frames: int) -> list[dict[str, Any]]:
    """The ``n`` functions with the most time of their own while ``fn()`` runs under
    ``cProfile``, each a frame: calls, own µs, µs with what it calls."""
    import cProfile
    import pstats

    profiler = cProfile.Profile()
    profiler.runcall(fn)
    stats = pstats.Stats(profiler).stats  # type: ignore[attr-defined]
    rows = sorted(stats.items(), key=lambda item: item[1][2], reverse=True)[:n]
    out = []
    for (filename, line, name), (_primitive, ncalls, own, cumulative, _callers) in rows:
        where = name if filename == "~" else f"{Path(filename).name}:{line}({name})"
        out.append({"function": where, "calls_per_frame": round(ncalls / frames, 2),
                    "self_us_per_frame": round(own / frames * 1e6, 1),
                    "us_per_frame": round(cumulative / frames * 1e6, 1)})
    return out


def run(backend: str, frames: int, seed: int, calls: bool = True, batch: int = 1, cprofile: int = 0) -> dict[str, Any]:
    """One run of ``frames`` corpus frames, ``batch`` at a time (one a request, or one
    request a platform), on a fresh database of ``backend`` (timed, with the probes), then,
    with ``calls``, the same frames on another fresh database with the calls counted, and
    with ``cprofile`` N, on a third under ``cProfile`` (its top N functions by own time)."""
    requests = corpus(frames, seed)
    dbs = Databases()
    try:
        with Probes() as probes:
            hub = Hub(dbs, backend, requests, "phases", batch)
            probes.clear()
            meter_before = hub.store.meter.snapshot()
            started = time.perf_counter()
            hub.drive()
            wall = time.perf_counter() - started
            meter = {k: v - meter_before[k] for k, v in hub.store.meter.snapshot().items()}
            hub.close()
        python_calls = builtin_calls = None
        if calls:
            hub = Hub(dbs, backend, requests, "calls", batch)
            python_calls, builtin_calls = count_calls(hub.drive)
            hub.close()
        profile = None
        if cprofile:
            hub = Hub(dbs, backend, requests, "cprofile", batch)
            profile = profile_top(hub.drive, cprofile, len(requests))
            hub.close()
    finally:
        dbs.close()
    n = len(requests)
    return {
        "backend": backend,
        "frames": n,
        "batch": batch,
        "frames_per_s": round(n / wall),
        "us_per_frame": round(wall / n * 1e6, 1),
        "phases": [
            {"phase": q, "what": what, "us_per_frame": round(probes.seconds[q] / n * 1e6, 1),
             "self_us_per_frame": round(probes.own[q] / n * 1e6, 1),
             "calls_per_frame": round(probes.calls[q] / n, 2)}
            for q, what in probes.found
        ],
        # Outside every phase: the loop that drives the hub, and the worker's ``drain_if_due``.
        "unphased_us_per_frame": round((wall - sum(probes.own.values())) / n * 1e6, 1),
        "statements_per_frame": {k: round(v / n, 3) for k, v in probes.kinds.most_common()},
        # The store's meter: every statement, BEGIN, COMMIT and savepoint statements included.
        "statements_per_frame_all": round(meter["statements"] / n, 2),
        "round_trips_per_frame": round(meter["round_trips"] / n, 2),
        "commits_per_frame": round(meter["commits"] / n, 3),
        "python_calls_per_frame": None if python_calls is None else round(python_calls / n, 1),
        "builtin_calls_per_frame": None if builtin_calls is None else round(builtin_calls / n, 1),
        "cprofile": profile,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--backend", choices=["sqlite", "postgresql"], default="sqlite")
    p.add_argument("--frames", type=int, default=5000)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--json", metavar="PATH")
    p.add_argument("--batch", type=int, default=1,
                   help="frames at a time, sent as one request a platform (default 1: one frame a request)")
    p.add_argument("--no-calls", dest="calls", action="store_false", help="skip the pass that counts calls")
    p.add_argument("--cprofile", type=int, default=0, metavar="N",
                   help="a pass under cProfile: print the N functions with the most time of their own")
    args = p.parse_args()
    import structlog

    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(40))  # errors only
    if args.batch < 1:
        p.error("--batch must be at least 1")
    if args.cprofile < 0:
        p.error("--cprofile must be 0 (off) or more")
    result = run(args.backend, args.frames, args.seed, args.calls, args.batch, args.cprofile)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1), encoding="utf-8")
    print(f"{result['backend']}: {result['frames']} frames, {result['batch']} at a time, {result['frames_per_s']:,} frames/s, "
          f"{result['us_per_frame']} µs a frame (timers on)")
    print(f"{'µs a frame:':>11} {'self':>6} {'nested':>7}  {'calls':>5}  phase")
    for row in result["phases"]:
        print(f"{'':>11} {row['self_us_per_frame']:>6.1f} {row['us_per_frame']:>7.1f}  {row['calls_per_frame']:>5.2f}  "
              f"{row['phase']}: {row['what']}")
    print(f"{'':>11} {result['unphased_us_per_frame']:>6.1f} {'':>7}  {'':>5}  outside every phase (the loop that "
          f"drives the hub, and the worker's drain_if_due)")
    print(f"statements a frame (the store's meter, BEGIN and COMMIT included): {result['statements_per_frame_all']}, "
          f"round trips a frame: {result['round_trips_per_frame']}")
    for kind, per in result["statements_per_frame"].items():
        print(f"{per:>11.3f}  {kind}")
    if result["python_calls_per_frame"] is not None:
        print(f"calls a frame (a second pass, counted): {result['python_calls_per_frame']:,} Python functions, "
              f"{result['builtin_calls_per_frame']:,} builtins")
    if result["cprofile"]:
        print("under cProfile (a third pass), the functions with the most time of their own, a frame:")
        print(f"{'µs self':>11} {'with callees':>12}  {'calls':>6}  function")
        for row in result["cprofile"]:
            print(f"{row['self_us_per_frame']:>11.1f} {row['us_per_frame']:>12.1f}  {row['calls_per_frame']:>6.2f}  "
                  f"{row['function']}")


if __name__ == "__main__":
    main()
