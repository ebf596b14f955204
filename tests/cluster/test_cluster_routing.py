"""Several real ``tidings serve`` processes on one PostgreSQL database behave as one hub:
cross-node steer and deliver, a replace across nodes, a held turn across nodes (PostgreSQL
only: clustering is a PostgreSQL feature; SQLite's one-server rule is tested in
``test_cluster_sqlite.py``)."""

from __future__ import annotations

import queue

import pytest
from cluster_harness import Cluster, iter_events, until


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
    session on another node does not arrive (the recovery scan is slower than the wait).
    Its owed row's hint (D123) is turned off too (``cluster.owed_hint_off``): it is the
    other notification that brings a mention to another node's session."""
    (a,) = cluster.start(1, faults="cluster.notify_off,cluster.owed_hint_off",
                         env={"TIDINGS_SCAN_INTERVAL_MS": "60000"})
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


def test_a_held_turn_reaches_no_node_before_the_authors_settle_edge(cluster: Cluster):
    a, b, c = cluster.start(3)
    alice, bot, watcher, ch = _world(a)
    bot_stream = b.session(bot["token"])
    watch_stream = c.session(watcher["token"])
    bot_stream.state("working")
    on_own_node = b.post(bot["token"], ch, "@watcher step one")
    on_other_node = a.post(bot["token"], ch, "step two")
    assert [e for e in iter_events(watch_stream.collect(1.0), ("steer", "deliver"))] == []
    bot_stream.state("ready")
    got = [watch_stream.next_dispatch(10), watch_stream.next_dispatch(10)]
    assert [(e, d["message"]["id"]) for e, d in got] == [("steer", on_own_node), ("deliver", on_other_node)]
    assert [e for e in iter_events(watch_stream.collect(0.5), ("steer", "deliver"))] == []
    bot_stream.close()
    watch_stream.close()


def test_one_wake_per_agent_across_the_cluster(cluster: Cluster, wake_recorder):
    _double_wake_scene(cluster, wake_recorder, faults="")


def test_without_the_leader_lock_an_agent_is_woken_twice(cluster: Cluster, wake_recorder):
    """Negative control: every node acting as leader wakes on its own."""
    with pytest.raises(AssertionError, match="woken"):
        _double_wake_scene(cluster, wake_recorder, faults="cluster.leader_lock_off")


def _double_wake_scene(cluster: Cluster, wake_recorder, faults: str) -> None:
    a, b, c = cluster.start(3, faults=faults)
    alice = a.account("human", "alice")
    sleeper = a.account("agent", "sleeper", owner=alice["id"], wake={"webhook": wake_recorder.url})
    ch = a.channel(alice["token"], "general", [sleeper["id"]])
    for node in (a, b, c):
        node.post(alice["token"], ch, "@sleeper wake up")
    wakes = wake_recorder.drain(2.0)
    assert wakes == [(sleeper["id"], "mention")], f"woken {len(wakes)} times: {wakes}"


def test_status_lists_the_nodes_their_sessions_and_the_leader_and_logs_carry_the_node_id(cluster: Cluster):
    a, b, c = cluster.start(3)
    alice, bot, _watcher, _ch = _world(a)
    stream = b.session(bot["token"])
    leader = cluster.leader()

    def listed():
        nodes = a.status()["cluster"]["nodes"]
        return len(nodes) == 3 and nodes
    nodes = until(listed, what="three nodes listed")
    by_id = {n["node_id"]: n for n in nodes}
    assert set(by_id) == {a.node_id, b.node_id, c.node_id}
    assert [n["node_id"] for n in nodes if n["leader"]] == [leader.node_id]
    until(lambda: {n["node_id"]: n["sessions"] for n in a.status()["cluster"]["nodes"]}
          == {a.node_id: 0, b.node_id: 1, c.node_id: 0}, what="the session counted on its node")
    for n in nodes:
        assert n["started_at_ms"] <= n["heartbeat_at_ms"] and n["address"].startswith("http://127.0.0.1:")
    def bot_row():
        r = a.http.get("/api/v1/agents", headers={"Authorization": f"Bearer {alice['token']}"})
        return next(x for x in r.json()["agents"] if x["id"] == bot["id"])
    row = until(lambda: bot_row()["live"] and bot_row(), what="the page's agent row live")
    assert row["node"] == b.node_id  # the page shows which node holds the session
    stream.close()
    assert f'"node_id": "{b.node_id}"' in b.log() or f"node_id={b.node_id}" in b.log()


def test_a_lost_listener_connection_is_an_overrun_that_resweeps_the_sessions(cluster: Cluster):
    a, b = cluster.start(2)
    alice, _bot, watcher, ch = _world(a)
    stream = b.session(watcher["token"])
    b_id = b.node_id
    import psycopg

    with psycopg.connect(cluster.db_url.replace("postgresql://", "postgresql://", 1), autocommit=True) as conn:
        killed = conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE application_name = %s AND query LIKE 'LISTEN%%'", (b_id,)).fetchall()
    assert killed == [(True,)]
    m = a.post(alice["token"], ch, "posted while the listener is down")
    event, data = stream.next_dispatch(10)
    assert (event, data["message"]["id"]) == ("deliver", m)
    status = b.status()
    assert status["cluster"]["this_node"]["listener_reconnects"] >= 1
    assert status["delivery"]["overruns_handled"] >= 1
    stream.close()


def _owed_late_scene(cluster: Cluster, faults: str):
    """The posting node's mention pass fails once (``delivery.route_error:1``), so the owed
    row is written later, by the leader's recovery scan, after the agent has connected on
    another node whose start sweep found nothing owed and whose copy of the post's
    notification found no session there. (The watcher's deliver on ``b`` proves ``b``
    handled the post before the bot connected; the scan leaves the message to its posting
    node for ``TIDINGS_DEAD_AFTER_MS``, 5 s, ample time for the bot to connect first.)"""
    slow = {"TIDINGS_DEAD_AFTER_MS": "5000"}
    (a,) = cluster.start(1, faults=",".join(["delivery.route_error:1", *filter(None, [faults])]), env=slow)
    until(a.is_leader, 15, what="a leads")
    (b,) = cluster.start(1, env=slow)
    alice, bot, watcher, ch = _world(a, subscribe_bot=False)
    watch_stream = b.session(watcher["token"])
    m = a.post(alice["token"], ch, "@bot owed late")
    event, data = watch_stream.next_dispatch(10)
    assert (event, data["message"]["id"]) == ("deliver", m)  # b has handled the post: no bot session then
    assert a.owed(bot["id"]) == []  # the mention pass failed: nothing owed yet
    bot_stream = b.session(bot["token"])
    watch_stream.close()
    return a, bot, m, bot_stream


def test_a_mention_owed_after_the_agent_connected_elsewhere_is_steered_to_that_session(cluster: Cluster):
    """The owed row's statement notifies its agent, and the node holding the agent's
    session steers it, once (D123)."""
    a, bot, m, bot_stream = _owed_late_scene(cluster, faults="")
    event, data = bot_stream.next_dispatch(20)  # the scan routes it after 5 s; the hint brings it here
    assert (event, data["message"]["id"]) == ("steer", m)
    assert a.owed(bot["id"]) == [m]
    assert [e for e in iter_events(bot_stream.collect(1.0), ("steer",))] == []  # once
    bot_stream.close()


def test_without_the_owed_hint_the_late_owed_mention_waits_for_a_reconnect(cluster: Cluster):
    """Negative control of D123: with ``cluster.owed_hint_off`` on the node that records
    the row, the mention is owed but the live session on the other node never gets it."""
    a, bot, m, bot_stream = _owed_late_scene(cluster, faults="cluster.owed_hint_off")
    until(lambda: a.owed(bot["id"]) == [m], 20, what="the scan recorded the owed row")
    with pytest.raises(queue.Empty):
        bot_stream.next_dispatch(2.0)
    bot_stream.close()
