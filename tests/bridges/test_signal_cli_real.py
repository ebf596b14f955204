"""The connector against the real signal-cli 0.13.19 daemon (no account can exist offline):
framing and request ids, error handling, the clear failure for an account the daemon does
not have, and reconnecting after the daemon is killed with -9 and restarted. Both
backends; the daemon is installed by scripts/signal-cli (cached outside git)."""

from __future__ import annotations

import os
import socket
import subprocess
import threading
from pathlib import Path

import pytest

from live import LiveServer
from tidings.api import create_app
from tidings.bridges.connectors.signal import Options, RpcError, SignalConnector, classify
from tidings.bridges.registry import create_bridge

ROOT = Path(__file__).resolve().parents[2]
ACCOUNT = "+14155550100"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(predicate, timeout: float = 90.0) -> bool:
    tick = threading.Event()
    end = threading.Event()
    timer = threading.Timer(timeout, end.set)
    timer.start()
    try:
        while not end.is_set():
            if predicate():
                return True
            tick.wait(0.1)
        return predicate()
    finally:
        timer.cancel()


def accepting(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    except OSError:
        return False


class RealDaemon:
    """The real daemon, its output kept in ``daemon.log`` beside its config so that a failing
    test can show what the daemon said."""

    def __init__(self, tmp: Path) -> None:
        self.config = tmp / "signal-cli"
        self.log = tmp / "daemon.log"
        self.tcp_port, self.http_port = free_port(), free_port()
        self.proc: subprocess.Popen | None = None

    def start(self) -> RealDaemon:
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                [str(ROOT / "scripts" / "signal-cli"), "--config", str(self.config), "daemon",
                 "--tcp", f"127.0.0.1:{self.tcp_port}", "--http", f"127.0.0.1:{self.http_port}"],
                stdout=out, stderr=subprocess.STDOUT, env=os.environ.copy(),
            )
        assert wait_until(lambda: accepting(self.tcp_port) and accepting(self.http_port)), "signal-cli did not start"
        return self

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill9(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait(30)

    def stop(self) -> None:
        if self.running():
            self.kill9()

    def tail(self, lines: int = 20) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])


@pytest.fixture(scope="module")
def real_daemon(tmp_path_factory):
    installed = subprocess.run([str(ROOT / "scripts" / "signal-cli"), "--install-only"], capture_output=True, text=True)
    assert installed.returncode == 0, f"scripts/signal-cli could not install signal-cli: {installed.stderr}"
    d = RealDaemon(tmp_path_factory.mktemp("sig")).start()
    yield d
    d.stop()


@pytest.fixture
def daemon(real_daemon):
    """The module's daemon, started again if an earlier test left it down, so that one
    failure does not fail every test after it."""
    if not real_daemon.running():
        real_daemon.start()
    return real_daemon


@pytest.fixture
def hub(runtime):
    bridge = create_bridge(runtime.store, platform="signal", name="phone", owner=None)
    with LiveServer(create_app(runtime)) as server:
        yield server.url, bridge


def connector(hub, rpc: str, account: str = ACCOUNT, lines=None) -> SignalConnector:
    url, bridge = hub
    return SignalConnector(Options(rpc=rpc, account=account, url=url, token=bridge["token"], pull_wait_ms=200,
                                   say=(lines if lines is not None else []).append))


@pytest.mark.parametrize("transport", ["tcp", "http"])
def test_an_account_the_real_daemon_does_not_have_fails_clearly(hub, daemon, transport):
    rpc = (f"tcp://127.0.0.1:{daemon.tcp_port}" if transport == "tcp"
           else f"http://127.0.0.1:{daemon.http_port}")
    c = connector(hub, rpc).start()
    try:
        assert wait_until(lambda: c.fatal is not None, 30)
        assert c.fatal.startswith(f"signal-cli has no registered account {ACCOUNT}")
        assert "[]" in c.fatal  # listAccounts answered an empty list
    finally:
        c.stop()


@pytest.mark.parametrize("transport", ["tcp", "http"])
def test_real_framing_request_ids_and_error_answers(hub, daemon, transport):
    rpc = (f"tcp://127.0.0.1:{daemon.tcp_port}" if transport == "tcp"
           else f"http://127.0.0.1:{daemon.http_port}")
    c = connector(hub, rpc, account="")  # no account: the connection stays up for raw calls
    c.start()
    try:
        assert c.connected.wait(30)
        assert c.call("version", None) == {"version": "0.13.19"}
        assert c.call("listAccounts", None) == []
        with pytest.raises(RpcError) as refused:
            c.call("send", {"account": ACCOUNT, "groupId": "AAAA", "message": "hi"})
        assert (refused.value.code, refused.value.message) == (-32602, "Specified account does not exist")
        outcome = classify(error=refused.value)
        assert (outcome.state, outcome.retryable) == ("failed", False)
        assert "Specified account does not exist" in outcome.cause
        with pytest.raises(RpcError) as unknown:
            c.call("noSuchMethod", None)
        assert unknown.value.code == -32601
        assert c._next_id == 4  # one id per request, in order; every answer matched to its id
    finally:
        c.stop()


def test_reconnects_after_the_real_daemon_is_killed_and_restarted(hub, daemon):
    """Killed with -9, the daemon's loss is noticed (connected clears, a disconnect is
    counted, a line says so) and, once it is back, the connector connects again by itself
    and calls succeed. Counted as "every connect matched by a disconnect" rather than
    exact numbers, so a connection the daemon itself drops and the connector re-makes
    before the kill does not fail the test; the lines must still alternate."""
    lines: list[str] = []
    c = connector(hub, f"tcp://127.0.0.1:{daemon.tcp_port}", account="", lines=lines)

    def seen() -> str:
        return f"counters={c.counters.snapshot()} lines={lines} daemon log:\n{daemon.tail()}"

    c.start()
    try:
        assert c.connected.wait(30), seen()
        daemon.kill9()
        down = lambda: (not c.connected.is_set() and c.counters.get("disconnects") >= 1  # noqa: E731
                        and c.counters.get("disconnects") == c.counters.get("connects"))
        assert wait_until(down, 30), seen()
        daemon.start()
        assert wait_until(lambda: c.connected.is_set() and c.counters.get("connects") > c.counters.get("disconnects"),
                          60), seen()
        assert c.call("version", None) == {"version": "0.13.19"}
        kinds = [line.split(" ")[0] for line in lines]
        assert kinds[0] == "connected" and kinds[-1] == "connected" and "disconnected" in kinds, seen()
        assert all(a != b for a, b in zip(kinds, kinds[1:])), seen()  # strictly alternating
    finally:
        c.stop()
