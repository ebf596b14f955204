"""The benchmark must not rot (issue 5, item 6): ``bench/run.py --smoke`` on each backend.

Tiny sizes, every section. What is checked is the results file's shape and the
correctness the benchmark itself verifies (nothing left unprocessed or unrouted, no steer
missing, the naive baseline writing the very same rows, nothing unprocessed after the
stuck-backlog restart). Speed is never asserted: the figures only have to be there.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from tidings.ingest.grouping import DRAIN_GROUP

pytestmark = pytest.mark.slow

RUN_PY = Path(__file__).resolve().parents[2] / "bench" / "run.py"
SECTIONS = ("ingest", "latency", "fanout", "recovery", "stuck")
LATENCY = ("p50_ms", "p90_ms", "p99_ms", "max_ms", "mean_ms", "n")


def _bench():
    spec = importlib.util.spec_from_file_location("tidings_bench_run", RUN_PY)
    assert spec is not None and spec.loader is not None, f"no benchmark at {RUN_PY}"
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("tidings_bench_run", module)
    spec.loader.exec_module(module)
    return module


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_bench_smoke_writes_every_figure_and_leaves_nothing_unprocessed(backend, tmp_path):
    out = tmp_path / "bench.json"
    code = _bench().main(["--smoke", "--backend", backend, "--json", str(out), "--no-progress"], configure_logging=False)
    assert code == 0
    results = json.loads(out.read_text(encoding="utf-8"))

    assert set(SECTIONS) <= set(results)
    assert results["meta"]["mode"] == "smoke" and results["meta"]["backends"] == [backend]
    assert set(results["targets"]) >= {"ingest_frames_per_s_sqlite", "commits_per_frame", "steer_p99_ms",
                                       "recovery_msgs_per_s", "stuck_ms_per_later_frame"}
    assert results["checks"]["ok"], results["checks"]["failed"]
    assert results["checks"]["checked"], "no correctness check ran"

    ingest = results["ingest"][backend]
    for way in ("ours", "ours_batched", "raw", "naive"):
        assert _number(ingest[way]["frames_per_s"]) and _number(ingest[way]["commits_per_frame"])
    for way in ("ours", "ours_batched", "naive"):
        assert ingest[way]["unprocessed"] == 0
        assert ingest[way]["outcomes"]["applied"] > 0
    assert ingest["naive"]["rows"] == ingest["ours"]["rows"]
    assert ingest["naive"]["content_equal"] is True
    assert ingest["raw"]["rows_inserted"] > 0
    assert ingest["ours_batched"]["commits"] < ingest["ours"]["commits"]  # one commit a request, not a frame
    assert set(ingest["ratios"]) == {"ours_over_naive", "ours_over_raw", "ours_over_raw_per_frame",
                                     "batched_over_ours", "grouped_over_alone", "drain_grouped_over_one",
                                     "commits_per_frame_naive_over_ours"}
    # The drain of a backlog, one frame a transaction and a group of them: nothing left behind.
    assert set(ingest["drain"]) == {"1", str(DRAIN_GROUP)}
    for drain in ingest["drain"].values():
        assert drain["unprocessed"] == 0 and _number(drain["frames_per_s"])
    # The floor (a statement, a commit) and the one-commit-a-frame raw run, measured in the same run.
    assert _number(ingest["floor"]["round_trip_us"]) and _number(ingest["floor"]["commit_us"])
    assert ingest["raw_per_frame"]["commits"] >= 1 and ingest["raw_per_frame"]["rows_inserted"] > 0
    # The client's CPU per frame, beside the wall time: what a frame waits on the server is the rest.
    assert 0 < ingest["ours"]["client_cpu_ms_per_frame"] and 0 < ingest["ours"]["client_cpu_share"] <= 1.5
    # The raw floor commits once per frame exactly, not once per pair of rows (D111).
    assert ingest["raw_per_frame"]["commits"] == ingest["raw_per_frame"]["frames"] == ingest["ours"]["frames"]
    # The server's CPU per frame beside the client's (D111): a local PostgreSQL only.
    for way in ("ours", "ours_batched", "raw_per_frame"):
        assert _number(ingest[way]["client_cpu_ms_per_frame"])
        if backend == "postgresql":
            assert ingest[way]["server_cpu_ms_per_frame"] > 0 and ingest[way]["server_cpu_share"] > 0
        else:
            assert "server_cpu_ms_per_frame" not in ingest[way]
    metrics = {(row["metric"], row["backend"]) for row in results["table"]}
    for metric in ("server CPU, ms/frame", "client + server CPU, ms/frame", "frames/s with every core busy"):
        assert ((metric, backend) in metrics) == (backend == "postgresql")
    # Several clients at once, grouped and not: the same rows, nothing left unprocessed.
    grouped, alone = ingest["concurrent"]["grouped"], ingest["concurrent"]["alone"]
    assert grouped["unprocessed"] == alone["unprocessed"] == 0
    assert grouped["outcomes"] == alone["outcomes"] and alone["appends_per_commit"] == 1.0

    latency = results["latency"][backend]
    assert latency["missing_steers"] == 0 and latency["mentioned_also_delivered"] == 0
    for figure in ("post_call", "steer_queued", "steer_read"):
        assert set(latency[figure]) == set(LATENCY)
        assert latency[figure]["n"] == latency["posts_measured"] > 0

    fanout = results["fanout"][backend]
    assert "0" in fanout and len(fanout) >= 2
    assert {f["posters"] for f in fanout.values()} == {1, 4}  # one poster, and concurrent posters
    for figure in fanout.values():
        assert figure["complete"] is True
        assert figure["dispatches"] == figure["agents"] * figure["messages"]
        assert _number(figure["messages_per_s"])

    recovery = results["recovery"][backend]
    assert len(recovery["by_size"]) >= 2
    for size, figure in recovery["by_size"].items():
        assert figure["messages"] >= int(size)
        assert figure["marked"] == figure["messages"]
        assert figure["unrouted_after"] == 0
        assert figure["owed_rows"] == figure["owed_recorded"] > 0
        assert _number(figure["messages_per_s"]) and _number(figure["tracemalloc_peak_kb"])
    assert _number(recovery["memory_growth_large_over_small"])

    stuck = results["stuck"][backend]["corpus_time"]
    assert stuck["ours"]["stuck_frames"] > 0 and stuck["ours"]["stuck_decodes"] > 0
    assert stuck["ours"]["unprocessed_before_restart"] > 0  # the stuck frames really stayed
    assert stuck["ours"]["unprocessed_after_restart"] == 0
    assert stuck["naive"]["unprocessed_after_restart"] == 0
    assert stuck["no_stuck"]["unprocessed_after"] == 0
    assert _number(stuck["ours"]["later_frame_drain_ms_avg"])

    rows = results["table"]
    assert {r["section"] for r in rows} == {"1 ingest", "2 post→steer", "3 fan-out", "4 recovery scan", "5 stuck backlog"}
    assert all(r["backend"] == backend for r in rows)


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_bench_search_section_compares_the_index_with_the_like_scan(backend, tmp_path):
    out = tmp_path / "bench.json"
    code = _bench().main(["--smoke", "--only", "search", "--backend", backend, "--json", str(out), "--no-progress",
                          "--search-queries", "3"], configure_logging=False)
    assert code == 0
    search = json.loads(out.read_text(encoding="utf-8"))["search"]
    assert search["messages"] == 2_000
    for band in ("rare", "medium", "common"):
        part = search[backend][band]
        assert _number(part["index"]["queries_per_s"]) and _number(part["like"]["queries_per_s"])
        assert _number(part["index"]["p99_ms"]) and _number(part["like"]["p99_ms"])
        # the same question, the same number of answers (up to the limit)
        assert part["index"]["mean_hits"] == part["like"]["mean_hits"]
