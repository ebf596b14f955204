"""MCP tool calls with bad arguments (issue 14 item 1), over ``/mcp`` on a live server, both
backends: every one answers a tool error that names the argument, never an internal error,
and the server keeps serving."""

from __future__ import annotations

import anyio
from mcp_scenario import call, fails
from test_mcp_http import mcp_http

BAD = [
    ("read_messages", {"after_seq": 2**63}, "after_seq"),
    ("read_messages", {"after_seq": 2**70}, "after_seq"),
    ("read_messages", {"after_seq": "soon"}, "after_seq"),
    ("read_messages", {"limit": 0}, "limit"),
    ("read_messages", {"channel_id": "ch_\x00x"}, "channel_id"),
    ("post_message", {"text": "a\x00b"}, "text"),
    ("post_message", {"text": "ok", "client_request_id": "r\x00"}, "client_request_id"),
    ("post_message", {"text": ["not", "text"]}, "text"),
    ("ack", {"message_id": "msg_\x00"}, "message_id"),
    ("list_conversations", {"before_ms": 2**64}, "before_ms"),
    ("list_conversations", {"bridge_id": "\x00"}, "bridge_id"),
    ("get_conversation_messages", {"conversation_id": "conv_\x00"}, "conversation_id"),
    ("search_messages", {"query": "a\x00"}, "query"),
    ("search_messages", {"query": "x", "limit": 10**30}, "limit"),
]


def test_bad_tool_arguments_are_tool_errors_naming_the_argument(hub):
    general = hub.channels["general"]

    async def main():
        async with mcp_http(hub.url, hub.token("bot")) as client:
            for tool, args, name in BAD:
                full = {**({"channel_id": general} if tool in ("read_messages", "post_message") else {}), **args}
                if tool == "post_message":
                    full.setdefault("text", "hi")
                if tool == "ack":
                    full.setdefault("message_id", "msg_x")
                if tool == "get_conversation_messages":
                    full.setdefault("conversation_id", hub.conversation_id)
                message = await fails(client, tool, **full)
                assert name in message, (tool, args, message)
                assert "internal" not in message.lower(), (tool, args, message)
            # still serving
            assert (await call(client, "list_channels"))["channels"]

    anyio.run(main)
