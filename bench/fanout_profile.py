"""Where a fan-out's time goes: one ``bench_delivery.run_fanout`` with each thread's CPU and
the hub's steps timed, per message of the measured window.

    uv run python bench/fanout_profile.py --backend postgresql --agents 50
    uv run python bench/fanout_profile.py --backend both --agents 50 --rounds 3 --json out.json

The fan-out section of ``bench/run.py`` gives messages/s; this says what a message's wall
time is made of, so a gap between the backends can be named rather than guessed:

* the wall time a message takes (the run's own measure: first post to every dispatch
  queued, the consumer idle);
* the CPU each thread spent in that window: the poster, the delivery consumer, the bench's
  readers (one asyncio loop reading every session, as the SSE endpoint does) and the rest;
  and the whole process's. On PostgreSQL the process can only run Python while it holds
  the GIL, so wall − CPU is time no thread of the hub had work: every one of them waited
  on a round trip or on another. SQLite's statements run outside the GIL, so there the
  CPU may exceed the wall;
* the wall of the hub's steps, per message: the post call, and in it the time the
  poster waited on PostgreSQL's answers (``Wire``, PostgreSQL only); the consumer's
  batched read of the rows and rosters, and in it its wait on PostgreSQL; the fan-out
  (steers and delivers, no statement); the flush of owed rows and marks.

A step's wall includes the time its thread waited to take the GIL back, so the steps of
different threads overlap and do not add up to the message's wall. The hooks wrap class
attributes for this process only and are put back afterwards; nothing in ``src/`` changes.
Thread CPU comes from ``/proc`` (Linux).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

#: The threads whose CPU is reported by name (``run_fanout`` and the runtime name them).
THREADS = {"MainThread": "poster", "tidings-delivery": "consumer", "bench-readers": "readers"}
_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def thread_cpu() -> dict[str, float]:
    """CPU seconds (user + system) of every live thread, summed by role."""
    out: dict[str, float] = {}
    for th in threading.enumerate():
        try:
            with open(f"/proc/self/task/{th.native_id}/stat", encoding="ascii") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        role = THREADS.get(th.name, "other")
        out[role] = out.get(role, 0.0) + (int(fields[11]) + int(fields[12])) / _TICK
    return out


class Steps:
    """Wall seconds and calls per hub step, summed over every thread that ran it."""

    def __init__(self) -> None:
        self.wall: dict[str, float] = {}
        self.calls: dict[str, int] = {}
        self._lock = threading.Lock()
        self._inside = threading.local()
        #: Only steps that end while this is set count (the measured window, not the setup).
        self.counting = False

    def add(self, name: str, seconds: float) -> None:
        if not self.counting:
            return
        with self._lock:
            self.wall[name] = self.wall.get(name, 0.0) + seconds
            self.calls[name] = self.calls.get(name, 0) + 1

    @contextlib.contextmanager
    def hooked(self) -> Iterator[Steps]:
        """Time the steps (see the module docstring) until the block ends."""
        from tidings.delivery.routing import Router
        from tidings.delivery.unit import Flusher
        from tidings.hub.posting import Posting
        from tidings.store.pg_wire import Wire

        inside = self._inside
        perf = time.perf_counter

        def timed(owner: Any, attr: str, name: str | None) -> tuple[Any, str, Any]:
            """Wrap ``owner.attr``: a step (``name``), or with None the wait on PostgreSQL,
            charged to the outermost step its thread is in."""
            original = getattr(owner, attr)

            @functools.wraps(original)
            def wrapper(*args: Any, **kwargs: Any) -> Any:
                outer = getattr(inside, "step", None)
                step = name or f"{outer or 'other'} waiting on PostgreSQL"
                inside.step = outer or name
                started = perf()
                try:
                    return original(*args, **kwargs)
                finally:
                    self.add(step, perf() - started)
                    inside.step = outer

            setattr(owner, attr, wrapper)
            return owner, attr, original

        saved = [
            timed(Posting, "post", "post"),
            timed(Router, "read_batch", "consumer read"),
            timed(Router, "fan_out", "fan-out"),
            timed(Flusher, "_write", "flush"),
            timed(Wire, "_next", None),
        ]
        try:
            yield self
        finally:
            for owner, attr, original in reversed(saved):
                setattr(owner, attr, original)


def profile(url: str, backend: str, *, agents: int, messages: int, reporter: Any) -> dict[str, Any]:
    """One fan-out run, profiled: per-message wall, CPU by thread and step walls (µs)."""
    import bench_delivery

    steps = Steps()
    marks: dict[str, tuple[float, float, dict[str, float]]] = {}
    readers = bench_delivery.Readers
    enter, leave = readers.__enter__, readers.__exit__

    def entered(self: Any) -> Any:
        got = enter(self)
        marks["start"] = (time.perf_counter(), time.process_time(), thread_cpu())
        steps.counting = True
        return got

    def left(self: Any, *exc: Any) -> Any:
        marks["end"] = (time.perf_counter(), time.process_time(), thread_cpu())
        steps.counting = False
        return leave(self, *exc)

    readers.__enter__, readers.__exit__ = entered, left  # type: ignore[method-assign]
    try:
        with steps.hooked():
            run = bench_delivery.run_fanout(url, agents=agents, messages=messages, reporter=reporter, label=backend)
    finally:
        readers.__enter__, readers.__exit__ = enter, leave  # type: ignore[method-assign]
    (w0, c0, t0), (w1, c1, t1) = marks["start"], marks["end"]
    per = 1e6 / messages
    cpu = {role: round((t1.get(role, 0.0) - t0.get(role, 0.0)) * per) for role in sorted(set(t0) | set(t1))}
    wall_us = run["elapsed_s"] * per
    process_cpu_us = (c1 - c0) * per
    window_us = (w1 - w0) * per
    return {
        "backend": backend,
        "agents": agents,
        "messages": messages,
        "messages_per_s": run["messages_per_s"],
        "complete": run["complete"],
        "wall_us_per_message": round(wall_us),
        "window_us_per_message": round(window_us),  # readers' window: wall plus their last reads
        "process_cpu_us_per_message": round(process_cpu_us),
        "no_thread_running_us_per_message": round(max(0.0, window_us - process_cpu_us)),
        "thread_cpu_us_per_message": cpu,
        "step_wall_us_per_message": {name: round(s * per) for name, s in sorted(steps.wall.items())},
        "step_calls_per_message": {name: round(n / messages, 2) for name, n in sorted(steps.calls.items())},
        "round_trips_per_message": run["round_trips_per_message"],
    }


def main(argv: list[str] | None = None, *, configure_logging: bool = True) -> int:
    """The command. ``configure_logging=False`` (tests) leaves structlog's global
    configuration alone: quieting it here would hide later tests' captured logs."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--backend", default="both", choices=["sqlite", "postgresql", "both"])
    p.add_argument("--agents", type=int, default=50)
    p.add_argument("--messages", type=int, default=2_000)
    p.add_argument("--rounds", type=int, default=1, help="runs per backend, the backends taking turns")
    p.add_argument("--json", help="also write the results here")
    args = p.parse_args(argv)
    if not os.path.isdir("/proc/self/task"):
        print("fanout_profile.py reads each thread's CPU from /proc: Linux only", file=sys.stderr)
        return 2
    import structlog
    from rich.console import Console
    from rich.table import Table

    import benchlib

    if configure_logging:
        structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(40))  # errors only
    console = Console()
    reporter = benchlib.Reporter(console, enabled=False)
    backends = ["sqlite", "postgresql"] if args.backend == "both" else [args.backend]
    dbs = benchlib.Databases()
    results: list[dict[str, Any]] = []
    try:
        for k in range(args.rounds):
            for backend in backends if k % 2 == 0 else list(reversed(backends)):
                url = dbs.fresh(backend, f"fanprof{k}")
                results.append(profile(url, backend, agents=args.agents, messages=args.messages, reporter=reporter))
                dbs.drop(url)
    finally:
        dbs.close()
    table = Table(title=f"fan-out into {args.agents} queues, one poster, µs a message")
    table.add_column("figure", no_wrap=True)
    for r in results:
        table.add_column(f"{r['backend']}", justify="right")
    figures: list[tuple[str, Any]] = [
        ("messages/s", lambda r: f"{r['messages_per_s']:,.0f}"),
        ("wall", lambda r: r["wall_us_per_message"]),
        ("process CPU (every thread)", lambda r: r["process_cpu_us_per_message"]),
        ("no thread running (window − CPU)", lambda r: r["no_thread_running_us_per_message"]),
    ]
    roles = sorted({role for r in results for role in r["thread_cpu_us_per_message"]})
    figures += [(f"CPU: {role}", lambda r, role=role: r["thread_cpu_us_per_message"].get(role, 0)) for role in roles]
    names = sorted({name for r in results for name in r["step_wall_us_per_message"]})
    figures += [(f"wall: {name}", lambda r, name=name: r["step_wall_us_per_message"].get(name, 0)) for name in names]
    figures.append(("round trips", lambda r: r["round_trips_per_message"]))
    for label, get in figures:
        table.add_row(label, *[f"{get(r):,}" if not isinstance(get(r), str) else get(r) for r in results])
    console.print(table)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2), encoding="utf-8")
    return 0 if all(r["complete"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
