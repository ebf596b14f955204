"""The mutation check must not rot: every planted bug still applies to today's source.

A refactor that renames the line a mutant edits would turn that mutant into an ``error``
at the next ``bench/mutants.py`` run, and the check would quietly cover less. This test
fails at once instead: each pattern occurs exactly once in its file, changes something,
and names test files that exist. Running the mutants (minutes) stays in ``bench/``.
"""

from __future__ import annotations

import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"
ROOT = BENCH.parent


def _mutants():
    if str(BENCH) not in sys.path:
        sys.path.insert(0, str(BENCH))
    from mutants import load_mutants  # noqa: PLC0415 - bench/ is not a package

    return load_mutants()


def _problems(mutants) -> list[str]:
    problems = []
    for m in mutants:
        text = (ROOT / m.file).read_text()
        if text.count(m.find) != 1:
            problems.append(f"{m.name}: pattern found {text.count(m.find)} times in {m.file}")
        if m.find == m.replace:
            problems.append(f"{m.name}: the substitution changes nothing")
        if m.backend not in ("sqlite", "postgres", "both"):
            problems.append(f"{m.name}: unknown backend {m.backend!r}")
        for node in m.tests:
            if not (ROOT / node.split("::")[0]).exists():
                problems.append(f"{m.name}: no test file {node}")
    return problems


def test_every_mutant_applies_exactly_once_and_names_real_tests():
    mutants = _mutants()
    assert len(mutants) >= 30, "issue 5 asks for at least 30 named mutants"
    names = [m.name for m in mutants]
    assert len(names) == len(set(names)), "mutant names must be unique"
    assert _problems(mutants) == []


def test_the_check_itself_reports_a_drifted_pattern():
    """Negative control: a pattern that no longer occurs, or a missing test file, is
    reported rather than passed over."""
    first = _mutants()[0]
    from mutants import Mutant  # noqa: PLC0415

    drifted = Mutant(name="drifted", file=first.file, find="no such line in the source", replace="x",
                     tests=("tests/no_such_test_file.py",))
    assert _problems([drifted]) == [
        f"drifted: pattern found 0 times in {first.file}",
        "drifted: no test file tests/no_such_test_file.py",
    ]
