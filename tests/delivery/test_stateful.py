"""A Hypothesis state machine over the whole engine (synchronous, so every interleaving it
finds replays exactly): posts with mentions, connects, disconnects, settles, acks (or
drops) what a session received, crashes (a fresh bus and consumer over the same store),
overruns, dropped publishes, failed routing passes and commits, and clock ticks,
interleaved with the consumer's pumps. ``TIDINGS_STATEFUL_EXAMPLES`` raises the example
count for a longer local run (default 20, which keeps the suite fast).

After quiescence (faults disarmed, a clock tick so every recovery point has run, the
consumer pumped dry):
* every mention of an agent member is acked by it, owed to it, or still above its cursor
  in a channel of its sweep set (messages held by a live author are still in its turn);
* nothing acked is owed; owed rows exist only for members outside the sweep set;
* then every agent reconnects: each message it is owed (every mention, every message of
  its sweep set) and has not acked arrives in that session, nothing it acked does, and
  no agent ever receives its own message.
"""

from __future__ import annotations

import os

from delivery_world import ADMIN_TOKEN, World, fresh_database_urls
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, rule, run_state_machine_as_test

from tidings.clock import FakeClock
from tidings.delivery import consumer as consumer_mod
from tidings.faults import Faults
from tidings.runtime import Runtime
from tidings.store import cursors as cursors_store
from tidings.store import messages as messages_store

AGENTS = ("a0", "a1", "a2", "a3")
PINGS = ("a0", "a1", "a2", "a3", "everyone", "users", "hu")
AUTHORS = st.sampled_from(("hu", "hu", "a0", "a1", "a2", "a3"))
CHANNELS = st.sampled_from(("C", "D", "H"))
ONE_POST = st.tuples(AUTHORS, CHANNELS, st.lists(st.sampled_from(PINGS), max_size=2))
POSTS = st.lists(ONE_POST, max_size=2)
FAULTS = ("bus.overrun", "bus.drop_publish", consumer_mod.ROUTE_FAULT, consumer_mod.FLUSH_FAULT,
          consumer_mod.BATCH_READ_FAULT)


class DeliveryMachine(RuleBasedStateMachine):
    make_url = None  # set per test run

    def __init__(self) -> None:
        super().__init__()
        self.clock = FakeClock()
        self.faults = Faults()
        self.rt = Runtime(type(self).make_url(), clock=self.clock, faults=self.faults, admin_token=ADMIN_TOKEN)
        # Small queues so refusals and catch-up sweeps happen too.
        self.w = World(self.rt, session_capacity=3, session_low_water=1, sweep_page=2)
        hu = self.w.human("hu")
        self.ids = {"hu": hu, **{a: self.w.agent(a, owner=hu) for a in AGENTS}}
        i = self.ids
        c = self.w.channel("C", hu, members=[i["a0"], i["a1"], i["a2"]], subscribe=[i["a0"]])
        d = self.w.channel("D", hu, members=[i["a1"], i["a2"]], subscribe=[i["a1"]])
        h = self.w.ids["a3.home"]
        self.channels = {"C": c, "D": d, "H": h}
        self.agent_members = {c: {i["a0"], i["a1"], i["a2"]}, d: {i["a1"], i["a2"]}, h: {i["a3"]}}
        self.sweep = {c: {i["a0"]}, d: {i["a1"]}, h: {i["a3"]}}
        self.messages: list[tuple[str, str, str, frozenset[str]]] = []  # id, channel, author, mentioned
        self.acked: dict[str, set[str]] = {i[a]: set() for a in AGENTS}
        self.received: dict[str, set[str]] = {i[a]: set() for a in AGENTS}

    # -- rules ---------------------------------------------------------------------------
    @initialize(live=st.sets(st.sampled_from(AGENTS)))
    def start_sessions(self, live):
        for agent in sorted(live):
            self.w.connect(self.ids[agent])

    # Every rule may post first: Hypothesis tends to repeat a rule, and a run without
    # posts proves nothing.
    @rule(posts=st.lists(ONE_POST, min_size=1, max_size=3))
    def post(self, posts):
        self._posts(posts)

    @rule(posts=POSTS, agent=st.sampled_from(AGENTS),
          action=st.sampled_from(("connect", "disconnect", "ready", "stopped", "working", "ack", "drop")))
    def session(self, posts, agent, action):
        """An agent's side: (re)connect, hang up, change state, or drain its session and
        ack (or lose) what arrived."""
        self._posts(posts)
        agent_id = self.ids[agent]
        if action == "connect":
            self._take(agent_id, ack=False)
            self.w.connect(agent_id)
        elif action == "disconnect":
            self._take(agent_id, ack=False)
            self.w.disconnect(agent_id)
        elif action in ("ready", "stopped", "working"):
            if agent_id in self.w.sessions:
                self.w.settle(agent_id, action)
        else:
            self.w.pump()
            self._take(agent_id, ack=action == "ack")

    @rule(posts=POSTS, event=st.sampled_from(("pump", "pump", "crash", "tick", *FAULTS)))
    def system(self, posts, event):
        """The hub's side: the consumer runs, the process crashes (a fresh bus and consumer
        over the same store), the bus overruns or loses a publish, a routing pass or its
        commit fails, the clock moves (a periodic scan)."""
        self._posts(posts)
        if event == "pump":
            self.w.pump()
        elif event == "crash":
            self.w.restart()
        elif event == "tick":
            self.clock.advance(30_000)
        else:
            self.faults.arm(event, 1)

    def _posts(self, posts):
        for author, channel, pings in posts:
            self._post(author, channel, pings)

    def _post(self, author, channel, pings):
        cid, aid = self.channels[channel], self.ids[author]
        if author != "hu" and aid not in self.agent_members[cid]:
            return
        text = " ".join(f"@{p}" for p in pings) + " news"
        mid = self.w.post(aid, cid, text)
        members = self.agent_members[cid]
        reached: set[str] = set()
        for p in pings:
            if p == "everyone":
                reached |= members
            elif p in AGENTS and self.ids[p] in members:
                reached.add(self.ids[p])
        reached.discard(aid)
        self.messages.append((mid, cid, aid, frozenset(reached)))

    def _take(self, agent_id, ack):
        session = self.w.sessions.get(agent_id)
        if session is None:
            return
        for kind, mid in self.w.got(agent_id):
            if kind == "end":
                continue
            self.received[agent_id].add(mid)
            if ack:
                self.w.ack(agent_id, mid)
                self.acked[agent_id].add(mid)

    # -- the invariants --------------------------------------------------------------------
    def teardown(self):
        try:
            self._check()
        finally:
            self.w.close()
            self.rt.stop()

    def _quiesce(self):
        for name in FAULTS:
            self.faults.disarm(name)
        self.clock.advance(30_000)
        while True:
            self.w.pump()
            moved = False
            for agent_id in list(self.w.sessions):
                before = sum(len(v) for v in self.received.values())
                self._take(agent_id, ack=False)  # a drain may ask for the next sweep page
                moved |= sum(len(v) for v in self.received.values()) != before
            if not moved and not self.w.pump():
                return

    def _check(self):
        self._quiesce()
        held = set(self.w.d.consumer.held_ids)
        with self.w.store.read() as tx:
            owed = {
                tuple(r)
                for r in tx.raw("SELECT agent_id, message_id FROM owed_mentions WHERE acked_at_ms IS NULL").fetchall()
            }
            seq = {m[0]: messages_store.message(tx, m[0])["channel_seq"] for m in self.messages}
            cursor = {
                (a, c): cursors_store.cursor(tx, a, c) for a in self.acked for c in self.agent_members
            }

        def above_cursor(agent_id, cid, mid):
            cur = cursor[(agent_id, cid)]
            return cur is not None and seq[mid] > cur.acked_seq and seq[mid] not in cur.above

        by_id = {m[0]: m for m in self.messages}
        for mid, cid, author, reached in self.messages:
            if mid in held:
                continue
            for x in reached:
                covered = mid in self.acked[x] or (x, mid) in owed or (x in self.sweep[cid] and above_cursor(x, cid, mid))
                assert covered, f"mention of {x} in {mid} is neither acked, owed nor above its cursor"
        for x, mid in owed:
            assert mid not in self.acked[x], "an acked mention is owed again"
            _, cid, author, _ = by_id[mid]
            assert x in self.agent_members[cid] and x not in self.sweep[cid] and x != author

        # Everyone reconnects: what is owed and not acked arrives, nothing acked does.
        for agent_id in list(self.w.sessions):
            self.w.disconnect(agent_id)
        self.w.pump()
        final: dict[str, set[str]] = {}
        for agent_id in self.acked:
            self.w.connect(agent_id)
        while True:
            self.w.pump()
            got = {a: {m for k, m in self.w.got(a) if k != "end"} for a in self.acked}
            if not any(got.values()):
                break
            for a, ms in got.items():
                final.setdefault(a, set()).update(ms)
        for mid, cid, author, reached in self.messages:
            for x in self.agent_members[cid]:
                if x == author:
                    assert mid not in final.get(x, set()) and mid not in self.received[x], "own message received"
                    continue
                due = x in reached or x in self.sweep[cid]
                if mid in self.acked[x]:
                    assert mid not in final.get(x, set()), "an acked message was sent again"
                elif due:
                    assert mid in final.get(x, set()), f"{mid} never reached {x}"


def test_delivery_never_drops_what_it_owes(backend_url, tmp_path):
    fresh_url = fresh_database_urls(backend_url, tmp_path, "example")

    machine = type("Machine", (DeliveryMachine,), {"make_url": staticmethod(fresh_url)})
    run_state_machine_as_test(
        machine,
        settings=settings(
            max_examples=int(os.environ.get("TIDINGS_STATEFUL_EXAMPLES", "20")),
            stateful_step_count=30,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
        ),
    )
