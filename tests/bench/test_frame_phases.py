"""``bench/frame_phases.py`` must not rot: on each backend it times every phase of a lone
frame, counts its statements by kind, and leaves the process as it found it (its probes
patch the store and the engine while it runs). Speed is never asserted."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tidings.ingest import on_append
from tidings.store import engine, pg_wire

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import frame_phases  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_frame_phases_times_every_phase_and_puts_the_code_back(backend):
    originals = (engine.Tx._send, engine.Tx.savepoint, pg_wire.Wire.run, on_append.insert_applied)
    result = frame_phases.run(backend, 150, 7)

    assert (engine.Tx._send, engine.Tx.savepoint, pg_wire.Wire.run, on_append.insert_applied) == originals
    assert [row["phase"] for row in result["phases"]] == [q for _m, q, _w in frame_phases.PHASES]  # all in this tree
    calls = {row["phase"]: row["calls_per_frame"] for row in result["phases"]}
    assert calls["Ingest.append_body"] == 1.0 and calls["Batch.flush"] == 1.0
    assert result["statements_per_frame"]["INSERT inbox"] > 0.9
    assert result["commits_per_frame"] == 1.0
    if backend == "postgresql":
        assert 2.0 <= result["round_trips_per_frame"] < 2.1  # (a duplicate, a held frame: one more)
        assert result["statements_per_frame"]["BEGIN"] == result["statements_per_frame"]["COMMIT"] == 1.0
