"""Shared pieces of the benchmark: throwaway databases, statistics, memory, progress.

Every measurement in ``bench/`` runs on a fresh database: a SQLite file in a temporary
directory, or a PostgreSQL database created for it and dropped afterwards
(``TIDINGS_BENCH_PG`` names the server's admin URL; default the local trust-auth server).
Times are wall-clock ``time.perf_counter`` readings: this is speed, nothing is pinned.
"""

from __future__ import annotations

import contextlib
import math
import os
import platform
import secrets
import shutil
import sqlite3
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

PG_ADMIN_URL = os.environ.get("TIDINGS_BENCH_PG", "postgresql://postgres@127.0.0.1:5432/postgres")
BACKENDS = ("sqlite", "postgresql")

# The main tables the ingest projection writes (and the inbox), in foreign-key order.
INGEST_TABLES = (
    "accounts",
    "bridges",
    "inbox",
    "identities",
    "conversations",
    "conversation_participants",
    "bridge_messages",
    "reactions",
    "reaction_fences",
    "read_cursors",
)
PROJECTED_TABLES = INGEST_TABLES[3:]


# -- databases ------------------------------------------------------------------------------
def _pg_admin() -> Any:
    import psycopg

    return psycopg.connect(PG_ADMIN_URL, autocommit=True, connect_timeout=10)


class Databases:
    """Hands out fresh databases and removes them all at the end (``close``)."""

    #: ``ALTER DATABASE ... SET`` for every PostgreSQL database handed out (``bench/run.py
    #: --pg-synchronous-commit off``: SQLite's durability, a diagnostic, never the default).
    pg_settings: dict[str, str] = {}

    def __init__(self, workdir: Path | None = None) -> None:
        self._own_dir = workdir is None
        self.dir = Path(tempfile.mkdtemp(prefix="tidings-bench-")) if workdir is None else workdir
        self.dir.mkdir(parents=True, exist_ok=True)
        self._pg: list[str] = []
        self._n = 0

    def fresh(self, backend: str, label: str) -> str:
        """A URL of a new, empty database (no schema yet)."""
        self._n += 1
        tag = f"{label}_{self._n}_{secrets.token_hex(3)}".replace("-", "_")
        if backend == "sqlite":
            return str(self.dir / f"{tag}.db")
        if backend != "postgresql":
            raise ValueError(f"unknown backend {backend!r}")
        name = f"tidings_bench_{tag}"[:63]
        with _pg_admin() as admin:
            admin.execute(f'CREATE DATABASE "{name}"')
            for key, value in self.pg_settings.items():
                admin.execute(f'ALTER DATABASE "{name}" SET {key} = {value}')
        self._pg.append(name)
        return f"{PG_ADMIN_URL.rsplit('/', 1)[0]}/{name}"

    def drop(self, url: str) -> None:
        """Drop one database now (PostgreSQL) or delete its files (SQLite)."""
        if url.startswith(("postgresql://", "postgres://")):
            name = url.rsplit("/", 1)[1]
            _drop_pg(name)
            if name in self._pg:
                self._pg.remove(name)
            return
        for suffix in ("", "-wal", "-shm", "-journal"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(url + suffix)

    def close(self) -> None:
        for name in list(self._pg):
            with contextlib.suppress(Exception):
                _drop_pg(name)
        self._pg.clear()
        if self._own_dir:
            shutil.rmtree(self.dir, ignore_errors=True)


def _drop_pg(name: str) -> None:
    with _pg_admin() as admin:
        admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s", (name,))
        admin.execute(f'DROP DATABASE IF EXISTS "{name}"')


def pg_reachable() -> str | None:
    """None when the PostgreSQL server answers, else the reason."""
    try:
        with _pg_admin() as admin:
            admin.execute("SELECT 1")
    except Exception as exc:  # noqa: BLE001 - reported, not raised
        return f"{type(exc).__name__}: {exc}".strip()
    return None


def raw_connect(url: str) -> Any:
    """A plain DBAPI connection (sqlite3 autocommit / psycopg), outside the store."""
    if url.startswith(("postgresql://", "postgres://")):
        import psycopg

        return psycopg.connect(url, autocommit=True)
    conn = sqlite3.connect(url, isolation_level=None)
    conn.execute("PRAGMA foreign_keys=ON")
    conn.execute("PRAGMA busy_timeout=5000")
    conn.execute("PRAGMA synchronous=NORMAL")
    return conn


def table_counts(url: str, tables: tuple[str, ...] = PROJECTED_TABLES) -> dict[str, int]:
    conn = raw_connect(url)
    try:
        return {t: int(conn.execute(f"SELECT count(*) FROM {t}").fetchone()[0]) for t in tables}
    finally:
        conn.close()


def inbox_outcomes(url: str) -> dict[str, int]:
    conn = raw_connect(url)
    try:
        rows = conn.execute("SELECT coalesce(outcome, 'unprocessed'), count(*) FROM inbox GROUP BY 1").fetchall()
    finally:
        conn.close()
    out = {"applied": 0, "quarantined": 0, "unprocessed": 0}
    out.update({str(k): int(v) for k, v in rows})
    return out


# -- statistics -------------------------------------------------------------------------------
def percentile(ordered: list[float], q: float) -> float:
    """Nearest-rank percentile of an ascending list (0.0 for an empty one)."""
    if not ordered:
        return 0.0
    rank = max(1, math.ceil(q * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]


def latency_ms(seconds: list[float]) -> dict[str, Any]:
    """p50/p90/p99/max/mean in milliseconds of a list of durations in seconds."""
    ordered = sorted(seconds)
    if not ordered:
        return {"n": 0, "p50_ms": None, "p90_ms": None, "p99_ms": None, "max_ms": None, "mean_ms": None}
    return {
        "n": len(ordered),
        "p50_ms": round(percentile(ordered, 0.50) * 1000, 3),
        "p90_ms": round(percentile(ordered, 0.90) * 1000, 3),
        "p99_ms": round(percentile(ordered, 0.99) * 1000, 3),
        "max_ms": round(ordered[-1] * 1000, 3),
        "mean_ms": round(sum(ordered) / len(ordered) * 1000, 3),
    }


def ratio(a: float | None, b: float | None, digits: int = 2) -> float | None:
    if a is None or b is None or b == 0:
        return None
    return round(a / b, digits)


# -- memory ---------------------------------------------------------------------------------------
def _status_kb(field: str) -> int | None:
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def rss_kb() -> int | None:
    return _status_kb("VmRSS")


def reset_peak_rss() -> bool:
    """Reset the kernel's peak-RSS mark (VmHWM) to the current RSS; False if not possible."""
    try:
        with open("/proc/self/clear_refs", "w", encoding="ascii") as fh:
            fh.write("5")
        return True
    except OSError:
        return False


def peak_rss_kb() -> int | None:
    return _status_kb("VmHWM")


def server_cpu_s(url: str) -> float | None:
    """CPU seconds (user + system) used so far by every PostgreSQL server process on this
    machine (backends, WAL writer, checkpointer: all of them, children's waited-for time
    included), read from ``/proc``; None for SQLite, for a server on another host, or
    where ``/proc`` cannot be read. The difference over a run is the server's share of the
    run's work, which the client's own CPU time does not show (D111)."""
    parts = urlsplit(url)
    if parts.scheme.split("+", 1)[0] not in ("postgresql", "postgres"):
        return None
    if (parts.hostname or "") not in ("127.0.0.1", "localhost", "::1", ""):
        return None
    try:
        ticks = os.sysconf("SC_CLK_TCK")
        pids = [p for p in os.listdir("/proc") if p.isdigit()]
    except (OSError, ValueError):
        return None
    total = 0
    found = False
    for pid in pids:
        try:
            with open(f"/proc/{pid}/comm", encoding="utf-8") as fh:
                if not fh.read().startswith("postgres"):
                    continue
            with open(f"/proc/{pid}/stat", encoding="utf-8") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
        except OSError:
            continue  # the process ended between the listing and the read
        # utime, stime, cutime, cstime: fields 14-17 of stat(5), 11-14 after the name
        total += int(fields[11]) + int(fields[12]) + int(fields[13]) + int(fields[14])
        found = True
    return total / ticks if found else None


class RunCpu:
    """The CPU a run used, the client's (this process) and a local PostgreSQL server's
    (``server_cpu_s``): made just before the timed loop, ``stop()`` just after it, then
    ``split(wall_s, frames)`` gives the figures every ingest run reports (D111). One client
    sending one request after another waits for the server, so the two add up: a frame
    costs at least client CPU + server CPU + the commit's flush, whatever the round trips."""

    __slots__ = ("_url", "_server", "_client", "client_s", "server_s")

    def __init__(self, url: str) -> None:
        self._url = url
        self._server = server_cpu_s(url)
        self._client = time.process_time()
        self.client_s = 0.0
        self.server_s: float | None = None

    def stop(self) -> RunCpu:
        self.client_s = time.process_time() - self._client
        after = server_cpu_s(self._url)
        if self._server is not None and after is not None:
            self.server_s = max(0.0, after - self._server)
        return self

    def split(self, wall_s: float, frames: int) -> dict[str, Any]:
        """CPU ms per frame and share of the wall time, the client's and (if read) the server's."""
        out: dict[str, Any] = {"client_cpu_ms_per_frame": round(self.client_s * 1000 / frames, 3),
                               "client_cpu_share": round(self.client_s / wall_s, 3)}
        if self.server_s is not None:
            out["server_cpu_ms_per_frame"] = round(self.server_s * 1000 / frames, 3)
            out["server_cpu_share"] = round(self.server_s / wall_s, 3)
        return out


# -- machine --------------------------------------------------------------------------------------
def machine() -> dict[str, Any]:
    info: dict[str, Any] = {
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "sqlite": sqlite3.sqlite_version,
    }
    with contextlib.suppress(OSError):
        info["loadavg_at_start"] = [round(x, 2) for x in os.getloadavg()]
    with contextlib.suppress(Exception):
        with _pg_admin() as admin:
            info["postgresql"] = admin.execute("SHOW server_version").fetchone()[0]
            info["pg_fsync"] = admin.execute("SHOW fsync").fetchone()[0]
            info["pg_synchronous_commit"] = admin.execute("SHOW synchronous_commit").fetchone()[0]
    return info


# -- progress ----------------------------------------------------------------------------------------
class Reporter:
    """Rich progress bars for the long steps and a one-line note when each step ends."""

    def __init__(self, console: Console, enabled: bool = True) -> None:
        self.console = console
        self.enabled = enabled
        self.progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            console=console,
            transient=True,
            disable=not enabled,
        )

    def __enter__(self) -> Reporter:
        self.progress.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.progress.stop()

    @contextlib.contextmanager
    def step(self, description: str, total: float | None = None) -> Iterator[Callable[[float], None]]:
        """A progress bar for one step; yields ``update(completed)``."""
        task = self.progress.add_task(description, total=total)
        last = [0.0]

        def update(completed: float) -> None:
            now = time.perf_counter()
            if now - last[0] >= 0.1 or (total is not None and completed >= total):
                last[0] = now
                self.progress.update(task, completed=completed)

        try:
            yield update
        finally:
            self.progress.remove_task(task)

    def note(self, text: str) -> None:
        if self.enabled:
            self.progress.console.print(text, markup=False, highlight=False)


def configure_logs() -> None:
    """Engine logs at ERROR unless ``TIDINGS_LOG_LEVEL`` says otherwise: a quarantined
    frame is a WARNING by design, and the corpus has ~0.5% of them on purpose."""
    from tidings import logs

    logs.configure(level=os.environ.get("TIDINGS_LOG_LEVEL", "ERROR"))


def python_executable() -> str:
    return sys.executable


def floor(url: str, statements: int = 2000, commits: int = 500) -> dict[str, Any]:
    """What one statement and one durable commit cost on this backend right now, measured
    with the plain DBAPI driver on a scratch table (created and dropped here): the limits
    no per-frame code can go under. ``round_trip_us``: ``SELECT 1`` inside a transaction
    (PostgreSQL: one network round trip; SQLite: one library call). ``commit_us``: a
    one-row INSERT and its COMMIT (PostgreSQL: a WAL flush, ``synchronous_commit=on``;
    SQLite: WAL with ``synchronous=NORMAL``, the store's own settings).
    ``pipelined_us``: per statement, four ``SELECT``s sent in one psycopg pipeline
    (PostgreSQL only)."""
    conn = raw_connect(url)
    postgres = not isinstance(conn, sqlite3.Connection)
    mark = "%s" if postgres else "?"
    perf = time.perf_counter
    try:
        if not postgres:
            conn.execute("PRAGMA journal_mode=WAL")  # the store's own mode (raw_connect sets the rest)
        conn.execute("CREATE TABLE bench_floor (k INTEGER PRIMARY KEY, v TEXT NOT NULL)")
        out: dict[str, Any] = {}
        if postgres:
            with conn.transaction():
                t0 = perf()
                for _ in range(statements):
                    conn.execute("SELECT 1").fetchone()
                out["round_trip_us"] = round((perf() - t0) / statements * 1e6, 1)
                t0 = perf()
                for i in range(0, statements, 4):
                    with conn.pipeline():
                        curs = [conn.execute("SELECT %s::int", (i + k,)) for k in range(4)]
                    for cur in curs:
                        cur.fetchone()
                out["pipelined_us"] = round((perf() - t0) / statements * 1e6, 1)
            t0 = perf()
            for i in range(commits):
                with conn.transaction():
                    conn.execute(f"INSERT INTO bench_floor VALUES ({mark}, 'x')", (i,))
            out["commit_us"] = round((perf() - t0) / commits * 1e6, 1)
        else:
            conn.execute("BEGIN")
            t0 = perf()
            for _ in range(statements):
                conn.execute("SELECT 1").fetchone()
            out["round_trip_us"] = round((perf() - t0) / statements * 1e6, 1)
            conn.execute("COMMIT")
            t0 = perf()
            for i in range(commits):
                conn.execute("BEGIN IMMEDIATE")
                conn.execute(f"INSERT INTO bench_floor VALUES ({mark}, 'x')", (i,))
                conn.execute("COMMIT")
            out["commit_us"] = round((perf() - t0) / commits * 1e6, 1)
        out["one_commit_a_frame_ceiling_per_s"] = round(1e6 / out["commit_us"], 1)
        conn.execute("DROP TABLE bench_floor")
        return out
    finally:
        conn.close()


# -- the hub under a bench (tidings imported on call: ``frame_phases`` runs older trees) -------
def new_store(url: str, start_ms: int) -> tuple[Any, Any, dict[str, str]]:
    """A migrated store on a pinned clock with one bridge per platform (the harness's ids)."""
    from tidings.clock import FakeClock
    from tidings.faults import Faults
    from tidings.replay.harness import create_bridges
    from tidings.store.engine import Store

    clock = FakeClock(start_ms)
    store = Store(url, clock=clock, faults=Faults())
    bridges = create_bridges(store)
    return store, clock, bridges


def route(raw: dict[str, Any], platform_of: dict[str, str]) -> str:
    """The platform whose bridge a corpus frame goes to (its codec's; unknown codecs to the
    harness's bridge for them)."""
    from tidings.replay.harness import UNKNOWN_CODEC_PLATFORM

    codec = raw.get("codec")
    return platform_of.get(codec, UNKNOWN_CODEC_PLATFORM) if isinstance(codec, str) else UNKNOWN_CODEC_PLATFORM


def feed(ingest: Any, clock: Any, bridge_id: str, raw: dict[str, Any], platform: str) -> bool:
    """One corpus frame as a bridge sends it, one a request: the clock pinned to its receipt
    time, ``Ingest.append_body``, then the worker's ``drain_if_due``. False when the append
    was refused (a ``TidingsError``: the frame is malformed)."""
    from tidings.errors import TidingsError

    received = raw.get("received_at_ms")
    if type(received) is int and received > 0:
        clock.set(received)
    try:
        ingest.append_body(bridge_id, raw, platform)
        accepted = True
    except TidingsError:
        accepted = False
    ingest.worker.drain_if_due()
    return accepted


def feed_batch(ingest: Any, clock: Any, bridges: dict[str, str], raws: list[dict[str, Any]],
               platforms: list[str]) -> tuple[int, int]:
    """Frames as a batching bridge sends them: one ``{"frames": [...]}`` request per
    platform (each platform's frames in the order given), the clock pinned to the latest
    receipt time among them, then the worker's ``drain_if_due``. Returns (requests sent,
    frames refused: a refused request refuses all of its frames, as a 400 would)."""
    from tidings.errors import TidingsError

    groups: dict[str, list[dict[str, Any]]] = {}
    latest = 0
    for raw, to in zip(raws, platforms, strict=True):
        received = raw.get("received_at_ms")
        if type(received) is int and received > latest:
            latest = received
        groups.setdefault(to, []).append(raw)
    if latest:
        clock.set(latest)
    refused = 0
    for to, frames in groups.items():
        try:
            ingest.append_body(bridges[to], {"frames": frames}, to)
        except TidingsError:
            refused += len(frames)
    ingest.worker.drain_if_due()
    return len(groups), refused
