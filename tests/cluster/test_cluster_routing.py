"""Several real ``tidings serve`` processes on one PostgreSQL database behave as one hub:
cross-node steer and deliver, a replace across nodes, a held turn across nodes (PostgreSQL
only: clustering is a PostgreSQL feature; SQLite's one-server rule is tested in
``test_cluster_sqlite.py``)."""

from __future__ import annotations

import queue

import pytest

from cluster_harness import Cluster, iter_events


def _world(node, *, subscribe_bot: bool = True):
    alice = node.account("human", "alice")
    bot = node.account("agent", "bot", owner=alice["id"])
    watcher = node.account("agent", "watcher", owner=alice["id"])
    ch = node.channel(alice["token"], "general", [bot["id"], watcher["id"]],
                      subscribe=[watcher["id"]] + ([bot["id"]] if subscribe_bot else []))
    return alice, bot, watcher, ch


def test_a_post_on_one_node_steers_and_delivers_to_sessions_on_the_others(cluster: Cluster):
    a, b, c = cluster.start(3)
    alice, bot, watcher, ch = _world(a, subscribe_bot=False)
    bot_stream = b.session(bot["token"])
    watch_stream = c.session(watcher["token"])
    m1 = a.post(alice["token"], ch, "@bot please look")
    event, data = bot_stream.next_dispatch(10)
    assert (event, data["message"]["id"]) == ("steer", m1)
    event, data = watch_stream.next_dispatch(10)
    assert (event, data["message"]["id"]) == ("deliver", m1)
    # exactly once, and the durable effects once in the cluster: one owed row, no wake
    m2 = c.post(alice["token"], ch, "a plain one")
    assert watch_stream.next_dispatch(10)[1]["message"]["id"] == m2
    assert [e for e in iter_events(bot_stream.collect(0.5), ("steer", "deliver"))] == []
    assert a.owed(bot["id"]) == [m1]
    bot_stream.close()
    watch_stream.close()


def test_cross_node_steer_needs_the_notification(cluster: Cluster):
    """Negative control: with ``cluster.notify_off`` on the posting node, the steer to a
    session on another node does not arrive (the recovery scan is slower than the wait)."""
    (a,) = cluster.start(1, faults="cluster.notify_off", env={"TIDINGS_SCAN_INTERVAL_MS": "60000"})
    (b,) = cluster.start(1, env={"TIDINGS_SCAN_INTERVAL_MS": "60000"})
    alice, bot, _watcher, ch = _world(a, subscribe_bot=False)
    stream = b.session(bot["token"])
    a.post(alice["token"], ch, "@bot are you there")
    with pytest.raises(queue.Empty):
        stream.next_dispatch(2.0)
    stream.close()


def test_a_connect_on_another_node_replaces_the_first_session_within_2_s(cluster: Cluster):
    a, b = cluster.start(2)
    alice, bot, _watcher, ch = _world(a, subscribe_bot=False)
    first = a.session(bot["token"])
    second = b.session(bot["token"])
    event, data = first.next_dispatch(2.0)
    assert (event, data) == ("end", {"type": "end", "reason": "replaced"})
    m = a.post(alice["token"], ch, "@bot again")
    assert second.next_dispatch(10)[1]["message"]["id"] == m
    second.close()
    first.close()
