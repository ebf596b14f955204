"""``tidings serve``: bind first, then open the database, then speak; stop cleanly.

Order of a start, each step only after the one before succeeded:

1. bind and listen on the port: a busy port is refused here, before any database is
   touched (also for ``--demo``), with one line and exit 1;
2. open (and migrate) the database, build the runtime and the app; a new SQLite file that
   then fails to open is removed again (``dbfiles.removed_on_failure``);
3. print where it listens and, if one was generated, the admin token: it is shown only
   once the port is ours, so it cannot be lost to a failed bind.

On SIGINT or SIGTERM every open agent session gets ``end`` with reason ``shutdown`` at
once (its SSE stream then closes), other streams get ``GRACE_S`` to finish, the engines
stop (the app's lifespan), and the process exits 0 without a traceback.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import structlog
import uvicorn

log = structlog.get_logger("tidings.serve")

GRACE_S = 1.0  # streams other than agent sessions (the web page's) get this long to finish


class PortBusy(Exception):
    pass


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on ``host:port``; ``PortBusy`` with the reason when it cannot be had."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP)
    except socket.gaierror as exc:
        raise PortBusy(f"cannot resolve {host!r}: {exc.strerror}") from None
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
        sock.listen(2048)
    except OSError as exc:
        sock.close()
        raise PortBusy(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    sock.set_inheritable(True)
    return sock


class HubServer(uvicorn.Server):
    """uvicorn with a shutdown that first tells every agent session why it ends."""

    def __init__(self, config: uvicorn.Config, on_signal: Callable[[], None]) -> None:
        super().__init__(config)
        self._on_signal = on_signal
        self._signalled = False

    def handle_exit(self, sig: int, frame: Any) -> None:
        if not self._signalled:
            self._signalled = True
            # not inside the signal handler: the handler may have interrupted a lock holder
            threading.Thread(target=self._on_signal, name="tidings-shutdown", daemon=True).start()
        super().handle_exit(sig, frame)

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        """uvicorn's, minus re-raising the signal afterwards: a signal is a clean exit here."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        original = {sig: signal.signal(sig, self.handle_exit) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for sig, handler in original.items():
                signal.signal(sig, handler)


@dataclass
class ServeOptions:
    db_url: str
    host: str = "127.0.0.1"
    port: int = 7860
    demo: bool = False
    admin_token: str | None = None
    log_level: str = "warning"
    admin_token_file: str | None = None
    metrics_bind: str | None = None
    max_body: int | None = None
    delivery_overrides: dict[str, Any] | None = None
    attachments_dir: str | None = None


def _host_port(value: str) -> tuple[str, int]:
    host, _, port = value.rpartition(":")
    if not host or not port.isdigit():
        raise PortBusy(f"--metrics-bind must be HOST:PORT, not {value!r}")
    return host.strip("[]"), int(port)


def _token_from_file(path: str | None) -> str | None:
    if not path or not os.path.exists(path):
        return None
    token = open(path, encoding="utf-8").read().strip()
    if not token:
        raise ValueError(f"the admin token file {path} is empty")
    return token


def _write_token(path: str, token: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(token + "\n")


def one_server_per_sqlite_file(url: str) -> Any:
    """SQLite: take the one-server lock of the file (``AnotherServer`` when another server
    holds it); PostgreSQL, where several servers are one hub: None."""
    from .cluster.guard import hold_sqlite_file
    from .store.engine import normalize_url

    dialect, sa_url = normalize_url(url)
    if dialect != "sqlite":
        return None
    return hold_sqlite_file(sa_url.split(":///", 1)[1])


def end_sessions(runtime: Any) -> None:
    """Every open agent session: ``end`` with reason ``shutdown``."""
    delivery = getattr(runtime, "delivery", None)
    if delivery is not None:
        n = delivery.registry.close_all("shutdown")
        log.info("shutdown: sessions ended", sessions=n)


def serve(options: ServeOptions, say: Callable[[str], None], build_app: Callable[[Any], Any] | None = None) -> int:
    """Run the hub until a signal; the exit code. Raises ``PortBusy`` before touching the database."""
    from . import dbfiles
    from .api import create_app
    from .runtime import Runtime

    sock = bind(options.host, options.port)
    metrics_sock = metrics_server = None
    try:
        if options.metrics_bind:
            metrics_sock = bind(*_host_port(options.metrics_bind))
        admin_token = options.admin_token or _token_from_file(options.admin_token_file)
        base = f"http://{options.host}:{options.port}"
        serve_lock = one_server_per_sqlite_file(options.db_url)  # noqa: F841 - held while serving
        with dbfiles.removed_on_failure(options.db_url):
            runtime = Runtime(options.db_url, admin_token=admin_token, cluster=True, address=base,
                              attachments_dir=options.attachments_dir)
        if options.delivery_overrides and runtime.delivery is not None:
            from .delivery.engine import Delivery

            current = runtime.delivery.options
            if any(getattr(current, k) != v for k, v in options.delivery_overrides.items()):
                runtime.delivery = Delivery(runtime, **options.delivery_overrides)  # not started: no subscription yet
                if runtime.cluster is not None:
                    runtime.delivery.attach_cluster(runtime.cluster)
        say(f"[bold]Tidings[/bold] on {base}  (database: {options.db_url})")
        if runtime.generated_admin_token:
            if options.admin_token_file:
                _write_token(options.admin_token_file, runtime.generated_admin_token)
                say(f"admin token written to {options.admin_token_file}")
            else:
                say(f"admin token (shown once, keep it): [bold]{runtime.generated_admin_token}[/bold]")
        if metrics_sock is not None:
            from .metrics import serve_metrics

            metrics_server = serve_metrics(runtime, metrics_sock)
            say(f"metrics on http://{options.metrics_bind}/metrics")
        if options.demo:
            from .demo import seed_demo

            say(seed_demo(runtime, base))
        extra = {"max_body": options.max_body} if options.max_body else {}
        app = (build_app or (lambda rt: create_app(rt, manage_runtime=True, **extra)))(runtime)
        config = uvicorn.Config(
            app, lifespan="on", log_level=options.log_level, timeout_graceful_shutdown=GRACE_S
        )
        server = HubServer(config, on_signal=lambda: end_sessions(runtime))
        server.run(sockets=[sock])
        runtime.stop()  # idempotent; the lifespan already stopped it
        return 0
    finally:
        if metrics_server is not None:
            metrics_server.shutdown()
        for s in (sock, metrics_sock):
            if s is not None:
                s.close()
