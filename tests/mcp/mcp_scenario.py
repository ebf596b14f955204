"""What an agent does with the MCP tools, written once and run over both transports.

Each function takes a connected ``mcp.Client`` (Streamable HTTP or stdio) and the
``McpWorld`` of ``conftest.py``, and asserts on the tools' structured results.
"""

from __future__ import annotations

from typing import Any

from mcp import Client
from tidings.mcp.server import TOOL_NAMES


class ToolFailed(AssertionError):
    pass


async def call(client: Client, name: str, **arguments: Any) -> dict[str, Any]:
    """A tool call that must succeed; its structured result."""
    result = await client.call_tool(name, arguments)
    if result.is_error:
        raise ToolFailed(f"{name}{arguments} failed: {result.content[0].text}")
    assert result.structured_content is not None
    return result.structured_content


async def fails(client: Client, name: str, **arguments: Any) -> str:
    """A tool call that must come back as a tool error; its message."""
    result = await client.call_tool(name, arguments)
    assert result.is_error, f"{name}{arguments} should have failed: {result.structured_content}"
    assert result.structured_content is None
    return result.content[0].text


async def lists_exactly_the_contract_tools(client: Client) -> None:
    tools = await client.list_tools()
    assert sorted(t.name for t in tools.tools) == sorted(TOOL_NAMES) == sorted(
        ["list_channels", "read_messages", "post_message", "owed_mentions", "ack", "list_conversations",
         "get_conversation_messages", "search_messages", "list_pins", "pin_message", "ask_people", "answer_ask"]
    )


async def agent_flow(client: Client, w: Any) -> dict[str, Any]:
    """The owner's agent ``bot``: channels, cursor reads, posts, owed mentions, acks,
    conversations, search, and the errors of everything it may not see. Returns the
    message bot posted (it mentions ``other``)."""
    general, private, home = w.channels["general"], w.channels["private"], w.channels["home"]
    await lists_exactly_the_contract_tools(client)

    # channels: the ones bot belongs to, never the owner's private one
    channels = (await call(client, "list_channels"))["channels"]
    assert {c["id"] for c in channels} == {general, home}
    assert {c["id"]: c["subscribed"] for c in channels} == {general: False, home: True}

    # a cursor read: the bridge's message is marked as untrusted external text
    page = await call(client, "read_messages", channel_id=general)
    assert [m["id"] for m in page["messages"]] == [w.bridge_post_id]
    assert page["messages"][0]["untrusted"] is True and page["contains_untrusted_text"] is True
    assert page["warning"].startswith("UNTRUSTED external content")
    assert page["next_after_seq"] == 1 and page["has_more"] is False

    # post, idempotently
    posted = await call(client, "post_message", channel_id=general, text="pumpkin soup tonight? @other",
                        client_request_id="bot-1")
    mine = posted["message"]
    assert posted["inserted"] is True and mine["seq"] == 2 and mine["author_account_id"] == w.id("bot")
    again = await call(client, "post_message", channel_id=general, text="pumpkin soup tonight? @other",
                       client_request_id="bot-1")
    assert again["inserted"] is False and again["message"]["id"] == mine["id"]

    # paging by cursor: one at a time, then nothing new
    first = await call(client, "read_messages", channel_id=general, after_seq=0, limit=1)
    assert [m["seq"] for m in first["messages"]] == [1] and first["has_more"] is True
    second = await call(client, "read_messages", channel_id=general, after_seq=first["next_after_seq"], limit=1)
    assert [m["id"] for m in second["messages"]] == [mine["id"]] and "contains_untrusted_text" not in second
    empty = await call(client, "read_messages", channel_id=general, after_seq=second["next_after_seq"])
    assert empty["messages"] == [] and empty["next_after_seq"] == 2 and empty["has_more"] is False

    # an owed mention: the owner mentions bot (offline, member, not subscribed)
    assert (await call(client, "owed_mentions"))["owed"] == []
    mention = w.post("owner", "general", "@bot can you check the oven?")
    owed = (await call(client, "owed_mentions"))["owed"]
    assert [(o["message_id"], o["channel_id"], o["seq"]) for o in owed] == [(mention["id"], general, 3)]
    assert owed[0]["message"]["text"] == "@bot can you check the oven?"
    # a missed push loses nothing: the cursor read has it too
    assert [m["id"] for m in (await call(client, "read_messages", channel_id=general, after_seq=2))["messages"]] == [
        mention["id"]]

    # ack clears it, idempotently
    acked = await call(client, "ack", message_id=mention["id"])
    assert acked == {"acked": True, "message_id": mention["id"], "owed_cleared": True}
    assert (await call(client, "owed_mentions"))["owed"] == []
    assert (await call(client, "ack", message_id=mention["id"]))["acked"] is True
    assert w.owed("bot") == []

    # bridge conversations of the owner's bridge
    for args in ({}, {"bridge_id": w.bridge["id"]}):
        convs = await call(client, "list_conversations", **args)
        assert convs["contains_untrusted_text"] is True
        assert [(c["id"], c["bridge_id"], c["kind"]) for c in convs["conversations"]] == [
            (w.conversation_id, w.bridge["id"], "group")]
        assert {p["name"] for p in convs["conversations"][0]["participants"]} >= {"Alice Moreau", "Bob Okafor"}
    newest = await call(client, "get_conversation_messages", conversation_id=w.conversation_id, limit=2)
    assert newest["contains_untrusted_text"] is True and len(newest["messages"]) == 2
    assert newest["messages"][0]["body"] == "dinner at 7!"
    assert newest["next_before_id"] == newest["messages"][-1]["id"]
    older = await call(client, "get_conversation_messages", conversation_id=w.conversation_id,
                       before_ms=newest["next_before_ms"], before_id=newest["next_before_id"])
    assert older["messages"] and all(
        (m["occurred_at_ms"], m["id"]) < (newest["next_before_ms"], newest["next_before_id"])
        for m in older["messages"])
    everything = await call(client, "get_conversation_messages", conversation_id=w.conversation_id)
    assert everything["next_before_ms"] is None and everything["next_before_id"] is None
    assert "before_id needs before_ms" in await fails(
        client, "get_conversation_messages", conversation_id=w.conversation_id, before_id=newest["next_before_id"])
    assert [m["id"] for m in everything["messages"]] == [m["id"] for m in newest["messages"] + older["messages"]]

    # search: bot's channels and the owner's bridge; never the private channel
    w.post("owner", "private", "pumpkin secret")
    found = await call(client, "search_messages", query="PUMPKIN")
    assert found["contains_untrusted_text"] is True
    assert [m["id"] for m in found["channel_messages"]] == [mine["id"]]
    bodies = {m["body"] for m in found["bridge_messages"]}
    assert "pumpkin pasta it is 🎃" in bodies and all("pumpkin" in b.lower() for b in bodies)
    hit = found["bridge_messages"][0]
    assert hit["conversation_id"] == w.conversation_id and hit["bridge_id"] == w.bridge["id"]
    assert "conversation_title" in hit and hit["remote_conversation_id"].startswith("signal-group:")
    assert (await call(client, "search_messages", query="100%_match"))["channel_messages"] == []

    # what bot may not see or do: tool errors with a reason, no data
    assert "unknown channel [unknown_channel]" in await fails(client, "read_messages", channel_id=private)
    assert "unknown channel" in await fails(client, "post_message", channel_id=private, text="hi")
    assert "unknown channel" in await fails(client, "read_messages", channel_id="ch_nope")
    assert "unknown message" in await fails(client, "ack", message_id="msg_nope")
    assert "unknown conversation" in await fails(client, "get_conversation_messages", conversation_id="conv_nope")
    assert "unknown bridge" in await fails(client, "list_conversations", bridge_id="br_nope")
    assert "bad_query" in await fails(client, "search_messages", query="   ")
    assert "empty_message" in await fails(client, "post_message", channel_id=general, text=" ")
    assert "limit" in await fails(client, "read_messages", channel_id=general, limit=0)
    assert "channel_id" in await fails(client, "read_messages")
    return mine


async def stranger_flow(client: Client, w: Any, bot_message_id: str) -> None:
    """Another owner's agent sees none of it: same errors as for what does not exist."""
    await lists_exactly_the_contract_tools(client)
    channels = (await call(client, "list_channels"))["channels"]
    assert [c["id"] for c in channels] == [w.accounts["strangers_bot"]["home_channel_id"]]
    assert "unknown conversation [unknown_conversation]" in await fails(
        client, "get_conversation_messages", conversation_id=w.conversation_id)
    assert "unknown bridge [unknown_bridge]" in await fails(client, "list_conversations", bridge_id=w.bridge["id"])
    assert (await call(client, "list_conversations"))["conversations"] == []
    found = await call(client, "search_messages", query="pumpkin")
    assert found["channel_messages"] == [] and found["bridge_messages"] == []
    assert "unknown channel" in await fails(client, "read_messages", channel_id=w.channels["general"])
    assert "unknown channel" in await fails(client, "post_message", channel_id=w.channels["general"], text="hi")
    assert "unknown message" in await fails(client, "ack", message_id=bot_message_id)
    assert (await call(client, "owed_mentions"))["owed"] == []
