"""The ``tidings`` command line (Typer + Rich).

Exit codes: 0 ok, 2 usage error, 1 anything else, always with a one-line reason on stderr.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

app = typer.Typer(
    name="tidings",
    help="Tidings: a durable message hub for people and AI agents.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
corpus_app = typer.Typer(help="Synthetic corpora of bridge frames.", no_args_is_help=True)
app.add_typer(corpus_app, name="corpus")

out = Console()
err = Console(stderr=True)

DEFAULT_DB = "./tidings.db"
DEMO_DB = "./tidings-demo.db"
DbOption = typer.Option(None, "--db", help="SQLite file path or postgresql:// URL (env TIDINGS_DB).")


def resolve_db(db: Optional[str], default: str = DEFAULT_DB) -> str:
    return db or os.environ.get("TIDINGS_DB") or default


def fail(message: str, code: int = 1) -> None:
    err.print(f"error: {message}", markup=False, highlight=False)
    raise typer.Exit(code)


@app.command()
def serve(
    db: Optional[str] = DbOption,
    host: str = typer.Option("127.0.0.1", help="Interface to bind (loopback by default)."),
    port: int = typer.Option(7860, help="TCP port."),
    demo: bool = typer.Option(False, "--demo", help="Seed a small demo world and print how to try it."),
    attachments_dir: Optional[str] = typer.Option(
        None, "--attachments-dir", envvar="TIDINGS_ATTACHMENTS_DIR",
        help="Folder for attachment bytes (default: <db>.attachments beside a SQLite file; "
        "~/.local/share/tidings/attachments for PostgreSQL).",
    ),
) -> None:
    """Run the whole hub: HTTP API, web page, MCP endpoint, ingest worker, delivery consumer."""
    import uvicorn

    from . import logs
    from .api import create_app
    from .runtime import Runtime

    logs.configure()
    url = resolve_db(db, DEMO_DB if demo else DEFAULT_DB)
    try:
        runtime = Runtime(url, admin_token=("tdg_demo_admin" if demo and not os.environ.get("TIDINGS_ADMIN_TOKEN") else None),
                          attachments_dir=attachments_dir)
    except ValueError as exc:
        fail(str(exc), 2)
    except Exception as exc:  # noqa: BLE001 - one-line reason, exit 1
        fail(f"cannot open the database {url!r}: {exc}")
    base = f"http://{host}:{port}"
    out.print(f"[bold]Tidings[/bold] on {base}  (database: {url})", soft_wrap=True)
    if runtime.generated_admin_token:
        out.print(f"admin token (shown once, keep it): [bold]{runtime.generated_admin_token}[/bold]")
    if demo:
        from .demo import seed_demo

        guide = seed_demo(runtime, base)
        out.print(guide, soft_wrap=True)
    app_ = create_app(runtime, manage_runtime=True)
    uvicorn.run(app_, host=host, port=port, log_level="warning", timeout_graceful_shutdown=3)


@app.command()
def status(
    db: Optional[str] = DbOption,
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
) -> None:
    """Show the counters of GET /api/status for a database."""
    from .runtime import Runtime

    url = resolve_db(db)
    if not url.startswith(("postgres", "sqlite:")) and not Path(url).exists():
        fail(f"no database at {url}", 1)
    runtime = Runtime(url)
    try:
        data = runtime.status()
    finally:
        runtime.stop()
    if as_json:
        out.print_json(json.dumps(data))
        return
    for section, values in data.items():
        table = Table(title=section, show_header=True)
        table.add_column("counter")
        table.add_column("value", justify="right")
        for key, value in _flatten(values):
            table.add_row(key, str(value))
        out.print(table)


def _flatten(values, prefix=""):
    if isinstance(values, dict):
        for key, value in values.items():
            yield from _flatten(value, f"{prefix}{key}.")
    else:
        yield prefix.rstrip("."), values


@app.command()
def ingest(
    file: Path = typer.Argument(..., exists=True, dir_okay=False, help="JSON-lines file of frames."),
    bridge: str = typer.Option(..., "--bridge", help="Bridge id the frames belong to."),
    db: Optional[str] = DbOption,
    url: Optional[str] = typer.Option(None, "--url", help="Append through a running hub at this URL instead."),
    token: Optional[str] = typer.Option(None, "--token", help="With --url: the bridge's token (env TIDINGS_BRIDGE_TOKEN)."),
) -> None:
    """Append frames from a JSON-lines file (with a progress bar), drain them, print counters."""
    try:
        from .ingest.cli import run_ingest, run_ingest_http
    except ModuleNotFoundError:
        fail("ingest is not available in this build")
    if url:
        token = token or os.environ.get("TIDINGS_BRIDGE_TOKEN")
        if not token:
            fail("--url needs the bridge's --token (or TIDINGS_BRIDGE_TOKEN)", 2)
        sys.exit(run_ingest_http(file, bridge, url, token, out, err))
    sys.exit(run_ingest(file, bridge, resolve_db(db), out, err))


@app.command()
def replay(
    args: list[str] = typer.Argument(..., metavar="CORPUS.jsonl | compare A B", show_default=False),
    out_store: Optional[str] = typer.Option(
        None, "--out", help="The fresh store to build: a new SQLite path or an empty postgresql:// database."
    ),
    metrics: Optional[Path] = typer.Option(None, "--metrics", help="Where to write the metrics JSON."),
    stuck: int = typer.Option(0, "--stuck", help="Frames that fail transiently on every attempt."),
    stuck_at: str = typer.Option(
        "decoded", "--stuck-at", help="Where stuck frames fail: 'decoded' (before the projection) or 'projected' (after it)."
    ),
    real_sleeps: bool = typer.Option(
        False, "--real-sleeps", help="Sleep the worker's 5/10/20 ms in-attempt retry waits (pinned and only counted by default)."
    ),
    limit: Optional[int] = typer.Option(None, "--limit", min=1, help="Replay only the first N frames."),
    codecs: Optional[str] = typer.Option(None, "--codecs", help="Replay only these codecs (comma-separated)."),
    label: str = typer.Option("", "--label", help="A label recorded in the metrics."),
    apply_on_append: bool = typer.Option(
        True, "--apply-on-append/--worker-only", help="Apply frames in their append transaction, or leave all to the worker."
    ),
    autocheckpoint: bool = typer.Option(
        False, "--autocheckpoint", help="SQLite: keep automatic WAL checkpoints (as in production); WAL bytes are then not measured."
    ),
    ignore: Optional[list[str]] = typer.Option(
        None, "--ignore", help="compare: a table.column (or table) reported but not required to match; repeatable."
    ),
    report: Optional[Path] = typer.Option(None, "--report", help="compare: also write the comparison as JSON."),
) -> None:
    """Replay a corpus into a fresh store and write metrics; or: replay compare A B."""
    try:
        from .replay.cli import run_replay
    except ModuleNotFoundError:
        fail("replay is not available in this build")
    from . import logs

    logs.configure(level=os.environ.get("TIDINGS_LOG_LEVEL", "ERROR"))
    sys.exit(run_replay(
        args, out_store=out_store, metrics=metrics, stuck=stuck, stuck_at=stuck_at, real_sleeps=real_sleeps, ignore=ignore, report=report, limit=limit,
        codecs=codecs, label=label, apply_on_append=apply_on_append, autocheckpoint=autocheckpoint, out=out, err=err,
    ))


@corpus_app.command("synth")
def corpus_synth(
    frames: int = typer.Option(..., "--frames", min=1, help="Number of frames."),
    seed: int = typer.Option(0, "--seed", help="Random seed (same seed, same corpus)."),
    output: Path = typer.Option(..., "-o", "--output", help="Output JSON-lines file."),
) -> None:
    """Write a deterministic synthetic corpus of frames for all three networks."""
    try:
        from .replay.synth import run_synth
    except ModuleNotFoundError:
        fail("corpus synthesis is not available in this build")
    sys.exit(run_synth(frames, seed, output, out, err))


@app.command()
def mcp(
    token: str = typer.Option(..., "--token", help="Agent token."),
    db: Optional[str] = DbOption,
    url: Optional[str] = typer.Option(
        None, "--url", help="A running hub's base URL: forward to its /mcp (posts are routed at once)."
    ),
) -> None:
    """Serve the MCP tools over stdio for one agent: on the database (--db), or in front of
    a running hub (--url)."""
    if url and db:
        fail("give either --db (the store itself) or --url (a running hub), not both")
    try:
        if url:
            from .mcp.proxy import run_proxy
        else:
            from .mcp.stdio import run_stdio
    except ModuleNotFoundError:
        fail("MCP is not available in this build")
    sys.exit(run_proxy(url, token) if url else run_stdio(resolve_db(db), token))


def main() -> None:
    try:
        app()
    except KeyboardInterrupt:
        sys.exit(130)
