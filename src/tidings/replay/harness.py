"""The replay harness: a corpus of frames through the real ingest, into a fresh store, measured.

``replay(ReplayConfig(...))`` is ``tidings replay CORPUS --out STORE --metrics FILE``
(docs/api.md §1, §8.3; our code):

* **A fresh store.** ``--out`` is a SQLite path that must not exist, or the URL of an
  empty PostgreSQL database. It gets one bridge per platform, with ids derived from the
  platform, and inbox ids minted deterministically (same shape as the real ones, the tail
  being the corpus line). Two replays of one corpus therefore give the same rows, and
  ``tidings replay compare`` can diff them table by table.
* **Routing.** A frame goes to the bridge of its codec's platform; a frame with an unknown
  codec goes to the designated bridge (``UNKNOWN_CODEC_PLATFORM``), where it is
  quarantined like any unknown codec.
* **Pinned time.** One ``FakeClock`` is every clock (the store's, the worker's, the
  backoff's); it is set to the frame's ``received_at_ms`` before the frame is appended.
  The worker's 5/10/20 ms in-attempt retry sleeps are pinned too: counted and reported
  (``retry_sleeps``), not slept, unless ``real_sleeps`` (``--real-sleeps``).
* **The real path, one frame at a time, on this thread.** The worker pumped exactly as
  its thread would be woken (``Worker.drain_if_due``): once when the clock is set to the
  frame's time (a retry timer that came due by then fires before the frame arrives, as
  the clock's listener wakes the thread), then ``Ingest.append_body`` (frame validation,
  the inbox insert and, by default, apply on append), then again (an append that left
  work). The time of all three is the frame's cost.
* **Counting** (``ReplayCounter``): committed row writes per table and operation by
  triggers, with OLD vs NEW for updates (the minimal-write oracle); commits at the store
  (``Store.commits``); WAL volume (``WalMeter``: SQLite, auto-checkpoint off on every
  connection and the ``-wal`` file's growth; PostgreSQL, this database's records read
  with ``pg_waldump``, beside the cluster-wide ``pg_wal_lsn_diff``).

``stuck=N`` (``--stuck N``): the first N Google frames that decode to a conversation event
fail transiently on every attempt: a real transient error is raised inside the attempt,
after the frame was decoded (``stuck_at="decoded"``) or after its whole projection ran
(``"projected"``). SQLite: SQLITE_BUSY from a second connection trying ``BEGIN
IMMEDIATE`` while the attempt holds the write lock; PostgreSQL: ``55P03
lock_not_available`` from ``FOR NO KEY UPDATE NOWAIT`` on a row another connection holds.
The metrics then add the stuck frames' decode count and the cost of every later frame;
finally the fault is cleared and a fresh worker (empty in-memory backoff) drains the same
store once, which must leave nothing unprocessed.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from ..clock import FakeClock
from ..errors import TidingsError
from ..faults import Faults
from ..ingest.events import PLATFORMS
from ..store import accounts as accounts_store
from ..store import inbox as inbox_store
from ..store.engine import Store, normalize_url
from ..store.sql import Stmt
from .writecount import BOOKKEEPING, OPS, ReplayCounter

UNKNOWN_CODEC_PLATFORM = "signal"  # the designated bridge for frames of an unknown codec
STUCK_CODEC = "google.json"
PROGRESS_EVERY = 250
CHUNK = 2048


class ReplayError(Exception):
    """A replay that cannot start (bad target, unreadable corpus): exit code 1 or 2."""

    def __init__(self, message: str, usage: bool = False) -> None:
        super().__init__(message)
        self.usage = usage


@dataclass
class ReplayConfig:
    corpus: Path
    out: str
    stuck: int = 0
    limit: int | None = None
    codecs: frozenset[str] | None = None
    stuck_at: str = "decoded"
    real_sleeps: bool = False
    apply_on_append: bool = True
    autocheckpoint: bool = False  # keep SQLite's automatic checkpoints (wal_bytes not measured)
    label: str = ""


@dataclass
class _Timings:
    by_codec: dict[str, list[float]] = field(default_factory=dict)

    def add(self, codec: str, seconds: float) -> None:
        self.by_codec.setdefault(codec, []).append(seconds)


# -- target -------------------------------------------------------------------------------------
def is_postgres(url: str) -> bool:
    return url.startswith(("postgresql://", "postgres://", "postgresql+psycopg://"))


def sqlite_path(url: str) -> Path:
    _dialect, sa_url = normalize_url(url)
    return Path(sa.engine.make_url(sa_url).database or "")


def check_fresh_target(out: str) -> None:
    """Refuse anything but a new SQLite path or an empty PostgreSQL database."""
    if is_postgres(out):
        import psycopg

        try:
            with psycopg.connect(out, connect_timeout=10) as conn:
                tables = conn.execute(
                    "SELECT count(*) FROM pg_tables WHERE schemaname NOT IN ('pg_catalog', 'information_schema')"
                ).fetchone()[0]
        except psycopg.Error as exc:
            raise ReplayError(f"cannot open {out}: {str(exc).strip()}") from None
        if tables:
            raise ReplayError(f"{out} is not empty ({tables} tables); the replay needs an empty database")
        return
    try:
        path = sqlite_path(out)
    except ValueError as exc:
        raise ReplayError(str(exc), usage=True) from None
    for suffix in ("", "-wal", "-shm", "-journal"):
        candidate = Path(f"{path}{suffix}")
        if candidate.exists():
            raise ReplayError(f"{candidate} already exists; the replay builds a fresh store")
    if not path.parent.exists():
        raise ReplayError(f"directory {path.parent} does not exist")


# -- deterministic ids ---------------------------------------------------------------------------
def replay_bridge_id(platform: str) -> str:
    return "br_" + hashlib.sha256(f"tidings replay bridge {platform}".encode()).hexdigest()[:32]


def replay_account_id(platform: str) -> str:
    return "acc_" + hashlib.sha256(f"tidings replay account {platform}".encode()).hexdigest()[:32]


class ReplayInboxIds:
    """Inbox ids shaped like ``ingest.inbox.new_inbox_id`` (millisecond, per-millisecond
    sequence), whose tail is the corpus line instead of random bits: deterministic, unique,
    and in append order within a millisecond."""

    def __init__(self) -> None:
        self.line = 0
        self._ms = -1
        self._seq = 0
        self.minted: Callable[[str], None] | None = None

    def __call__(self, now_ms: int) -> str:
        if now_ms == self._ms:
            self._seq += 1
        else:
            self._ms, self._seq = now_ms, 0
        inbox_id = f"in_{now_ms:012x}{self._seq:06x}{self.line:014x}"
        if self.minted is not None:
            self.minted(inbox_id)
        return inbox_id


def create_bridges(store: Store) -> dict[str, str]:
    """One bridge (and its system account) per platform, with derived ids."""
    now = store.now_ms()
    out = {}
    with store.write() as tx:
        for platform in PLATFORMS:
            account_id, bridge_id = replay_account_id(platform), replay_bridge_id(platform)
            accounts_store.insert_account(
                tx, id=account_id, kind="system", handle=f"replay-{platform}",
                display_name=f"replay ({platform})", owner_id=None, wake_json=None, now=now,
            )
            inbox_store.insert_bridge(
                tx, id=bridge_id, platform=platform, name=f"replay {platform}", owner_id=None,
                account_id=account_id, now=now,
            )
            out[platform] = bridge_id
    return out


# -- the stuck fault ------------------------------------------------------------------------------
_CONTENDED = Stmt(
    "SELECT version FROM schema_migrations WHERE version = :version FOR NO KEY UPDATE NOWAIT",
    name="replay_contended",
)


class Contention:
    """A real transient database error, on demand, inside the caller's write transaction."""

    def __init__(self, store: Store) -> None:
        self.store = store
        if store.dialect == "sqlite":
            self.conn: Any = sqlite3.connect(str(sqlite_path(store.url)), timeout=0, isolation_level=None)
        else:
            import psycopg

            self.conn = psycopg.connect(store.url)
            row = self.conn.execute(
                "SELECT version FROM schema_migrations ORDER BY version LIMIT 1 FOR NO KEY UPDATE"
            ).fetchone()
            self.version = row[0]  # held until close(): the transaction stays open

    def error(self, tx: Any) -> Exception:
        """Provoke the error on ``tx``'s database and return it (to be raised)."""
        if self.store.dialect == "sqlite":
            try:
                self.conn.execute("BEGIN IMMEDIATE")  # the attempt holds the write lock: BUSY
            except sqlite3.OperationalError as exc:
                return exc
            self.conn.execute("ROLLBACK")
        else:
            import psycopg

            try:
                # A statement like the frame's own, so it goes out in the round trip a real
                # statement of the attempt would have taken (with the reads announced ahead).
                tx.execute(_CONTENDED, {"version": self.version})
            except psycopg.errors.LockNotAvailable as exc:
                return exc
        raise RuntimeError("the contention fault could not provoke a transient error")

    def close(self) -> None:
        try:
            self.conn.close()
        except Exception:  # noqa: BLE001 - best effort  # pragma: no cover
            pass


STUCK_AT = ("decoded", "projected")


class StuckFault:
    """The ``project`` seam of the worker, with the fault point for stuck frames.

    ``at="decoded"``: the attempt fails right after its frame was loaded, decoded and
    validated, before the projection (where the worker's own ``ingest.busy`` fault point
    is). ``at="projected"``: the whole projection runs, then the attempt fails, so every
    row it changed is taken back (the costliest place). Either way the error is real.

    It hands each frame on to the real projection with its context, so the frames are
    projected in batches as without the fault (``batches``): a frame that is not stuck
    costs what it costs in production.
    """

    batches = True

    def __init__(self, contention: Contention, at: str = "decoded") -> None:
        from ..ingest.projection import project_frame

        if at not in STUCK_AT:
            raise ReplayError(f"--stuck-at must be one of {list(STUCK_AT)}", usage=True)
        self.real = project_frame
        self.contention = contention
        self.at = at
        self.ids: set[str] = set()
        self.armed = True
        self.decodes = 0  # attempts on stuck frames that decoded (and so reached here)

    def __call__(self, tx: Any, ctx: Any, events: list) -> bool:
        stuck = ctx.inbox_id in self.ids
        if stuck:
            self.decodes += 1
            if self.armed and self.at == "decoded":
                raise self.contention.error(tx)
        changed = self.real(tx, ctx, events)
        if stuck and self.armed:
            raise self.contention.error(tx)
        return changed


class PinnedSleep:
    """The worker's in-attempt retry sleeps (5/10/20 ms), pinned like every clock: recorded,
    not slept. ``real=True`` sleeps them for real as well."""

    def __init__(self, real: bool = False) -> None:
        self.real = real
        self.requested_s = 0.0
        self.calls = 0

    def __call__(self, seconds: float) -> None:
        self.calls += 1
        self.requested_s += seconds
        if self.real:
            time.sleep(seconds)


def select_stuck(lines: list[str], n: int) -> list[int]:
    """Line numbers of the first ``n`` Google frames that decode to a conversation event
    (skipping a repeat of an already chosen dedupe key, which would be deduplicated)."""
    from ..ingest.decoders import decode_frame
    from ..ingest.events import ConversationEvent

    chosen: list[int] = []
    keys: set[str] = set()
    for index, line in enumerate(lines):
        if len(chosen) >= n:
            break
        try:
            raw = json.loads(line)
        except ValueError:
            continue
        if not isinstance(raw, dict) or raw.get("codec") != STUCK_CODEC:
            continue
        key = raw.get("dedupe_key")
        if isinstance(key, str) and key and key in keys:
            continue
        try:
            events = decode_frame(raw["codec"], raw.get("codec_version"), raw.get("payload"))
        except Exception:  # noqa: BLE001 - a frame that does not decode is not a candidate
            continue
        if any(isinstance(ev, ConversationEvent) for ev in events):
            chosen.append(index)
            if isinstance(key, str) and key:
                keys.add(key)
    return chosen


# -- measuring -------------------------------------------------------------------------------------
def percentile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank percentile of an ascending list (0 for an empty one)."""
    if not sorted_values:
        return 0.0
    rank = max(1, math.ceil(q * len(sorted_values)))
    return sorted_values[min(rank, len(sorted_values)) - 1]


def _ms(seconds: float) -> float:
    return round(seconds * 1000.0, 4)


def _summary(values: list[float]) -> dict[str, Any]:
    ordered = sorted(values)
    return {
        "frames": len(ordered),
        "p50_ms": _ms(percentile(ordered, 0.50)),
        "p95_ms": _ms(percentile(ordered, 0.95)),
        "max_ms": _ms(ordered[-1] if ordered else 0.0),
        "total_ms": _ms(sum(ordered)),
    }


class WalMeter:
    """WAL volume written between ``start()`` and ``stop()``.

    SQLite: the ``-wal`` file's growth (every connection has auto-checkpoint off, and the
    WAL is checkpointed to zero at the start). PostgreSQL: ``pg_wal_lsn_diff`` of the
    cluster's WAL position, which also counts every other database's writes meanwhile; so
    when ``pg_waldump`` can read the server's ``pg_wal`` (a local server), ``tick()``
    (called between frames, outside the clock) also sums the records of this database's
    transactions exactly (``PgWalDump``), and that is the ``wal_bytes`` reported.
    """

    def __init__(self, store: Store, measure: bool = True) -> None:
        self.store = store
        self.measure = measure or store.dialect != "sqlite"
        self.start_value: Any = None
        self.other_commits_start: int | None = None
        self.dump: PgWalDump | None = None
        self.dump_error: str | None = None

    def start(self) -> None:
        if not self.measure:
            return
        if self.store.dialect == "sqlite":
            conn = self.store.engine.raw_connection()
            try:
                conn.driver_connection.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
            finally:
                conn.close()
            self.start_value = self._wal_size()
            return
        try:
            self.dump = PgWalDump(self.store)
        except PgWalDumpUnavailable as exc:
            self.dump_error = str(exc)
        with self.store.read() as tx:
            self.start_value = tx.raw("SELECT pg_current_wal_lsn()").fetchone()[0]
            self.other_commits_start = _other_db_commits(tx)

    def tick(self) -> None:
        if self.dump is not None:
            try:
                self.dump.advance()
            except PgWalDumpUnavailable as exc:
                self.dump_error = str(exc)
                self.close()

    def close(self) -> None:
        if self.dump is not None:
            self.dump.close()
            self.dump = None

    def stop(self) -> dict[str, Any]:
        if not self.measure:
            return {"wal_bytes": None, "wal_scope": "not measured: SQLite's automatic checkpoints were on"}
        if self.store.dialect == "sqlite":
            return {"wal_bytes": self._wal_size() - self.start_value, "wal_scope": "the -wal file's growth"}
        self.tick()
        with self.store.read() as tx:
            diff = tx.raw("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), %s)", (self.start_value,)).fetchone()[0]
            other = _other_db_commits(tx)
        out: dict[str, Any] = {
            "wal_bytes_cluster": int(diff),
            "wal_other_db_commits": max(0, other - (self.other_commits_start or 0)),
        }
        if self.dump is not None:
            out["wal_bytes"] = self.dump.bytes
            out["wal_scope"] = "this database's WAL records (pg_waldump, by transaction)"
            out["wal_records"] = self.dump.records
            out["wal_fpi_record_bytes"] = self.dump.fpi_bytes
            out["pg_checkpoints_during"] = self.dump.checkpoints()
            self.close()
        else:
            out["wal_bytes"] = int(diff)
            out["wal_scope"] = (
                "cluster (pg_current_wal_lsn: includes other databases' writes meanwhile); "
                f"pg_waldump unavailable: {self.dump_error}"
            )
        return out

    def _wal_size(self) -> int:
        wal = Path(f"{sqlite_path(self.store.url)}-wal")
        return wal.stat().st_size if wal.exists() else 0


class PgWalDumpUnavailable(Exception):
    pass


_WAL_RECORD = re.compile(r"len \(rec/tot\):\s*\d+/\s*(\d+), tx:\s*(\d+),")


class PgWalDump:
    """This database's share of the WAL, read with ``pg_waldump`` a range at a time.

    A record counts when it references a relation of this database, or belongs to a
    transaction that did (its commit record, for one). A *temporary* physical replication
    slot keeps the server from recycling the segments before they are read (a checkpoint,
    e.g. one forced by another database's DROP DATABASE, may come at any time); each
    ``advance()`` reads up to the flushed position and then releases what it read. The
    slot lives as long as this object's own connection, so a crash cannot leave it behind.
    Needs a local server whose ``pg_wal`` this process may read, and a free slot.
    """

    def __init__(self, store: Store) -> None:
        import shutil

        import psycopg

        with store.read() as tx:
            row = tx.raw(
                "SELECT current_setting('data_directory'), current_setting('server_version_num')::int / 10000, "
                "(SELECT oid FROM pg_database WHERE datname = current_database())"
            ).fetchone()
        data_dir, major, oid = row
        self.store = store
        self.wal_dir = Path(data_dir) / "pg_wal"
        binary = shutil.which("pg_waldump") or f"/usr/lib/postgresql/{major}/bin/pg_waldump"
        if not Path(binary).exists():
            raise PgWalDumpUnavailable("no pg_waldump binary")
        try:
            readable = os.access(self.wal_dir, os.R_OK | os.X_OK) and any(self.wal_dir.iterdir())
        except OSError:
            readable = False
        if not readable:
            raise PgWalDumpUnavailable(f"cannot read {self.wal_dir} (not a local server, or no permission)")
        self.binary = binary
        self.marker = f"/{oid}/"
        self.slot = f"tidings_replay_{os.getpid()}_{id(self):x}"
        try:
            self.conn = psycopg.connect(store.url, autocommit=True)
            self.conn.execute("SELECT pg_create_physical_replication_slot(%s, true, true)", (self.slot,))
            self.position = str(self.conn.execute("SELECT pg_current_wal_flush_lsn()").fetchone()[0])
        except psycopg.Error as exc:
            raise PgWalDumpUnavailable(f"no replication slot to hold the WAL: {str(exc).strip()}") from None
        self.bytes = 0
        self.records = 0
        self.fpi_bytes = 0  # bytes of our records that carry full-page images (after checkpoints)
        self.checkpoints_start = self._checkpoints()

    def _checkpoints(self) -> int:
        row = self.conn.execute("SELECT checkpoints_timed + checkpoints_req FROM pg_stat_bgwriter").fetchone()
        return int(row[0])

    def checkpoints(self) -> int:
        """Checkpoints during the replay: each makes the next write of every page log it whole."""
        return self._checkpoints() - self.checkpoints_start

    def close(self) -> None:
        try:
            self.conn.execute("SELECT pg_drop_replication_slot(%s)", (self.slot,))
        except Exception:  # noqa: BLE001 - closing the connection drops a temporary slot anyway
            pass
        self.conn.close()

    def advance(self) -> None:
        import subprocess

        end = str(self.conn.execute("SELECT pg_current_wal_flush_lsn()").fetchone()[0])
        if end == self.position:
            return
        proc = subprocess.run(
            [self.binary, "-p", str(self.wal_dir), "-s", str(self.position), "-e", str(end)],
            capture_output=True, text=True,
        )
        if proc.returncode != 0 and not proc.stdout:
            raise PgWalDumpUnavailable(f"pg_waldump failed: {proc.stderr.strip()[:200]}")
        by_xid: dict[str, list[int]] = {}
        ours: set[str] = set()
        for line in proc.stdout.splitlines():
            m = _WAL_RECORD.search(line)
            if m is None:
                continue
            size, xid = int(m.group(1)), m.group(2)
            mine = self.marker in line and " rel " in line
            fpi = size if " FPW" in line else 0
            if xid == "0":
                if mine:
                    self.bytes += size
                    self.records += 1
                    self.fpi_bytes += fpi
                continue
            slot = by_xid.setdefault(xid, [0, 0, 0])
            slot[0] += size
            slot[1] += 1
            slot[2] += fpi
            if mine:
                ours.add(xid)
        for xid in ours:
            size, records, fpi = by_xid[xid]
            self.bytes += size
            self.records += records
            self.fpi_bytes += fpi
        self.position = end
        self.conn.execute("SELECT pg_replication_slot_advance(%s, %s::pg_lsn)", (self.slot, end))


def _other_db_commits(tx: Any) -> int:
    row = tx.raw("SELECT coalesce(sum(xact_commit), 0) FROM pg_stat_database WHERE datname <> current_database()").fetchone()
    return int(row[0])


def _pg_stat_writes(url: str, tables: list[str]) -> dict[str, dict[str, int]]:
    """``pg_stat_user_tables`` counts, read from a fresh connection once they stop moving
    (a backend flushes its counts at exit or about once a second)."""
    import psycopg

    last: dict[str, dict[str, int]] | None = None
    for _ in range(20):
        with psycopg.connect(url, autocommit=True) as conn:
            rows = conn.execute(
                "SELECT relname, n_tup_ins, n_tup_upd, n_tup_del FROM pg_stat_user_tables WHERE schemaname = current_schema()"
            ).fetchall()
        now = {r[0]: {"insert": int(r[1]), "update": int(r[2]), "delete": int(r[3])} for r in rows if r[0] in tables}
        if now == last:
            return now
        last = now
        time.sleep(0.5)
    return last or {}


def _outcomes(store: Store) -> dict[str, int]:
    with store.read() as tx:
        rows = tx.raw("SELECT coalesce(outcome, 'unprocessed'), count(*) FROM inbox GROUP BY 1").fetchall()
    return {str(k): int(v) for k, v in rows}


# -- the replay -----------------------------------------------------------------------------------------
def read_corpus(path: Path, limit: int | None, codecs: frozenset[str] | None) -> list[str]:
    try:
        with path.open("r", encoding="utf-8") as fh:
            lines = [line for line in fh if line.strip()]
    except (OSError, UnicodeDecodeError) as exc:
        raise ReplayError(f"cannot read {path}: {exc}") from None
    if codecs:
        kept = []
        for line in lines:
            try:
                codec = json.loads(line).get("codec")
            except (ValueError, AttributeError):
                codec = None
            if codec in codecs:
                kept.append(line)
        lines = kept
    if limit is not None:
        lines = lines[:limit]
    return lines


Progress = Callable[[int, int], None]


def replay(config: ReplayConfig, progress: Progress | None = None) -> dict[str, Any]:
    """Run one replay; return the metrics (docs/api.md §8.3 keys plus extras)."""
    if config.stuck < 0:
        raise ReplayError("--stuck must be at least 0", usage=True)
    if config.stuck_at not in STUCK_AT:
        raise ReplayError(f"--stuck-at must be one of {list(STUCK_AT)}", usage=True)
    lines = read_corpus(config.corpus, config.limit, config.codecs)
    if not lines:
        raise ReplayError(f"{config.corpus}: no frames")
    check_fresh_target(config.out)
    run = _Run(config, lines)
    try:
        run.setup()
        run.frames(progress)
        metrics = run.frame_metrics()
        if config.stuck:
            metrics.update(run.restart())
        metrics.update(run.write_metrics())
        if run.store.dialect == "postgresql":
            metrics.update(run.pg_stat_cross_check())
        return metrics
    finally:
        run.close()


class _Run:
    """One replay's state, phase by phase (see ``replay``)."""

    def __init__(self, config: ReplayConfig, lines: list[str]) -> None:
        self.config = config
        self.lines = lines
        self.clock = FakeClock(_first_time(lines))
        self.faults = Faults()
        self.store = Store(config.out, clock=self.clock, faults=self.faults)
        self.contention: Contention | None = None
        self.fault: StuckFault | None = None
        self.counter: ReplayCounter | None = None
        self.sleep = PinnedSleep(config.real_sleeps)
        self.stuck_lines: set[int] = set()
        self.timings = _Timings()
        self.later: list[float] = []
        self.rejected = 0
        self.wall = self.parse = 0.0

    # -- phases ------------------------------------------------------------------------
    def setup(self) -> None:
        from ..ingest.engine import Ingest

        config, store = self.config, self.store
        self.bridges = create_bridges(store)
        # Every connection from here on counts row writes and (unless asked to keep SQLite's
        # automatic checkpoints) never checkpoints the WAL, so its size is what was written.
        store.engine.dispose()
        if store.dialect == "sqlite" and not config.autocheckpoint:
            sa.event.listen(store.engine, "connect", _no_autocheckpoint)
            if store.checkpointer is not None:
                store.checkpointer.enabled = False  # nor the store's checkpoint thread (D128)
        self.counter = ReplayCounter(store).install()
        self.pg_before = _pg_stat_writes(config.out, list(self.counter.columns)) if store.dialect == "postgresql" else {}
        self.ids = ReplayInboxIds()
        options: dict[str, Any] = {"sleep": self.sleep}
        if config.stuck:
            self.stuck_lines = set(select_stuck(self.lines, config.stuck))
            self.contention = Contention(store)
            fault = self.fault = StuckFault(self.contention, config.stuck_at)
            ids, stuck_lines = self.ids, self.stuck_lines
            ids.minted = lambda inbox_id: fault.ids.add(inbox_id) if ids.line in stuck_lines else None
            options["project"] = fault
        self.ingest = Ingest(
            store=store, faults=self.faults, clock=self.clock, inbox_ids=self.ids,
            apply_on_append=config.apply_on_append, **options,
        )
        self.wal = WalMeter(store, measure=not config.autocheckpoint)

    def frames(self, progress: Progress | None) -> None:
        """Every frame, one at a time: pin the clock, append, pump the worker; time it.

        The corpus is parsed a chunk at a time outside the clock (a request body reaches
        ``append_body`` already parsed); ``wall`` times the per-frame work only.
        """
        ingest, clock, ids, bridges = self.ingest, self.clock, self.ids, self.bridges
        platform_of = ingest.codec_platforms()
        last_stuck = max(self.stuck_lines) if self.stuck_lines else -1
        total = len(self.lines)
        perf = time.perf_counter
        self.wal.start()
        self.commits_before = self.store.commits
        meter_before = self.store.meter.snapshot()
        for first in range(0, total, CHUNK):
            t0 = perf()
            chunk = [_parse_line(line) for line in self.lines[first:first + CHUNK]]
            t1 = perf()
            self.parse += t1 - t0
            for offset, raw in enumerate(chunk):
                index = first + offset
                if raw is None:
                    self.rejected += 1  # not a JSON object: a 400 at the HTTP edge
                    continue
                codec = raw.get("codec")
                codec = codec if isinstance(codec, str) else "?"
                received = raw.get("received_at_ms")
                if type(received) is int and received > 0:
                    clock.set(received)
                platform = platform_of.get(codec, UNKNOWN_CODEC_PLATFORM)
                ids.line = index
                t0 = perf()
                ingest.worker.drain_if_due()  # a retry timer due by now fires first
                try:
                    ingest.append_body(bridges[platform], raw, platform)
                except TidingsError:
                    self.rejected += 1  # a 400/413 at the HTTP edge: never stored
                ingest.worker.drain_if_due()
                elapsed = perf() - t0
                self.timings.add(codec, elapsed)
                if index > last_stuck >= 0:
                    self.later.append(elapsed)
                if progress is not None and (index + 1) % PROGRESS_EVERY == 0:
                    progress(index + 1, total)
            self.wall += perf() - t1
            self.wal.tick()
        if progress is not None:
            progress(total, total)
        # Everything measured "after the replay" is taken now, before any restart.
        self.sleep_during = self.sleep.requested_s
        self.commits = self.store.commits - self.commits_before
        meter_after = self.store.meter.snapshot()
        self.sent = {k: meter_after[k] - meter_before[k] for k in ("statements", "round_trips")}
        self.wal_metrics = self.wal.stop()
        assert self.counter is not None
        self.counted = self.counter.snapshot()
        self.outcomes = _outcomes(self.store)
        self.counters = {self.bridges[p]: ingest.counters.of(self.bridges[p]).snapshot() for p in PLATFORMS}
        ingest.stop()

    def frame_metrics(self) -> dict[str, Any]:
        config, total = self.config, len(self.lines)
        ingest_s = sum(sum(v) for v in self.timings.by_codec.values())
        return {
            "label": config.label,
            "corpus": str(config.corpus),
            "backend": self.store.dialect,
            "out": _redacted(config.out),
            "apply_on_append": config.apply_on_append,
            "frames": total,
            "wall_ms": _ms(self.wall),
            "corpus_parse_ms": _ms(self.parse),
            "ingest_ms": _ms(ingest_s),
            "frames_per_second": round(total / self.wall, 1) if self.wall > 0 else None,
            "frames_per_second_ingest": round(total / ingest_s, 1) if ingest_s > 0 else None,
            "per_codec": {codec: _summary(values) for codec, values in sorted(self.timings.by_codec.items())},
            "retry_sleeps": {
                "calls": self.sleep.calls,
                "requested_ms": _ms(self.sleep_during),
                "slept": config.real_sleeps,
                "note": "the worker's in-attempt retry sleeps; pinned (not slept) unless real_sleeps",
            },
            "commits": self.commits,
            "commits_per_frame": round(self.commits / total, 4),
            # Store.meter: every statement sent (BEGIN, SAVEPOINT, COMMIT included) and the
            # round trips they took (PostgreSQL pipelines deferred ones); deterministic for
            # a corpus, unlike frames/s.
            "statements": self.sent["statements"],
            "statements_per_frame": round(self.sent["statements"] / total, 4),
            "round_trips": self.sent["round_trips"],
            "round_trips_per_frame": round(self.sent["round_trips"] / total, 4),
            **self.wal_metrics,
            "unprocessed_after": self.outcomes.get("unprocessed", 0),
            "quarantined": self.outcomes.get("quarantined", 0),
            "applied": self.outcomes.get("applied", 0),
            "deduplicated": total - self.rejected - sum(self.outcomes.values()),
            "rejected": self.rejected,
            "bridges": dict(self.bridges),
            "counters": self.counters,
        }

    def restart(self) -> dict[str, Any]:
        """The fault clears and the worker restarts: a fresh one (empty in-memory backoff)
        on the same store drains once."""
        from ..ingest.engine import Ingest

        fault, contention = self.fault, self.contention
        assert fault is not None and contention is not None
        fault.armed = False
        contention.close()
        self.contention = None
        fresh = Ingest(
            store=self.store, faults=self.faults, clock=self.clock, apply_on_append=self.config.apply_on_append,
            sleep=self.sleep,
        )
        t0 = time.perf_counter()
        stats = fresh.drain()
        restart_ms = _ms(time.perf_counter() - t0)
        fresh.stop()
        after = _outcomes(self.store)
        later = self.later
        return {
            "stuck_at": self.config.stuck_at,
            "stuck_frames": len(self.stuck_lines),
            "stuck_lines": sorted(self.stuck_lines),
            "stuck_decodes": fault.decodes,
            "stuck_quarantined": sum(1 for i in fault.ids if _outcome_of(self.store, i) == "quarantined"),
            "later_frames": len(later),
            "later_frame_drain_ms_avg": _ms(sum(later) / len(later)) if later else 0.0,
            "later_frame_drain_ms": _summary(later),
            "later_frame_requested_sleep_ms_avg": _ms(self.sleep_during / len(later)) if later else 0.0,
            "unprocessed_after_restart": after.get("unprocessed", 0),
            "restart_drain_ms": restart_ms,
            "restart_applied": stats.applied,
        }

    def write_metrics(self) -> dict[str, Any]:
        """Row writes per table and operation, and the minimal-write oracle's verdict."""
        assert self.counter is not None
        self.counter.uninstall()
        self.counter = None
        counted = self.counted
        row_writes = {t: {op: v[op] for op in OPS} for t, v in counted.items()}
        total = sum(sum(v.values()) for v in row_writes.values())
        minimal = sum(v["effective"] for v in counted.values())
        touches = sum(v["touch"] for v in counted.values())
        return {
            "row_writes": row_writes,
            "row_writes_total": total,
            "minimal_row_writes": minimal,
            "writes_over_minimal": round(total / minimal, 4) if minimal else None,
            "wasted_row_writes": total - minimal,
            "write_oracle": {
                t: {"writes": sum(v[op] for op in OPS), "effective": v["effective"], "wasted": v["wasted"],
                    **({"roster_touches": v["touch"]} if v["touch"] else {})}
                for t, v in counted.items()
                if any(v[op] for op in OPS)
            },
            "write_oracle_rule": (
                "effective = INSERT, DELETE, or UPDATE changing a column other than "
                + "/".join(sorted(BOOKKEEPING))
                + "; a conversation's updated_at_ms touch counts only when the same frame changed its roster (D9)"
            ),
            "roster_touches": touches,
            "writes_over_minimal_strict": round(total / (minimal - touches), 4) if minimal > touches else None,
        }

    def pg_stat_cross_check(self) -> dict[str, Any]:
        """``pg_stat_user_tables`` deltas beside the triggers' counts (they also count the
        writes of rolled-back attempts and savepoints)."""
        self.store.dispose()  # backends flush their table statistics as they exit
        tables = list(self.counted)
        after = _pg_stat_writes(self.config.out, tables)
        before = self.pg_before
        return {
            "pg_stat_row_writes": {
                t: {op: after.get(t, {}).get(op, 0) - before.get(t, {}).get(op, 0) for op in OPS} for t in tables
            },
            "pg_stat_note": "pg_stat_user_tables deltas: counts rolled-back writes too",
        }

    def close(self) -> None:
        wal = getattr(self, "wal", None)
        if wal is not None:
            wal.close()
        if self.contention is not None:
            self.contention.close()
        if self.counter is not None:
            try:
                self.counter.uninstall()
            except Exception:  # noqa: BLE001 - the store is going away anyway  # pragma: no cover
                pass
        self.store.dispose()


def _parse_line(line: str) -> dict[str, Any] | None:
    try:
        raw = json.loads(line)
    except ValueError:
        return None
    return raw if isinstance(raw, dict) else None


def _first_time(lines: list[str]) -> int:
    for line in lines:
        try:
            value = json.loads(line).get("received_at_ms")
        except (ValueError, AttributeError):
            continue
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return 1_700_000_000_000


def _outcome_of(store: Store, inbox_id: str) -> str | None:
    with store.read() as tx:
        row = inbox_store.frame_state(tx, inbox_id)
    return None if row is None else (row["outcome"] or "unprocessed")


def _no_autocheckpoint(dbapi: sqlite3.Connection, _record: Any) -> None:
    dbapi.execute("PRAGMA wal_autocheckpoint=0")


def _redacted(url: str) -> str:
    if is_postgres(url):
        return sa.engine.make_url(normalize_url(url)[1]).render_as_string(hide_password=True)
    return url


def write_metrics(metrics: dict[str, Any], path: Path) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(metrics, indent=2, sort_keys=False) + "\n", encoding="utf-8")
    os.replace(tmp, path)
