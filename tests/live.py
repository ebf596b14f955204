"""A real HTTP server for tests: uvicorn in a thread on a free port, plus an SSE reader.

``LiveServer`` binds and listens on 127.0.0.1:0 *before* the server thread starts, so a
client may connect at once (the kernel queues the connection until uvicorn accepts it,
after the app's lifespan startup): no readiness polling, no sleeps.

``SSEStream`` reads a ``text/event-stream`` on its own thread and hands parsed events to
the test through a queue: ``next(timeout)`` returns ``(event, data)`` where ``data`` is the
decoded JSON of the ``data:`` lines; the stream's end shows up as ``("closed", reason)``,
and with ``comments=True`` comment lines show up as ``("comment", text)``.

    with LiveServer(create_app(runtime, manage_runtime=True)) as server:
        with SSEStream(server.url + "/api/v1/session", {"Authorization": ...}) as stream:
            assert stream.next()[0] == "session"
"""

from __future__ import annotations

import json
import queue
import socket
import threading
from typing import Any

import httpx
import uvicorn


class LiveServer:
    def __init__(self, app: Any, *, graceful_timeout: float = 5.0) -> None:
        # proto=IPPROTO_TCP matters: asyncio only sets TCP_NODELAY on accepted sockets whose
        # listening socket says TCP, and without it every response waits ~40 ms on Nagle.
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(128)
        self.port = self._sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(
            app, lifespan="on", log_level="warning", timeout_graceful_shutdown=graceful_timeout
        )
        self.server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [self._sock]}, name=f"uvicorn-{self.port}", daemon=True
        )

    def __enter__(self) -> LiveServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.server.should_exit = True
        self._thread.join(15)
        self._sock.close()

    def client(self, **kwargs: Any) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=10.0, **kwargs)


class SSEStream:
    def __init__(self, url: str, headers: dict[str, str] | None = None, *, comments: bool = False) -> None:
        self.url = url
        self.headers = headers or {}
        self.report_comments = comments  # also queue ("comment", text) for ": ..." lines
        self.events: queue.Queue[tuple[str, Any]] = queue.Queue()
        self.comments = 0
        self.status: int | None = None
        self._client = httpx.Client(timeout=httpx.Timeout(10.0, read=None))
        self._response: httpx.Response | None = None
        self._thread = threading.Thread(target=self._read, name="sse-reader", daemon=True)

    def __enter__(self) -> SSEStream:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _read(self) -> None:
        reason = None
        try:
            with self._client.stream("GET", self.url, headers=self.headers) as response:
                self._response = response
                self.status = response.status_code
                if response.status_code != 200:
                    body = response.read()
                    self.events.put(("http_error", {"status": response.status_code, "body": json.loads(body)}))
                    return
                event, data = None, []
                for line in response.iter_lines():
                    if line == "":
                        if event is not None or data:
                            self.events.put((event or "message", json.loads("\n".join(data)) if data else None))
                        event, data = None, []
                    elif line.startswith(":"):
                        self.comments += 1
                        if self.report_comments:
                            self.events.put(("comment", line[1:].strip()))
                    else:
                        name, _, value = line.partition(":")
                        value = value[1:] if value.startswith(" ") else value
                        if name == "event":
                            event = value
                        elif name == "data":
                            data.append(value)
        except Exception as exc:  # noqa: BLE001 - the stream was closed under us
            reason = repr(exc)
        finally:
            self.events.put(("closed", reason))

    def next(self, timeout: float = 10.0) -> tuple[str, Any]:
        """The next event; raises ``queue.Empty`` when none arrives within ``timeout``."""
        return self.events.get(timeout=timeout)

    def close(self) -> None:
        """Hang up like a client that goes away: shut the socket down under the reader."""
        response = self._response
        if response is not None:
            stream = response.extensions.get("network_stream")
            sock = stream.get_extra_info("socket") if stream is not None else None
            if sock is not None:
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:  # already closed
                    pass
        self._thread.join(10)
        self._client.close()
