"""Mutation check: plant named bugs one at a time and require a test to catch each.

Every mutant is an exact text substitution in one source file plus the tests that should
catch it. For each mutant, the script copies ``src/`` and ``tests/`` into a scratch folder,
applies the substitution there (the working tree is never touched), and runs pytest on the
named tests with the scratch ``src`` first on ``PYTHONPATH``.

Outcomes:
- caught    — pytest reported failing tests (exit code 1);
- SURVIVED  — every selected test passed with the bug in place: a hole in the suite;
- error     — the substitution did not apply exactly once, pytest could not collect or
              run (exit codes 2-5), or it timed out. An error is never counted as a catch.

Usage: ``uv run python bench/mutants.py [--only NAME_SUBSTRING] [--jobs 2] [--json FILE]``.
Exit code 0 only when every mutant was caught.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Mutant:
    name: str
    file: str  # relative to the repository root
    find: str
    replace: str
    tests: tuple[str, ...]  # pytest node ids or paths, relative to the repository root
    why: str = ""


def load_mutants() -> list[Mutant]:
    from mutant_list import MUTANTS  # noqa: PLC0415 - kept beside this script

    return MUTANTS


def run_one(mutant: Mutant, timeout: float) -> dict:
    started = time.monotonic()
    scratch = Path(tempfile.mkdtemp(prefix="tidings-mutant-"))
    try:
        shutil.copytree(ROOT / "src", scratch / "src", ignore=shutil.ignore_patterns("__pycache__"))
        shutil.copytree(ROOT / "tests", scratch / "tests", ignore=shutil.ignore_patterns("__pycache__", ".hypothesis"))
        shutil.copy(ROOT / "pyproject.toml", scratch / "pyproject.toml")
        target = scratch / mutant.file
        text = target.read_text()
        count = text.count(mutant.find)
        if count != 1:
            return _result(mutant, "error", started, f"pattern found {count} times in {mutant.file} (need exactly 1)")
        target.write_text(text.replace(mutant.find, mutant.replace))
        env = dict(os.environ)
        env["PYTHONPATH"] = str(scratch / "src") + os.pathsep + str(scratch / "tests")
        env["PYTHONDONTWRITEBYTECODE"] = "1"
        cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "-p", "no:randomly",
               "--timeout", str(int(timeout)), *mutant.tests]
        try:
            proc = subprocess.run(cmd, cwd=scratch, env=env, capture_output=True, text=True, timeout=timeout + 30)
        except subprocess.TimeoutExpired:
            return _result(mutant, "error", started, "timed out")
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-3:])
        if proc.returncode == 1:
            return _result(mutant, "caught", started, _first_failure(proc.stdout) or tail)
        if proc.returncode == 0:
            return _result(mutant, "SURVIVED", started, tail)
        return _result(mutant, "error", started, f"pytest exit {proc.returncode}: {tail}")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _first_failure(stdout: str) -> str:
    for line in stdout.splitlines():
        if line.startswith("FAILED "):
            return line[len("FAILED "):].split(" - ")[0]
    return ""


def _result(mutant: Mutant, outcome: str, started: float, detail: str) -> dict:
    return {
        "name": mutant.name,
        "file": mutant.file,
        "outcome": outcome,
        "detail": detail,
        "seconds": round(time.monotonic() - started, 1),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="run mutants whose name contains this text")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=300)
    parser.add_argument("--json", type=Path, default=None, help="write the results here")
    parser.add_argument("--list", action="store_true", help="list the mutants and exit")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    mutants = [m for m in load_mutants() if args.only in m.name]
    if args.list:
        for m in mutants:
            print(f"{m.name:45s} {m.file}  ->  {' '.join(m.tests)}")
        return 0
    names = [m.name for m in mutants]
    if len(set(names)) != len(names):
        print("duplicate mutant names", file=sys.stderr)
        return 2
    print(f"planting {len(mutants)} mutants, {args.jobs} at a time")
    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        results = []
        for res in pool.map(lambda m: run_one(m, args.timeout), mutants):
            mark = {"caught": "ok ", "SURVIVED": "!! ", "error": "ERR"}[res["outcome"]]
            print(f"{mark} {res['name']:45s} {res['outcome']:9s} {res['seconds']:6.1f}s  {res['detail'][:110]}", flush=True)
            results.append(res)
    caught = sum(r["outcome"] == "caught" for r in results)
    survivors = [r["name"] for r in results if r["outcome"] == "SURVIVED"]
    errors = [r["name"] for r in results if r["outcome"] == "error"]
    print(f"\ncaught {caught}/{len(results)}")
    if survivors:
        print("survivors: " + ", ".join(survivors))
    if errors:
        print("errors (not counted as caught): " + ", ".join(errors))
    if args.json:
        args.json.write_text(json.dumps({"caught": caught, "total": len(results), "results": results}, indent=2))
    return 0 if caught == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())
