"""Two cluster nodes draining one bridge's backlog (``ingest/cluster_drain.py``): frames of
one bridge are applied by one node at a time, each exactly once, in receipt order. Each
node is an ``Ingest`` of its own on the one store (both backends: on SQLite the single
writer already serialises, on PostgreSQL the bridge lock does)."""

from __future__ import annotations

import threading

from test_worker import Rig, Script


class Contended(Script):
    """While node A projects frame f0, it waits (bounded) for node B to decode f0."""

    def __init__(self) -> None:
        super().__init__()
        self.b_decoded_f0 = threading.Event()
        self.a_inside_f0 = threading.Event()
        self.node = threading.local()
        self.projected: list[str] = []

    def decode(self, codec, version, payload):
        events = super().decode(codec, version, payload)
        if getattr(self.node, "name", "") == "b" and events[0]["id"] == "f0":
            self.b_decoded_f0.set()
        return events

    def project(self, tx, ctx, events):
        if getattr(self.node, "name", "") == "a" and events[0]["id"] == "f0" and not self.a_inside_f0.is_set():
            self.a_inside_f0.set()
            self.b_decoded_f0.wait(2.0)  # B may only get here if nothing holds it back
        with self.lock:
            # Projected under the bridge lock, which is held to the commit: this is the
            # commit order. (``applied_order`` is appended after each commit, on each
            # node's own thread, so two nodes' callbacks may land in either order.)
            self.projected.append(events[0]["id"])
        return super().project(tx, ctx, events)


def test_two_nodes_drain_one_bridge_one_frame_at_a_time_once_each_in_order(store):
    rig = Rig(store, store.clock, store.faults)
    rig.script = script = Contended()
    rig.ingest.stop()
    node_a, node_b = rig._build(), rig._build()
    for node in (node_a, node_b):
        node.worker.across_nodes = True
    frames = [f"f{i}" for i in range(12)]
    for fid in frames:
        rig.append(fid)

    def drain(name, node, started=None):
        script.node.name = name
        if started is not None:
            started.wait(10)
        node.drain()

    a = threading.Thread(target=drain, args=("a", node_a))
    b = threading.Thread(target=drain, args=("b", node_b, script.a_inside_f0))
    a.start()
    b.start()
    a.join(30)
    b.join(30)
    assert not a.is_alive() and not b.is_alive()
    assert script.decodes["f0"] == 1, "node B decoded f0 while node A was applying it"
    assert script.projected == frames  # applied one at a time, in receipt order, each once
    assert sorted(script.applied_order) == sorted(frames)
    for fid in frames:
        assert rig.rows(fid) == ["message", "reactions"]
    node_a.stop()
    node_b.stop()
