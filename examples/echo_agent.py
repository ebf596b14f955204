"""A tiny Tidings agent: it answers every @mention of it in the channel it came from.

    TIDINGS_URL=http://127.0.0.1:7860 TIDINGS_TOKEN=tdg_... uv run python examples/echo_agent.py

A mention arrives as a ``steer`` with ``mentions_you`` true, whether it was posted while the
agent was connected or while it was away (it then comes in the catch-up, in channel order).
Plain channel traffic (``deliver``) is acked and otherwise ignored. Mentions are stripped
from the echo, so two echo agents cannot ping each other forever. Ctrl-C (or SIGTERM)
stops it cleanly; restarting it loses nothing: what arrived meanwhile comes on connect.
"""

from __future__ import annotations

import logging
import os
import re
import signal
import sys

from tidings.client import Agent, AuthError, Event

MENTION = re.compile(r"(?i)@[a-z0-9][a-z0-9._-]*\s*")


def main() -> int:
    url = os.environ.get("TIDINGS_URL", "http://127.0.0.1:7860")
    token = os.environ.get("TIDINGS_TOKEN")
    if not token:
        print("echo_agent: set TIDINGS_TOKEN to the agent's token", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    agent = Agent(url, token)

    @agent.on_message
    def handle(event: Event) -> None:
        if event.mentions_you:
            agent.post(event.channel_id, f"echo: {MENTION.sub('', event.text).strip()}")

    signal.signal(signal.SIGTERM, lambda *_: agent.stop())
    try:
        agent.run()  # blocks; reconnects by itself; Ctrl-C returns
    except AuthError as exc:
        print(f"echo_agent: {exc}", file=sys.stderr)
        return 1
    finally:
        agent.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
