"""``tidings ingest FILE.jsonl --bridge ID [--db URL]``: append a file of frames, drain it.

Every line is validated first (a blank line is skipped); one bad line is an error naming
the line and nothing is appended. Then the frames are appended in transactions of
``APPEND_BATCH`` with a progress bar, drained with another, and the bridge's counters are
printed. Frames deferred by transient errors are waited for (their backoff timers) for at
most ``MAX_WAIT_S``; any still unprocessed stay in the inbox, where ``tidings serve``
retries them, and the exit code is 1.

Exit codes: 0 all appended and drained, 1 anything else (one line on stderr), 2 usage.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from ..errors import TidingsError
from ..progress import progress_bar
from ..store import inbox as inbox_store

APPEND_BATCH = 500
MAX_WAIT_S = 30.0


class _LineError(Exception):
    pass


def _lines(path: Path) -> Iterator[tuple[int, Any]]:
    with path.open("r", encoding="utf-8") as fh:
        for number, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                yield number, json.loads(line)
            except (ValueError, RecursionError) as exc:
                raise _LineError(f"line {number}: not valid JSON ({exc})") from None


def run_ingest(file: Path, bridge_id: str, db_url: str, out: Console, err: Console) -> int:
    from ..runtime import Runtime

    def fail(message: str, code: int = 1) -> int:
        err.print(f"error: {message}", markup=False, highlight=False)
        return code

    try:
        runtime = Runtime(db_url)
    except ValueError as exc:
        return fail(str(exc), 2)
    except Exception as exc:  # noqa: BLE001 - one line, exit 1
        return fail(f"cannot open the database {db_url!r}: {exc}")
    try:
        ingest = runtime.ingest
        with runtime.store.read() as tx:
            bridge = inbox_store.bridge(tx, bridge_id)
        if bridge is None:
            return fail(f"no bridge {bridge_id!r} in {db_url}")
        platform = bridge["platform"]

        # 1. validate every line (nothing is appended if one is bad)
        total = 0
        try:
            for number, raw in _lines(file):
                try:
                    ingest.parse([raw], platform)
                except TidingsError as exc:
                    raise _LineError(f"line {number}: {exc.message.removeprefix('frame 0: ')}") from None
                total += 1
        except (OSError, UnicodeDecodeError) as exc:
            return fail(f"cannot read {file}: {exc}")
        except _LineError as exc:
            return fail(f"{file}: {exc}")
        if total == 0:
            out.print(f"{file}: no frames")
            return 0

        # 2. append with a progress bar
        appended = replays = 0
        with progress_bar(out) as progress:
            task = progress.add_task("appending", total=total)
            batch: list[Any] = []
            for _number, raw in _lines(file):
                batch.append(raw)
                if len(batch) >= APPEND_BATCH:
                    results = ingest.append(bridge_id, ingest.parse(batch, platform))
                    replays += sum(r.replay for r in results)
                    appended += len(results)
                    progress.advance(task, len(batch))
                    batch = []
            if batch:
                results = ingest.append(bridge_id, ingest.parse(batch, platform))
                replays += sum(r.replay for r in results)
                appended += len(results)
                progress.advance(task, len(batch))

            # 3. drain (this process; a running server would drain them too)
            with runtime.store.read() as tx:
                backlog = inbox_store.backlog(tx)
            drain = progress.add_task("draining", total=backlog)

            def on_frame(_inbox_id: str, outcome: str) -> None:
                if outcome not in ("skipped", "deferred"):
                    progress.advance(drain)

            started = time.monotonic()
            ingest.drain(on_frame)
            while len(ingest.worker.retries) and time.monotonic() - started < MAX_WAIT_S:
                earliest = ingest.worker.retries.earliest() or 0
                time.sleep(min(max(0.0, (earliest - runtime.clock.now_ms()) / 1000.0), MAX_WAIT_S))
                ingest.drain(on_frame)
        with runtime.store.read() as tx:
            left = inbox_store.backlog_by_bridge(tx).get(bridge_id, 0)
        counters = ingest.counters.of(bridge_id).snapshot()
        out.print(f"bridge {bridge_id} ({platform})", markup=False, highlight=False)
        table = Table()
        table.add_column("counter")
        table.add_column("value", justify="right")
        for name, value in counters.items():
            table.add_row(name, str(value))
        table.add_row("replays in this file", str(replays))
        table.add_row("unprocessed", str(left))
        out.print(table)
        if left:
            return fail(f"{left} frames are still unprocessed; they stay in the inbox and the hub retries them")
        return 0
    finally:
        runtime.ingest.stop()  # closes the drain's connection (the runtime was never started)
        runtime.stop()


HTTP_BATCH = 200


def run_ingest_http(file: Path, bridge_id: str, url: str, token: str, out: Console, err: Console) -> int:
    """The same file, appended through a running hub's ``POST /api/v1/bridges/{id}/frames``
    with the bridge's token: the hub applies the frames and delivers linked messages at once.
    Frames go in batches (each batch is all-or-nothing on the server, and each answer means
    "durably committed"); a failed batch stops the run with the server's reason."""
    import httpx

    def fail(message: str, code: int = 1) -> int:
        err.print(f"error: {message}", markup=False, highlight=False)
        return code

    try:
        frames = [raw for _number, raw in _lines(file)]
    except (OSError, UnicodeDecodeError) as exc:
        return fail(f"cannot read {file}: {exc}")
    except _LineError as exc:
        return fail(f"{file}: {exc}")
    endpoint = f"{url.rstrip('/')}/api/v1/bridges/{bridge_id}/frames"
    appended = replays = 0
    with httpx.Client(headers={"Authorization": f"Bearer {token}"}, timeout=30.0) as client, progress_bar(out) as progress:
        task = progress.add_task("appending", total=len(frames))
        for start in range(0, len(frames), HTTP_BATCH):
            batch = frames[start:start + HTTP_BATCH]
            try:
                response = client.post(endpoint, json={"frames": batch})
            except httpx.HTTPError as exc:
                return fail(f"cannot reach {url}: {exc}")
            if response.status_code != 202:
                try:
                    reason = response.json()["error"]["message"]
                except (ValueError, KeyError, TypeError):
                    reason = response.text[:200]
                return fail(f"frames {start + 1}-{start + len(batch)}: HTTP {response.status_code}: {reason}")
            results = response.json()["results"]
            appended += len(results)
            replays += sum(1 for r in results if r.get("replay"))
            progress.advance(task, len(batch))
    out.print(f"{appended} frames accepted by {url} ({replays} were replays of frames it already had)",
              markup=False, highlight=False)
    return 0
