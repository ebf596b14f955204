"""``bench/frame_phases.py`` must not rot: on each backend it times every phase of a lone
frame (with and without its nested phases, the database a phase of its own), counts its
statements by kind and, in a second pass, its calls (with ``--cprofile``, a third pass under
``cProfile``), and leaves the process as it found it (its probes patch the store and the
engine while it runs). Speed is never asserted."""

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
    expected = [q for _m, q, _w in frame_phases.PHASES + frame_phases.DATABASE]  # all in this tree
    assert [row["phase"] for row in result["phases"]] == expected
    calls = {row["phase"]: row["calls_per_frame"] for row in result["phases"]}
    assert calls["Ingest.append_body"] == 1.0 and calls["Batch.flush"] == 1.0
    # Each phase's own time leaves out what its nested phases took, the database included.
    rows = {row["phase"]: row for row in result["phases"]}
    database = "Wire.run" if backend == "postgresql" else "Tx._send"
    assert rows[database]["self_us_per_frame"] > 0
    top = rows["Ingest.append_body"]
    assert top["self_us_per_frame"] < top["us_per_frame"] / 2  # most of an append is in its phases
    for row in result["phases"]:
        assert 0 <= row["self_us_per_frame"] <= row["us_per_frame"]
    assert result["unphased_us_per_frame"] >= 0  # (the own times add up to no more than the wall time)
    # The counted pass: the same frames again, every call counted.
    assert result["python_calls_per_frame"] > 100 and result["builtin_calls_per_frame"] > 100
    assert result["statements_per_frame"]["INSERT inbox"] > 0.9
    assert result["commits_per_frame"] == 1.0
    if backend == "postgresql":
        assert 2.0 <= result["round_trips_per_frame"] < 2.1  # (a duplicate, a held frame: one more)
        assert result["statements_per_frame"]["BEGIN"] == result["statements_per_frame"]["COMMIT"] == 1.0


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_frame_phases_drives_a_batching_bridge_as_the_batched_bench_does(backend):
    """``--batch N``: N frames at a time as one request a platform (``benchlib.feed_batch``,
    the batched ingest bench's own step), so one append and one commit a request."""
    many = engine.Tx.execute_many
    result = frame_phases.run(backend, 300, 7, calls=False, batch=100)

    assert engine.Tx.execute_many is many  # (its probe, SQLite's many-row statements, put back)

    calls = {row["phase"]: row["calls_per_frame"] for row in result["phases"]}
    assert result["batch"] == 100 and result["python_calls_per_frame"] is None
    assert 0 < calls["Ingest.append_body"] < 0.1  # a request holds the frames of one platform
    assert result["commits_per_frame"] == calls["Ingest.append_body"]  # one commit a request
    assert calls["FrameApplier.decode_ahead"] == 1.0  # every frame decoded, once
    assert result["statements_per_frame"]["INSERT inbox"] == calls["Ingest.append_body"]  # one insert a request


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_frame_phases_cprofile_pass_names_the_functions_with_the_most_time_of_their_own(backend):
    """``--cprofile N``: a third pass under ``cProfile``, the N functions with the most time
    of their own, a frame, the database's own calls among them; the profiler is off after."""
    result = frame_phases.run(backend, 150, 7, calls=False, cprofile=12)

    assert sys.getprofile() is None
    rows = result["cprofile"]
    assert len(rows) == 12
    own = [row["self_us_per_frame"] for row in rows]
    assert own == sorted(own, reverse=True) and own[0] > 0 and own[-1] >= 0
    for row in rows:
        assert row["self_us_per_frame"] <= row["us_per_frame"] and row["calls_per_frame"] > 0
    names = {row["function"]: row for row in rows}
    if backend == "postgresql":  # the wire's round trips, two a frame (a duplicate, a held frame: one more)
        (run,) = [row for name, row in names.items() if name.startswith("pg_wire.py:") and name.endswith("(run)")]
        assert 2.0 <= run["calls_per_frame"] < 2.1
    else:  # BEGIN and COMMIT, then the frame's statements: the C calls themselves
        assert names["<method 'execute' of 'sqlite3.Connection' objects>"]["calls_per_frame"] == 2.0
        assert "<method 'execute' of 'sqlite3.Cursor' objects>" in names
    assert frame_phases.run(backend, 20, 7, calls=False)["cprofile"] is None  # off unless asked
