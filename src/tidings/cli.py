"""The ``tidings`` command line (Typer + Rich).

Exit codes: 0 ok, 2 usage error, 1 anything else, always with a one-line reason on stderr.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import typer
from rich.console import Console

app = typer.Typer(
    name="tidings",
    help="Tidings: a durable message hub for people and AI agents.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
corpus_app = typer.Typer(help="Synthetic corpora of bridge frames.", no_args_is_help=True)
app.add_typer(corpus_app, name="corpus")
from .bridges.connectors.cli import bridge_app  # noqa: E402 - `tidings bridge signal`

app.add_typer(bridge_app, name="bridge")

out = Console()
err = Console(stderr=True)

DEFAULT_DB = "./tidings.db"
DEMO_DB = "./tidings-demo.db"
DbOption = typer.Option(None, "--db", help="SQLite file path or postgresql:// URL (env TIDINGS_DB).")


def resolve_db(db: str | None, default: str = DEFAULT_DB) -> str:
    return db or os.environ.get("TIDINGS_DB") or default


def _say(text: str) -> None:
    """Print one line now (a pipe would otherwise hold it back, e.g. the admin token)."""
    out.print(text, soft_wrap=True)
    out.file.flush()


def fail(message: str, code: int = 1) -> None:
    err.print(f"error: {message}", markup=False, highlight=False, soft_wrap=True)
    raise typer.Exit(code)


@app.command()
def serve(
    config: Path | None = typer.Option(None, "--config", help="A TOML configuration file (see tidings init)."),
    db: str | None = DbOption,
    host: str | None = typer.Option(None, help="Interface to bind (default 127.0.0.1, loopback)."),
    port: int | None = typer.Option(None, help="TCP port (default 7860)."),
    metrics_bind: str | None = typer.Option(None, "--metrics-bind", help="HOST:PORT: serve /metrics there, no token."),
    demo: bool = typer.Option(False, "--demo", help="Seed a small demo world and print how to try it."),
    attachments_dir: str | None = typer.Option(
        None, "--attachments-dir", envvar="TIDINGS_ATTACHMENTS_DIR",
        help="Folder for attachment bytes (default: <db>.attachments beside a SQLite file; "
        "~/.local/share/tidings/attachments for PostgreSQL).",
    ),
) -> None:
    """Run the whole hub: HTTP API, web page, MCP endpoint, ingest worker, delivery consumer."""
    from . import logs
    from .cluster.guard import AnotherServer
    from .config import ConfigError, resolve
    from .serving import PortBusy, ServeOptions
    from .serving import serve as run_serve

    try:
        settings = resolve(str(config) if config else None,
                           {"db": db, "host": host, "port": port, "metrics_bind": metrics_bind})
    except ConfigError as exc:
        fail(str(exc), 2)
    json_logs = None if settings.log_format == "auto" else settings.log_format == "json"
    logs.configure(level=settings.log_level, json=json_logs)
    url = DEMO_DB if demo and settings.origin["db"] == "default" else settings.db
    token = "tdg_demo_admin" if demo and not os.environ.get("TIDINGS_ADMIN_TOKEN") else None
    options = ServeOptions(
        db_url=url, host=settings.host, port=settings.port, demo=demo, admin_token=token,
        admin_token_file=settings.admin_token_file, metrics_bind=settings.metrics_bind,
        max_body=settings.max_body_bytes, delivery_overrides=settings.delivery_overrides(),
        log_level="warning" if settings.log_level in ("debug", "info") else settings.log_level,
        attachments_dir=attachments_dir,
    )
    try:
        code = run_serve(options, _say)
    except (PortBusy, AnotherServer) as exc:
        fail(str(exc))
    except ValueError as exc:
        fail(str(exc), 2)
    except Exception as exc:  # noqa: BLE001 - one-line reason, exit 1
        fail(f"cannot open the database {url!r}: {exc}")
    # The engines are stopped and the store is closed. An idle AnyIO worker thread (not a
    # daemon) would hold the interpreter's exit for seconds; nothing is left to wait for.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


@app.command()
def init(
    path: Path = typer.Argument(Path("tidings.toml"), help="Where to write the example configuration."),
) -> None:
    """Write a commented example configuration file (never overwrites one)."""
    from .config import ConfigError, write_example

    try:
        written = write_example(path)
    except ConfigError as exc:
        fail(str(exc))
    out.print(f"wrote {written}; run: tidings serve --config {written}", soft_wrap=True)


@app.command()
def status(
    db: str | None = DbOption,
    url: str | None = typer.Option(None, "--url", help="A running hub's base URL: its live figures."),
    token: str | None = typer.Option(None, "--token", help="With --url: the admin token (env TIDINGS_ADMIN_TOKEN)."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of tables."),
) -> None:
    """Show a hub's figures: live from a running hub (--url), or the durable ones from a database (--db)."""
    from . import status_cli

    if url and db:
        fail("give either --url (a running hub) or --db (the store), not both", 2)
    try:
        if url:
            token = token or os.environ.get("TIDINGS_ADMIN_TOKEN")
            if not token:
                fail("--url needs the admin --token (or TIDINGS_ADMIN_TOKEN)", 2)
            data = status_cli.from_url(url, token)
        else:
            db_url = resolve_db(db)
            if not db_url.startswith(("postgres", "sqlite:")) and not Path(db_url).exists():
                fail(f"no database at {db_url}", 1)
            data = status_cli.from_db(db_url)
    except typer.Exit:
        raise
    except Exception as exc:  # noqa: BLE001 - one line, exit 1
        fail(str(exc))
    status_cli.render(data, out, as_json)


@app.command()
def ingest(
    file: Path = typer.Argument(..., exists=True, dir_okay=False, help="JSON-lines file of frames."),
    bridge: str = typer.Option(..., "--bridge", help="Bridge id the frames belong to."),
    db: str | None = DbOption,
    url: str | None = typer.Option(None, "--url", help="Append through a running hub at this URL instead."),
    token: str | None = typer.Option(None, "--token", help="With --url: the bridge's token (env TIDINGS_BRIDGE_TOKEN)."),
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
    from . import dbfiles

    db_url = resolve_db(db)
    existed = dbfiles.existed(db_url)
    code = run_ingest(file, bridge, db_url, out, err)
    if code != 0 and not existed:  # never leave a database this command created and could not use
        dbfiles.remove(dbfiles.sqlite_path(db_url))
    sys.exit(code)


@app.command()
def replay(
    args: list[str] = typer.Argument(..., metavar="CORPUS.jsonl | compare A B", show_default=False),
    out_store: str | None = typer.Option(
        None, "--out", help="The fresh store to build: a new SQLite path or an empty postgresql:// database."
    ),
    metrics: Path | None = typer.Option(None, "--metrics", help="Where to write the metrics JSON."),
    stuck: int = typer.Option(0, "--stuck", help="Frames that fail transiently on every attempt."),
    stuck_at: str = typer.Option(
        "decoded", "--stuck-at", help="Where stuck frames fail: 'decoded' (before the projection) or 'projected' (after it)."
    ),
    real_sleeps: bool = typer.Option(
        False, "--real-sleeps", help="Sleep the worker's 5/10/20 ms in-attempt retry waits (pinned and only counted by default)."
    ),
    limit: int | None = typer.Option(None, "--limit", min=1, help="Replay only the first N frames."),
    codecs: str | None = typer.Option(None, "--codecs", help="Replay only these codecs (comma-separated)."),
    label: str = typer.Option("", "--label", help="A label recorded in the metrics."),
    apply_on_append: bool = typer.Option(
        True, "--apply-on-append/--worker-only", help="Apply frames in their append transaction, or leave all to the worker."
    ),
    autocheckpoint: bool = typer.Option(
        False, "--autocheckpoint",
        help="SQLite: keep automatic WAL checkpoints (as in production); WAL bytes are then not measured."
    ),
    ignore: list[str] | None = typer.Option(
        None, "--ignore", help="compare: a table.column (or table) reported but not required to match; repeatable."
    ),
    report: Path | None = typer.Option(None, "--report", help="compare: also write the comparison as JSON."),
) -> None:
    """Replay a corpus into a fresh store and write metrics; or: replay compare A B."""
    try:
        from .replay.cli import run_replay
    except ModuleNotFoundError:
        fail("replay is not available in this build")
    from . import logs

    logs.configure(level=os.environ.get("TIDINGS_LOG_LEVEL", "ERROR"))
    sys.exit(run_replay(
        args, out_store=out_store, metrics=metrics, stuck=stuck, stuck_at=stuck_at, real_sleeps=real_sleeps,
        ignore=ignore, report=report, limit=limit,
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
    db: str | None = DbOption,
    url: str | None = typer.Option(
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
    if url:
        sys.exit(run_proxy(url, token))
    from . import dbfiles

    db_url = resolve_db(db)
    existed = dbfiles.existed(db_url)
    code = run_stdio(db_url, token)
    if code != 0 and not existed:  # a refused token on a path that held no database: leave none
        dbfiles.remove(dbfiles.sqlite_path(db_url))
    sys.exit(code)


def main() -> None:
    try:
        app()
    except KeyboardInterrupt:
        sys.exit(130)


from .admin_cli import EXAMPLES as _ADMIN_EXAMPLES  # noqa: E402
from .admin_cli import admin_app as _admin_app  # noqa: E402
from .cli_polish import install as _polish  # noqa: E402 - after every command is registered

app.add_typer(_admin_app, name="admin")

_polish(app, _ADMIN_EXAMPLES)
