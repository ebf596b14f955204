"""The issue-16 MCP tools over Streamable HTTP against a live hub, both backends:
``list_pins``/``pin_message`` (members read, the owner changes) and ``ask_people`` /
``answer_ask`` / ``ack(ask_id)`` (answered once, owed to the asker until it acks)."""

from __future__ import annotations

import anyio
from mcp_scenario import call, fails
from test_mcp_http import mcp_http

from tidings.hub import pins as pins_hub
from tidings.hub.tokens import authenticate


def test_pins_and_asks_over_mcp(hub):
    general = hub.channels["general"]
    rule = hub.post("owner", "general", "standing order: be brief")
    pins_hub.pin(hub.runtime.store, hub.runtime.bus, authenticate(hub.runtime.store, hub.token("owner")), general,
                 rule["id"])

    async def main():
        async with mcp_http(hub.url, hub.token("bot")) as bot, mcp_http(hub.url, hub.token("other")) as other:
            pins = await call(bot, "list_pins", channel_id=general)
            assert [p["message_id"] for p in pins["pins"]] == [rule["id"]]
            assert "not_channel_owner" in await fails(bot, "pin_message", channel_id=general, message_id=rule["id"],
                                                      pinned=False)
            assert "unknown_channel" in await fails(bot, "list_pins", channel_id=hub.channels["private"])

            asked = await call(bot, "ask_people", channel_id=general, text="Before dinner:",
                               questions=[{"id": "soup", "text": "Pumpkin soup, @other?", "options": ["yes", "no"]}])
            mid, ask_id = asked["message"]["id"], asked["ask_id"]
            assert asked["message"]["text"] == "Before dinner:\nPumpkin soup, @other?"
            hub.runtime.delivery.wait_idle()
            assert hub.owed("other") == []  # the question mentions nobody
            assert "own_ask" in await fails(bot, "answer_ask", message_id=mid, ask_id=ask_id, answers={"soup": "yes"})
            assert "bad_answers" in await fails(other, "answer_ask", message_id=mid, ask_id=ask_id,
                                                answers={"soup": "maybe"})
            done = await call(other, "answer_ask", message_id=mid, ask_id=ask_id, answers={"soup": "yes"})
            assert done["ask"]["answered"] is True and done["ask"]["answered_by"] == hub.id("other")
            assert "already_answered" in await fails(other, "answer_ask", message_id=mid, ask_id=ask_id,
                                                     answers={"soup": "no"})
            acked = await call(bot, "ack", message_id=mid, ask_id=ask_id)
            assert acked["answer_cleared"] is True
            assert (await call(bot, "ack", message_id=mid, ask_id=ask_id))["answer_cleared"] is False

    anyio.run(main)
