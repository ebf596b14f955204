"""Mentions: the grammar (CONTRACT §2) and the steer arm (spec §5.3, M1-M13)."""

from __future__ import annotations

import pytest
from delivery_world import general_channel

from tidings.delivery.mentions import mention_handles, parse_mentions, resolve_mentioned
from tidings.store.sweep import ChannelAgent


# -- grammar (pure) ------------------------------------------------------------------------
@pytest.mark.parametrize(
    "text,handles",
    [
        ("hey @aa look here", ["aa"]),
        ("@AA and @Aa and @aa", ["aa"]),  # case-folded, deduplicated
        ("mail bob@example.com", ["example.com"]),  # no word boundary before @
        ("thanks @ann.", ["ann."]),  # greedy class: the trailing dot is part of the handle
        ("@ @. @- @_x", []),  # a handle starts with a letter or digit
        ("@a-b_c.d! and @9lives", ["a-b_c.d", "9lives"]),
        ("\u212a@\u212aelvin", ["kelvin"]),  # the Kelvin sign folds to k, as Go's (?i) does
        ("@everyone @agents @users", ["everyone", "agents", "users"]),
    ],
)
def test_mention_grammar(text, handles):
    assert parse_mentions(text) == handles


def test_only_text_blocks_count_and_handles_dedupe_across_blocks():
    blocks = [
        {"kind": "text", "text": "@aa first"},
        {"kind": "ask", "text": "@bb in an ask block"},
        {"kind": "text", "text": "@AA again, @cc"},
    ]
    assert mention_handles(blocks) == ["aa", "cc"]
    assert mention_handles([]) == [] and mention_handles(None) == []


def test_resolution_counts_agent_members_only_never_the_author():
    members = [ChannelAgent("acc_1", "aa", None, True), ChannelAgent("acc_2", "bb", None, False)]
    assert [m.id for m in resolve_mentioned(["bb", "nobody", "users"], members, "acc_x")] == ["acc_2"]
    assert [m.id for m in resolve_mentioned(["everyone"], members, "acc_1")] == ["acc_2"]
    assert [m.id for m in resolve_mentioned(["agents", "aa"], members, "acc_x")] == ["acc_1", "acc_2"]
    assert resolve_mentioned(["aa"], members, "acc_1") == []  # self-mention


# -- the steer arm -------------------------------------------------------------------------
def setup(world, *agents, subscribed=None, live=None):
    return general_channel(world, agents, subscribed=agents if subscribed is None else subscribed,
                           live=agents if live is None else live, settle=world.pump)


def test_a_mentioned_live_subscriber_gets_exactly_one_steer_and_no_deliver(world):
    # M1, M7 (the steer carries the message)
    hu, ch, ids = setup(world, "aa")
    m = world.post(hu, ch, "hey @aa look here")
    world.pump()
    items = world.sessions[ids["aa"]].drain()
    assert [(i.kind, i.message_id) for i in items] == [("steer", m)]
    assert items[0].payload() == {"type": "steer", "message": items[0].message, "channel_id": ch,
                                  "mentions_you": True}
    assert items[0].message["text"] == "hey @aa look here" and items[0].message["seq"] == 1


def test_a_mentioned_subscriber_gets_only_the_steer_even_when_its_floor_is_behind(world):
    """M1 where nothing else masks a second dispatch: the agent's own post (never pushed to
    it) leaves its session's floor below the mention, so a deliver would not be dropped as
    already swept; steer-only precedence alone must keep the mentioned agent off the
    deliver. The same holds when the mention pass already ran (the scan routed it first)."""
    hu, ch, ids = setup(world, "aa", "bb")
    world.post(ids["aa"], ch, "my own post")  # held while aa is live, never pushed to aa
    world.settle(ids["aa"])
    world.pump()
    assert world.got(ids["aa"]) == []
    world.got(ids["bb"])
    m = world.post(hu, ch, "hey @aa look here")
    world.pump()
    assert world.got(ids["aa"]) == [("steer", m)]
    assert world.got(ids["bb"]) == [("deliver", m)]
    again = world.post(hu, ch, "@aa once more")
    assert world.d.consumer.scan() == 1  # the scan routes it before its event is handled
    assert world.got(ids["aa"]) == [("steer", again)]
    world.pump()  # the live event finds it routed: no second steer, and still no deliver
    assert world.got(ids["aa"]) == []
    assert world.got(ids["bb"]) == [("deliver", again)]


def test_mentioned_gets_the_steer_and_the_others_the_deliver(world):
    # M2
    hu, ch, ids = setup(world, "aa", "bb")
    m = world.post(hu, ch, "@aa please")
    world.pump()
    assert world.got(ids["aa"]) == [("steer", m)]
    assert world.got(ids["bb"]) == [("deliver", m)]


def test_a_live_non_member_is_never_steered(world):
    # M3
    hu, ch, ids = setup(world, "bb")
    outsider = world.agent("aa", owner=hu)
    world.connect(outsider)
    world.pump()
    m = world.post(hu, ch, "@aa are you there")
    world.pump()
    assert world.got(outsider) == []
    assert world.got(ids["bb"]) == [("deliver", m)]
    assert world.owed() == []


def test_held_agent_message_routes_mentions_at_settle_and_never_to_its_author(world):
    # M4, M8: mentions are parsed from the settled (re-read) blocks
    hu, ch, ids = setup(world, "author", "aa", "bb", subscribed=("author", "bb"))
    m = world.post(ids["author"], ch, "one moment")
    world.pump()
    world.edit(ids["author"], m, "@author @agents standup, here you go @aa")
    world.pump()
    assert world.got(ids["aa"]) == [] and world.got(ids["bb"]) == []
    world.settle(ids["author"])
    world.pump()
    assert world.got(ids["aa"]) == [("steer", m)]
    assert world.got(ids["bb"]) == [("steer", m)]
    assert world.got(ids["author"]) == []
    assert world.routed(m)


def test_dead_agent_author_steers_every_other_agent_on_agents_ping(world):
    # M5
    hu, ch, ids = setup(world, "author", "aa", "bb", live=("aa", "bb"))
    m = world.post(ids["author"], ch, "@agents sync")
    world.pump()
    assert world.got(ids["aa"]) == [("steer", m)] and world.got(ids["bb"]) == [("steer", m)]
    assert world.counters()["steered"] == 2


def test_an_offline_mentioned_subscriber_gets_no_deliver_and_the_others_do(world):
    # M6
    hu, ch, ids = setup(world, "aa", "bb", live=("bb",))
    m = world.post(hu, ch, "@aa when you are back")
    world.pump()
    assert world.got(ids["bb"]) == [("deliver", m)]
    assert world.waker.of(ids["aa"]) == ["mention"]
    assert world.owed() == []  # aa is in its sweep set: the cursor carries it


def test_users_ping_reaches_no_agent(world):
    # M9
    hu, ch, ids = setup(world, "aa", "bb")
    m = world.post(hu, ch, "@users ping")
    world.pump()
    assert world.got(ids["aa"]) == [("deliver", m)] and world.got(ids["bb"]) == [("deliver", m)]
    assert world.counters()["steered"] == 0


def test_everyone_ping_by_an_agent_steers_every_other_agent_member(world):
    # M10: subscribed or not
    hu, ch, ids = setup(world, "author", "aa", "bb", subscribed=("aa",), live=("aa", "bb"))
    m = world.post(ids["author"], ch, "@everyone sync")
    world.pump()
    assert world.got(ids["aa"]) == [("steer", m)] and world.got(ids["bb"]) == [("steer", m)]


def test_an_unknown_handle_does_nothing(world):
    # M11
    hu, ch, ids = setup(world, "aa")
    m = world.post(hu, ch, "@nobody ping")
    world.pump()
    assert world.got(ids["aa"]) == [("deliver", m)]
    assert world.counters()["steered"] == 0 and world.routed(m)


def test_a_handle_in_two_blocks_steers_once(world):
    # M12
    hu, ch, ids = setup(world, "aa")
    row, _ = world.rt.posting.post(
        author_id=hu, channel_id=ch, blocks=[{"kind": "text", "text": "@aa one"}, {"kind": "text", "text": "@aa two"}]
    )
    world.pump()
    assert world.got(ids["aa"]) == [("steer", row["id"])]


def test_an_offline_unsubscribed_member_gets_nothing_dispatched(world):
    # M13 (its owed row is covered in test_offline_mentions)
    hu, ch, ids = setup(world, "aa", "bb", subscribed=("bb",), live=("bb",))
    m = world.post(hu, ch, "@aa ping")
    world.pump()
    assert world.got(ids["bb"]) == [("deliver", m)]
    assert world.counters()["steered"] == 0


def test_a_mention_of_a_human_or_the_system_account_steers_nobody(world):
    hu, ch, ids = setup(world, "aa")
    m = world.post(hu, ch, "@hu and @tidings")
    world.pump()
    assert world.got(ids["aa"]) == [("deliver", m)]
    assert world.owed() == []
