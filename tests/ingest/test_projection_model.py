"""Model-based properties of the projection (spec §6.2), on both backends.

* Identity merge and conversation refresh: after every random snapshot the identities,
  the conversation and the roster equal a model of the merge rules, and ``updated_at_ms``
  is the time of the last change (for a conversation, a roster change counts).
* Delta reactions: last writer wins by occurrence time, so any delivery order of the
  same events ends in the same state.
* Keyset paging (D39): walking messages and conversations a page at a time with the
  answer's cursor yields the full listing once, whatever the ties in time.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_projection_support import World, conv, member, msg, react, ref

from tidings.ingest.events import identity_key

SETTINGS = settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    database=None,
)

PEOPLE = 4
SPELLINGS = ("+1555000{}", "+1 555 000{}")

participant = st.tuples(
    st.integers(0, PEOPLE - 1),  # who
    st.integers(0, 1),  # raw spelling
    st.sampled_from(["", "N1", "N2"]),  # name
    st.booleans(),  # is_self
    st.sampled_from(["member", "admin"]),
    st.booleans(),  # active
)
snapshot = st.tuples(
    st.integers(0, 1),  # conversation
    st.sampled_from(["direct", "group"]),
    st.sampled_from(["", "A", "B"]),
    st.sampled_from([None, "1"]),
    st.lists(participant, max_size=PEOPLE, unique_by=lambda p: p[0]),
    st.integers(0, 2),  # clock advance
)


@pytest.fixture(autouse=True, params=["eager", "behind"])
def projection_mode(request, monkeypatch):
    """Every test twice: writes sent at once, and sent behind with the frame's reads
    announced first (apply on append on PostgreSQL, D105; on SQLite both run at once)."""
    monkeypatch.setattr(World, "behind", request.param == "behind")
    return request.param


@settings(SETTINGS)
@given(snapshots=st.lists(snapshot, min_size=1, max_size=8))
def test_identity_merge_and_conversation_refresh_follow_the_model(store, snapshots):
    w = World(store, "google")
    idents: dict[str, dict] = {}
    convs: dict[str, dict] = {}
    rosters: dict[str, dict] = {}
    for which, kind, title, revision, parts, advance in snapshots:
        store.clock.advance(advance)
        now = w.now
        remote = f"g{which}"
        members = []
        for who, spelling, name, is_self, role, active in parts:
            raw = SPELLINGS[spelling].format(who)
            members.append(member(raw, name, role=role, active=active, self_=is_self))
        w.frame([conv(remote, members, kind=kind, title=title, revision=revision)])

        # the model
        c = convs.get(remote)
        if c is None:
            c = convs[remote] = {"content": (kind, title, revision), "created": now, "updated": now}
        elif c["content"] != (kind, title, revision):
            c["content"], c["updated"] = (kind, title, revision), now
        roster = {}
        for who, spelling, name, is_self, role, active in parts:
            raw = SPELLINGS[spelling].format(who)
            canonical = identity_key("google", raw)[1]
            i = idents.get(canonical)
            if i is None:
                idents[canonical] = {"raw": raw, "name": name, "self": is_self, "created": now, "updated": now}
            else:
                merged = {"raw": raw, "name": name or i["name"], "self": i["self"] or is_self}
                if any(merged[k] != i[k] for k in merged):
                    i.update(merged, updated=now)
            roster[canonical] = (role, name, active)
        if rosters.get(remote, {}) != roster:
            c["updated"] = max(c["updated"], now)
        rosters[remote] = roster

        # the store equals the model
        for canonical, i in idents.items():
            row = w.identity(canonical)
            assert (row["raw"], row["display_name"], row["is_self"], row["created_at_ms"], row["updated_at_ms"]) == (
                i["raw"], i["name"], i["self"], i["created"], i["updated"]), canonical
        for r, c in convs.items():
            row = w.conversation(r)
            assert (row["kind"], row["title"], row["remote_revision"]) == c["content"]
            assert (row["created_at_ms"], row["updated_at_ms"]) == (c["created"], c["updated"]), r
            assert w.roster(r) == rosters[r]


reaction_events = st.lists(
    st.tuples(
        st.integers(0, 1),  # reactor
        st.sampled_from(["add", "switch", "remove"]),
        st.sampled_from(["👍", "❤️", "😂"]),
    ),
    min_size=1,
    max_size=6,
)


@settings(SETTINGS)
@given(events=reaction_events, data=st.data())
def test_delta_reactions_end_in_the_same_state_in_any_delivery_order(store, events, data):
    w = World(store, "signal")
    chat = "signal:+15550100"
    w.frame([msg(chat, "m", ref("+15550100", platform="signal"), at=1)])
    timed = [(who, action, emoji, 1_000 + 10 * i) for i, (who, action, emoji) in enumerate(events)]
    order = data.draw(st.permutations(timed))
    actors = [ref("+1555011" + str(who), platform="signal") for who in range(2)]
    for who, action, emoji, at in order:
        w.frame([react(chat, "m", actors[who], "" if action == "remove" else emoji, action=action, at=at)])
    expected = {}
    for who in range(2):
        mine = [e for e in timed if e[0] == who]
        if mine:
            last = max(mine, key=lambda e: e[3])
            if last[1] != "remove":
                expected[w.ident_id("+1555011" + str(who))] = last[2]
    assert w.reactions(chat, "m") == expected


# -- keyset paging (D39) -------------------------------------------------------------------------
@settings(SETTINGS)
@given(times=st.lists(st.integers(1, 4), min_size=0, max_size=14), limit=st.integers(1, 5))
def test_keyset_paging_walks_every_message_once_in_order_whatever_the_ties(store, times, limit):
    """Messages with few distinct times (many ties), walked a page at a time with the last
    row's (time, id) as the cursor: the concatenated pages are exactly the full listing,
    newest first, each message once; so are the bridge's conversations."""
    from tidings.store import bridge_messages, conversations

    w = World(store, "signal")
    bob = ref("+15550100", platform="signal")
    w.frame([msg("signal:+15550100", f"bob:{i}", bob, at=1_000 * t) for i, t in enumerate(times)])
    w.frame([msg(f"signal-group:g{i}", f"bob:g{i}", bob, at=1_000 * t) for i, t in enumerate(times[:6])])

    def walk(page_of, time_key):
        seen, cursor = [], {}
        while True:
            with store.read() as tx:
                rows = page_of(tx, limit=limit, **cursor)
            seen += [r["id"] for r in rows]
            if len(rows) < limit:
                return seen
            cursor = {"before_ms": rows[-1][time_key], "before_id": rows[-1]["id"]}

    cid = w.conv_id("signal:+15550100")
    with store.read() as tx:
        everything = bridge_messages.of_conversation(tx, cid, limit=1000) if times else []
        convs = conversations.list_of_bridge(tx, w.bridge_id, limit=1000)
    assert [(r["occurred_at_ms"], r["id"]) for r in everything] == sorted(
        ((r["occurred_at_ms"], r["id"]) for r in everything), reverse=True)
    assert len(everything) == len(times)
    if times:
        assert walk(lambda tx, **kw: bridge_messages.of_conversation(tx, cid, **kw), "occurred_at_ms") == [
            r["id"] for r in everything]
    assert walk(lambda tx, **kw: conversations.list_of_bridge(tx, w.bridge_id, **kw), "last_message_at_ms") == [
        c["id"] for c in convs]
