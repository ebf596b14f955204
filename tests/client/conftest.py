"""Fixtures for the agent-client tests: a live hub with a small world, and agents wired to
it with a recording transport and an injected (near-zero) backoff sleeper.

Every live test runs on both backends (the root ``backend_url`` fixture)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from clientkit import Hub, Sleeper, Wire, World, build_world

from tidings.client import Agent


@pytest.fixture
def world(backend_url) -> Iterator[World]:
    with Hub(backend_url) as hub:
        yield build_world(hub)


@pytest.fixture
def agents() -> Iterator[Callable[..., tuple[Agent, Wire, Sleeper]]]:
    """``agents(url, token, **options)`` -> (agent, wire, sleeper); every agent is stopped
    and closed at teardown, before the hub (fixtures tear down in reverse order)."""
    made: list[tuple[Agent, Wire]] = []

    def make(url: str, token: str, **options: Any) -> tuple[Agent, Wire, Sleeper]:
        wire, sleeper = Wire(), Sleeper()
        agent = Agent(url, token, transport=wire, sleep=sleeper, **options)
        made.append((agent, wire))
        return agent, wire, sleeper

    yield make
    for agent, wire in made:
        agent.close()
        wire.close()
