"""Sections 2-4: post→steer latency, fan-out throughput, recovery-scan rate and memory.

All three use the real hub: ``Runtime`` (store, bus, posting, the delivery engine with its
consumer on its own thread, as in ``tidings serve``), real accounts and channels made
through ``tidings.hub``, and agent sessions connected in-process with
``runtime.delivery.connect(agent_id)``. The sessions are read the way the SSE endpoint
reads them: one asyncio loop (on its own thread) awaiting ``Session.next`` for every
session.

Posts come from an open loop (``open_loop``): post i is due at ``start + i/rate`` whatever
the earlier posts took, spread over a few poster threads (4 by default, like concurrent
HTTP requests in the server's threadpool), so a slow commit delays its own post, not the
schedule. Each post is timed from the moment it is called.

Two timestamps per dispatch:

* **queued** — when the consumer put it on the session's queue. The benchmark wraps
  ``Session.offer`` (a class attribute, for the bench process only, restored afterwards)
  to stamp every accepted offer; nothing in ``src/`` changes.
* **read** — when the session's reader took it off the queue (what an agent's stream sees,
  including the reader thread's wake-up).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import threading
import time
import tracemalloc
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from benchlib import Reporter, latency_ms, peak_rss_kb, ratio, raw_connect, reset_peak_rss, rss_kb

ADMIN_TOKEN = "tdg_bench_admin"


# -- the world ---------------------------------------------------------------------------------
@dataclass
class World:
    human_id: str
    channel_id: str
    agents: list[tuple[str, str]]  # (account id, handle)


def make_world(runtime: Any, n_agents: int, *, subscribe: int | None = None, tag: str = "") -> World:
    """A human, ``n_agents`` agents it owns, and one channel with all of them as members;
    the first ``subscribe`` agents (default all) subscribed to it."""
    from tidings.hub import accounts, channels
    from tidings.hub.tokens import Principal

    store = runtime.store
    human = accounts.create_account(store, kind="human", handle=f"bench-human{tag}")
    agents = [
        accounts.create_account(store, kind="agent", handle=f"agent{tag}{i:02d}", owner=human.id)
        for i in range(n_agents)
    ]
    principal = Principal(scope="account", account_id=human.id, kind="human")
    channel = channels.create_channel(store, principal, name=f"bench{tag}", members=[a.id for a in agents])
    k = n_agents if subscribe is None else subscribe
    if k:
        channels.update_members(store, principal, channel["id"], {"subscribe": [a.id for a in agents[:k]]})
    return World(human.id, channel["id"], [(a.id, a.handle) for a in agents])


def new_runtime(url: str) -> Any:
    from tidings.faults import Faults
    from tidings.runtime import Runtime

    return Runtime(url, faults=Faults(), admin_token=ADMIN_TOKEN)


# -- observing dispatches ------------------------------------------------------------------------
@dataclass
class Stamp:
    kind: str
    message_id: str
    agent_id: str
    at: float


@contextlib.contextmanager
def stamp_offers() -> Iterator[list[Stamp]]:
    """Stamp every dispatch a session accepts (see the module docstring)."""
    from tidings.delivery.sessions import OFFER_OK, Session

    stamps: list[Stamp] = []
    original = Session.offer
    perf = time.perf_counter

    def offer(self: Any, item: Any) -> str:
        outcome = original(self, item)
        if outcome == OFFER_OK:
            stamps.append(Stamp(item.kind, item.message["id"], self.agent_id, perf()))
        return outcome

    Session.offer = offer  # type: ignore[method-assign]
    try:
        yield stamps
    finally:
        Session.offer = original  # type: ignore[method-assign]


class Readers:
    """One asyncio loop on its own thread reading every session (like the SSE endpoint)."""

    def __init__(self, sessions: list[Any]) -> None:
        self.sessions = sessions
        self.read: list[Stamp] = []
        self.ended: list[str] = []
        self._stopping = False
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()), name="bench-readers", daemon=True)

    def __enter__(self) -> Readers:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stopping = True
        self._thread.join(10)

    async def _main(self) -> None:
        await asyncio.gather(*(self._read(s) for s in self.sessions))

    async def _read(self, session: Any) -> None:
        from tidings.delivery.sessions import SessionEnd

        perf = time.perf_counter
        while not self._stopping:
            item = await session.next(0.1)
            if item is None:
                continue
            if isinstance(item, SessionEnd):
                self.ended.append(session.agent_id)
                return
            self.read.append(Stamp(item.kind, item.message_id, session.agent_id, perf()))


def _wait_for(predicate: Any, timeout: float) -> bool:
    deadline = time.perf_counter() + timeout
    while time.perf_counter() < deadline:
        if predicate():
            return True
        time.sleep(0.005)
    return predicate()


def _connect_all(runtime: Any, world: World) -> list[Any]:
    sessions = [runtime.delivery.connect(agent_id) for agent_id, _ in world.agents]
    runtime.delivery.wait_idle(60)
    return sessions


# -- section 2: post -> steer latency --------------------------------------------------------------
@dataclass
class _Post:
    message_id: str
    agent_id: str
    intended: float
    called: float
    returned: float


@contextlib.contextmanager
def profile_consumer(path: str | None) -> Iterator[None]:
    """With ``path``: profile the delivery consumer's thread (pyinstrument, started inside
    that thread by wrapping ``Consumer.run`` for this process only) and save it there."""
    if not path:
        yield
        return
    from pathlib import Path

    from pyinstrument import Profiler

    from tidings.delivery.consumer import Consumer

    original = Consumer.run

    def run(self: Any) -> None:
        profiler = Profiler(interval=0.0005)
        profiler.start()
        try:
            original(self)
        finally:
            profiler.stop()
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            Path(path).write_text(profiler.output_html(), encoding="utf-8")
            Path(path).with_suffix(".txt").write_text(
                profiler.output_text(unicode=False, color=False), encoding="utf-8"
            )

    Consumer.run = run  # type: ignore[method-assign]
    try:
        yield
    finally:
        Consumer.run = original  # type: ignore[method-assign]


def open_loop(fn: Any, *, total: int, rate: float, posters: int, update: Any = None,
              profiler: Any = None) -> list[_Post]:
    """Call ``fn(i)`` for i in 0..total-1, call i at ``start + i/rate`` whatever the
    earlier calls took (an open loop: a slow call does not slow the schedule down, up to
    ``posters`` calls in flight, one per poster thread). ``fn`` returns (message id,
    agent id); each call's intended, start and end times are kept. ``profiler`` (if any)
    profiles poster 0."""
    perf = time.perf_counter
    out: list[_Post | None] = [None] * total
    errors: list[BaseException] = []
    start = perf() + 0.05

    def poster(j: int) -> None:
        if profiler is not None and j == 0:
            profiler.start()
        try:
            for i in range(j, total, posters):
                intended = start + i / rate
                delay = intended - perf()
                if delay > 0:
                    time.sleep(delay)
                called = perf()
                message_id, agent_id = fn(i)
                out[i] = _Post(message_id, agent_id, intended, called, perf())
                if update is not None and j == 0 and i % 64 == 0:
                    update(i)
        except BaseException as exc:  # noqa: BLE001 - re-raised on the caller's thread
            errors.append(exc)
        finally:
            if profiler is not None and j == 0:
                profiler.stop()

    threads = [threading.Thread(target=poster, args=(j,), name=f"bench-poster-{j}") for j in range(posters)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return [p for p in out if p is not None]


def run_latency(url: str, *, rate: float, seconds: float, warmup_s: float, agents: int, reporter: Reporter,
                label: str, posters: int = 4, profile: str | None = None) -> dict[str, Any]:
    with profile_consumer(profile):
        return _run_latency(url, rate=rate, seconds=seconds, warmup_s=warmup_s, agents=agents, reporter=reporter,
                            label=label, posters=posters, profile=profile)


def _run_latency(url: str, *, rate: float, seconds: float, warmup_s: float, agents: int, reporter: Reporter,
                 label: str, posters: int, profile: str | None) -> dict[str, Any]:
    runtime = new_runtime(url)
    profiler = None
    if profile:
        from pyinstrument import Profiler

        profiler = Profiler(interval=0.0005)
    try:
        world = make_world(runtime, agents)
        runtime.start()
        sessions = _connect_all(runtime, world)
        warm = int(rate * warmup_s)
        total = warm + int(rate * seconds)
        post = runtime.posting.post

        def one(i: int) -> tuple[str, str]:
            agent_id, handle = world.agents[i % agents]
            row, _ = post(author_id=world.human_id, channel_id=world.channel_id, text=f"@{handle} please pick up item {i}")
            return row["id"], agent_id

        with stamp_offers() as stamps, Readers(sessions) as readers:
            with reporter.step(f"latency: {rate:g} posts/s on {label}", total) as update:
                posts = open_loop(one, total=total, rate=rate, posters=posters, update=update, profiler=profiler)
                if profiler is not None:
                    _save(profiler, str(profile).replace(".html", "_poster.html"))
                update(total)
            measured = posts[warm:]
            wanted = {p.message_id for p in measured}
            _wait_for(lambda: wanted <= {s.message_id for s in list(readers.read) if s.kind == "steer"}, 30)
            runtime.delivery.wait_idle(30)
            steer_queued = {(s.message_id, s.agent_id): s.at for s in stamps if s.kind == "steer"}
            steer_read = {(s.message_id, s.agent_id): s.at for s in readers.read if s.kind == "steer"}
            delivered_to_mentioned = sum(
                1 for s in stamps if s.kind == "deliver" and (s.message_id, s.agent_id) in steer_queued
            )
        queued, read, from_intended, calls, missing = [], [], [], [], 0
        for p in measured:
            key = (p.message_id, p.agent_id)
            calls.append(p.returned - p.called)
            if key not in steer_queued or key not in steer_read:
                missing += 1
                continue
            queued.append(steer_queued[key] - p.called)
            read.append(steer_read[key] - p.called)
            from_intended.append(steer_queued[key] - p.intended)
        span = max(p.called for p in measured) - min(p.called for p in measured) if len(measured) > 1 else 0.0
        status = runtime.delivery.status()
        return {
            "agents": agents,
            "posters": posters,
            "rate_target_per_s": rate,
            "rate_achieved_per_s": round((len(measured) - 1) / span, 1) if span > 0 else None,
            "posts_measured": len(measured),
            "posts_warmup": warm,
            "post_call": latency_ms(calls),
            "steer_queued": latency_ms(queued),
            "steer_read": latency_ms(read),
            "steer_queued_from_schedule": latency_ms(from_intended),
            "max_schedule_lag_ms": round(max((p.called - p.intended for p in measured), default=0.0) * 1000, 3),
            "missing_steers": missing,
            "mentioned_also_delivered": delivered_to_mentioned,
            "delivered": status.get("delivered"),
            "steered": status.get("steered"),
            "dispatch_refused": status.get("dispatch_refused"),
        }
    finally:
        runtime.stop()


def _save(profiler: Any, path: str) -> None:
    from pathlib import Path

    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(profiler.output_html(), encoding="utf-8")
    Path(path).with_suffix(".txt").write_text(profiler.output_text(unicode=False, color=False), encoding="utf-8")


# -- section 3: fan-out throughput ------------------------------------------------------------------
def run_fanout(url: str, *, agents: int, messages: int, reporter: Reporter, label: str,
               posters: int = 1) -> dict[str, Any]:
    """Posts as fast as ``posters`` threads can (each posts its share, one post after the
    other); throughput = messages / (first post .. every dispatch queued and the consumer
    idle). One poster measures the post call's latency as much as the fan-out: each post
    waits for its commit before the next starts. Several posters are what the server sees
    from concurrent HTTP requests (its threadpool), and their commits overlap.
    ``agents=0``: the same with nobody to deliver to (the post path and the consumer pass
    alone), the baseline."""
    runtime = new_runtime(url)
    try:
        world = make_world(runtime, agents)
        runtime.start()
        sessions = _connect_all(runtime, world)
        post = runtime.posting.post
        perf = time.perf_counter
        meter_before = runtime.store.meter.snapshot()
        with stamp_offers() as stamps, Readers(sessions) as readers:
            with reporter.step(f"fan-out: {agents} agents, {posters} poster(s) on {label}", messages) as update:
                done = [0] * posters

                def poster(k: int) -> None:
                    for i in range(k, messages, posters):
                        post(author_id=world.human_id, channel_id=world.channel_id, text=f"status update {i}")
                        done[k] += 1
                        if k == 0 and i % 64 == 0:
                            update(sum(done))

                threads = [threading.Thread(target=poster, args=(k,), name=f"bench-poster-{k}")
                           for k in range(1, posters)]
                started = perf()
                for th in threads:
                    th.start()
                poster(0)
                for th in threads:
                    th.join()
                posted = perf()
                update(messages)
            expected = agents * messages
            complete = _wait_for(lambda: len(stamps) >= expected, 120)
            runtime.delivery.wait_idle(60)
            finished = perf()
            pairs = {(s.message_id, s.agent_id) for s in stamps if s.kind == "deliver"}
            _wait_for(lambda: len(readers.read) >= len(stamps), 60)
        elapsed = finished - started
        status = runtime.delivery.status()
        meter_after = runtime.store.meter.snapshot()  # poster + consumer threads: approximate
        return {
            "agents": agents,
            "posters": posters,
            "messages": messages,
            "round_trips_per_message": round(
                (meter_after["round_trips"] - meter_before["round_trips"]) / messages, 2),
            "statements_per_message": round(
                (meter_after["statements"] - meter_before["statements"]) / messages, 2),
            "post_phase_s": round(posted - started, 3),
            "elapsed_s": round(elapsed, 3),
            "messages_per_s": round(messages / elapsed, 1),
            "dispatches_per_s": round(len(pairs) / elapsed, 1),
            "dispatches": len(pairs),
            "dispatches_expected": expected,
            "complete": complete and len(pairs) == expected,
            "dispatch_refused": status.get("dispatch_refused"),
            "read_by_sessions": len(readers.read),
        }
    finally:
        runtime.stop()


# -- section 4: the recovery scan ---------------------------------------------------------------------
AGENTS_IN_SCAN = 10
MENTION_EVERY = 10  # one message in ten mentions an agent (half of them outside the sweep set)


def _bulk_insert(url: str, world: World, topic_id: str, first_seq: int, count: int, at_ms: int) -> None:
    """``count`` committed messages with ``mentions_routed_at`` NULL: the state a crash
    between commit and routing leaves (the bus event never reached the consumer)."""
    rows = []
    for i in range(count):
        n = first_seq + i
        if n % MENTION_EVERY == 0:
            handle = world.agents[(n // MENTION_EVERY) % len(world.agents)][1]
            text = f"@{handle} can you check build {n}?"
        else:
            text = f"build {n} passed"
        blocks = json.dumps([{"kind": "text", "text": text}], separators=(",", ":"))
        rows.append((f"msg_bench{n:012d}", world.channel_id, n, topic_id, world.human_id, at_ms, blocks, text))
    conn = raw_connect(url)
    sql = (
        "INSERT INTO messages (id, channel_id, channel_seq, topic_id, author_account_id, at_unix_ms, blocks, text, "
        "client_request_id) VALUES ({0}, {0}, {0}, {0}, {0}, {0}, {0}, {0}, '')"
    )
    last = first_seq + count - 1
    if isinstance(conn, __import__("sqlite3").Connection):
        conn.execute("BEGIN IMMEDIATE")
        conn.executemany(sql.format("?"), rows)
        conn.execute("UPDATE channels SET last_seq = ? WHERE id = ?", (last, world.channel_id))
        conn.execute("COMMIT")
    else:
        with conn.transaction():
            conn.cursor().executemany(sql.format("%s"), rows)
            conn.execute("UPDATE channels SET last_seq = %s WHERE id = %s", (last, world.channel_id))
    conn.close()


def _reset_routing(url: str) -> int:
    conn = raw_connect(url)
    try:
        conn.execute("UPDATE messages SET mentions_routed_at = NULL")
        conn.execute("DELETE FROM owed_mentions")
        return int(conn.execute("SELECT count(*) FROM messages WHERE mentions_routed_at IS NULL").fetchone()[0])
    finally:
        conn.close()


def _unrouted(url: str) -> tuple[int, int]:
    conn = raw_connect(url)
    try:
        left = conn.execute("SELECT count(*) FROM messages WHERE mentions_routed_at IS NULL").fetchone()[0]
        owed = conn.execute("SELECT count(*) FROM owed_mentions").fetchone()[0]
        return int(left), int(owed)
    finally:
        conn.close()


def _raw_scan(url: str, batch: int) -> float:
    """The floor: walk the unrouted rows in keyset batches and mark each batch, plain DBAPI."""
    conn = raw_connect(url)
    sqlite = isinstance(conn, __import__("sqlite3").Connection)
    started = time.perf_counter()
    after = 0
    while True:
        if sqlite:
            rows = conn.execute(
                "SELECT seq, blocks FROM messages WHERE mentions_routed_at IS NULL AND seq > ? ORDER BY seq LIMIT ?",
                (after, batch),
            ).fetchall()
        else:
            with conn.transaction():
                conn.execute("SET LOCAL enable_sort = off")
                rows = conn.execute(
                    "SELECT seq, blocks FROM messages WHERE mentions_routed_at IS NULL AND seq > %s ORDER BY seq LIMIT %s",
                    (after, batch),
                ).fetchall()
        if not rows:
            break
        seqs = [r[0] for r in rows]
        if sqlite:
            conn.execute("BEGIN IMMEDIATE")
            conn.execute(
                "UPDATE messages SET mentions_routed_at = 1 WHERE seq IN (SELECT value FROM json_each(?))",
                (json.dumps(seqs),),
            )
            conn.execute("COMMIT")
        else:
            with conn.transaction():
                conn.execute("UPDATE messages SET mentions_routed_at = 1 WHERE seq = ANY(%s)", (seqs,))
        after = seqs[-1]
        if len(rows) < batch:
            break
    elapsed = time.perf_counter() - started
    conn.close()
    return elapsed


def _scan_once(runtime: Any, measure_memory: bool) -> dict[str, Any]:
    from tidings.delivery.engine import Delivery

    delivery = Delivery(runtime, threaded=False, scan_enabled=False, scan_interval_ms=0)
    delivery.start()  # opens the consumer (subscribes, no start scan)
    try:
        gc.collect()
        out: dict[str, Any] = {}
        if measure_memory:
            tracemalloc.start()
            tracemalloc.reset_peak()
            base = tracemalloc.get_traced_memory()[0]
            started = time.perf_counter()
            marked = delivery.consumer.scan()
            out["elapsed_traced_s"] = round(time.perf_counter() - started, 3)
            out["tracemalloc_peak_kb"] = round((tracemalloc.get_traced_memory()[1] - base) / 1024, 1)
            tracemalloc.stop()
        else:
            hwm_reset = reset_peak_rss()
            rss_before = rss_kb()
            started = time.perf_counter()
            marked = delivery.consumer.scan()
            out["elapsed_s"] = round(time.perf_counter() - started, 4)
            peak = peak_rss_kb()
            if hwm_reset and peak is not None and rss_before is not None:
                out["rss_peak_delta_kb"] = max(0, peak - rss_before)
            out["rss_after_kb"] = rss_kb()
        out["marked"] = marked
        out["owed_recorded"] = delivery.counters.snapshot().get("owed_recorded")
        return out
    finally:
        delivery.stop()


def run_recovery(url: str, *, sizes: list[int], batch_note: int, reporter: Reporter, label: str) -> dict[str, Any]:
    """For each backlog size (ascending): insert up to that many unrouted messages, then time
    the scan (no tracemalloc), again under tracemalloc (memory), and the raw floor."""
    runtime = new_runtime(url)
    try:
        world = make_world(runtime, AGENTS_IN_SCAN, subscribe=AGENTS_IN_SCAN // 2, tag="s")
        first, _ = runtime.posting.post(author_id=world.human_id, channel_id=world.channel_id, text="scan backlog")
        have = 1
        results: dict[str, Any] = {}
        for size in sorted(sizes):
            with reporter.step(f"recovery: inserting {size:,} unrouted messages on {label}", size) as update:
                step = 20_000
                while have < size:
                    n = min(step, size - have)
                    _bulk_insert(url, world, first["topic_id"], have + 1, n, first["at_unix_ms"])
                    have += n
                    update(have)
            unrouted = _reset_routing(url)
            with reporter.step(f"recovery: scan of {unrouted:,} on {label}", None):
                speed = _scan_once(runtime, measure_memory=False)
            left, owed = _unrouted(url)
            _reset_routing(url)
            with reporter.step(f"recovery: scan of {unrouted:,} under tracemalloc on {label}", None):
                memory = _scan_once(runtime, measure_memory=True)
            _reset_routing(url)
            with reporter.step(f"recovery: raw keyset walk of {unrouted:,} on {label}", None):
                raw_s = _raw_scan(url, batch_note)
            results[str(size)] = {
                "messages": unrouted,
                "scan_s": speed["elapsed_s"],
                "messages_per_s": round(unrouted / speed["elapsed_s"], 1),
                "raw_walk_s": round(raw_s, 4),
                "raw_messages_per_s": round(unrouted / raw_s, 1),
                "ours_over_raw": ratio(raw_s, speed["elapsed_s"], 3),
                "marked": speed["marked"],
                "owed_recorded": speed["owed_recorded"],
                "owed_rows": owed,
                "unrouted_after": left,
                "tracemalloc_peak_kb": memory["tracemalloc_peak_kb"],
                "rss_peak_delta_kb": speed.get("rss_peak_delta_kb"),
                "rss_after_kb": speed.get("rss_after_kb"),
            }
            reporter.note(
                f"recovery [{label}] {unrouted:,}: {results[str(size)]['messages_per_s']:,.0f} msgs/s "
                f"(raw {results[str(size)]['raw_messages_per_s']:,.0f}), tracemalloc peak "
                f"{memory['tracemalloc_peak_kb']:,.0f} KiB, unrouted after {left}"
            )
        small, large = str(min(sizes)), str(max(sizes))
        return {
            "by_size": results,
            "scan_batch": batch_note,
            "memory_growth_large_over_small": ratio(
                results[large]["tracemalloc_peak_kb"], results[small]["tracemalloc_peak_kb"]
            ),
        }
    finally:
        runtime.stop()
