"""``tidings.client.Agent`` against a live hub: handler calls, ack after return, a raising
handler, dedupe across reconnects with re-ack, turn states, a server restart, auth errors,
replacement by another connection."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from clientkit import ADMIN_TOKEN, WAIT, Hub, Recorder, auth, build_world, post_into_store

from live import SSEStream
from tidings.client import Agent, AuthError


def start(agent: Agent, handler) -> None:
    agent.on_message(handler)
    agent.run_in_thread()
    assert agent.wait_connected(WAIT)


def test_handler_gets_deliver_and_steer_and_the_ack_follows_its_return(world, agents):
    hub, bot = world.hub, world.bot
    gates = {"deliver": threading.Event(), "steer": threading.Event()}
    recorder = Recorder(lambda event: gates[event.kind].wait(WAIT))
    agent, wire, _ = agents(hub.url, bot["token"])
    start(agent, recorder)

    d = hub.post(world.alice["token"], world.home, "plain news")
    assert recorder.wait_for(d)
    event = recorder.events[0]
    assert (event.kind, event.channel_id, event.text, event.author_id) == (
        "deliver", world.home, "plain news", world.alice["id"])
    assert event.session_id == agent.session_id and event.seq == 1
    assert hub.acked_seq(bot["id"], world.home) == 0  # the handler is still running: no ack
    assert wire.entries("ack") == []
    gates["deliver"].set()
    assert wire.wait_for("ack", d)
    assert hub.acked_seq(bot["id"], world.home) == 1

    s = hub.post(world.alice["token"], world.gap, "@bot what's for dinner?")
    assert recorder.wait_for(s)
    event = recorder.events[1]
    assert (event.kind, event.is_steer, event.channel_id, event.text) == (
        "steer", True, world.gap, "@bot what's for dinner?")
    hub.runtime.delivery.wait_idle()  # the steer is queued before its owed row's flush commits
    assert hub.owed(bot["id"]) == [s]  # still owed while the handler runs
    gates["steer"].set()
    assert wire.wait_for("ack", s)
    assert hub.owed(bot["id"]) == []
    assert agent.owed() == [] and agent.stats["handled"] == 2


def test_turn_states_and_replies_are_routed_when_the_turn_settles(world, agents):
    hub, bot = world.hub, world.bot
    listener = hub.account("agent", "listener", owner=world.alice["id"])
    room = hub.channel(world.alice["token"], "room", [bot["id"], listener["id"]], subscribe=[listener["id"]])
    agent, wire, _ = agents(hub.url, bot["token"])
    start(agent, lambda event: agent.post(event.channel_id, f"got: {event.text}"))

    with SSEStream(f"{hub.url}/api/v1/session", auth(listener["token"])) as stream:
        assert stream.next()[0] == "session"
        ask = hub.post(world.alice["token"], room, "@bot ping")
        assert stream.next()[1]["message"]["id"] == ask  # the listener follows the room
        event, data = stream.next(WAIT)  # bot's reply: held during its turn, routed at ready
        assert (event, data["message"]["text"]) == ("deliver", "got: @bot ping")
        assert wire.wait_for("state", "ready")
        turn = [e[1:] for e in wire.log if e[1] in ("state", "post", "ack")]
        assert turn == [("state", "working"), ("post", "got: @bot ping"), ("ack", ask), ("state", "ready")]

        # a post outside any handler reports ready itself, so it is not held until a turn
        agent.post(room, "unprompted")
        event, data = stream.next(WAIT)
        assert (event, data["message"]["text"]) == ("deliver", "unprompted")
        assert wire.entries("state") == ["working", "ready", "ready"]

    status = hub.delivery()
    assert status["held"] == 2 and status["settled"] == 2 and status["held_now"] == 0
    assert agent.set_state("working") is True and agent.set_state("ready") is True
    with pytest.raises(ValueError):
        agent.set_state("napping")


def test_a_raising_handler_leaves_the_message_unacked_and_it_comes_back_on_reconnect(world, agents, caplog):
    hub, bot = world.hub, world.bot
    failures = []

    def flaky(event):
        if not failures:
            failures.append(event.message_id)
            raise RuntimeError("the model timed out")

    recorder = Recorder(flaky)
    agent, wire, sleeper = agents(hub.url, bot["token"])
    start(agent, recorder)
    with caplog.at_level(logging.ERROR, logger="tidings.client"):
        m = hub.post(world.alice["token"], world.gap, "@bot summarise the thread")
        assert recorder.wait_for(m)
        # handled after m's failure is dealt with (one thread, in order): a barrier
        barrier = hub.post(world.alice["token"], world.home, "barrier")
        assert recorder.wait_for(barrier) and wire.wait_for("ack", barrier)
    assert wire.entries("ack") == [barrier]  # never m
    assert hub.owed(bot["id"]) == [m]
    assert agent.stats["handler_errors"] == 1
    assert any("handler raised" in r.getMessage() and m in r.getMessage() for r in caplog.records)
    assert any(r.exc_info and "model timed out" in str(r.exc_info[1]) for r in caplog.records)

    agent.reconnect()  # the server sends the unacked mention again, in the new session
    assert recorder.wait_for(m, times=2) and wire.wait_for("ack", m)
    assert [e.kind for e in recorder.events if e.message_id == m] == ["steer", "steer"]
    assert hub.owed(bot["id"]) == [] and recorder.count(barrier) == 1
    assert agent.stats["sessions"] == 2 and sleeper.delays == []  # a requested reconnect has no backoff


def test_a_duplicate_after_a_lost_ack_is_acked_again_but_not_handled_again(world, agents):
    hub, bot = world.hub, world.bot
    recorder = Recorder()
    agent, wire, _ = agents(hub.url, bot["token"])
    start(agent, recorder)
    wire.lose_acks = True  # the acks are lost in flight: the server never hears them
    m = hub.post(world.alice["token"], world.gap, "@bot once only")
    d = hub.post(world.alice["token"], world.home, "also once")
    assert recorder.wait_for(m, d) and wire.wait_for("ack-lost", m) and wire.wait_for("ack-lost", d)
    assert hub.owed(bot["id"]) == [m] and hub.acked_seq(bot["id"], world.home) == 0

    wire.lose_acks = False
    agent.reconnect()  # the server re-sends both: the dedupe absorbs them and re-acks
    assert wire.wait_for("ack", m) and wire.wait_for("ack", d)
    assert sorted(recorder.ids()) == sorted([m, d])  # once each (steers and delivers may interleave)
    assert agent.stats["duplicates"] == 2
    assert hub.owed(bot["id"]) == [] and hub.acked_seq(bot["id"], world.home) == 1


def test_an_ack_that_fails_on_the_network_is_retried_with_the_next_one(world, agents):
    hub, bot = world.hub, world.bot
    recorder = Recorder()
    agent, wire, _ = agents(hub.url, bot["token"])
    start(agent, recorder)
    wire.fail_acks = True
    first = hub.post(world.alice["token"], world.home, "first")
    assert recorder.wait_for(first) and wire.wait_for("ack-failed", first)
    assert hub.acked_seq(bot["id"], world.home) == 0 and agent.stats["ack_failures"] == 1
    wire.fail_acks = False
    second = hub.post(world.alice["token"], world.home, "second")
    assert wire.wait_for("ack", second) and wire.wait_for("ack", first)
    assert hub.acked_seq(bot["id"], world.home) == 2
    assert recorder.ids() == [first, second]


def test_through_a_server_restart_the_agent_reconnects_and_gets_what_was_posted_while_down(backend_url, agents):
    recorder = Recorder()
    with Hub(backend_url) as hub:
        world = build_world(hub)
        agent, wire, sleeper = agents(hub.url, world.bot["token"])
        sessions = []
        agent.on_session(sessions.append)
        start(agent, recorder)
        before = hub.post(world.alice["token"], world.home, "before the restart")
        assert recorder.wait_for(before) and wire.wait_for("ack", before)
        sleeper.hold()  # the next backoff waits for the test
    # uvicorn stopped: the open stream was cut; the client is in its backoff
    assert sleeper.wait_calls(1)
    assert not agent.connected
    plain = post_into_store(backend_url, world.alice["id"], world.home, "while you were away")
    mention = post_into_store(backend_url, world.alice["id"], world.gap, "@bot call me back")
    sleeper.allow(2)  # two attempts against the dead port, refused, each backing off further
    assert sleeper.wait_calls(3)
    assert sleeper.delays[1] > sleeper.delays[0] and sleeper.delays[2] > sleeper.delays[1]

    with Hub(backend_url, port=hub.port) as hub2:
        sleeper.release()
        assert recorder.wait_for(plain, mention)
        assert wire.wait_for("ack", plain) and wire.wait_for("ack", mention)
        live = hub2.post(world.alice["token"], world.home, "after the restart")
        assert recorder.wait_for(live) and wire.wait_for("ack", live)
        assert recorder.ids() == [before, plain, mention, live]  # each exactly once
        assert [e.kind for e in recorder.events] == ["deliver", "deliver", "steer", "deliver"]
        assert hub2.owed(world.bot["id"]) == [] and hub2.acked_seq(world.bot["id"], world.home) == 3
        assert agent.stats["sessions"] == 2 and agent.stats["duplicates"] == 0
        assert len(sessions) == 2 and sessions[1] == agent.session_id != sessions[0]
        assert wire.entries("session") == [200, 200]  # the refused attempts never got an answer
        agent.stop()
        assert agent.end_reason == "stopped"


def test_a_bad_token_raises_auth_error_at_once(world, agents):
    hub = world.hub
    agent, _, sleeper = agents(hub.url, "tdg_not_a_token")
    agent.on_message(lambda event: None)
    with pytest.raises(AuthError) as raised:
        agent.run()
    assert raised.value.status == 401 and sleeper.delays == []

    human, _, sleeper = agents(hub.url, world.alice["token"])  # a token, but not an agent's
    human.on_message(lambda event: None)
    human.run_in_thread()
    with pytest.raises(AuthError) as raised:
        human.wait(WAIT)
    assert (raised.value.status, raised.value.code) == (403, "agent_only") and sleeper.delays == []

    with pytest.raises(AuthError):
        agent.post(world.home, "hello")


def test_replaced_by_another_connection_stops_unless_told_to_reconnect(world, agents):
    hub, bot = world.hub, world.bot
    agent, _, sleeper = agents(hub.url, bot["token"])
    start(agent, Recorder())
    with SSEStream(f"{hub.url}/api/v1/session", auth(bot["token"])) as other:
        assert other.next()[0] == "session"
        assert agent.wait(WAIT)  # run() returned
        assert agent.end_reason == "replaced" and sleeper.delays == []

    fighter, _, sleeper = agents(hub.url, bot["token"], on_replaced="reconnect")
    start(fighter, Recorder())
    first = fighter.session_id
    with SSEStream(f"{hub.url}/api/v1/session", auth(bot["token"])) as other:
        assert other.next()[0] == "session"
        assert other.next(WAIT) == ("end", {"type": "end", "reason": "replaced"})  # the fighter came back
        assert fighter.wait_connected(WAIT) and sleeper.wait_calls(1)
    assert fighter.session_id not in (None, first)
    assert fighter.stats["sessions"] == 2


def test_helpers_post_read_owed_and_idempotent_post(world, agents):
    hub, bot = world.hub, world.bot
    agent, wire, _ = agents(hub.url, bot["token"])
    assert agent.account_id == bot["id"]
    m = hub.post(world.alice["token"], world.gap, "@bot owed to you")
    hub.delivery()
    assert [o["message_id"] for o in agent.owed()] == [m]
    first = agent.post(world.gap, "reply", client_request_id="req-1")
    again = agent.post(world.gap, "reply", client_request_id="req-1")
    assert first == again
    assert [x["text"] for x in agent.read(world.gap)] == ["@bot owed to you", "reply"]
    assert [x["text"] for x in agent.read(world.gap, after_seq=1)] == ["reply"]
    assert agent.ack(m)["owed_cleared"] is True and agent.owed() == []
    assert world.gap in {c["id"] for c in agent.channels()}
    r = hub.http.get(f"/api/v1/agents/{bot['id']}/owed", headers=auth(ADMIN_TOKEN))
    assert r.json() == {"owed": []}


def test_stop_during_a_handler_lets_it_finish_acks_it_and_takes_nothing_more(world, agents):
    hub, bot = world.hub, world.bot
    gate = threading.Event()
    recorder = Recorder(lambda event: gate.wait(WAIT))
    agent, wire, _ = agents(hub.url, bot["token"])
    start(agent, recorder)
    m = hub.post(world.alice["token"], world.home, "slow one")
    assert recorder.wait_for(m)
    later = hub.post(world.alice["token"], world.home, "arrives during the stop")
    agent.stop(timeout=0)
    gate.set()
    assert agent.wait(WAIT) and agent.end_reason == "stopped"
    assert recorder.ids() == [m] and wire.entries("ack") == [m]
    assert hub.acked_seq(bot["id"], world.home) == 1  # `later` waits for the next session

    agent.run_in_thread()  # the same agent runs again
    assert recorder.wait_for(later) and wire.wait_for("ack", later)
    assert recorder.ids() == [m, later]


def test_the_echo_example_answers_a_mention_and_stops_cleanly_on_ctrl_c(world):
    hub = world.hub
    echo = hub.account("agent", "echo", owner=world.alice["id"])
    listener = hub.account("agent", "listener", owner=world.alice["id"])
    room = hub.channel(world.alice["token"], "room", [echo["id"], listener["id"]], subscribe=[listener["id"]])
    script = Path(__file__).resolve().parents[2] / "examples" / "echo_agent.py"
    env = {**os.environ, "TIDINGS_URL": hub.url, "TIDINGS_TOKEN": echo["token"]}
    with SSEStream(f"{hub.url}/api/v1/session", auth(listener["token"])) as stream:
        assert stream.next()[0] == "session"
        proc = subprocess.Popen([sys.executable, str(script)], env=env, stderr=subprocess.PIPE, text=True)
        try:
            ask = hub.post(world.alice["token"], room, "@echo hello there")  # owed until it connects
            assert stream.next(WAIT)[1]["message"]["id"] == ask
            event, data = stream.next(WAIT)
            assert (event, data["message"]["text"], data["message"]["author_account_id"]) == (
                "deliver", "echo: hello there", echo["id"])
            proc.send_signal(signal.SIGINT)
            assert proc.wait(WAIT) == 0, proc.stderr.read()
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert hub.owed(echo["id"]) == []
    assert "session" in proc.stderr.read()  # it logged its session


def test_the_echo_example_answers_a_mention_it_missed_while_offline_in_a_subscribed_channel(world):
    # The README tour, step 4: the agent follows the channel, is offline when mentioned, and
    # its next session gets the mention as a steer (D54), so the example answers it.
    hub = world.hub
    echo = hub.account("agent", "echo", owner=world.alice["id"])
    listener = hub.account("agent", "listener", owner=world.alice["id"])
    room = hub.channel(world.alice["token"], "room", [echo["id"], listener["id"]],
                       subscribe=[echo["id"], listener["id"]])
    plain = hub.post(world.alice["token"], room, "plain news first")
    ask = hub.post(world.alice["token"], room, "@echo are you there?")
    assert hub.owed(echo["id"]) == []  # subscribed: nothing is owed, the cursor carries it
    script = Path(__file__).resolve().parents[2] / "examples" / "echo_agent.py"
    env = {**os.environ, "TIDINGS_URL": hub.url, "TIDINGS_TOKEN": echo["token"]}
    with SSEStream(f"{hub.url}/api/v1/session", auth(listener["token"])) as stream:
        assert stream.next()[0] == "session"
        assert [stream.next(WAIT)[1]["message"]["id"] for _ in range(2)] == [plain, ask]
        proc = subprocess.Popen([sys.executable, str(script)], env=env, stderr=subprocess.PIPE, text=True)
        try:
            event, data = stream.next(WAIT)
            assert (event, data["message"]["text"], data["message"]["author_account_id"], data["mentions_you"]) == (
                "deliver", "echo: are you there?", echo["id"], False)
            proc.send_signal(signal.SIGINT)
            assert proc.wait(WAIT) == 0, proc.stderr.read()
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert hub.acked_seq(echo["id"], room) == 3  # both acked; its own echo (seq 3) counts too


def test_events_carry_mentions_you(world, agents):
    hub, bot = world.hub, world.bot
    recorder = Recorder(lambda event: None)
    agent, _, _ = agents(hub.url, bot["token"])
    start(agent, recorder)
    d = hub.post(world.alice["token"], world.home, "plain news")
    s = hub.post(world.alice["token"], world.home, "@bot you there?")
    assert recorder.wait_for(s)
    assert [(e.message_id, e.kind, e.mentions_you) for e in recorder.events] == [
        (d, "deliver", False), (s, "steer", True)]
