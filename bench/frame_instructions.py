"""CPU instructions a lone frame costs the hub's process, counted by valgrind: the same on
every run, so two trees compare without the timing noise.

    uv run python bench/frame_instructions.py --backend sqlite
    uv run python bench/frame_instructions.py --backend sqlite --against /tmp/old/src
    uv run python bench/frame_instructions.py --backend postgresql --frames 500 --batch 100

Drives ``frame_phases.Hub`` (one frame a request through ``Ingest.append_body``, then
``drain_if_due``; ``--batch N``: N frames at a time, one request a platform) in a child
process under ``valgrind --tool=callgrind``, twice: once over the first ``--warm`` frames of
one corpus, once over the first ``--warm`` + ``--frames``. The difference of the two totals,
divided by ``--frames``, is what a frame costs past the warm-up: start-up, imports, the
corpus and the migrations cancel out. It counts every instruction of the process (the
interpreter, ``sqlite3``, ``libc``, the wire), none of the PostgreSQL server's, and no
time spent waiting (a ``COMMIT``'s flush, a round trip). Timings on this machine vary by
±15% from run to run; these counts agree within about 1% (the ids are random, so B-trees
split at different rows), so a change of 2% is seen, and a smaller one with a few runs.

``--against SRC`` counts a second tree (its ``src`` directory, e.g. a ``git worktree`` of
an older commit) beside this one, with the same corpus, and prints the ratio. Each child
runs about 50 times slower than it would alone: 1,000 frames take a minute or two.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
SRC = HERE.parent / "src"

#: What callgrind prints of the instructions it counted (``==pid== Collected : N``).
_COLLECTED = re.compile(r"Collected\s*:\s*(\d+)")


def child(backend: str, drive: int, total: int, seed: int, batch: int) -> None:
    """Run in the child: the first ``drive`` frames of a ``total``-frame corpus, quietly."""
    sys.path.insert(0, str(HERE))
    import structlog

    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(40))  # errors only
    import frame_phases
    from benchlib import Databases

    requests = frame_phases.corpus(total, seed)
    dbs = Databases()
    try:
        hub = frame_phases.Hub(dbs, backend, requests, "instructions", batch)
        hub.requests, hub.platforms = hub.requests[:drive], hub.platforms[:drive]
        hub.drive()
        hub.close()
    finally:
        dbs.close()


def collected(src: Path, backend: str, drive: int, total: int, seed: int, batch: int) -> int:
    """The instructions callgrind counted in one child over ``src``'s tree."""
    env = {**os.environ, "PYTHONPATH": str(src)}
    with tempfile.TemporaryDirectory(prefix="tidings-callgrind-") as tmp:
        cmd = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={tmp}/out",
               sys.executable, str(Path(__file__).resolve()), "--child",
               backend, str(drive), str(total), str(seed), str(batch)]
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    found = _COLLECTED.search(done.stderr)
    if done.returncode != 0 or found is None:
        raise RuntimeError(f"the child under valgrind failed ({done.returncode}):\n{done.stderr[-2000:]}")
    return int(found.group(1))


def measure(trees: list[Path], backend: str, frames: int, warm: int, seed: int, batch: int) -> list[dict[str, Any]]:
    """Instructions a frame for each tree: every child runs at once (a count hardly
    depends on what else the machine does)."""
    total = warm + frames
    jobs = [(src, drive) for src in trees for drive in (warm, total)]
    with ThreadPoolExecutor(max_workers=len(jobs)) as pool:
        counts = list(pool.map(lambda job: collected(job[0], backend, job[1], total, seed, batch), jobs))
    out = []
    for i, src in enumerate(trees):
        short, long = counts[2 * i], counts[2 * i + 1]
        out.append({"tree": str(src), "backend": backend, "frames": frames, "warm": warm, "batch": batch,
                    "instructions_per_frame": round((long - short) / frames)})
    return out


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        backend, drive, total, seed, batch = sys.argv[2], *map(int, sys.argv[3:7])
        child(backend, drive, total, seed, batch)
        return
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--backend", choices=["sqlite", "postgresql"], default="sqlite")
    p.add_argument("--frames", type=int, default=1000, help="frames counted (default 1000)")
    p.add_argument("--warm", type=int, default=300, help="frames run first and not counted (default 300)")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--batch", type=int, default=1,
                   help="frames at a time, sent as one request a platform (default 1: one frame a request)")
    p.add_argument("--against", metavar="SRC", type=Path,
                   help="another tree's src directory, counted beside this one")
    p.add_argument("--json", metavar="PATH")
    args = p.parse_args()
    if shutil.which("valgrind") is None:
        p.error("valgrind is not installed (Debian: apt-get install valgrind)")
    if args.frames < 1 or args.warm < 1 or args.batch < 1:
        p.error("--frames, --warm and --batch must be positive")
    trees = [SRC] + ([args.against.resolve()] if args.against else [])
    rows = measure(trees, args.backend, args.frames, args.warm, args.seed, args.batch)
    for row in rows:
        print(f"{row['instructions_per_frame']:>12,} instructions a frame  {row['tree']}")
    if len(rows) == 2:
        print(f"this tree ÷ the other: {rows[0]['instructions_per_frame'] / rows[1]['instructions_per_frame']:.3f}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
