"""Channel pins and ask blocks over HTTP (issue 16), both backends: limits, permissions,
the answer's exactly-once rule, and a clear 4xx in the one envelope for bad input."""

from __future__ import annotations

import pytest

from helpers import auth, create_account, create_channel, post_text
from tidings.hub.events import AskAnswered, PinsChanged

ADMIN = "tdg_test_admin"


def error_of(r) -> str:
    body = r.json()
    assert set(body) == {"error"} and {"code", "message"} <= set(body["error"]), body
    return body["error"]["code"]


@pytest.fixture
def scene(client):
    """owner ``olga`` (channel owner), member ``mia``, agent ``bot`` (member), outsider ``otto``."""
    olga = create_account(client, "human", "olga", admin_token=ADMIN)
    mia = create_account(client, "human", "mia", admin_token=ADMIN)
    otto = create_account(client, "human", "otto", admin_token=ADMIN)
    bot = create_account(client, "agent", "bot", admin_token=ADMIN, owner=olga["id"])
    ch = create_channel(client, olga["token"], "ops", members=[mia["id"], bot["id"]])
    return {"olga": olga, "mia": mia, "otto": otto, "bot": bot, "ch": ch}


def _events(sub, kind):
    """Every payload of type ``kind`` the subscription saw (its replay, then live)."""
    got = [e.payload for e in sub.replay]
    while (e := sub.get_nowait()) is not None:
        got.append(e.payload)
    return [p for p in got if isinstance(p, kind)]


def _pin(client, token, ch, mid):
    return client.post(f"/api/v1/channels/{ch}/pins/{mid}", headers=auth(token))


def test_pins_are_ordered_at_most_five_and_the_sixth_is_a_clear_409(client, scene):
    s = scene
    ids = [post_text(client, s["mia"]["token"], s["ch"], f"rule {i}")["id"] for i in range(6)]
    for mid in reversed(ids[:5]):
        r = _pin(client, s["olga"]["token"], s["ch"], mid)
        assert r.status_code == 200 and r.json()["created"] is True, r.text
    r = _pin(client, s["olga"]["token"], s["ch"], ids[5])
    assert r.status_code == 409 and error_of(r) == "too_many_pins"
    r = client.get(f"/api/v1/channels/{s['ch']}/pins", headers=auth(s["mia"]["token"]))
    assert r.status_code == 200
    pins = r.json()["pins"]
    assert [p["message_id"] for p in pins] == list(reversed(ids[:5]))  # pin order = position order
    assert [p["position"] for p in pins] == sorted(p["position"] for p in pins)
    assert pins[0]["message"]["text"] == "rule 4" and pins[0]["pinned_by"] == s["olga"]["id"]
    # pinning again is a no-op; unpinning frees a place, and a new pin goes last
    r = _pin(client, s["olga"]["token"], s["ch"], ids[0])
    assert r.status_code == 200 and r.json()["created"] is False
    r = client.delete(f"/api/v1/channels/{s['ch']}/pins/{ids[2]}", headers=auth(s["olga"]["token"]))
    assert r.status_code == 200 and r.json()["removed"] is True
    r = client.delete(f"/api/v1/channels/{s['ch']}/pins/{ids[2]}", headers=auth(s["olga"]["token"]))
    assert r.status_code == 200 and r.json()["removed"] is False
    r = _pin(client, s["olga"]["token"], s["ch"], ids[5])
    assert r.status_code == 200
    assert [p["message_id"] for p in r.json()["pins"]] == [ids[4], ids[3], ids[1], ids[0], ids[5]]


def test_members_read_pins_only_the_owner_and_the_admin_change_them(client, scene):
    s = scene
    mid = post_text(client, s["mia"]["token"], s["ch"], "standing order")["id"]
    r = _pin(client, s["mia"]["token"], s["ch"], mid)
    assert r.status_code == 403 and error_of(r) == "not_channel_owner"
    r = _pin(client, s["bot"]["token"], s["ch"], mid)
    assert r.status_code == 403 and error_of(r) == "not_channel_owner"
    r = _pin(client, s["otto"]["token"], s["ch"], mid)
    assert r.status_code == 404 and error_of(r) == "unknown_channel"
    r = client.get(f"/api/v1/channels/{s['ch']}/pins", headers=auth(s["otto"]["token"]))
    assert r.status_code == 404
    r = _pin(client, ADMIN, s["ch"], mid)
    assert r.status_code == 200 and r.json()["pins"][0]["message_id"] == mid
    r = client.delete(f"/api/v1/channels/{s['ch']}/pins/{mid}", headers=auth(s["mia"]["token"]))
    assert r.status_code == 403
    for token in (s["mia"]["token"], s["bot"]["token"], ADMIN):
        r = client.get(f"/api/v1/channels/{s['ch']}/pins", headers=auth(token))
        assert r.status_code == 200 and [p["message_id"] for p in r.json()["pins"]] == [mid]
    r = client.delete(f"/api/v1/channels/{s['ch']}/pins/{mid}", headers=auth(s["olga"]["token"]))
    assert r.status_code == 200 and r.json()["pins"] == []


def test_a_pin_of_an_unknown_or_foreign_message_is_a_404_and_changes_publish(client, scene, runtime):
    s = scene
    other = create_channel(client, s["mia"]["token"], "elsewhere")
    foreign = post_text(client, s["mia"]["token"], other, "not here")["id"]
    for mid in ("msg_nope", foreign):
        r = _pin(client, s["olga"]["token"], s["ch"], mid)
        assert r.status_code == 404 and error_of(r) == "unknown_message"
    mid = post_text(client, s["mia"]["token"], s["ch"], "pin me")["id"]
    sub = runtime.bus.subscribe(0)
    _pin(client, s["olga"]["token"], s["ch"], mid)
    _pin(client, s["olga"]["token"], s["ch"], mid)  # a no-op publishes nothing
    client.delete(f"/api/v1/channels/{s['ch']}/pins/{mid}", headers=auth(s["olga"]["token"]))
    assert _events(sub, PinsChanged) == [PinsChanged(s["ch"], mid, True), PinsChanged(s["ch"], mid, False)]


ASK = {"kind": "ask", "ask": {"questions": [
    {"id": "go", "text": "Deploy to prod?", "options": ["yes", "no"]},
    {"id": "why", "text": "Anything to tell @mia first?"},
], "answered": False}}


def _post_ask(client, token, ch, blocks=None):
    r = client.post(f"/api/v1/channels/{ch}/messages", json={"blocks": blocks or [
        {"kind": "text", "text": "Before I ship:"}, ASK]}, headers=auth(token))
    assert r.status_code == 201, r.text
    return r.json()["message"]


def test_an_ask_block_gets_an_id_and_its_questions_join_the_text(client, scene):
    msg = _post_ask(client, scene["bot"]["token"], scene["ch"])
    ask = msg["blocks"][1]["ask"]
    assert ask["ask_id"].startswith("ask_") and ask["answered"] is False
    assert ask["questions"][0] == {"id": "go", "text": "Deploy to prod?", "options": ["yes", "no"]}
    assert msg["text"] == "Before I ship:\nDeploy to prod?\nAnything to tell @mia first?"


@pytest.mark.parametrize("bad", [
    {"kind": "ask"},
    {"kind": "ask", "ask": {"questions": []}},
    {"kind": "ask", "ask": {"questions": [{"id": "a", "text": "x"}], "answered": True}},
    {"kind": "ask", "ask": {"questions": [{"id": "a", "text": "x"}], "ask_id": "ask_mine"}},
    {"kind": "ask", "ask": {"questions": [{"id": "a", "text": "x"}, {"id": "a", "text": "y"}]}},
    {"kind": "ask", "ask": {"questions": [{"id": "a", "text": "x", "options": []}]}},
    {"kind": "ask", "ask": {"questions": [{"id": "a", "text": " "}]}},
    {"kind": "ask", "ask": {"questions": [{"id": "a", "text": "x", "options": ["y", "y"]}]}},
    {"kind": "ask", "ask": {"questions": ["a"]}},
])
def test_a_malformed_ask_block_is_a_400_and_posts_nothing(client, scene, bad):
    r = client.post(f"/api/v1/channels/{scene['ch']}/messages", json={"blocks": [bad]},
                    headers=auth(scene["bot"]["token"]))
    assert r.status_code == 400 and error_of(r) == "bad_blocks", r.text
    r = client.get(f"/api/v1/channels/{scene['ch']}/messages", headers=auth(scene["mia"]["token"]))
    assert r.json()["messages"] == []


def _answer(client, token, mid, ask_id, answers):
    return client.post(f"/api/v1/messages/{mid}/asks/{ask_id}/answer", json={"answers": answers},
                       headers=auth(token))


def test_any_member_but_the_asker_answers_exactly_once_then_409(client, scene, runtime):
    s = scene
    msg = _post_ask(client, s["bot"]["token"], s["ch"])
    ask_id = msg["blocks"][1]["ask"]["ask_id"]
    good = {"go": "yes", "why": "all clear"}
    r = _answer(client, s["bot"]["token"], msg["id"], ask_id, good)
    assert r.status_code == 403 and error_of(r) == "own_ask"
    r = _answer(client, s["otto"]["token"], msg["id"], ask_id, good)
    assert r.status_code == 404
    sub = runtime.bus.subscribe(0)
    clock_now = runtime.clock.now_ms()
    r = _answer(client, s["mia"]["token"], msg["id"], ask_id, good)
    assert r.status_code == 200, r.text
    ask = r.json()["ask"]
    assert ask["answered"] is True and ask["answered_by"] == s["mia"]["id"] and ask["answered_at_ms"] == clock_now
    assert ask["answers"] == good
    assert _events(sub, AskAnswered) == [AskAnswered(msg["id"], s["ch"], ask_id, s["bot"]["id"])]
    r = _answer(client, s["olga"]["token"], msg["id"], ask_id, {"go": "no", "why": "wait"})
    assert r.status_code == 409 and error_of(r) == "already_answered"
    r = client.get(f"/api/v1/messages/{msg['id']}", headers=auth(s["olga"]["token"]))
    stored = r.json()["message"]
    assert stored["blocks"][1]["ask"]["answers"] == good and "edited_at_ms" not in stored


@pytest.mark.parametrize("answers,code", [
    ({"go": "maybe", "why": "x"}, "bad_answers"),
    ({"go": "yes"}, "bad_answers"),
    ({"go": "yes", "why": "x", "extra": "y"}, "bad_answers"),
    ({"go": "yes", "why": ""}, "bad_answers"),
    (["yes"], "bad_answers"),
])
def test_a_bad_answer_is_a_400_and_leaves_the_ask_open(client, scene, answers, code):
    s = scene
    msg = _post_ask(client, s["bot"]["token"], s["ch"])
    ask_id = msg["blocks"][1]["ask"]["ask_id"]
    r = _answer(client, s["mia"]["token"], msg["id"], ask_id, answers)
    assert r.status_code == 400 and error_of(r) == code
    r = _answer(client, s["mia"]["token"], msg["id"], "ask_unknown", {"go": "yes", "why": "x"})
    assert r.status_code == 404 and error_of(r) == "unknown_ask"
    r = _answer(client, s["mia"]["token"], msg["id"], ask_id, {"go": "no", "why": "later"})
    assert r.status_code == 200


def test_the_page_stream_turns_a_pin_change_into_a_pins_event_for_members_only(client, scene, runtime):
    from tidings.bus import Stamped
    from tidings.hub.channels import visible_events
    from tidings.hub.tokens import authenticate

    s = scene
    mid = post_text(client, s["mia"]["token"], s["ch"], "pin me")["id"]
    stamped = Stamped(7, 0, 1, PinsChanged(s["ch"], mid, True))
    for name in ("mia", "olga"):
        who = authenticate(runtime.store, s[name]["token"])
        assert visible_events(runtime.store, who, [stamped]) == [
            {"page_event": "pins", "channel_id": s["ch"], "message_id": mid, "pinned": True, "bus_seq": 7}]
    assert visible_events(runtime.store, authenticate(runtime.store, s["otto"]["token"]), [stamped]) == []


def test_only_the_asking_agent_acks_its_answer_and_a_bad_ack_is_a_4xx(client, scene):
    s = scene
    other_bot = create_account(client, "agent", "otherbot", admin_token=ADMIN, owner=s["olga"]["id"])
    msg = _post_ask(client, s["bot"]["token"], s["ch"])
    ask_id = msg["blocks"][1]["ask"]["ask_id"]
    r = client.post("/api/v1/ack", json={"message_id": msg["id"], "ask_id": ask_id}, headers=auth(s["bot"]["token"]))
    assert r.status_code == 404 and error_of(r) == "unknown_answer"  # not answered yet: nothing owed
    assert _answer(client, s["mia"]["token"], msg["id"], ask_id, {"go": "yes", "why": "ok"}).status_code == 200
    r = client.post("/api/v1/ack", json={"message_id": msg["id"], "ask_id": ask_id},
                    headers=auth(other_bot["token"]))
    assert r.status_code == 404 and error_of(r) == "unknown_answer"
    r = client.post("/api/v1/ack", json={"message_id": msg["id"], "ask_id": 5}, headers=auth(s["bot"]["token"]))
    assert r.status_code == 400 and error_of(r) == "bad_message_id"
    r = client.post("/api/v1/ack", json={"message_id": msg["id"], "ask_id": ask_id}, headers=auth(s["bot"]["token"]))
    assert r.status_code == 200 and r.json()["answer_cleared"] is True
    r = client.post("/api/v1/ack", json={"message_id": msg["id"], "ask_id": ask_id}, headers=auth(s["bot"]["token"]))
    assert r.status_code == 200 and r.json()["answer_cleared"] is False


def _race(n, fn):
    """Run ``fn(i)`` on ``n`` threads released together; the results (or exceptions)."""
    import threading

    gate = threading.Barrier(n)
    out: list = [None] * n

    def run(i):
        gate.wait(10)
        try:
            out[i] = fn(i)
        except Exception as exc:  # noqa: BLE001 - collected for the assertion
            out[i] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(30)
    return out


def test_racing_answers_and_racing_pins_keep_exactly_once_and_at_most_five(client, scene, runtime):
    from tidings.errors import Conflict
    from tidings.hub import asks as asks_hub
    from tidings.hub import pins as pins_hub
    from tidings.hub.tokens import authenticate

    s = scene
    msg = _post_ask(client, s["bot"]["token"], s["ch"])
    ask_id = msg["blocks"][1]["ask"]["ask_id"]
    people = [authenticate(runtime.store, s[n]["token"]) for n in ("mia", "olga")]
    results = _race(2, lambda i: asks_hub.answer(runtime.store, runtime.bus, people[i], msg["id"], ask_id,
                                                 {"go": ["yes", "no"][i], "why": "race"}))
    assert sum(isinstance(r, dict) for r in results) == 1
    assert sum(isinstance(r, Conflict) and r.code == "already_answered" for r in results) == 1
    with runtime.store.read() as tx:
        assert tx.raw("SELECT COUNT(*) FROM ask_answers").fetchone()[0] == 1

    ids = [post_text(client, s["mia"]["token"], s["ch"], f"p{i}")["id"] for i in range(7)]
    owner = authenticate(runtime.store, s["olga"]["token"])
    for mid in ids[:3]:
        pins_hub.pin(runtime.store, runtime.bus, owner, s["ch"], mid)
    results = _race(4, lambda i: pins_hub.pin(runtime.store, runtime.bus, owner, s["ch"], ids[3 + i]))
    assert sum(isinstance(r, dict) for r in results) == 2
    assert sum(isinstance(r, Conflict) and r.code == "too_many_pins" for r in results) == 2
    assert len(pins_hub.list_pins(runtime.store, owner, s["ch"])["pins"]) == 5
