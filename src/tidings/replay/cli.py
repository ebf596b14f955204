"""``tidings replay``: the replay harness and the store comparison, as commands.

* ``tidings replay CORPUS.jsonl --out STORE --metrics FILE.json [--stuck N]`` runs
  ``harness.replay`` with a progress bar, prints a summary and writes the metrics (docs/api.md
  §8.3). Exit 1 when a frame is left unprocessed (with ``--stuck``: after the restart).
* ``tidings replay compare A B [--ignore table.column ...] [--report FILE.json]`` diffs two
  stores table by table. Exit 0 when identical (modulo the ignored columns), 1 otherwise.

Exit code 2 is a usage error, always with a one-line reason on stderr.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from ..progress import progress_bar
from .harness import ReplayConfig, ReplayError, replay, write_metrics


def run_replay(
    args: list[str],
    *,
    out_store: str | None = None,
    metrics: Path | None = None,
    stuck: int = 0,
    stuck_at: str = "decoded",
    real_sleeps: bool = False,
    ignore: list[str] | None = None,
    report: Path | None = None,
    limit: int | None = None,
    codecs: str | None = None,
    label: str = "",
    apply_on_append: bool = True,
    autocheckpoint: bool = False,
    out: Console,
    err: Console,
) -> int:
    def usage(message: str) -> int:
        err.print(f"error: {message}", markup=False, highlight=False)
        return 2

    if args and args[0] == "compare":
        if len(args) != 3:
            return usage("usage: tidings replay compare A B [--ignore table.column ...] [--report FILE.json]")
        if (out_store or metrics or stuck or limit or codecs or label or not apply_on_append or autocheckpoint
                or real_sleeps or stuck_at != "decoded"):
            return usage("compare takes only --ignore and --report")
        return _compare(args[1], args[2], ignore or [], report, out, err)
    if len(args) != 1:
        return usage("usage: tidings replay CORPUS.jsonl --out STORE --metrics FILE.json [--stuck N] (or: replay compare A B)")
    if ignore or report:
        return usage("--ignore and --report belong to 'tidings replay compare A B'")
    if not out_store or not metrics:
        return usage("--out STORE and --metrics FILE.json are required")
    corpus = Path(args[0])
    if not corpus.is_file():
        return usage(f"no corpus file at {corpus}")
    if stuck < 0:
        return usage("--stuck must be at least 0")
    codec_set = frozenset(c.strip() for c in codecs.split(",") if c.strip()) if codecs else None
    config = ReplayConfig(
        corpus=corpus, out=out_store, stuck=stuck, stuck_at=stuck_at, real_sleeps=real_sleeps, limit=limit, codecs=codec_set,
        apply_on_append=apply_on_append, autocheckpoint=autocheckpoint, label=label,
    )
    try:
        with progress_bar(out) as progress:
            task = progress.add_task("replaying", total=None)

            def tick(done: int, total: int) -> None:
                progress.update(task, completed=done, total=total)

            result = replay(config, tick)
    except ReplayError as exc:
        err.print(f"error: {exc}", markup=False, highlight=False)
        return 2 if exc.usage else 1
    except Exception as exc:  # noqa: BLE001 - one line, exit 1
        err.print(f"error: replay failed: {type(exc).__name__}: {exc}", markup=False, highlight=False)
        return 1
    try:
        write_metrics(result, metrics)
    except OSError as exc:
        err.print(f"error: cannot write {metrics}: {exc}", markup=False, highlight=False)
        return 1
    _summary(result, out)
    out.print(f"metrics written to {metrics}", markup=False, highlight=False)
    if stuck:
        left = result["unprocessed_after_restart"]
        if left:
            err.print(f"error: {left} frames still unprocessed after the restart", markup=False)
            return 1
        return 0
    if result["unprocessed_after"]:
        err.print(f"error: {result['unprocessed_after']} frames left unprocessed", markup=False)
        return 1
    return 0


def _compare(a: str, b: str, ignore: list[str], report_path: Path | None, out: Console, err: Console) -> int:
    from .compare import CompareError, Ignore, compare_stores, render, write_report

    try:
        parsed = Ignore.parse(ignore)
    except ValueError as exc:
        err.print(f"error: {exc}", markup=False, highlight=False)
        return 2
    try:
        report = compare_stores(a, b, parsed)
    except CompareError as exc:
        err.print(f"error: {exc}", markup=False, highlight=False)
        return 1
    render(report, out)
    if report_path is not None:
        try:
            write_report(report, report_path)
        except OSError as exc:
            err.print(f"error: cannot write {report_path}: {exc}", markup=False, highlight=False)
            return 1
    return 0 if report["identical"] else 1


def _summary(m: dict[str, Any], console: Console) -> None:
    table = Table(title=f"replay of {m['frames']:,} frames on {m['backend']}", show_header=False, title_justify="left")
    table.add_column("measure")
    table.add_column("value", justify="right")
    rows = [
        ("frames/s (wall)", f"{m['frames_per_second']:,}"),
        ("wall", f"{m['wall_ms'] / 1000:.2f} s"),
        ("commits / frame", f"{m['commits_per_frame']:.4f} ({m['commits']:,} commits)"),
        ("statements / frame", f"{m['statements_per_frame']:.4f} ({m['statements']:,} sent)"),
        ("round trips / frame", f"{m['round_trips_per_frame']:.4f} ({m['round_trips']:,})"),
        ("row writes / minimal", f"{m['writes_over_minimal']} ({m['row_writes_total']:,} / {m['minimal_row_writes']:,})"),
        ("WAL written", "not measured" if m["wal_bytes"] is None else f"{m['wal_bytes'] / 1e6:,.1f} MB"),
        ("applied / quarantined / unprocessed", f"{m['applied']:,} / {m['quarantined']:,} / {m['unprocessed_after']:,}"),
    ]
    if "stuck_frames" in m:
        rows += [
            ("stuck frames (decodes)", f"{m['stuck_frames']} ({m['stuck_decodes']:,} decodes)"),
            ("later frames: avg drain", f"{m['later_frame_drain_ms_avg']:.3f} ms over {m['later_frames']:,}"),
            ("later frames: avg retry sleep asked", f"{m['later_frame_requested_sleep_ms_avg']:.3f} ms"
             + ("" if m["retry_sleeps"]["slept"] else " (pinned, not slept)")),
            ("unprocessed after restart", str(m["unprocessed_after_restart"])),
        ]
    for name, value in rows:
        table.add_row(name, value)
    console.print(table)
    codecs = Table(title="per codec (append + drain, ms)", title_justify="left")
    for name, justify in (("codec", "left"), ("frames", "right"), ("p50", "right"), ("p95", "right"), ("max", "right")):
        codecs.add_column(name, justify=justify)  # type: ignore[arg-type]
    for codec, s in m["per_codec"].items():
        codecs.add_row(codec, f"{s['frames']:,}", f"{s['p50_ms']:.3f}", f"{s['p95_ms']:.3f}", f"{s['max_ms']:.3f}")
    console.print(codecs)
