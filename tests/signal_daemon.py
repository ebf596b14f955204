"""A protocol-faithful fake signal-cli daemon for the connector tests.

It speaks what signal-cli 0.13 speaks (see its signal-cli-jsonrpc(5) page and
SignalJsonRpcCommandHandler): newline-delimited JSON-RPC 2.0 on TCP (responses matched by
``id``; ``receive`` notifications interleaved, wrapped in ``{"subscription", "result"}``
after ``subscribeReceive`` in manual mode) and HTTP (``POST /api/v1/rpc``,
``GET /api/v1/events`` as ``event:receive`` / ``data:{envelope, account}`` server-sent events,
``GET /api/v1/check``). ``send``, ``sendReaction`` and ``remoteDelete`` answer
``{"timestamp", "results": [{"recipientAddress", "type": "SUCCESS"}]}``; a scripted failure
answers like signal-cli: error -5 (rate limit), -4 (untrusted identity), -3 (network), -1
(other) with ``data.response`` holding the per-recipient results (``type``,
``retryAfterSeconds``). An unknown ``account`` param is error -32602 "Specified account does
not exist". A send may be echoed back as a ``syncMessage.sentMessage`` notification.

Everything a client asks is recorded in ``requests``; ``wait_requests(n, method)`` blocks on
a condition. ``pipelined`` counts requests that arrived while another was unanswered.
"""

from __future__ import annotations

import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

FIXTURES = Path(__file__).parent / "ingest" / "fixtures"
SELF_UUID = "a1b2c3d4-0000-4000-8000-000000000001"


def fixture_notifications() -> list[dict[str, Any]]:
    """Every signal-cli ``receive`` fixture, in file-name order."""
    out = []
    for path in sorted(FIXTURES.glob("signal_*.json")):
        out.append(json.loads(path.read_text()))
    return out


class FakeSignalDaemon:
    def __init__(self, account: str = "+14155550100", *, accounts: list[str] | None = None,
                 mode: str = "on-connection", echo: bool = True, start_ts: int = 1_717_200_000_000) -> None:
        self.account = account
        self.accounts = [account] if accounts is None else accounts
        self.mode = mode
        self.echo = echo
        self.next_ts = start_ts
        self.lock = threading.Condition()
        self.requests: list[dict[str, Any]] = []
        self.failures: list[tuple[int, str, list[dict[str, Any]]]] = []  # scripted send answers
        self.hold_sends = threading.Event()  # set: a send waits for release before answering
        self.release = threading.Event()
        self.pipelined = 0
        self._in_flight = 0
        self._clients: list[socket.socket] = []
        self._subscribed: set[int] = set()
        self._sse: list[Any] = []
        self.tcp_port = 0
        self.http_port = 0
        self._tcp: socket.socket | None = None
        self._http: ThreadingHTTPServer | None = None
        self.backlog: list[dict[str, Any]] = []  # pushed while nobody listened (delivered on connect)

    # -- lifecycle ------------------------------------------------------------------------
    def start(self, tcp_port: int = 0, http_port: int = 0) -> FakeSignalDaemon:
        self._tcp = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._tcp.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._tcp.bind(("127.0.0.1", tcp_port))
        self._tcp.listen(16)
        self.tcp_port = self._tcp.getsockname()[1]
        threading.Thread(target=self._accept, args=(self._tcp,), daemon=True).start()
        daemon = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                if self.path.startswith("/api/v1/check"):
                    self._send(200, b"")
                elif self.path.startswith("/api/v1/events"):
                    self.send_response(200)
                    self.send_header("Content-Type", "text/event-stream")
                    self.end_headers()
                    self.wfile.flush()
                    daemon._add_sse(self.wfile)
                    while not daemon._sse_closed(self.wfile):
                        with daemon.lock:
                            daemon.lock.wait(0.5)
                else:
                    self._send(404, b"")

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length)
                try:
                    req = json.loads(raw)
                except ValueError:
                    return self._send(200, json.dumps(_error(None, -32700, "parse error")).encode())
                self._send(200, json.dumps(daemon.answer(req, conn=None)).encode())

            def _send(self, status: int, body: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self._http = ThreadingHTTPServer(("127.0.0.1", http_port), Handler)
        self._http.daemon_threads = True
        self.http_port = self._http.server_address[1]
        threading.Thread(target=self._http.serve_forever, daemon=True).start()
        return self

    def kill(self) -> None:
        """Drop every connection and stop listening (a daemon killed with -9)."""
        if self._tcp is not None:
            try:
                self._tcp.shutdown(socket.SHUT_RDWR)  # wakes the accept thread on Linux
            except OSError:
                pass
            self._tcp.close()
        if self._http is not None:
            self._http.shutdown()
            self._http.server_close()
        with self.lock:
            for c in self._clients:
                try:
                    c.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                c.close()
            self._clients.clear()
            self._subscribed.clear()
            for w in self._sse:
                try:
                    w.close()
                except (OSError, ValueError):
                    pass
            self._sse.clear()
            self.lock.notify_all()

    def restart(self) -> None:
        self.kill()
        self.start(self.tcp_port, self.http_port)

    @property
    def tcp_url(self) -> str:
        return f"tcp://127.0.0.1:{self.tcp_port}"

    @property
    def http_url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    # -- notifications ------------------------------------------------------------------------
    def push(self, notification: dict[str, Any]) -> int:
        """Send one ``receive`` notification to every listening client; returns how many."""
        params = notification.get("params", notification)
        if "subscription" in params:
            params = params["result"]
        delivered = 0
        with self.lock:
            for c in list(self._clients):
                if self.mode == "manual" and id(c) not in self._subscribed:
                    continue
                body = ({"jsonrpc": "2.0", "method": "receive", "params": {"subscription": 0, "result": params}}
                        if self.mode == "manual" else {"jsonrpc": "2.0", "method": "receive", "params": params})
                try:
                    c.sendall(json.dumps(body).encode() + b"\n")
                    delivered += 1
                except OSError:
                    pass
            for w in list(self._sse):
                try:
                    w.write(b"event:receive\ndata:" + json.dumps(params).encode() + b"\n\n")
                    w.flush()
                    delivered += 1
                except (OSError, ValueError):
                    self._sse.remove(w)
            if not delivered:
                self.backlog.append(notification)
        return delivered

    def listeners(self) -> int:
        with self.lock:
            if self.mode == "manual":
                return len(self._subscribed) + len(self._sse)
            return len(self._clients) + len(self._sse)

    def wait_listeners(self, n: int = 1, timeout: float = 10.0) -> bool:
        with self.lock:
            return self.lock.wait_for(lambda: self._listeners_locked() >= n, timeout)

    def _listeners_locked(self) -> int:
        return (len(self._subscribed) if self.mode == "manual" else len(self._clients)) + len(self._sse)

    def _add_sse(self, wfile: Any) -> None:
        with self.lock:
            self._sse.append(wfile)
            self.lock.notify_all()

    def _sse_closed(self, wfile: Any) -> bool:
        with self.lock:
            return wfile not in self._sse

    # -- requests -----------------------------------------------------------------------------
    def sends(self, method: str | None = None) -> list[dict[str, Any]]:
        with self.lock:
            return [r for r in self.requests if method is None or r.get("method") == method]

    def wait_requests(self, n: int, method: str | None = "send", timeout: float = 10.0) -> list[dict[str, Any]]:
        with self.lock:
            self.lock.wait_for(lambda: len([r for r in self.requests
                                            if method is None or r.get("method") == method]) >= n, timeout)
        return self.sends(method)

    def fail_next(self, code: int, message: str, result_type: str, retry_after_s: int | None = None) -> None:
        result: dict[str, Any] = {"recipientAddress": {"uuid": SELF_UUID, "number": "+14155550133"},
                                  "type": result_type}
        if retry_after_s is not None:
            result["retryAfterSeconds"] = retry_after_s
        with self.lock:
            self.failures.append((code, message, [result]))

    def answer(self, req: Any, conn: socket.socket | None) -> dict[str, Any]:
        if not isinstance(req, dict) or "method" not in req:
            return _error(req.get("id") if isinstance(req, dict) else None, -32600, "method field must be set")
        rid, method, params = req.get("id"), req["method"], dict(req.get("params") or {})
        with self.lock:
            if self._in_flight:
                self.pipelined += 1
            self._in_flight += 1
            self.requests.append(req)
            self.lock.notify_all()
        try:
            return self._answer(rid, method, params, conn)
        finally:
            with self.lock:
                self._in_flight -= 1

    def _answer(self, rid: Any, method: str, params: dict[str, Any], conn: socket.socket | None) -> dict[str, Any]:
        account = params.pop("account", None)
        if account is not None and account not in self.accounts:
            return _error(rid, -32602, "Specified account does not exist")
        if method == "version":
            return _ok(rid, {"version": "0.13.19"})
        if method == "listAccounts":
            return _ok(rid, [{"number": a} for a in self.accounts])
        if method == "subscribeReceive":
            with self.lock:
                if conn is not None:
                    self._subscribed.add(id(conn))
                self.lock.notify_all()
            self._flush_backlog()
            return _ok(rid, 0)
        if method in ("send", "sendReaction", "remoteDelete", "sendTyping"):
            if account is None and len(self.accounts) != 1:
                return _error(rid, -32602, "No account specified")
            if method == "sendTyping":
                return _ok(rid, {})
            if method == "send" and self.hold_sends.is_set():
                self.release.wait(10)
            with self.lock:
                failure = self.failures.pop(0) if self.failures else None
                ts = self.next_ts
                self.next_ts += 1
            if failure is not None:
                code, message, results = failure
                return _error(rid, code, message, {"response": {"timestamp": ts, "results": results}})
            results = [{"recipientAddress": {"uuid": SELF_UUID, "number": "+14155550133"}, "type": "SUCCESS"}]
            if method == "send" and self.echo:
                threading.Thread(target=self.push, args=(self._echo_of(params, ts),), daemon=True).start()
            return _ok(rid, {"timestamp": ts, "results": results})
        return _error(rid, -32601, "Method not implemented")

    def _echo_of(self, params: dict[str, Any], ts: int) -> dict[str, Any]:
        sent: dict[str, Any] = {"destination": None, "destinationNumber": None, "destinationUuid": None,
                                "timestamp": ts, "message": params.get("message"), "expiresInSeconds": 0,
                                "viewOnce": False}
        if "groupId" in params:
            sent["groupInfo"] = {"groupId": params["groupId"], "groupName": "Family", "revision": 3,
                                 "type": "DELIVER"}
        else:
            rcpt = params.get("recipient")
            rcpt = rcpt[0] if isinstance(rcpt, list) else rcpt
            sent.update(destination=rcpt, destinationNumber=rcpt)
        envelope = {"source": self.account, "sourceNumber": self.account, "sourceUuid": SELF_UUID,
                    "sourceName": "Sam Reyes", "sourceDevice": 1, "timestamp": ts,
                    "serverReceivedTimestamp": ts + 100, "syncMessage": {"sentMessage": sent}}
        return {"jsonrpc": "2.0", "method": "receive", "params": {"envelope": envelope, "account": self.account}}

    def _flush_backlog(self) -> None:
        with self.lock:
            pending, self.backlog = self.backlog, []
        for n in pending:
            threading.Thread(target=self.push, args=(n,), daemon=True).start()

    # -- TCP ------------------------------------------------------------------------------------
    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            with self.lock:
                self._clients.append(conn)
                self.lock.notify_all()
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()
            if self.mode != "manual":
                self._flush_backlog()

    def _serve(self, conn: socket.socket) -> None:
        try:
            with conn.makefile("rb") as stream:
                for line in stream:
                    if not line.strip():
                        continue
                    try:
                        req = json.loads(line)
                    except ValueError:
                        reply = _error(None, -32700, "parse error")
                    else:
                        reply = self.answer(req, conn)
                    with self.lock:
                        conn.sendall(json.dumps(reply).encode() + b"\n")
        except OSError:
            pass
        finally:
            with self.lock:
                if conn in self._clients:
                    self._clients.remove(conn)
                self._subscribed.discard(id(conn))


def _ok(rid: Any, result: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "result": result, "id": rid}


def _error(rid: Any, code: int, message: str, data: Any = None) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "error": {"code": code, "message": message, "data": data}, "id": rid}


def main() -> None:  # pragma: no cover - the README tour's stand-in for a registered daemon
    """``uv run python tests/signal_daemon.py --tcp 7583 [--http 8080]``: serve until Ctrl-C,
    printing every request (a ``send`` shows what reached "Signal")."""
    import argparse

    parser = argparse.ArgumentParser(description="A fake signal-cli daemon that prints what it is asked.")
    parser.add_argument("--tcp", type=int, default=7583)
    parser.add_argument("--http", type=int, default=0)
    parser.add_argument("--account", default="+14155550100")
    args = parser.parse_args()
    daemon = FakeSignalDaemon(args.account)
    seen = 0
    daemon.start(args.tcp, args.http)
    print(f"fake signal-cli: tcp://127.0.0.1:{daemon.tcp_port} http://127.0.0.1:{daemon.http_port} "
          f"account {args.account}", flush=True)
    try:
        while True:
            with daemon.lock:
                daemon.lock.wait_for(lambda: len(daemon.requests) > seen)
                fresh = daemon.requests[seen:]
            seen += len(fresh)
            for req in fresh:
                print(json.dumps(req, ensure_ascii=False), flush=True)
    except KeyboardInterrupt:
        daemon.kill()


if __name__ == "__main__":
    main()
