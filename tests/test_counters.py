"""``Counters``: every name known from the start, a typo fails loudly, and several counts
added at once (``add``, how a frame's staged counts reach its bridge's) are added whole."""

from __future__ import annotations

import pytest

from tidings.counters import Counters


def test_add_adds_every_count_under_one_lock_or_none_when_a_name_is_unknown():
    counters = Counters(["projected", "imported", "quarantined"])
    counters.add({"projected": 1, "imported": 3})
    counters.add({"projected": 2})
    assert counters.snapshot() == {"projected": 3, "imported": 3, "quarantined": 0}
    with pytest.raises(KeyError, match="unknown counter 'improted'"):
        counters.add({"projected": 1, "improted": 1})
    assert counters.snapshot() == {"projected": 3, "imported": 3, "quarantined": 0}  # nothing added


def test_incr_of_an_unknown_name_fails_loudly():
    counters = Counters(["projected"])
    with pytest.raises(KeyError, match="unknown counter 'projectd'"):
        counters.incr("projectd")
    assert counters.snapshot() == {"projected": 0}
