"""MCP tools for channel pins and ask blocks (issue 16), registered by ``build_server``.

They call the same use cases as the HTTP API (``hub/pins.py``, ``hub/asks.py``,
``runtime.posting``), so the rules are the API's: members read pins, the channel owner
changes them; an ask is answered once, by anyone but the asker.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any

from mcp.server.mcpserver import Context, MCPServer
from mcp_types import ToolAnnotations
from pydantic import BaseModel, Field

from ..hub import asks as asks_hub
from ..hub import channels as channels_hub
from ..hub import pins as pins_hub
from ..hub.tokens import Principal
from .server import _READ_ONLY, _domain_errors

TOOL_NAMES = ("list_pins", "pin_message", "ask_people", "answer_ask")

_WRITE = ToolAnnotations(read_only_hint=False, destructive_hint=False, open_world_hint=False)


class Question(BaseModel):
    id: Annotated[str, Field(description="Your id for the question; answers are keyed by it.")]
    text: str
    options: Annotated[list[str] | None, Field(description="The allowed answers, if it is a choice.")] = None


def register(mcp: MCPServer, runtime: Any, agent: Callable[[Context], Principal]) -> None:
    store = runtime.store

    @mcp.tool(annotations=_READ_ONLY)
    @_domain_errors
    def list_pins(channel_id: str, ctx: Context) -> dict[str, Any]:
        """The pinned messages of a channel you belong to, in position order: its standing
        instructions (you also get them at every session start)."""
        return pins_hub.list_pins(store, agent(ctx), channel_id)

    @mcp.tool(annotations=_WRITE)
    @_domain_errors
    def pin_message(channel_id: str, message_id: str, ctx: Context, pinned: bool = True) -> dict[str, Any]:
        """Pin a message of a channel you own (at most 5 pins), or unpin it with
        ``pinned: false``. Idempotent."""
        who = agent(ctx)
        change = pins_hub.pin if pinned else pins_hub.unpin
        return change(store, runtime.bus, who, channel_id, message_id)

    @mcp.tool(annotations=_WRITE)
    @_domain_errors
    def ask_people(
        channel_id: str,
        questions: list[Question],
        ctx: Context,
        text: Annotated[str | None, Field(description="An optional lead-in shown before the questions.")] = None,
        client_request_id: str | None = None,
    ) -> dict[str, Any]:
        """Ask the people of a channel questions (each with optional options). One member
        answers; you get the answer as an ``answer`` event in your session (or when you next
        connect). Ack it with ``ack(message_id, ask_id)``."""
        who = agent(ctx)
        ask = {"questions": [q.model_dump(exclude_none=True) for q in questions], "answered": False}
        blocks: list[dict[str, Any]] = [{"kind": "text", "text": text}] if text else []
        blocks.append({"kind": "ask", "ask": ask})
        row, inserted = runtime.posting.post(
            author_id=who.account_id, channel_id=channel_id, blocks=blocks, client_request_id=client_request_id
        )
        ask_id = next(b["ask"]["ask_id"] for b in row["blocks"] if b["kind"] == "ask")
        return {"message": channels_hub.public_message(row), "ask_id": ask_id, "inserted": inserted}

    @mcp.tool(annotations=_WRITE)
    @_domain_errors
    def answer_ask(message_id: str, ask_id: str, answers: dict[str, str], ctx: Context) -> dict[str, Any]:
        """Answer another account's ask: ``answers`` maps each question id to your answer
        (one of its options when it has any). An ask is answered once."""
        return asks_hub.answer(store, runtime.bus, agent(ctx), message_id, ask_id, answers)
