"""``bench/frame_phases.py`` must not rot: on each backend it times every phase of a lone
frame, counts its statements by kind, and leaves the process as it found it (its probes
patch the store and the engine while it runs). Speed is never asserted."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from tidings.ingest import on_append
from tidings.store import engine, pg_wire

pytestmark = pytest.mark.slow

FRAME_PHASES = Path(__file__).resolve().parents[2] / "bench" / "frame_phases.py"


def _frame_phases():
    spec = importlib.util.spec_from_file_location("tidings_bench_frame_phases", FRAME_PHASES)
    assert spec is not None and spec.loader is not None, f"no script at {FRAME_PHASES}"
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("tidings_bench_frame_phases", module)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_frame_phases_times_every_phase_and_puts_the_code_back(backend):
    originals = (engine.Tx._send, engine.Tx.savepoint, pg_wire.Wire.run, on_append.insert_applied)
    phases = _frame_phases()

    result = phases.run(backend, 150, 7)

    assert (engine.Tx._send, engine.Tx.savepoint, pg_wire.Wire.run, on_append.insert_applied) == originals
    assert [row["phase"] for row in result["phases"]] == [q for _m, q, _w in phases.PHASES]  # all in this tree
    calls = {row["phase"]: row["calls_per_frame"] for row in result["phases"]}
    assert calls["Ingest.append_body"] == 1.0 and calls["Batch.flush"] == 1.0
    assert result["statements_per_frame"]["INSERT inbox"] > 0.9
    assert result["commits_per_frame"] == 1.0
    if backend == "postgresql":
        assert 2.0 <= result["round_trips_per_frame"] < 2.1  # (a duplicate, a held frame: one more)
        assert result["statements_per_frame"]["BEGIN"] == result["statements_per_frame"]["COMMIT"] == 1.0
