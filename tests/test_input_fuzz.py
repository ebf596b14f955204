"""Never a 500 for bad input (issue 14 item 1), both backends, every route of the route table.

A live server (uvicorn, real keep-alive connections) over a small hub. Hypothesis throws
generated requests at it: a route taken from ``app.routes`` (so a route added later is
covered without touching this file), any of its methods, path ids (real ones, garbage,
NUL, lone surrogates, huge numbers), query parameters, and bodies (valid JSON of every
shape with NUL / lone surrogates / huge integers inside, JSON nested thousands deep,
invalid UTF-8, plain garbage), under every kind of token. Every answer must be < 500 and,
for a 4xx, the one error envelope. Afterwards the server still answers and still posts.

Streaming routes (SSE) are only opened and hung up: the status line is all we judge.
"""

from __future__ import annotations

import json
import re

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from helpers import auth, create_account, create_channel, post_text
from live import LiveServer
from tidings.api import create_app

EXAMPLES = 400
FIELDS = ["text", "name", "kind", "handle", "owner", "members", "add", "subscribe", "unsubscribe", "remove",
          "message_id", "state", "topic", "blocks", "client_request_id", "platform", "wake", "display_name",
          "mandatory_subscription", "channel_id", "conversation_id", "after_seq", "limit", "codec",
          "codec_version", "dedupe_key", "payload", "frames", "jsonrpc", "method", "params", "id"]
QUERY = ["after_seq", "limit", "before_ms", "before_id", "q", "query", "channel_id", "since", "cursor"]

NASTY_TEXT = st.sampled_from(["", " ", "\x00", "a\x00b", "\ud800", "x\udfffy", "💥", "@agent-a hi", "x" * 5000,
                              "-1", "0", "9223372036854775808", "1e400", "NaN", "null", "%00", "../../etc"])
TEXT = st.one_of(NASTY_TEXT, st.text(max_size=40))
INTS = st.one_of(st.integers(-10, 10), st.sampled_from([2**31, 2**63 - 1, 2**63, 2**64, -(2**63) - 1, 10**40]),
                 st.integers())
SCALAR = st.one_of(st.none(), st.booleans(), INTS, st.floats(allow_nan=False, allow_infinity=False), TEXT)
JSONV = st.recursive(SCALAR, lambda kids: st.one_of(st.lists(kids, max_size=4),
                                                    st.dictionaries(st.one_of(st.sampled_from(FIELDS), TEXT),
                                                                    kids, max_size=4)), max_leaves=12)
OBJECT = st.dictionaries(st.sampled_from(FIELDS), JSONV, max_size=6)


def _dumps(value) -> bytes:
    return json.dumps(value, ensure_ascii=True).encode()


BODY = st.one_of(
    OBJECT.map(_dumps),
    OBJECT.map(_dumps),
    OBJECT.map(_dumps),
    JSONV.map(_dumps),
    st.integers(2, 5000).map(lambda n: ("[" * n + "]" * n).encode()),
    st.integers(2, 5000).map(lambda n: ('{"text":' * n + "1" + "}" * n).encode()),
    st.integers(2, 3000).map(lambda n: ('{"add":' + "[" * n + "]" * n + "}").encode()),
    st.sampled_from([b"", b"{", b"\xff\xfe", b'{"text": "\xed\xa0\x80"}', b'{"text": NaN}', b'{"limit": Infinity}',
                     b"null", b"[]", b'"x"', b'{"text": "a\\u0000b"}', b'{"a\\u0000": 1}']),
    st.binary(max_size=64),
)


def _routes(routes, prefix: str = "") -> list[tuple[str, list[str]]]:
    """Every (path, methods) of the app's route table, included routers flattened."""
    out = []
    for route in routes:
        included = getattr(route, "original_router", None)
        if included is not None:
            context = getattr(route, "include_context", None)
            out += _routes(included.routes, prefix + (getattr(context, "prefix", "") or ""))
        elif getattr(route, "methods", None):
            out.append((prefix + route.path, sorted(set(route.methods) - {"HEAD"})))
        elif getattr(route, "path", None):  # a raw ASGI endpoint (/mcp): every method
            out.append((prefix + route.path, ["GET", "POST", "DELETE"]))
    return out


@pytest.fixture
def hub(runtime):
    app = create_app(runtime, manage_runtime=True)
    with LiveServer(app) as server, server.client() as http:
        admin = "tdg_test_admin"
        alice = create_account(http, "human", "alice", admin_token=admin)
        agent = create_account(http, "agent", "agent-a", admin_token=admin, owner=alice["id"])
        channel = create_channel(http, alice["token"], "room", [agent["id"]])
        message = post_text(http, alice["token"], channel, "hello @agent-a")
        r = http.post("/api/v1/bridges", json={"platform": "signal", "name": "phone", "owner": alice["id"]},
                      headers=auth(admin))
        bridge = r.json()
        yield {
            "server": server, "http": http, "app": app, "channel": channel, "alice": alice, "runtime": runtime,
            "agent_id": agent["id"], "bridge_id": bridge["id"],
            "ids": [channel, message["id"], agent["id"], alice["id"], bridge["id"]],
            "tokens": {"none": None, "bad": "tdg_nope", "admin": admin, "alice": alice["token"],
                       "agent": agent["token"], "bridge": bridge["token"]},
        }


@pytest.mark.timeout(600)
def test_no_input_gets_a_5xx_on_any_route(hub, backend_url, request):
    routes = _routes(hub["app"].routes)
    assert any("/channels/{channel_id}/messages" in path for path, _ in routes)
    ids = hub["ids"]
    path_id = st.one_of(st.sampled_from(ids), st.sampled_from(ids), st.sampled_from(ids), TEXT, INTS.map(str),
                        st.sampled_from(["%00", "%ED%A0%80", "a%2Fb"]))
    query = st.dictionaries(st.sampled_from(QUERY), st.one_of(TEXT, INTS.map(str)), max_size=3)
    seen = {"requests": 0, "5xx": [], "by_status": {}}
    base = hub["server"].url

    tokens = ["admin", "admin", "admin", "alice", "alice", "alice", "agent", "bridge", "none", "bad"]

    @settings(max_examples=EXAMPLES, deadline=None, derandomize=True,
              suppress_health_check=list(HealthCheck))
    @given(route=st.sampled_from(routes), data=st.data(), token=st.sampled_from(tokens),
           body=BODY, params=query, json_type=st.booleans())
    def throw(route, data, token, body, params, json_type):
        path, methods = route
        method = data.draw(st.sampled_from(methods))
        url = re.sub(r"\{[^}]+\}", lambda _m: _quote(data.draw(path_id)), path)
        headers = {"content-type": "application/json" if json_type else "text/plain"}
        if hub["tokens"][token]:
            headers.update(auth(hub["tokens"][token]))
        if path.startswith("/mcp"):
            headers["accept"] = "application/json, text/event-stream"
        query_string = "&".join(f"{_quote(k)}={_quote(v)}" for k, v in params.items())
        full = base + url + ("?" + query_string if query_string else "")
        try:
            status, payload = _send(sender, method, full, headers, body if method != "GET" else None)
        except httpx.TransportError as exc:  # the server hung up on us: as bad as a 500
            status, payload = 599, repr(exc)
        seen["requests"] += 1
        _follow_token_resets(hub, url, status, payload)
        seen["by_status"][status] = seen["by_status"].get(status, 0) + 1
        if status >= 500:
            seen["5xx"].append((method, url, params, body[:120], payload[:200]))
        elif status >= 400 and not path.startswith("/mcp"):
            assert "error" in json.loads(payload), (method, url, payload)

    with httpx.Client(timeout=httpx.Timeout(10.0)) as sender:  # one keep-alive client, as a real caller
        throw()
    print(f"\nfuzz[{request.node.callspec.params['backend_url']}]: {seen['requests']} requests, "
          f"{len(seen['5xx'])} 5xx, statuses {dict(sorted(seen['by_status'].items()))}")
    assert seen["5xx"] == [], seen["5xx"][:5]
    # still healthy, and still doing its job (the fuzz may have reset any token: issue fresh ones)
    from tidings.hub import token_admin

    http = hub["http"]
    assert http.get("/healthz").json() == {"ok": True}
    admin = token_admin.reset_admin_token(hub["runtime"].store)["token"]
    carol = create_account(http, "human", "carol-after", admin_token=admin)
    room = create_channel(http, carol["token"], "after")
    post_text(http, carol["token"], room, "still here")


def _follow_token_resets(hub, url: str, status: int, payload: str) -> None:
    """A generated call may reset a token (admin routes): keep using the new one."""
    if status != 200 or not url.endswith("/token") or '"token"' not in payload:
        return
    token = json.loads(payload)["token"]
    owners = {hub["alice"]["id"]: "alice", hub["agent_id"]: "agent", hub["bridge_id"]: "bridge"}
    if url == "/api/v1/admin/token":
        hub["tokens"]["admin"] = token
    for owner_id, name in owners.items():
        if f"/{owner_id}/" in url:
            hub["tokens"][name] = token


_SAFE = re.compile(r"[A-Za-z0-9_.~-]")
_ENCODED = re.compile(r"(?:%[0-9A-F]{2}|[A-Za-z0-9])*%[0-9A-F]{2}(?:%[0-9A-F]{2}|[A-Za-z0-9])*")


def _quote(value: str) -> str:
    """Percent-encode ``value`` as UTF-8, surrogates kept as their (invalid) 3-byte form."""
    if _ENCODED.fullmatch(value):  # already percent-encoded on purpose ("%00", "%ED%A0%80", "a%2Fb")
        return value
    raw = value.encode("utf-8", "surrogatepass")
    return "".join(chr(b) if _SAFE.fullmatch(chr(b)) else f"%{b:02X}" for b in raw)


def _send(client: httpx.Client, method: str, url: str, headers: dict, body: bytes | None) -> tuple[int, str]:
    with client.stream(method, url, headers=headers, content=body) as response:
        if response.headers.get("content-type", "").startswith("text/event-stream"):
            return response.status_code, ""  # a stream: hang up (closes that connection)
        return response.status_code, response.read().decode("utf-8", "replace")
