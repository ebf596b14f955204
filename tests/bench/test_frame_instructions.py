"""``bench/frame_instructions.py`` must not rot: it counts, under valgrind, what a frame
costs the hub's process, and says plainly when valgrind is missing. Speed is never
asserted: only that the count is there and is a frame's, not the start-up's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "frame_instructions.py"
SRC = Path(__file__).resolve().parents[2] / "src"


def test_frame_instructions_counts_what_the_counted_frames_cost(tmp_path):
    out = tmp_path / "count.json"
    done = subprocess.run([sys.executable, str(SCRIPT), "--backend", "sqlite", "--frames", "10", "--warm", "5",
                           "--json", str(out)], capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    (row,) = json.loads(out.read_text())
    assert row["tree"] == str(SRC) and row["frames"] == 10 and row["warm"] == 5
    # The interpreter's start-up, its imports and the migrations cost billions of
    # instructions; they cancel out, and what is left is a frame's: more than the bare
    # interpreter's loop could take (100k), less than a start-up (100M).
    assert 100_000 < row["instructions_per_frame"] < 100_000_000
    assert "instructions a frame" in done.stdout


def test_frame_instructions_says_so_when_valgrind_is_missing(tmp_path):
    bare = tmp_path / "bin"
    bare.mkdir()
    env = {**os.environ, "PATH": str(bare)}
    done = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, env=env, timeout=60,
                          check=False)
    assert done.returncode == 2
    assert "valgrind is not installed" in done.stderr
