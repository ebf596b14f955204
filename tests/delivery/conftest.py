"""Fixtures for the delivery suite (both backends through the root ``runtime`` fixture)."""

from __future__ import annotations

import pytest
from delivery_world import World


@pytest.fixture
def world(runtime):
    w = World(runtime)
    try:
        yield w
    finally:
        w.close()
