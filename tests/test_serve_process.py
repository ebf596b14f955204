"""``tidings serve`` as a real process (issue 14 item 4), both backends: a busy port is
refused before the database is touched, the admin token is printed only once the port is
bound, and SIGINT/SIGTERM end every agent session with ``end``/``shutdown`` and exit 0
within 2 s without a traceback. A failed ``tidings ingest`` leaves no database file."""

from __future__ import annotations

import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from helpers import auth, create_account
from live import SSEStream

CLI = [sys.executable, "-c", "from tidings.cli import main; main()"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _accounts(url: str) -> int:
    if url.startswith("postgres"):
        import psycopg

        with psycopg.connect(url) as conn:
            return conn.execute("SELECT count(*) FROM accounts").fetchone()[0]
    import sqlite3

    with sqlite3.connect(url) as conn:
        return conn.execute("SELECT count(*) FROM accounts").fetchone()[0]


class Serve:
    """``tidings serve`` on a subprocess; stdout lines arrive on a queue."""

    def __init__(self, *args: str, env: dict | None = None, cwd: Path | None = None) -> None:
        self.proc = subprocess.Popen([*CLI, "serve", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True, env={**os.environ, "TIDINGS_LOG_LEVEL": "INFO", **(env or {})},
                                     cwd=cwd)
        self.lines: queue.Queue[str] = queue.Queue()
        self.stdout: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.stdout.append(line)
            self.lines.put(line)

    def wait_line(self, needle: str, timeout: float = 30.0) -> str:
        deadline = time.monotonic() + timeout
        while True:
            line = self.lines.get(timeout=max(0.01, deadline - time.monotonic()))
            if needle in line:
                return line

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)


@pytest.fixture
def db_url(backend_url):
    return backend_url


def test_a_busy_port_is_refused_before_the_database_is_touched(db_url, tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        run = subprocess.run([*CLI, "serve", "--db", db_url, "--port", str(port)], capture_output=True, text=True,
                             timeout=60)
        assert run.returncode == 1, run.stderr
        assert "cannot listen on" in run.stderr and "Traceback" not in run.stderr
        assert "admin token" not in run.stdout
        if db_url.startswith("postgres"):
            assert _accounts(db_url) == 0  # not even the system account was bootstrapped
        else:
            assert not Path(db_url).exists()
        demo = subprocess.run([*CLI, "serve", "--demo", "--port", str(port)], capture_output=True, text=True,
                              timeout=60, cwd=tmp_path)
        assert demo.returncode == 1 and "cannot listen on" in demo.stderr
        assert list(tmp_path.iterdir()) == []  # no demo database either


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_ends_every_session_with_shutdown_and_exits_within_2s(db_url, sig):
    port = free_port()
    hub = Serve("--db", db_url, "--port", str(port))
    try:
        line = hub.wait_line("admin token")
        admin = line.split(":", 1)[1].strip()
        base = f"http://127.0.0.1:{port}"
        with httpx.Client(base_url=base, timeout=10) as http:  # bound before the token was shown
            human = create_account(http, "human", "alice", admin_token=admin)
            agents = [create_account(http, "agent", f"bot-{i}", admin_token=admin, owner=human["id"])
                      for i in range(2)]
        streams = [SSEStream(base + "/api/v1/session", auth(a["token"])) for a in agents]
        for stream in streams:
            stream.__enter__()
            assert stream.next()[0] == "session"
        started = time.monotonic()
        hub.proc.send_signal(sig)
        for stream in streams:
            event, data = stream.next()
            assert (event, data["reason"]) == ("end", "shutdown")
        code = hub.proc.wait(timeout=10)
        elapsed = time.monotonic() - started
        stderr = hub.proc.stderr.read()
        print(f"\nshutdown[{signal.Signals(sig).name}] took {elapsed:.2f} s")
        assert code == 0, stderr
        assert "Traceback" not in stderr, stderr
        assert elapsed < 2.0, elapsed
        for stream in streams:
            stream.close()
    finally:
        hub.stop()


def test_a_failed_ingest_leaves_no_database_file(tmp_path):
    frames = tmp_path / "frames.jsonl"
    frames.write_text('{"codec": "signal.jsonrpc"}\n')
    db = tmp_path / "fresh.db"
    run = subprocess.run([*CLI, "ingest", str(frames), "--bridge", "br_nope", "--db", str(db)],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode != 0
    assert not db.exists() and list(tmp_path.iterdir()) == [frames]


def test_mcp_with_a_bad_token_on_a_new_path_leaves_no_database_file(tmp_path):
    db = tmp_path / "fresh.db"
    run = subprocess.run([*CLI, "mcp", "--token", "tdg_nope", "--db", str(db)], capture_output=True, text=True,
                         timeout=60, stdin=subprocess.DEVNULL)
    assert run.returncode != 0, run.stderr
    assert list(tmp_path.iterdir()) == []
