"""Section 5: the stuck backlog — drain cost per later frame, and nothing left after a restart.

The seed's scenario: a run of Google frames in which the first N conversation frames fail
transiently on every attempt; what does each later frame cost, and is anything left
unprocessed once the fault clears and the worker restarts?

**Ours** is driven exactly like the replay harness's ``--stuck N``, from its own parts
(``tidings.replay.harness``: ``select_stuck`` picks the frames, ``StuckFault`` +
``Contention`` raise a real transient database error inside each of their attempts,
``PinnedSleep`` records the 5/10/20 ms in-attempt sleeps without sleeping them,
``ReplayInboxIds`` mints the ids; every clock is one ``FakeClock`` set to each frame's
``received_at_ms``): per frame on this thread, ``worker.drain_if_due()`` (a retry timer
due by the frame's time fires before it arrives, as the clock's listener wakes the worker
thread), ``Ingest.append_body``, then ``worker.drain_if_due()`` again. The one difference
is that no counting triggers are installed, so the times are the engine's own. The
harness itself (``replay(stuck=N)``, triggers and all) is run once more as a cross-check:
its stuck-frame decode count must be the same.

Because the clock is pinned, the backoff (1 s doubling to 5 min) runs in corpus time, so
the cost per later frame depends on how densely the frames arrive. Two paces are run:

* **corpus time** — the synthetic corpus's own receipt times (its Google frames arrive
  about once a minute, so once a stuck frame's backoff reaches its 5-minute cap it is
  retried every five frames or so: with 20 stuck, about three retry rounds come due per
  later frame, one attempt each once the frame is backed off);
* **paced** — the same frames re-stamped ``pace_ms`` apart (a busy bridge), where the
  backoff spaces the retries out over many frames.

Baselines: the same frames with **no frame stuck** (ours, same loop), and the **naive
(before)** ``bench/naive_ingest.py``: it re-reads every unprocessed frame after each
append and retries each stuck one four times, with no backoff; each of its attempts
gets the same real transient error as ours (``Contention``, inside a write transaction),
and its sleeps are recorded, not slept, like ours.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from benchlib import Databases, Reporter, inbox_outcomes, latency_ms, ratio

CODEC = "google.json"


def _lines(corpus: Path, frames: int) -> list[str]:
    from tidings.replay.harness import read_corpus

    return read_corpus(corpus, frames, frozenset({CODEC}))


def _paced(lines: list[str], pace_ms: int | None) -> list[dict[str, Any]]:
    parsed = [json.loads(line) for line in lines]
    if pace_ms:
        first = parsed[0]["received_at_ms"]
        for i, raw in enumerate(parsed):
            raw["received_at_ms"] = first + i * pace_ms
    return parsed


def _ours(lines: list[str], url: str, stuck: int, pace_ms: int | None, reporter: Reporter, what: str,
          later_after: int | None = None) -> dict[str, Any]:
    """One run; "later" frames are those after the last stuck one (or after ``later_after``)."""
    from tidings.clock import FakeClock
    from tidings.errors import TidingsError
    from tidings.faults import Faults
    from tidings.ingest.engine import Ingest
    from tidings.replay.harness import Contention, PinnedSleep, ReplayInboxIds, StuckFault, create_bridges, select_stuck
    from tidings.store.engine import Store

    frames = _paced(lines, pace_ms)
    stuck_lines = set(select_stuck(lines, stuck)) if stuck else set()
    last_stuck = max(stuck_lines) if stuck_lines else (-1 if later_after is None else later_after)
    clock = FakeClock(frames[0]["received_at_ms"])
    faults = Faults()
    store = Store(url, clock=clock, faults=faults)
    bridge = create_bridges(store)["google"]
    ids = ReplayInboxIds()
    sleep = PinnedSleep()
    contention = fault = None
    options: dict[str, Any] = {}
    if stuck:
        contention = Contention(store)
        fault = StuckFault(contention)
        ids.minted = lambda inbox_id: fault.ids.add(inbox_id) if ids.line in stuck_lines else None
        options["project"] = fault
    ingest = Ingest(store=store, faults=faults, clock=clock, inbox_ids=ids, sleep=sleep, **options)
    later: list[float] = []
    every: list[float] = []
    sleep_at_first_later = 0.0
    commits_before = store.commits
    trips_at_first_later = None
    rounds_at_first_later = 0
    perf = time.perf_counter
    try:
        with reporter.step(what, len(frames)) as update:
            for index, raw in enumerate(frames):
                if index == last_stuck + 1:
                    sleep_at_first_later = sleep.requested_s
                    trips_at_first_later = store.meter.round_trips
                    rounds_at_first_later = ingest.counters.of(bridge).get("deferred")
                clock.set(raw["received_at_ms"])
                ids.line = index
                t0 = perf()
                ingest.worker.drain_if_due()  # a retry timer due by now fires first (the harness's pump)
                try:
                    ingest.append_body(bridge, raw, "google")
                except TidingsError:
                    pass
                ingest.worker.drain_if_due()
                elapsed = perf() - t0
                every.append(elapsed)
                if index > last_stuck:
                    later.append(elapsed)
                if index % 16 == 0:
                    update(index)
        commits = store.commits - commits_before
        trips_later = store.meter.round_trips - (trips_at_first_later or store.meter.round_trips)
        sleep_later = sleep.requested_s - sleep_at_first_later
        rounds_later = ingest.counters.of(bridge).get("deferred") - rounds_at_first_later
        before_restart = inbox_outcomes(url)["unprocessed"]
        ingest.stop()
        restart_ms = None
        if fault is not None and contention is not None:
            fault.armed = False
            contention.close()
            contention = None
            restart = Ingest(store=store, faults=faults, clock=clock, sleep=sleep)
            t0 = perf()
            restart.drain()
            restart_ms = round((perf() - t0) * 1000, 3)
            restart.stop()
    finally:
        if contention is not None:
            contention.close()
        store.dispose()
    return {
        "frames": len(frames),
        "pace_ms": pace_ms,
        "corpus_span_s": round((frames[-1]["received_at_ms"] - frames[0]["received_at_ms"]) / 1000, 1),
        "stuck_frames": len(stuck_lines),
        "stuck_decodes": fault.decodes if fault is not None else 0,
        "later_frames": len(later),
        "later_frame_drain_ms_avg": round(sum(later) / len(later) * 1000, 4) if later else 0.0,
        "later_frame_drain_ms": latency_ms(later),
        "frame_ms_avg": round(sum(every) / len(every) * 1000, 4),
        # Store.meter: every round trip while the later frames went in (their own, and the
        # stuck frames' retries that came due meanwhile), per later frame; deterministic.
        "later_frame_round_trips_avg": round(trips_later / len(later), 3) if later else 0.0,
        "later_frame_requested_sleep_ms_avg": round(sleep_later / len(later) * 1000, 4) if later else 0.0,
        # Failed retry rounds of the stuck frames that came due meanwhile (the backoff's
        # schedule: 1 s doubling to 5 min each), per later frame.
        "later_frame_retry_rounds_avg": round(rounds_later / len(later), 3) if later else 0.0,
        "commits_per_frame": round(commits / len(frames), 4),
        "unprocessed_before_restart": before_restart,
        "restart_drain_ms": restart_ms,
        "unprocessed_after_restart": inbox_outcomes(url)["unprocessed"],
        "deferred": ingest.counters.of(bridge).snapshot().get("deferred"),
    }


def _naive(lines: list[str], url: str, stuck: int, pace_ms: int | None, reporter: Reporter, what: str) -> dict[str, Any]:
    from naive_ingest import NaiveIngest
    from tidings.replay.harness import Contention, create_bridges, select_stuck
    from tidings.store.engine import Store

    frames = _paced(lines, pace_ms)
    stuck_lines = set(select_stuck(lines, stuck))
    last_stuck = max(stuck_lines) if stuck_lines else -1
    store = Store(url)
    bridge = create_bridges(store)["google"]
    contention = Contention(store)  # the same real transient error ours gets
    stuck_ids: set[str] = set()
    # sleep=None: the 5/10/20 ms retry sleeps are recorded, not slept (like ours)
    naive = NaiveIngest(url, stuck_ids=stuck_ids, contention=contention)
    later: list[float] = []
    sleep_at_first_later = 0.0
    perf = time.perf_counter
    with reporter.step(what, len(frames)) as update:
        for index, raw in enumerate(frames):
            if index == last_stuck + 1:
                sleep_at_first_later = naive.requested_sleep_s
            t0 = perf()
            inbox_id = naive.append(raw, bridge, "google", drain=False)
            if index in stuck_lines and inbox_id is not None:
                stuck_ids.add(inbox_id)
            naive.drain()
            if index > last_stuck:
                later.append(perf() - t0)
            if index % 16 == 0:
                update(index)
    sleep_later = naive.requested_sleep_s - sleep_at_first_later
    before_restart = inbox_outcomes(url)["unprocessed"]
    naive.close()
    contention.close()
    store.dispose()
    restarted = NaiveIngest(url)  # the fault cleared, a fresh process
    restarted.drain()
    restarted.close()
    return {
        "frames": len(frames),
        "pace_ms": pace_ms,
        "stuck_frames": len(stuck_lines),
        "stuck_decodes": naive.stuck_decodes,
        "later_frames": len(later),
        "later_frame_drain_ms_avg": round(sum(later) / len(later) * 1000, 4) if later else 0.0,
        "later_frame_requested_sleep_ms_avg": round(sleep_later / len(later) * 1000, 4) if later else 0.0,
        "unprocessed_before_restart": before_restart,
        "unprocessed_after_restart": inbox_outcomes(url)["unprocessed"],
    }


def _harness(corpus: Path, url: str, stuck: int, frames: int, reporter: Reporter, what: str) -> dict[str, Any]:
    from tidings.replay.harness import ReplayConfig, replay

    config = ReplayConfig(corpus=corpus, out=url, stuck=stuck, limit=frames, codecs=frozenset({CODEC}), label=what)
    with reporter.step(what, frames) as update:
        m = replay(config, lambda done, total: update(done))
    return {k: m.get(k) for k in (
        "frames", "stuck_frames", "stuck_decodes", "later_frames", "later_frame_drain_ms_avg",
        "later_frame_requested_sleep_ms_avg", "unprocessed_after_restart", "commits_per_frame", "writes_over_minimal",
    )}


def run(backends: list[str], *, stuck: int, frames: int, seed: int, pace_ms: int, naive_on: list[str],
        dbs: Databases, reporter: Reporter, harness_check: bool = True) -> dict[str, Any]:
    from tidings.replay.synth import synthesize

    corpus = dbs.dir / f"stuck_corpus_{seed}.jsonl"
    # About 30% of a synthetic corpus is Google: synthesize enough to hold ``frames`` of them.
    corpus.write_text("\n".join(synthesize(int(frames / 0.28) + 200, seed).lines) + "\n", encoding="utf-8")
    lines = _lines(corpus, frames)
    from tidings.replay.harness import select_stuck

    last_stuck = max(select_stuck(lines, stuck), default=-1)
    section: dict[str, Any] = {"stuck": stuck, "google_frames": len(lines), "seed": seed, "pace_ms": pace_ms}
    for backend in backends:
        entry: dict[str, Any] = {}
        paces = [(None, "corpus_time")] + ([(pace_ms, "paced")] if pace_ms else [])
        for pace, key in paces:
            where = "corpus time" if pace is None else f"{pace} ms apart"
            url = dbs.fresh(backend, "stuck_ours")
            ours = _ours(lines, url, stuck, pace, reporter, f"stuck: ours, {stuck} stuck, {where}, {backend}")
            dbs.drop(url)
            url = dbs.fresh(backend, "stuck_none")
            clean = _ours(lines, url, 0, pace, reporter, f"stuck: ours, none stuck, {where}, {backend}",
                          later_after=last_stuck)
            dbs.drop(url)
            part: dict[str, Any] = {"ours": ours, "no_stuck": {
                "frames": clean["frames"],
                "frame_ms_avg": clean["frame_ms_avg"],
                "later_frame_drain_ms_avg": clean["later_frame_drain_ms_avg"],
                "later_frame_round_trips_avg": clean["later_frame_round_trips_avg"],
                "unprocessed_after": clean["unprocessed_before_restart"],
                "commits_per_frame": clean["commits_per_frame"],
            }}
            if backend in naive_on:
                url = dbs.fresh(backend, "stuck_naive")
                part["naive"] = _naive(lines, url, stuck, pace, reporter,
                                       f"stuck: naive, {stuck} stuck, {where}, {backend}")
                dbs.drop(url)
            part["ratios"] = {
                "naive_over_ours": ratio(part.get("naive", {}).get("later_frame_drain_ms_avg"),
                                         ours["later_frame_drain_ms_avg"], 1),
                "ours_over_no_stuck": ratio(ours["later_frame_drain_ms_avg"],
                                            part["no_stuck"]["later_frame_drain_ms_avg"]),
            }
            entry[key] = part
            reporter.note(
                f"stuck [{backend}, {where}]: ours {ours['later_frame_drain_ms_avg']:.3f} ms/later frame, "
                f"{ours['later_frame_round_trips_avg']:.2f} round trips/later frame, "
                f"{ours['later_frame_retry_rounds_avg']:.2f} retry rounds/later frame "
                f"({ours['stuck_decodes']} stuck decodes; none stuck "
                f"{part['no_stuck']['later_frame_drain_ms_avg']:.3f} ms, "
                f"{part['no_stuck']['later_frame_round_trips_avg']:.2f} round trips; naive "
                f"{part.get('naive', {}).get('later_frame_drain_ms_avg', float('nan')):.3f}); "
                f"unprocessed after restart {ours['unprocessed_after_restart']}"
            )
        if harness_check:
            url = dbs.fresh(backend, "stuck_harness")
            h = _harness(corpus, url, stuck, frames, reporter, f"stuck: replay harness --stuck {stuck}, {backend}")
            dbs.drop(url)
            h["same_stuck_decodes"] = h["stuck_decodes"] == entry["corpus_time"]["ours"]["stuck_decodes"]
            entry["harness"] = h
        section[backend] = entry
    return section

