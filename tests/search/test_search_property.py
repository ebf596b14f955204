"""The search property (issue 15 item 2), both backends: under random channel memberships
and bridge ownerships, a search returns exactly the readable messages that match (the
model: ``store.search.text_matches`` over what the caller may read), never others."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from test_projection_support import World, delete, make_account, msg, ref

from tidings.hub import search as search_hub
from tidings.hub.tokens import Principal
from tidings.store import channels as channels_store
from tidings.store import messages as messages_store

VOCAB = ["pumpkin", "pump", "pasta", "Pastry", "soup", "tonight", "dinner", "din", "42", "a1"]
QUERIES = ["pump", "past", "p", "soup", "din", "dinner", "tonight", "42", "a", "pump soup", "PAST din", "x"]
CALLERS = ["alice", "bob", "agent", "loner", "admin"]
N_CHANNELS = 3
_ids = itertools.count()

texts = st.lists(st.sampled_from(VOCAB), min_size=1, max_size=5).flatmap(
    lambda words: st.sampled_from([" ", ", ", "! "]).map(lambda sep: sep.join(words))
)
messages = st.lists(
    st.tuples(st.sampled_from(["hub", "bridge"]), st.integers(0, 5), texts, st.booleans()),
    min_size=0, max_size=8,
)
memberships = st.lists(st.sets(st.sampled_from(["alice", "bob", "agent", "loner"])), min_size=N_CHANNELS,
                       max_size=N_CHANNELS)
owners = st.tuples(st.sampled_from(["alice", "bob", None]), st.sampled_from(["alice", "bob", None]))


@pytest.fixture
def cast(runtime):
    store = runtime.store
    people = {
        "alice": make_account(store, kind="human"),
        "bob": make_account(store, kind="human"),
        "loner": make_account(store, kind="human"),
    }
    people["agent"] = make_account(store, kind="agent", owner_id=people["alice"])
    poster = make_account(store, kind="human")
    now = store.now_ms()
    channel_ids = []
    with store.write() as tx:
        for i in range(N_CHANNELS):
            cid = f"ch_prop{next(_ids)}"
            channels_store.insert_channel(tx, id=cid, name=f"c{i}", kind="channel", post_policy="open",
                                          owner_account_id=poster, mandatory=False,
                                          created_by=poster, now=now)
            channels_store.add_member(tx, cid, poster, False, now)
            channel_ids.append(cid)
    bridges = [World(store, "signal"), World(store, "signal")]
    return {"rt": runtime, "people": people, "poster": poster, "channels": channel_ids, "bridges": bridges}


def _reset(cast, member_sets, bridge_owners):
    store = cast["rt"].store
    people = cast["people"]
    with store.write() as tx:
        tx.raw("DELETE FROM messages")
        tx.raw("DELETE FROM bridge_messages")
        for cid, members in zip(cast["channels"], member_sets):
            for handle, account in people.items():
                if handle in members:
                    channels_store.add_member(tx, cid, account, False, 1)
                else:
                    tx.raw("DELETE FROM channel_members WHERE channel_id = {0} AND account_id = {0}".format(
                        "?" if store.dialect == "sqlite" else "%s"), (cid, account))
        for world, owner in zip(cast["bridges"], bridge_owners):
            tx.raw("UPDATE bridges SET owner_id = {0} WHERE id = {0}".format(
                "?" if store.dialect == "sqlite" else "%s"), (people.get(owner) if owner else None, world.bridge_id))


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(member_sets=memberships, bridge_owners=owners, msgs=messages, query=st.sampled_from(QUERIES),
       caller=st.sampled_from(CALLERS))
# Always tried, whatever the random draw: a matching message in a channel the caller is not
# in, and one in a bridge another person owns (the two ways a search could over-share).
@example(member_sets=[{"alice"}, set(), set()], bridge_owners=("bob", None),
         msgs=[("hub", 0, "pumpkin", False), ("hub", 1, "pumpkin", False), ("bridge", 0, "pumpkin", False)],
         query="pump", caller="alice")
def test_search_returns_exactly_the_readable_matching_messages(cast, member_sets, bridge_owners, msgs, query, caller):
    rt = cast["rt"]
    _reset(cast, member_sets, bridge_owners)
    expected: set[str] = set()
    words = search_hub.parse_request(query).words
    for kind, where, text, deleted in msgs:
        if kind == "hub":
            index = where % N_CHANNELS
            row, _ = rt.posting.post(author_id=cast["poster"], channel_id=cast["channels"][index], text=text)
            if deleted:
                with rt.store.write() as tx:
                    messages_store.mark_deleted(tx, row["id"], 1)
            readable = caller == "admin" or caller in member_sets[index]
            if readable and not deleted and search_store_matches(words, text):
                expected.add(row["id"])
        else:
            world = cast["bridges"][where % 2]
            remote = f"m{next(_ids)}"
            world.frame([msg("signal:+15550100", remote, ref("+15550100", "Mom", platform="signal"), body=text,
                             at=1_000 + next(_ids))])
            if deleted:
                world.frame([delete("signal:+15550100", remote, at=10**9)])
            owner = bridge_owners[where % 2]
            reader = {"admin": None, "agent": "alice"}.get(caller, caller)
            readable = caller == "admin" or (owner is not None and owner == reader)
            if readable and not deleted and search_store_matches(words, text):
                expected.add(world.msg_id("signal:+15550100", remote))
    if caller == "admin":
        who = Principal(scope="admin", account_id=rt.system_account_id, kind="system")
    else:
        who = Principal(scope="account", account_id=cast["people"][caller],
                        kind="agent" if caller == "agent" else "human")
    got = search_hub.search(rt.store, who, search_hub.parse_request(query, limit=100))["results"]
    assert sorted(h["message"]["id"] for h in got) == sorted(expected)


def search_store_matches(words, text):
    from tidings.store.search import text_matches

    return text_matches(list(words), text)
