"""``bench/fanout_profile.py`` says what a fan-out message's time is made of, on both
backends, and puts back every hook it set.

Speed is never asserted; what is checked is that the figures are there, that they come
from the measured window only (the setup's statements are not charged to the messages),
and that PostgreSQL's waits are split out where SQLite has none.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from rich.console import Console

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import benchlib  # noqa: E402
import fanout_profile  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_a_profiled_fan_out_names_its_threads_and_steps_and_leaves_no_hook_behind(backend):
    from tidings.delivery.routing import Router
    from tidings.hub.posting import Posting
    from tidings.store.pg_wire import Wire

    before = (Posting.post, Router.read_batch, Router.fan_out, Wire._next)
    dbs = benchlib.Databases()
    try:
        url = dbs.fresh(backend, "fanprof")
        r = fanout_profile.profile(url, backend, agents=3, messages=40,
                                   reporter=benchlib.Reporter(Console(stderr=True), enabled=False))
    finally:
        dbs.close()
    assert (Posting.post, Router.read_batch, Router.fan_out, Wire._next) == before

    assert r["complete"] is True and r["messages"] == 40
    assert {"poster", "consumer", "readers"} <= set(r["thread_cpu_us_per_message"])
    assert r["wall_us_per_message"] > 0 and r["process_cpu_us_per_message"] > 0
    steps, calls = r["step_wall_us_per_message"], r["step_calls_per_message"]
    # Only the window counts: one post call and one fan-out per message, no setup posts.
    assert calls["post"] == 1.0 and calls["fan-out"] == 1.0
    assert {"post", "consumer read", "fan-out", "flush"} <= set(steps)
    waits = {name for name in steps if name.endswith("waiting on PostgreSQL")}
    if backend == "postgresql":
        assert {"post waiting on PostgreSQL", "consumer read waiting on PostgreSQL"} <= waits
        # The sessions' start sweeps ran before the window: their statements are not charged.
        assert "other waiting on PostgreSQL" not in waits
        assert steps["post waiting on PostgreSQL"] <= steps["post"]
    else:
        assert not waits


def test_the_command_prints_the_table_and_exits_0_and_leaves_logging_alone(capsys):
    """Run in the suite, it must not quiet structlog for every later test (their
    ``capture_logs`` would find nothing)."""
    import structlog

    before = structlog.get_config()["wrapper_class"]
    assert fanout_profile.main(["--backend", "sqlite", "--agents", "2", "--messages", "20"],
                               configure_logging=False) == 0
    assert structlog.get_config()["wrapper_class"] is before
    out = capsys.readouterr().out
    assert "fan-out into 2 queues" in out and "no thread running" in out and "wall: post" in out
