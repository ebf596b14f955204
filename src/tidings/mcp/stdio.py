"""``tidings mcp --token T [--db URL]``: the MCP tools over stdio, for one agent.

The process opens the store directly and serves the same tools as ``/mcp``
(``server.build_server``) on stdin/stdout. Before serving it checks, in this order, and
exits 1 with a one-line reason on stderr when one fails: the database exists (a SQLite
file is never created here, and a database without a hub is never bootstrapped here, so
no admin token is minted where nobody would see it), and the token is an agent's.
Every call re-checks the token, so a revoked one stops working at once.

No engine runs in this process: no delivery consumer (the hub server's consumer is the
only one; a second one here would steer nobody, since sessions live in the server, yet
it would mark mentions routed and so take them away from the server), no ingest
worker, no waker. Reads, acks and owed mentions are plain store work and are exact.

Posting: a post commits here with ``mentions_routed_at`` NULL, and this process's bus has
no subscriber. The hub server does not see a bus event for it; its recovery scan finds
the row (every 30 s, ``scan_interval_ms``, and at its start) and runs the one mention
pass: a mentioned agent outside its sweep set is owed the message, a live mentioned agent
is steered, an offline one woken. So a mention posted over stdio reaches its agent within
one scan interval instead of at once; nothing is lost, because the row is durable and
every reader's cursor sees it immediately (``read_messages``, the HTTP API, the next
session's cursor sweep). A live session that would get the post as a plain ``deliver``
(sweep set, not mentioned) gets it at its next sweep, not pushed: the scan routes
mentions, it does not fan out. See docs/decisions.md (D29). Agents that need push latency
should use ``/mcp`` over HTTP, or ``tidings mcp --url`` (``proxy.py``, D40): stdio in front
of the running hub, whose posts go through the server's bus.

Logs go to stderr (stdout is the protocol), at ``TIDINGS_LOG_LEVEL`` (default WARNING).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import anyio
from mcp.server.mcpserver.exceptions import ToolError

from .. import logs
from ..errors import Forbidden, TidingsError
from ..hub import accounts as accounts_hub
from ..hub.tokens import Principal, authenticate
from ..runtime import Runtime
from ..store.engine import Store, normalize_url
from .server import build_server


class StartupError(Exception):
    """A reason not to serve, printed as one line on stderr."""


def _fail(message: str) -> int:
    print(f"error: {message}", file=sys.stderr, flush=True)
    return 1


def agent_of(store: Store, token: str | None) -> Principal:
    """The agent ``token`` belongs to; Unauthorized/Forbidden otherwise."""
    who = authenticate(store, token)
    if not who.is_agent or not who.account_id:
        raise Forbidden("the token is not an agent token; `tidings mcp` serves one agent", code="agent_only")
    return who


def _check_database(db_url: str) -> None:
    """Refuse a database this command would have to create or bootstrap."""
    try:
        dialect, sa_url = normalize_url(db_url)
    except ValueError as exc:
        raise StartupError(str(exc)) from None
    if dialect == "sqlite":
        path = Path(sa_url.split(":///", 1)[1])
        if not path.is_file():
            raise StartupError(f"no database at {str(path)!r} (start the hub with `tidings serve` first)")
    try:
        store = Store(db_url)
    except Exception as exc:  # noqa: BLE001 - one line, exit 1
        raise StartupError(f"cannot open the database {db_url!r}: {exc}") from None
    try:
        ready = accounts_hub.hub_is_set_up(store)
    finally:
        store.dispose()
    if not ready:
        raise StartupError(f"the database {db_url!r} holds no hub yet (start it with `tidings serve` first)")


def open_runtime(db_url: str, token: str) -> tuple[Any, Principal]:
    """The runtime (engines not started) and the token's agent; StartupError otherwise."""
    _check_database(db_url)
    try:
        runtime = Runtime(db_url)
    except Exception as exc:  # noqa: BLE001 - one line, exit 1
        raise StartupError(f"cannot open the database {db_url!r}: {exc}") from None
    try:
        who = agent_of(runtime.store, token)
    except TidingsError as exc:
        runtime.stop()
        raise StartupError(exc.message) from None
    return runtime, who


def run_stdio(db_url: str, token: str) -> int:
    """Serve the tools on stdin/stdout until stdin closes; the process exit code."""
    logs.configure(level=os.environ.get("TIDINGS_LOG_LEVEL", "WARNING"))
    try:
        runtime, _ = open_runtime(db_url, token)
    except StartupError as exc:
        return _fail(str(exc))

    def current_agent(ctx: Any) -> Principal:
        try:
            return agent_of(runtime.store, token)
        except TidingsError as exc:
            raise ToolError(f"{exc.message} [{exc.code}]") from None

    server = build_server(runtime, current_agent)
    try:
        anyio.run(server.run_stdio_async)
    except KeyboardInterrupt:
        return 130
    finally:
        runtime.stop()
    return 0
