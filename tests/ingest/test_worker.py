"""The ingest worker on both backends, with a scripted decoder and projection (spec §6.2).

The script (like the reference's ``wvHarness``): a frame's payload is a JSON object with
its ``id`` and what should go wrong. The scripted projection writes a row to ``t_applied``
*before* it fails, so every test also shows that a failed attempt left nothing behind.
No sleeps: a ``FakeClock`` drives the backoff, the 5/10/20 ms sleeps are recorded.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from collections import Counter

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tidings.bridges.registry import create_bridge
from tidings.clock import SYSTEM_CLOCK
from tidings.ids import new_id
from tidings.ingest.backoff import RETRY_MAX_MS, retry_delay_ms
from tidings.ingest.decoders import DecodeError
from tidings.ingest.engine import Ingest
from tidings.ingest.inbox import Frame, append_frames
from tidings.store import inbox as inbox_store
from tidings.store.sql import Stmt

PROPERTY = settings(
    max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow]
)
INSERT_APPLIED = Stmt("INSERT INTO t_applied (frame, inbox_id, step) VALUES (:frame, :inbox_id, :step)")
CODEC = "test.script"


class Crash(BaseException):
    """A process dying mid-frame: not an Exception, so nothing in the worker handles it."""


def transient() -> Exception:
    exc = sqlite3.OperationalError("database is locked")
    exc.sqlite_errorcode = 5
    return exc


class Script:
    """Scripted decode/project. Payload: {"id", "fail"?: n transient failures, "bad"?: where}."""

    def __init__(self) -> None:
        self.decodes: Counter[str] = Counter()
        self.fail_left: dict[str, int] = {}
        self.crash_at: str | None = None
        self.applied_order: list[str] = []
        self.lock = threading.Lock()

    def decode(self, codec, version, payload):
        doc = json.loads(payload)
        with self.lock:
            self.decodes[doc["id"]] += 1
        if doc.get("bad") == "decode":
            raise DecodeError("scripted: cannot decode")
        if doc.get("bad") == "events":
            return "not a list of events"
        return [doc]

    def project(self, tx, ctx, events):
        doc = events[0]
        fid = doc["id"]
        tx.execute(INSERT_APPLIED, {"frame": fid, "inbox_id": ctx.inbox_id, "step": "message"})
        ctx.counters.incr("reactions_applied")
        if self.crash_at == fid:
            raise Crash()
        left = self.fail_left.get(fid, doc.get("fail", 0))
        if left:
            self.fail_left[fid] = left - 1
            raise transient()  # in the "reactions step", after the message row was written
        self.fail_left[fid] = 0
        tx.execute(INSERT_APPLIED, {"frame": fid, "inbox_id": ctx.inbox_id, "step": "reactions"})
        if doc.get("bad") == "project":
            raise ValueError("scripted: projection refused the frame")
        tx.after_commit(lambda: self.applied_order.append(fid))  # committed work only
        return True


class Rig:
    """One store, one bridge, one worker (a fresh one per ``restart()``)."""

    def __init__(self, store, clock, faults, group_size=1, **options) -> None:
        self.store, self.clock, self.faults = store, clock, faults
        with store.write() as tx:
            tx.raw("CREATE TABLE IF NOT EXISTS t_applied (frame TEXT NOT NULL, inbox_id TEXT NOT NULL, step TEXT NOT NULL)")
            tx.raw("DELETE FROM t_applied")
            tx.raw("DELETE FROM inbox")
        self.bridge = create_bridge(store, platform="signal", name=new_id("phone"))["id"]
        self.script = Script()
        self.sleeps: list[float] = []
        self.group_size = group_size
        self.options = options
        self.ids: dict[str, str] = {}  # frame id -> inbox id
        self.ingest = self._build()

    def _build(self) -> Ingest:
        return Ingest(
            store=self.store,
            faults=self.faults,
            decode=self.script.decode,
            project=self.script.project,
            validate=False,
            sleep=self.sleeps.append,
            group_size=self.group_size,
            clock=self.clock,
            **self.options,
        )

    @property
    def worker(self):
        return self.ingest.worker

    def restart(self) -> None:
        self.ingest.stop()
        self.ingest = self._build()

    def append(self, fid: str, **doc) -> str:
        payload = json.dumps({"id": fid, **doc})
        with self.store.write() as tx:
            [res] = append_frames(tx, self.bridge, [Frame(CODEC, 1, "", None, payload)], self.clock.now_ms())
        self.ids[fid] = res.inbox_id
        self.ingest.worker.notify()
        return res.inbox_id

    def drain(self):
        return self.ingest.drain()

    def rows(self, fid: str) -> list[str]:
        with self.store.read() as tx:
            return [r[0] for r in tx.raw(
                "SELECT step FROM t_applied WHERE frame = " + ("?" if self.store.dialect == "sqlite" else "%s")
                + " ORDER BY step", (fid,)).fetchall()]

    def state(self, fid: str) -> dict:
        with self.store.read() as tx:
            return inbox_store.frame_state(tx, self.ids[fid])

    def counters(self) -> dict:
        return self.ingest.counters.of(self.bridge).snapshot()

    def backlog(self) -> int:
        with self.store.read() as tx:
            return inbox_store.backlog(tx)

    def close(self) -> None:
        self.ingest.stop()


@pytest.fixture(params=[1, 8], ids=["single", "group8"])
def rig(request, store, clock, faults):
    r = Rig(store, clock, faults, group_size=request.param)
    yield r
    r.close()


# -- basics -------------------------------------------------------------------------------------
def test_drain_applies_a_paged_backlog_in_receipt_order_once_each(rig, clock):
    for n in range(2 * 256 + 7):
        rig.append(f"f{n}")
        if n % 3 == 0:
            clock.advance(1)  # receipt-time ties in between
    stats = rig.drain()
    assert stats.applied == 2 * 256 + 7 and stats.listed == 2 * 256 + 7
    assert set(rig.script.decodes.values()) == {1}
    by_inbox = sorted(rig.ids, key=lambda fid: (rig.state(fid)["received_at_ms"], rig.ids[fid]))
    assert rig.script.applied_order == by_inbox
    c = rig.counters()
    assert c["projected"] == 2 * 256 + 7 and c["quarantined"] == 0 and c["reactions_applied"] == 2 * 256 + 7
    assert rig.backlog() == 0 and rig.state("f0")["outcome"] == "applied"


@pytest.mark.parametrize(
    "bad,cause",
    [("decode", "decode: scripted: cannot decode"),
     ("events", "decode: the decoder returned str"),
     ("project", "internal error (ValueError): scripted: projection refused the frame")],
)
def test_deterministic_failures_are_quarantined_with_their_cause(rig, bad, cause):
    rig.append("ok1")
    rig.append("bad", bad=bad)
    rig.append("ok2")
    stats = rig.drain()
    assert (stats.applied, stats.quarantined) == (2, 1)
    state = rig.state("bad")
    assert state["outcome"] == "quarantined" and state["processed_at_ms"] is not None
    assert state["cause"].startswith(cause)
    assert rig.rows("bad") == []  # the failed projection's rows were rolled back
    assert rig.rows("ok2") == ["message", "reactions"]
    c = rig.counters()
    assert c["quarantined"] == 1 and c["projected"] == 2
    assert c["reactions_applied"] == 2  # staged counts of the rolled-back frame are dropped


def test_unknown_codec_and_wrong_platform_are_quarantined(store, clock, faults):
    ingest = Ingest(store=store, faults=faults, project=lambda tx, ctx, events: False, sleep=lambda s: None)
    bridge = create_bridge(store, platform="signal", name="p")["id"]
    with store.write() as tx:
        a, b = append_frames(tx, bridge, [Frame("nope.codec", 1, "", None, "{}"),
                                          Frame("google.json", 1, "", None, "{}")], clock.now_ms())
    ingest.drain()
    with store.read() as tx:
        sa, sb = inbox_store.frame_state(tx, a.inbox_id), inbox_store.frame_state(tx, b.inbox_id)
    assert sa["outcome"] == "quarantined" and "unknown codec" in sa["cause"]
    assert sb["outcome"] == "quarantined" and "signal bridge" in sb["cause"]


# -- one transaction per frame -------------------------------------------------------------------
def test_transient_failure_in_the_reactions_step_leaves_the_frame_untouched_then_applies_fully(rig, clock):
    rig.append("f", fail=4)  # every try of the first attempt fails after writing the message row
    stats = rig.drain()
    assert stats.deferred == 1
    state = rig.state("f")
    assert state["processed_at_ms"] is None and state["outcome"] is None and state["cause"] is None
    assert rig.rows("f") == []  # the message row written before the failure was rolled back
    assert rig.script.decodes["f"] == 4 and rig.sleeps == [0.005, 0.010, 0.020]
    c = rig.counters()
    assert c["deferred"] == 1 and c["transient_retries"] == 3 and c["projected"] == 0
    clock.advance(1000)
    assert rig.drain().applied == 1
    assert rig.rows("f") == ["message", "reactions"]
    state = rig.state("f")
    assert state["outcome"] == "applied" and state["processed_at_ms"] == clock.now_ms()
    assert rig.script.decodes["f"] == 5


def test_a_frame_commits_once(rig):
    """The projection and the processed mark share one commit (no partial commits)."""
    rig.append("a")
    before = rig.store.commits
    rig.drain()
    assert rig.store.commits - before == 1


def test_fault_ingest_busy_fails_the_next_n_attempts(rig, faults, clock):
    faults.arm("ingest.busy", 6)
    rig.append("a")
    clock.advance(1)
    rig.append("b")
    stats = rig.drain()
    # a: 4 busy tries -> deferred; b: 2 busy tries, then applied on its third.
    assert (stats.deferred, stats.applied) == (1, 1)
    assert rig.rows("a") == [] and rig.rows("b") == ["message", "reactions"]
    assert rig.ingest.status()["deferred_now"] == 1 and rig.ingest.status()["backlog"] == 1
    clock.advance(1000)
    assert rig.drain().applied == 1 and rig.backlog() == 0


# -- backoff ------------------------------------------------------------------------------------
def test_deferred_frame_is_passed_over_until_its_time_then_backs_off_doubling(rig, clock):
    rig.append("stuck", fail=5)  # two failed rounds: 4 tries, then the retry round's one
    rig.drain()
    assert rig.script.decodes["stuck"] == 4
    entry = rig.worker.retries.get(rig.ids["stuck"])
    assert entry.failures == 1 and entry.not_before_ms == clock.now_ms() + 1000
    # New traffic before the backoff ends drains past it without loading or decoding it.
    clock.advance(999)
    rig.append("later")
    stats = rig.drain()
    assert stats.skipped == 1 and stats.applied == 1 and rig.script.decodes["stuck"] == 4
    clock.advance(1)
    rig.drain()  # second round fails too: now 2 s
    assert rig.script.decodes["stuck"] == 5
    entry = rig.worker.retries.get(rig.ids["stuck"])
    assert entry.failures == 2 and entry.not_before_ms == clock.now_ms() + 2000
    clock.advance(1999)
    rig.drain()
    assert rig.script.decodes["stuck"] == 5
    clock.advance(1)
    assert rig.drain().applied == 1
    assert rig.script.decodes["stuck"] == 6 and len(rig.worker.retries) == 0
    c = rig.counters()
    assert c["deferred"] == 2 and c["projected"] == 2


def test_a_backed_off_frame_gets_one_try_per_retry_round_without_in_attempt_sleeps(rig, clock):
    """The 4 tries 5/10/20 ms apart are for a frame's first attempt; once it is backed off,
    each retry round is one try (the backoff is its spacing), so a frame that stays stuck
    costs one load and decode per round and never sleeps the drain."""
    rig.append("stuck", fail=10**6)
    rig.append("later")
    rig.drain()
    assert rig.script.decodes["stuck"] == 4 and rig.sleeps == [0.005, 0.010, 0.020]
    for failures in range(2, 6):
        clock.advance(retry_delay_ms(failures - 1))
        rig.append(f"later{failures}")  # drained right after the retry round, in the same walk
        stats = rig.drain()
        assert (stats.deferred, stats.applied) == (1, 1)
        entry = rig.worker.retries.get(rig.ids["stuck"])
        assert entry.failures == failures and entry.not_before_ms == clock.now_ms() + retry_delay_ms(failures)
    assert rig.script.decodes["stuck"] == 4 + 4 and rig.sleeps == [0.005, 0.010, 0.020]
    c = rig.counters()
    assert c["deferred"] == 5 and c["transient_retries"] == 3
    # The classification is unchanged: a retry round that succeeds applies the frame ...
    rig.script.fail_left["stuck"] = 0
    clock.advance(retry_delay_ms(5))
    assert rig.drain().applied == 1 and rig.rows("stuck") == ["message", "reactions"]
    assert len(rig.worker.retries) == 0
    # ... and a restart (an empty schedule) gives a frame its full first attempt again.
    rig.append("again", fail=4)
    rig.drain()
    rig.restart()
    rig.drain()
    assert rig.script.decodes["again"] == 5 and rig.rows("again") == ["message", "reactions"]


def test_a_stuck_frame_logs_its_failed_rounds_1_2_4_8_and_counts_every_one(rig, clock):
    """A warning per failed round would cost a stuck frame a log line every 5 minutes for as
    long as it is stuck (and as much time as its retry); rounds 1, 2, 4, 8, ... are logged,
    each with the round's number, while ``deferred`` counts every one."""
    from structlog.testing import capture_logs

    rig.append("stuck", fail=10**6)
    with capture_logs() as logs:
        for failures in range(1, 11):
            rig.drain()
            clock.advance(retry_delay_ms(failures))
    rounds = [e["failed_rounds"] for e in logs if e["event"].startswith("ingest frame exhausted")]
    assert rounds == [1, 2, 4, 8]
    assert all(e["inbox_id"] == rig.ids["stuck"] and e["bridge_id"] == rig.bridge for e in logs
               if e["event"].startswith("ingest frame exhausted"))
    assert rig.counters()["deferred"] == 10 and rig.worker.retries.get(rig.ids["stuck"]).failures == 10


def test_a_deterministic_failure_in_a_retry_round_quarantines_the_frame(rig, clock):
    rig.append("stuck", fail=4)
    rig.drain()
    rig.worker.applier.project = lambda tx, ctx, events: (_ for _ in ()).throw(ValueError("now it is bad"))
    clock.advance(1000)
    stats = rig.drain()
    assert stats.quarantined == 1 and rig.state("stuck")["outcome"] == "quarantined"
    assert "now it is bad" in rig.state("stuck")["cause"] and len(rig.worker.retries) == 0


def test_backoff_is_capped():
    delays = [retry_delay_ms(n) for n in range(1, 13)]
    assert delays == [1000, 2000, 4000, 8000, 16000, 32000, 64000, 128000, 256000, 300000, 300000, 300000]
    assert retry_delay_ms(10**6) == RETRY_MAX_MS and retry_delay_ms(0) == 1000


def test_backoff_rounds_are_capped_and_entries_of_frames_processed_elsewhere_are_pruned(rig, clock):
    rig.append("stuck", fail=10**6)
    waits = []
    for _ in range(12):
        rig.drain()
        entry = rig.worker.retries.get(rig.ids["stuck"])
        waits.append(entry.not_before_ms - clock.now_ms())
        clock.advance(waits[-1])
    assert waits == [min(1000 * 2**k, 300_000) for k in range(12)]
    with rig.store.write() as tx:  # processed elsewhere (another process, an operator)
        inbox_store.mark_quarantined(tx, rig.ids["stuck"], clock.now_ms(), "operator")
    stats = rig.drain()
    assert stats.pruned == 1 and len(rig.worker.retries) == 0
    assert rig.ingest.status()["deferred_now"] == 0


# -- no frame lost or repeated -------------------------------------------------------------------
op = st.one_of(
    st.tuples(st.just("append"), st.integers(0, 3), st.integers(0, 2)),
    st.tuples(st.just("drain")),
    st.tuples(st.just("advance"), st.integers(0, 400_000)),
)


@PROPERTY
@given(ops=st.lists(op, max_size=25), group=st.sampled_from([1, 3]))
def test_random_transient_failures_lose_or_repeat_no_frame(store, clock, faults, ops, group):
    rig = Rig(store, clock, faults, group_size=group)
    try:
        rounds: dict[str, int] = {}
        drain_no = 0
        applied_in_drain: dict[str, int] = {}
        for n, step in enumerate(ops):
            if step[0] == "append":
                _, k, tick = step
                clock.advance(tick)
                fid = f"f{n}"
                rounds[fid] = k
                rig.append(fid, fail=4 * k)
            elif step[0] == "drain":
                before = len(rig.script.applied_order)
                rig.drain()
                drain_no += 1
                for fid in rig.script.applied_order[before:]:
                    applied_in_drain[fid] = drain_no
            else:
                clock.advance(step[1])
        for _ in range(40):
            if rig.backlog() == 0:
                break
            clock.advance(300_001)
            before = len(rig.script.applied_order)
            rig.drain()
            drain_no += 1
            for fid in rig.script.applied_order[before:]:
                applied_in_drain[fid] = drain_no
        assert rig.backlog() == 0
        assert sorted(rig.script.applied_order) == sorted(rounds)  # each exactly once
        for fid, k in rounds.items():
            assert rig.rows(fid) == ["message", "reactions"], fid
            assert rig.script.decodes[fid] == 4 * k + 1, (fid, k)
            assert rig.state(fid)["outcome"] == "applied"
        assert rig.counters()["quarantined"] == 0
        # Frames that never failed apply in receipt order within each drain.
        clean = [f for f in rig.script.applied_order if rounds[f] == 0]
        key = {f: (applied_in_drain[f], rig.state(f)["received_at_ms"], rig.ids[f]) for f in clean}
        assert clean == sorted(clean, key=key.__getitem__)
    finally:
        rig.close()


# -- restart ---------------------------------------------------------------------------------------
def test_restart_in_the_middle_of_a_backlog_loses_nothing(rig, clock):
    for n in range(600):
        rig.append(f"f{n}", fail=(4 if n % 50 == 7 else 0))
        clock.advance(1)
    rig.script.crash_at = "f300"
    with pytest.raises(Crash):
        rig.drain()
    done_before = set(rig.script.applied_order)
    assert 0 < len(done_before) < 600 and len(rig.worker.retries) > 0
    assert rig.rows("f300") == []  # the crashed frame's transaction never committed
    rig.script.crash_at = None
    rig.restart()  # a new process: empty retry map, so deferred frames are retried at once
    rig.drain()
    deferred_before_crash = [f"f{n}" for n in range(7, 300, 50)]
    assert all(rig.script.decodes[f] == 5 and f in rig.script.applied_order for f in deferred_before_crash)
    assert rig.backlog() == len(range(307, 600, 50))  # reached only now, deferred once
    clock.advance(1000)
    rig.drain()
    assert rig.backlog() == 0
    assert sorted(rig.script.applied_order) == sorted(f"f{n}" for n in range(600))
    assert all(rig.rows(f"f{n}") == ["message", "reactions"] for n in range(0, 600, 37))


# -- the thread ------------------------------------------------------------------------------------
def test_running_worker_drains_on_append_and_wakes_for_its_retry_on_a_fake_clock(rig, clock):
    rig.worker.start()
    rig.append("a", fail=4)
    assert rig.worker.wait_for(lambda: rig.counters()["deferred"] == 1)
    rig.append("b")
    assert rig.worker.wait_for(lambda: "b" in rig.script.applied_order)
    assert "a" not in rig.script.applied_order
    clock.advance(1000)  # no new traffic: the clock's move alone wakes the worker
    assert rig.worker.wait_for(lambda: "a" in rig.script.applied_order)
    assert rig.script.decodes["a"] == 5
    rig.worker.stop()


def test_worker_drains_at_start(rig):
    for n in range(5):
        rig.append(f"f{n}")
    rig.worker.start()
    assert rig.worker.wait_for(lambda: len(rig.script.applied_order) == 5)


def test_running_worker_wakes_for_its_retry_on_the_real_clock(store, faults):
    rig = Rig(store, SYSTEM_CLOCK, faults, retry_base_ms=20, retry_max_ms=40)
    try:
        rig.worker.start()
        rig.append("a", fail=4)
        assert rig.worker.wait_for(lambda: "a" in rig.script.applied_order)  # the 20 ms timer fired
        assert rig.script.decodes["a"] == 5 and rig.counters()["deferred"] == 1
    finally:
        rig.close()


def test_status_reports_backlog_deferred_now_and_counters_per_bridge(rig, clock):
    rig.append("a", fail=4)
    rig.append("b")
    status = rig.ingest.status()
    assert status["backlog"] == 2 and status["deferred_now"] == 0
    assert status["per_bridge"][rig.bridge]["appended"] == 0  # appended outside Ingest.append
    rig.drain()
    status = rig.ingest.status()
    assert status["backlog"] == 1 and status["deferred_now"] == 1
    assert status["per_bridge"][rig.bridge]["projected"] == 1


@pytest.mark.postgres_only  # a lost server connection is a PostgreSQL failure mode
def test_a_lost_postgresql_connection_is_transient_and_the_worker_reconnects(store, clock, faults):
    rig = Rig(store, clock, faults)
    try:
        killed = []
        original = rig.script.project

        def project(tx, ctx, events):
            if events[0]["id"] == "b" and not killed:
                killed.append(1)
                tx.raw("SELECT pg_terminate_backend(pg_backend_pid())")  # the server drops us
            return original(tx, ctx, events)

        rig.ingest.worker.applier.project = project
        rig.append("a")
        clock.advance(1)
        rig.append("b")
        clock.advance(1)
        rig.append("c")
        stats = rig.drain()
        assert killed and stats.applied == 3 and rig.backlog() == 0
        assert rig.rows("b") == ["message", "reactions"]
        assert rig.counters()["transient_retries"] == 1 and rig.counters()["quarantined"] == 0
    finally:
        rig.close()


def test_stop_ends_a_long_drain_between_frames_and_a_restart_finishes_it(rig, clock):
    for n in range(50):
        rig.append(f"f{n}")
        clock.advance(1)
    inside, release = threading.Event(), threading.Event()
    original = rig.script.project

    def project(tx, ctx, events):
        if events[0]["id"] == "f5":
            inside.set()
            release.wait(10)
        return original(tx, ctx, events)

    rig.worker.applier.project = project
    rig.worker.start()
    assert inside.wait(10)
    stopper = threading.Thread(target=rig.ingest.stop)
    stopper.start()
    while not rig.worker._stopping:  # stop() has asked the thread to end
        stopper.join(0.001)
    release.set()
    stopper.join(10)
    assert not stopper.is_alive()
    assert 0 < rig.backlog() < 50 - 5  # it stopped soon after f5 (a group may finish first)
    rig.restart()
    rig.drain()
    assert rig.backlog() == 0 and sorted(rig.script.applied_order) == sorted(f"f{n}" for n in range(50))


def test_an_invalid_event_from_a_decoder_is_quarantined(store, clock, faults):
    from tidings.ingest.events import IdentityRef, MessageEvent

    bad = MessageEvent("conv", "m1", IdentityRef("+1555"), "sideways", "hi", 1)
    projected = []
    ingest = Ingest(store=store, faults=faults, sleep=lambda s: None,
                    decode=lambda codec, version, payload: [bad],
                    project=lambda tx, ctx, events: projected.append(events))
    bridge = create_bridge(store, platform="signal", name="p")["id"]
    with store.write() as tx:
        [res] = append_frames(tx, bridge, [Frame(CODEC, 1, "", None, "{}")], clock.now_ms())
    assert ingest.drain().quarantined == 1 and projected == []
    with store.read() as tx:
        cause = inbox_store.frame_state(tx, res.inbox_id)["cause"]
    assert cause.startswith("invalid event 0: MessageEvent.direction is 'sideways'")


# -- the claim (issue 12): load + applied mark in one statement, still at most once -------------
def test_a_frame_finished_after_it_was_listed_is_gone_not_applied_again(rig):
    rig.append("a")
    rig.append("b")
    applier = rig.worker.applier
    if rig.group_size == 1:
        real = applier.project

        def project(tx, ctx, events):
            if events[0]["id"] == "a":  # b is finished elsewhere while the drain is on a
                assert inbox_store.mark_applied(tx, rig.ids["b"], 5)
            return real(tx, ctx, events)

        applier.project = project
    else:  # a group claims its frames at once: b is finished elsewhere before that claim
        real_claim = applier.claim_group

        def claim_group(tx, ids):
            assert inbox_store.mark_applied(tx, rig.ids["b"], 5)
            return real_claim(tx, ids)

        applier.claim_group = claim_group
    stats = rig.drain()
    assert (stats.applied, stats.gone) == (1, 1)
    assert rig.rows("a") == ["message", "reactions"] and rig.rows("b") == []
    assert rig.state("b")["outcome"] == "applied" and rig.state("b")["processed_at_ms"] == 5
    assert rig.script.decodes["b"] == 0


def test_a_failed_frame_leaves_its_claim_rolled_back_and_is_quarantined_once(rig):
    rig.append("bad", bad="project")
    rig.append("ok")
    stats = rig.drain()
    assert (stats.applied, stats.quarantined) == (1, 1)
    state = rig.state("bad")
    assert state["outcome"] == "quarantined" and "refused" in state["cause"]
    assert rig.rows("bad") == [] and rig.rows("ok") == ["message", "reactions"]
