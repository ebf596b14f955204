"""``tidings.client`` pieces without a server: the SSE parser, the backoff schedule, the
bounded dedupe LRU, giving up on an unreachable server (fake clock, no real sleep), and
clear errors for misuse."""

from __future__ import annotations

import json
import random
import socket

import httpx
import pytest
from clientkit import Sleeper
from hypothesis import given, settings
from hypothesis import strategies as st

from tidings.client import Agent, APIError, Backoff, ClientError, ServerUnavailable, SSEEvent, SSEParser, _Seen


def test_sse_parser_events_comments_and_line_endings():
    parser = SSEParser()
    stream = (
        b": keep-alive\n\n"
        b"event: session\ndata: {\"type\":\"session\"}\n\n"
        b"event: deliver\r\ndata: a\r\ndata: b\r\n\r\n"
        b"data:no-space\rid: 7\rretry: 10\r\r"
        b"event: end\ndata: {}\n"
    )
    assert parser.feed(stream) == [
        SSEEvent("session", '{"type":"session"}'),
        SSEEvent("deliver", "a\nb"),
        SSEEvent("message", "no-space"),
    ]
    assert parser.comments == 1 and parser.partial  # "end" has not been terminated yet
    assert parser.feed(b"\n") == [SSEEvent("end", "{}")]
    assert not parser.partial


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(min_value=1, max_value=40), max_size=30), st.sampled_from([b"\n", b"\r\n", b"\r"]))
def test_sse_parser_is_independent_of_chunk_boundaries(cuts, newline):
    text = "éé ünïcode ✓"
    body = newline.join(
        [b": ka", b"", b"event: deliver", ("data: " + text).encode(), b"", b"event: steer", b"data: x", b"", b""]
    )
    first = SSEParser()
    whole = first.feed(body) + (first.feed(b"\n") if newline == b"\r" else [])
    assert whole == [SSEEvent("deliver", text), SSEEvent("steer", "x")]
    parser, got, at = SSEParser(), [], 0
    for cut in cuts:
        got += parser.feed(body[at : at + cut])
        at += cut
    got += parser.feed(body[at:])
    if newline == b"\r":  # a trailing CR waits to see whether an LF follows
        got += parser.feed(b"\n")
    assert got == whole


def test_backoff_grows_exponentially_with_bounded_jitter_up_to_the_cap():
    backoff, rng = Backoff(base=0.5, factor=2, cap=8, jitter=0.5), random.Random(7)
    for attempt, ceiling in enumerate([0.5, 1, 2, 4, 8, 8, 8]):
        delays = [backoff.delay(attempt, rng) for _ in range(200)]
        assert all(ceiling / 2 <= d <= ceiling for d in delays)
        assert max(delays) - min(delays) > ceiling / 4  # really jittered
    assert Backoff(jitter=0).delay(3) == 4.0
    assert Backoff(cap=30).ceiling(10_000) == 30  # no overflow on long outages


def test_the_dedupe_lru_is_bounded_and_refreshes_on_touch():
    seen = _Seen(3)
    for m in ("a", "b", "c"):
        seen.add(m)
    seen.touch("a")
    seen.add("d")  # evicts the least recent: b
    assert "b" not in seen and all(m in seen for m in ("a", "c", "d")) and len(seen) == 3
    with pytest.raises(ValueError):
        _Seen(0)


def _refused_url() -> str:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()  # nothing listens there now: connections are refused
    return f"http://127.0.0.1:{port}"


def test_an_unreachable_server_is_retried_with_backoff_then_given_up_on():
    now = [0.0]
    delays: list[float] = []

    def sleep(seconds: float) -> None:  # a fake sleep moves a fake clock
        delays.append(seconds)
        now[0] += seconds

    agent = Agent(
        _refused_url(),
        "tdg_x",
        sleep=sleep,
        clock=lambda: now[0],
        rng=random.Random(1),
        backoff=Backoff(base=1, cap=4),
        give_up_after=20,
    )
    agent.on_message(lambda event: None)
    with pytest.raises(ServerUnavailable, match="no session for"):
        agent.run()
    ceilings = [1, 2, 4, 4, 4, 4, 4, 4, 4, 4][: len(delays)]
    assert all(c / 2 <= d <= c for d, c in zip(delays, ceilings))
    assert 20 <= now[0] < 24 + 4 and agent.stats["sessions"] == 0
    agent.close()


def test_stop_interrupts_the_backoff_and_run_returns():
    sleeper = Sleeper()
    sleeper.hold()
    agent = Agent(_refused_url(), "tdg_x", sleep=sleeper)
    agent.on_message(lambda event: None)
    agent.run_in_thread()
    assert sleeper.wait_calls(1)
    agent.stop(timeout=0)  # stop while it is in its backoff
    sleeper.release()
    assert agent.wait(10) and agent.end_reason == "stopped" and len(sleeper.delays) == 1
    # the default sleep is interruptible by stop() itself
    default = Agent(_refused_url(), "tdg_x", backoff=Backoff(base=60, cap=60))
    default.on_message(lambda event: None)
    thread = default.run_in_thread()
    default.stop(timeout=10)
    assert not thread.is_alive() and default.end_reason == "stopped"
    agent.close()
    default.close()


def test_misuse_is_a_clear_error():
    with pytest.raises(ValueError):
        Agent("http://127.0.0.1:1", "")
    with pytest.raises(ValueError):
        Agent("http://127.0.0.1:1", "tdg_x", on_replaced="fight")
    with pytest.raises(ClientError, match="no handler"):
        Agent("http://127.0.0.1:1", "tdg_x").run()


def _sse(kind: str, payload: dict) -> bytes:
    return f"event: {kind}\ndata: {json.dumps({'type': kind, **payload})}\n\n".encode()


def test_a_5xx_is_retried_a_duplicate_in_one_stream_is_reacked_and_replaced_stops():
    message = {"id": "msg_1", "seq": 1, "channel_id": "ch_1", "text": "hi"}
    body = (
        b": keep-alive\n\n"
        + _sse("session", {"session_id": "ses_1"})
        + _sse("deliver", {"message": message, "channel_id": "ch_1"})
        + _sse("steer", {"message": message, "channel_id": "ch_1"})  # the same message again
        + _sse("end", {"reason": "replaced"})
    )
    answers = iter([httpx.Response(503, json={"error": {"code": "busy", "message": "later"}})] * 2
                   + [httpx.Response(200, headers={"content-type": "text/event-stream"}, content=body)])
    seen: list[tuple[str, object]] = []

    def serve(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/api/v1/session":
            assert request.headers["authorization"] == "Bearer tdg_x"
            return next(answers)
        seen.append((request.url.path, json.loads(request.content)))
        return httpx.Response(200, json={})

    handled: list[tuple[str, str]] = []
    sleeper = Sleeper()
    agent = Agent("http://hub.test", "tdg_x", transport=httpx.MockTransport(serve), sleep=sleeper,
                  rng=random.Random(3))
    agent.on_message(lambda event: handled.append((event.kind, event.message_id)))
    agent.run()
    assert handled == [("deliver", "msg_1")]
    assert seen == [
        ("/api/v1/session/ses_1/state", {"state": "working"}),
        ("/api/v1/ack", {"message_id": "msg_1"}),
        ("/api/v1/ack", {"message_id": "msg_1"}),  # the duplicate: acked again, not handled
    ]
    assert len(sleeper.delays) == 2 and sleeper.delays[1] > sleeper.delays[0]
    assert agent.end_reason == "replaced" and agent.stats["duplicates"] == 1
    agent.close()


def test_a_server_that_is_not_a_hub_is_a_clear_error():
    page = httpx.MockTransport(lambda request: httpx.Response(200, headers={"content-type": "text/html"}, text="<p>"))
    agent = Agent("http://example.test", "tdg_x", transport=page, sleep=Sleeper())
    agent.on_message(lambda event: None)
    with pytest.raises(APIError, match="not text/event-stream"):
        agent.run()
    agent.close()


def test_at_info_the_agent_logs_only_connects_disconnects_and_errors(caplog):
    """issue 14 item 7: httpx's per-request lines are DEBUG, not INFO."""
    import logging

    body = _sse("session", {"session_id": "ses_1"}) + _sse("end", {"reason": "replaced"})

    def serve(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/api/v1/session":
            return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=body)
        return httpx.Response(200, json={})

    caplog.set_level(logging.INFO)
    agent = Agent("http://hub.test", "tdg_x", transport=httpx.MockTransport(serve), sleep=Sleeper(),
                  on_replaced="stop")
    agent.on_message(lambda event: None)
    agent.run()
    agent.close()
    info = [r.getMessage() for r in caplog.records if r.levelno >= logging.INFO]
    assert not [m for m in info if m.startswith("HTTP Request")], info
    assert any("session ses_1 started" in m for m in info) and any("replaced" in m for m in info), info
