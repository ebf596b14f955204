"""Mutation check: plant named bugs one at a time and require a test to catch each.

Every mutant is an exact text substitution in one source file plus the tests that should
catch it. For each mutant, the script copies ``src/`` and ``tests/`` into a scratch folder,
applies the substitution there (the working tree is never touched), and runs pytest on the
named tests with the scratch ``src`` first on ``PYTHONPATH``.

Backends: a mutant runs its tests on one backend (``-k "not postgres"`` / ``-k "not
sqlite"``) unless it says ``backend="both"``; the default is SQLite, which keeps the whole
check short. ``--backend`` overrides every mutant's choice (``both`` runs everything on
both). A mutant's own ``k`` expression is combined with the backend's.

Baseline: before planting anything, every distinct test selection is run once on the
unmutated tree. A selection that fails (or collects nothing) there makes its mutants
``error``: a failure that is not the mutant's doing is never counted as a catch.

Outcomes:
- caught    — pytest reported failing tests (exit code 1) on a selection that passes
              unmutated;
- SURVIVED  — every selected test passed with the bug in place: a hole in the suite;
- error     — the substitution did not apply exactly once, the baseline failed, pytest
              could not collect or run (exit codes 2-5), or it timed out. An error is
              never counted as a catch.

Usage: ``uv run python bench/mutants.py [--only NAME_REGEX] [--jobs 2] [--json FILE]
[--backend sqlite|postgres|both] [--no-baseline] [--check] [--list]``.
Exit code 0 only when every mutant was caught.
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
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BACKEND_FILTER = {"sqlite": "not postgres", "postgres": "not sqlite", "both": ""}


@dataclass(frozen=True)
class Mutant:
    name: str
    file: str  # relative to the repository root
    find: str
    replace: str
    tests: tuple[str, ...]  # pytest node ids or paths, relative to the repository root
    why: str = ""
    k: str = ""  # an extra pytest -k expression (combined with the backend's)
    backend: str = "sqlite"  # "sqlite" | "postgres" | "both"


def load_mutants() -> list[Mutant]:
    from mutant_list import MUTANTS  # noqa: PLC0415 - kept beside this script

    return MUTANTS


def selection(mutant: Mutant, backend_override: str | None) -> tuple[str, ...]:
    """The pytest arguments that select a mutant's tests."""
    backend = backend_override or mutant.backend
    if backend not in BACKEND_FILTER:
        raise ValueError(f"{mutant.name}: unknown backend {backend!r}")
    parts = [p for p in (BACKEND_FILTER[backend], mutant.k) if p]
    args = list(mutant.tests)
    if parts:
        args += ["-k", " and ".join(f"({p})" for p in parts)]
    return tuple(args)


def _scratch() -> Path:
    scratch = Path(tempfile.mkdtemp(prefix="tidings-mutant-"))
    shutil.copytree(ROOT / "src", scratch / "src", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(ROOT / "tests", scratch / "tests", ignore=shutil.ignore_patterns("__pycache__", ".hypothesis"))
    shutil.copy(ROOT / "pyproject.toml", scratch / "pyproject.toml")
    return scratch


def _pytest(scratch: Path, args: tuple[str, ...], timeout: float) -> subprocess.CompletedProcess | None:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(scratch / "src") + os.pathsep + str(scratch / "tests")
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "-p", "no:randomly",
           "--timeout", str(int(timeout)), *args]
    try:
        return subprocess.run(cmd, cwd=scratch, env=env, capture_output=True, text=True, timeout=timeout + 30)
    except subprocess.TimeoutExpired:
        return None


def run_baseline(args: tuple[str, ...], timeout: float) -> dict:
    started = time.monotonic()
    scratch = _scratch()
    try:
        proc = _pytest(scratch, args, timeout)
        if proc is None:
            return {"ok": False, "detail": "timed out", "seconds": round(time.monotonic() - started, 1)}
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-3:])
        return {"ok": proc.returncode == 0, "detail": f"pytest exit {proc.returncode}: {tail}",
                "seconds": round(time.monotonic() - started, 1)}
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def run_one(mutant: Mutant, args: tuple[str, ...], timeout: float) -> dict:
    started = time.monotonic()
    scratch = _scratch()
    try:
        target = scratch / mutant.file
        text = target.read_text()
        count = text.count(mutant.find)
        if count != 1:
            return _result(mutant, "error", started, f"pattern found {count} times in {mutant.file} (need exactly 1)")
        target.write_text(text.replace(mutant.find, mutant.replace))
        proc = _pytest(scratch, args, timeout)
        if proc is None:
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
        for mark in ("FAILED ", "ERROR "):
            if line.startswith(mark):
                return ("" if mark == "FAILED " else "ERROR ") + line[len(mark):].split(" - ")[0]
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
    parser.add_argument("--only", default="", help="run mutants whose name matches this regular expression (re.search)")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=300)
    parser.add_argument("--json", type=Path, default=None, help="write the results here")
    parser.add_argument("--list", action="store_true", help="list the mutants and exit")
    parser.add_argument("--backend", choices=sorted(BACKEND_FILTER), default=None,
                        help="run every mutant's tests on this backend (default: each mutant's own, mostly sqlite)")
    parser.add_argument("--check", action="store_true",
                        help="only check that every pattern applies exactly once, and exit")
    parser.add_argument("--no-baseline", action="store_true",
                        help="skip the unmutated run of each selection (faster; a failing selection then counts)")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    started = time.monotonic()
    only = re.compile(args.only)
    mutants = [m for m in load_mutants() if only.search(m.name)]
    names = [m.name for m in mutants]
    if len(set(names)) != len(names):
        print("duplicate mutant names", file=sys.stderr)
        return 2
    selections = {m.name: selection(m, args.backend) for m in mutants}
    if args.check:
        bad = 0
        for m in mutants:
            count = (ROOT / m.file).read_text().count(m.find)
            if count != 1 or m.find == m.replace:
                bad += 1
                print(f"ERR {m.name}: pattern found {count} times in {m.file}")
        print(f"{len(mutants) - bad}/{len(mutants)} patterns apply exactly once")
        return 1 if bad else 0
    if args.list:
        for m in mutants:
            print(f"{m.name:45s} {m.file}  ->  {' '.join(selections[m.name])}")
        return 0
    baseline: dict[tuple[str, ...], dict] = {}
    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        if not args.no_baseline:
            distinct = sorted(set(selections.values()))
            print(f"baseline: {len(distinct)} distinct test selections on the unmutated tree", flush=True)
            for sel, res in zip(distinct, pool.map(lambda s: run_baseline(s, args.timeout), distinct), strict=True):
                baseline[sel] = res
                if not res["ok"]:
                    print(f"ERR baseline fails ({res['seconds']}s): {' '.join(sel)}\n    {res['detail']}", flush=True)
        print(f"planting {len(mutants)} mutants, {args.jobs} at a time", flush=True)

        def plant(m: Mutant) -> dict:
            sel = selections[m.name]
            base = baseline.get(sel)
            if base is not None and not base["ok"]:
                return _result(m, "error", time.monotonic(), f"the unmutated selection fails: {base['detail']}")
            res = run_one(m, sel, args.timeout)
            res["tests"] = " ".join(sel)
            return res

        results = []
        for res in pool.map(plant, mutants):
            mark = {"caught": "ok ", "SURVIVED": "!! ", "error": "ERR"}[res["outcome"]]
            print(f"{mark} {res['name']:45s} {res['outcome']:9s} {res['seconds']:6.1f}s  {res['detail'][:110]}", flush=True)
            results.append(res)
    caught = sum(r["outcome"] == "caught" for r in results)
    survivors = [r["name"] for r in results if r["outcome"] == "SURVIVED"]
    errors = [r["name"] for r in results if r["outcome"] == "error"]
    elapsed = time.monotonic() - started
    print(f"\ncaught {caught}/{len(results)} in {elapsed:.0f}s")
    if survivors:
        print("survivors: " + ", ".join(survivors))
    if errors:
        print("errors (not counted as caught): " + ", ".join(errors))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({
            "caught": caught, "total": len(results), "seconds": round(elapsed, 1),
            "survivors": survivors, "errors": errors, "results": results,
        }, indent=2))
    return 0 if caught == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())
