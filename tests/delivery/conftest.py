"""Fixtures for the delivery suite (both backends through the root ``runtime`` fixture)."""

from __future__ import annotations

import pytest
from delivery_world import World


@pytest.fixture
def world_options() -> dict:
    """Delivery options for ``world``; a test module overrides this fixture to set some."""
    return {}


@pytest.fixture
def world(runtime, world_options):
    w = World(runtime, **world_options)
    try:
        yield w
    finally:
        w.close()
