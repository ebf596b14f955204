"""``tidings bridge ...``: the connectors that ship with Tidings, as Typer commands."""

from __future__ import annotations

import os
import sys

import typer

bridge_app = typer.Typer(help="Run a bridge connector between a network and a running hub.", no_args_is_help=True)


@bridge_app.command("signal")
def signal(
    rpc: str = typer.Option(..., "--rpc", help="signal-cli daemon: tcp://HOST:PORT (JSON-RPC) or http://HOST:PORT."),
    account: str = typer.Option(..., "--account", help="The Signal account (+NUMBER) to send as."),
    url: str | None = typer.Option(None, "--url", help="The hub's base URL (env TIDINGS_URL)."),
    token: str | None = typer.Option(None, "--token", help="The bridge's token (env TIDINGS_TOKEN)."),
    receive_mode: str = typer.Option("on-connection", "--receive-mode",
                                     help="The daemon's receive mode: on-connection or manual (subscribeReceive)."),
    queue_max: int = typer.Option(1000, "--queue", min=1, help="Frames held in memory while the hub is away."),
) -> None:
    """Two-way Signal: receive notifications become frames, the bridge's outbox is sent."""
    from ... import logs
    from .signal import Fatal, Options, SignalConnector

    logs.configure()  # structured logs on stderr; stdout has one line per connect/disconnect

    hub_url = url or os.environ.get("TIDINGS_URL")
    hub_token = token or os.environ.get("TIDINGS_TOKEN")
    if not hub_url or not hub_token:
        print("error: --url and --token (or TIDINGS_URL and TIDINGS_TOKEN) are required", file=sys.stderr)
        raise typer.Exit(2)
    if receive_mode not in ("on-connection", "manual"):
        print("error: --receive-mode must be on-connection or manual", file=sys.stderr)
        raise typer.Exit(2)
    connector = SignalConnector(Options(
        rpc=rpc, account=account, url=hub_url, token=hub_token, receive_mode=receive_mode, queue_max=queue_max,
        say=lambda line: print(line, flush=True),
    ))
    try:
        code = connector.run_forever()
    except Fatal as exc:
        print(f"error: {exc}", file=sys.stderr)
        code = 2
    except Exception as exc:  # noqa: BLE001 - one line, not a traceback
        print(f"error: {type(exc).__name__}: {exc}", file=sys.stderr)
        code = 1
    raise typer.Exit(code)
