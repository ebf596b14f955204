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
    def __init__(self, tmp: Path) -> None:
        self.config = tmp / "signal-cli"
        self.tcp_port, self.http_port = free_port(), free_port()
        self.proc: subprocess.Popen | None = None

    def start(self) -> RealDaemon:
        self.proc = subprocess.Popen(
            [str(ROOT / "scripts" / "signal-cli"), "--config", str(self.config), "daemon",
             "--tcp", f"127.0.0.1:{self.tcp_port}", "--http", f"127.0.0.1:{self.http_port}"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=os.environ.copy(),
        )
        assert wait_until(lambda: accepting(self.tcp_port) and accepting(self.http_port)), "signal-cli did not start"
        return self

    def kill9(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait(30)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.kill9()


@pytest.fixture(scope="module")
def real_daemon(tmp_path_factory):
    installed = subprocess.run([str(ROOT / "scripts" / "signal-cli"), "--install-only"], capture_output=True, text=True)
    assert installed.returncode == 0, f"scripts/signal-cli could not install signal-cli: {installed.stderr}"
    d = RealDaemon(tmp_path_factory.mktemp("sig")).start()
    yield d
    d.stop()


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
def test_an_account_the_real_daemon_does_not_have_fails_clearly(hub, real_daemon, transport):
    rpc = (f"tcp://127.0.0.1:{real_daemon.tcp_port}" if transport == "tcp"
           else f"http://127.0.0.1:{real_daemon.http_port}")
    c = connector(hub, rpc).start()
    try:
        assert wait_until(lambda: c.fatal is not None, 30)
        assert c.fatal.startswith(f"signal-cli has no registered account {ACCOUNT}")
        assert "[]" in c.fatal  # listAccounts answered an empty list
    finally:
        c.stop()


@pytest.mark.parametrize("transport", ["tcp", "http"])
def test_real_framing_request_ids_and_error_answers(hub, real_daemon, transport):
    rpc = (f"tcp://127.0.0.1:{real_daemon.tcp_port}" if transport == "tcp"
           else f"http://127.0.0.1:{real_daemon.http_port}")
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


def test_reconnects_after_the_real_daemon_is_killed_and_restarted(hub, real_daemon):
    lines: list[str] = []
    c = connector(hub, f"tcp://127.0.0.1:{real_daemon.tcp_port}", account="", lines=lines)
    c.start()
    try:
        assert c.connected.wait(30)
        real_daemon.kill9()
        assert wait_until(lambda: c.counters.get("disconnects") == 1, 30)
        real_daemon.start()
        assert wait_until(lambda: c.counters.get("connects") == 2, 150)
        assert c.call("version", None) == {"version": "0.13.19"}
        assert [line.split(" ")[0] for line in lines] == ["connected", "disconnected", "connected"]
    finally:
        c.stop()
