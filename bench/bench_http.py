"""Section 2, secondary figure: post→steer over the real edges, HTTP in and SSE out.

A ``tidings serve`` subprocess (its own interpreter, so its GIL is not shared with the
client) over a fresh database; the world is made through the HTTP API (a human, agents it
owns, one channel with every agent subscribed, as in the in-process run). Every agent
opens ``GET /api/v1/session``; the streams are read by one asyncio loop on a thread of
the benchmark process. Poster threads (``posters``, each with its own keep-alive
connection) post ``@agent`` messages on a fixed open-loop schedule (``open_loop``).
Latency: from the moment the POST is sent to the moment the ``steer`` event has been
parsed off that agent's stream.

The client shares two cores with the server, so this is an upper bound on what a remote
agent would see.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from bench_delivery import open_loop
from benchlib import Reporter, latency_ms

ADMIN = "tdg_bench_http_admin"


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, url: str) -> None:
        self.port = _free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        script = Path(sys.executable).with_name("tidings")
        cmd = [str(script)] if script.exists() else [sys.executable, "-c", "from tidings.cli import main; main()"]
        env = {**os.environ, "TIDINGS_ADMIN_TOKEN": ADMIN, "TIDINGS_LOG_LEVEL": "ERROR", "TIDINGS_FAULTS": ""}
        self.proc = subprocess.Popen(
            [*cmd, "serve", "--db", url, "--port", str(self.port)],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        )

    def __enter__(self) -> Server:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"tidings serve exited: {self.proc.stderr.read().decode(errors='replace')[-2000:]}")
            try:
                if httpx.get(self.base + "/healthz", timeout=1.0).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise RuntimeError("tidings serve did not answer /healthz within 60 s")

    def __exit__(self, *exc: Any) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)


class SSEReaders:
    """Every agent's stream, read by one asyncio loop on its own thread."""

    def __init__(self, base: str, tokens: dict[str, str]) -> None:
        self.base = base
        self.tokens = tokens
        self.steers: dict[str, tuple[str, float]] = {}  # message id -> (agent id, perf_counter)
        self.delivers = 0
        self.opened: set[str] = set()
        self._stop = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()), name="bench-sse", daemon=True)

    def __enter__(self) -> SSEReaders:
        self._thread.start()
        deadline = time.monotonic() + 30
        while len(self.opened) < len(self.tokens) and time.monotonic() < deadline:
            time.sleep(0.01)
        if len(self.opened) < len(self.tokens):
            raise RuntimeError(f"only {len(self.opened)} of {len(self.tokens)} SSE streams opened")
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join(10)

    async def _main(self) -> None:
        timeout = httpx.Timeout(10.0, read=None)
        limits = httpx.Limits(max_connections=len(self.tokens) + 2)
        async with httpx.AsyncClient(base_url=self.base, timeout=timeout, limits=limits) as client:
            tasks = [asyncio.create_task(self._read(client, a, t)) for a, t in self.tokens.items()]
            while not self._stop.is_set():
                await asyncio.sleep(0.05)
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _read(self, client: httpx.AsyncClient, agent_id: str, token: str) -> None:
        perf = time.perf_counter
        async with client.stream("GET", "/api/v1/session", headers={"Authorization": f"Bearer {token}"}) as resp:
            event = None
            async for line in resp.aiter_lines():
                if line.startswith("event: "):
                    event = line[7:]
                elif line.startswith("data: "):
                    if event == "session":
                        self.opened.add(agent_id)
                    elif event == "steer":
                        at = perf()
                        data = json.loads(line[6:])
                        self.steers[data["message"]["id"]] = (agent_id, at)
                    elif event == "deliver":
                        self.delivers += 1


def run_http_latency(url: str, *, rate: float, seconds: float, warmup_s: float, agents: int, reporter: Reporter,
                     label: str, posters: int = 4) -> dict[str, Any]:
    with Server(url) as server, httpx.Client(base_url=server.base, timeout=10.0) as client:
        admin = {"Authorization": f"Bearer {ADMIN}"}

        def call(method: str, path: str, body: dict[str, Any], headers: dict[str, str]) -> dict[str, Any]:
            r = client.request(method, path, json=body, headers=headers)
            if r.status_code >= 300:
                raise RuntimeError(f"{method} {path}: {r.status_code} {r.text[:300]}")
            return r.json()

        human = call("POST", "/api/v1/accounts", {"kind": "human", "handle": "bench-http-human"}, admin)
        hh = {"Authorization": f"Bearer {human['token']}"}
        made = [
            call("POST", "/api/v1/accounts", {"kind": "agent", "handle": f"httpagent{i:02d}", "owner": human["id"]}, admin)
            for i in range(agents)
        ]
        channel = call("POST", "/api/v1/channels", {"name": "bench-http", "members": [a["id"] for a in made]}, hh)
        call("POST", f"/api/v1/channels/{channel['id']}/members", {"subscribe": [a["id"] for a in made]}, hh)
        tokens = {a["id"]: a["token"] for a in made}
        warm = int(rate * warmup_s)
        total = warm + int(rate * seconds)
        path = f"/api/v1/channels/{channel['id']}/messages"
        local = threading.local()
        clients: list[httpx.Client] = []

        def one(i: int) -> tuple[str, str]:
            own = getattr(local, "client", None)
            if own is None:
                own = local.client = httpx.Client(base_url=server.base, timeout=10.0)
                clients.append(own)
            agent = made[i % agents]
            r = own.post(path, json={"text": f"@{agent['handle']} please pick up item {i}"}, headers=hh)
            if r.status_code != 201:
                raise RuntimeError(f"POST {path}: {r.status_code} {r.text[:300]}")
            return r.json()["message"]["id"], agent["id"]

        with SSEReaders(server.base, tokens) as readers:
            try:
                with reporter.step(f"latency: HTTP+SSE {rate:g} posts/s on {label}", total) as update:
                    posts = open_loop(one, total=total, rate=rate, posters=posters, update=update)
                    update(total)
            finally:
                for own in clients:
                    own.close()
            measured = posts[warm:]
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and not all(p.message_id in readers.steers for p in measured):
                time.sleep(0.01)
            steers = dict(readers.steers)
        lat, calls, missing = [], [], 0
        for p in measured:
            calls.append(p.returned - p.called)
            got = steers.get(p.message_id)
            if got is None or got[0] != p.agent_id:
                missing += 1
                continue
            lat.append(got[1] - p.called)
        span = max(p.called for p in measured) - min(p.called for p in measured) if len(measured) > 1 else 0.0
        return {
            "agents": agents,
            "posters": posters,
            "rate_target_per_s": rate,
            "rate_achieved_per_s": round((len(measured) - 1) / span, 1) if span > 0 else None,
            "posts_measured": len(measured),
            "post_call": latency_ms(calls),
            "steer_sse": latency_ms(lat),
            "missing_steers": missing,
        }
