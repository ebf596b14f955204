"""The projection driven directly with hand-built events, one ``store.write()`` per frame
(both backends): what each event kind writes, counts, and refuses."""

from __future__ import annotations

import pytest
from test_projection_support import (
    World,
    conv,
    delete,
    edit,
    gmsg,
    member,
    msg,
    react,
    receipt,
    ref,
)
from writecount import WriteCounter

from tidings.ingest.events import IdentityRef
from tidings.ingest.projection import (
    ProjectionError,
    conversation_id_for,
    derive_id,
    infer_conversation_kind,
    message_id_for,
)

SIG = "signal:+15550100"
BOB = "+15550100"


@pytest.fixture(autouse=True, params=["eager", "behind"])
def projection_mode(request, monkeypatch):
    """Every test twice: writes sent at once, and sent behind with the frame's reads
    announced first (apply on append on PostgreSQL, D105; on SQLite both run at once)."""
    monkeypatch.setattr(World, "behind", request.param == "behind")
    return request.param


def sref(raw, name="", self_=False):
    return ref(raw, name, self_=self_, platform="signal")


# -- ids and kinds -----------------------------------------------------------------------
def test_derived_ids_are_deterministic_and_injective():
    assert conversation_id_for("br_1", "x") == conversation_id_for("br_1", "x")
    assert conversation_id_for("br_1", "x").startswith("conv_")
    assert conversation_id_for("br_1", "x") != conversation_id_for("br_2", "x")
    # length-prefixed parts: moving the separator between parts changes the id
    assert derive_id("p", "e", "b", "a\x1fb", "c") != derive_id("p", "e", "b", "a", "b\x1fc")
    assert message_id_for("br", "c", "m").startswith("bmsg_")


@pytest.mark.parametrize(
    "platform,remote,kind",
    [
        ("signal", "signal-group:abc=", "group"),
        ("signal", "signal:+15550100", "direct"),
        ("whatsapp", "whatsapp:123-456@g.us", "group"),
        ("whatsapp", "whatsapp:status@broadcast", "broadcast"),
        ("whatsapp", "whatsapp:4915@s.whatsapp.net", "direct"),
        ("google", "12345", "direct"),
    ],
)
def test_conversation_kind_inferred_from_remote_id(platform, remote, kind):
    assert infer_conversation_kind(platform, remote) == kind


# -- messages ----------------------------------------------------------------------------
def test_incoming_message_mints_conversation_identity_and_sender_roster(store):
    w = World(store, "signal")
    assert w.frame([msg(SIG, "bob:1", sref(BOB, "Bob"), body="hi", at=1_000)])
    c = w.conversation(SIG)
    assert c["id"] == w.conv_id(SIG) and c["kind"] == "direct"
    assert c["last_message_at_ms"] == 1_000 and c["created_at_ms"] == c["updated_at_ms"] == w.now
    m = w.message(SIG, "bob:1")
    assert m["body"] == "hi" and m["state"] == "active" and m["direction"] == "incoming"
    assert m["sender_identity_id"] == w.ident_id(BOB)
    assert w.identity(BOB)["display_name"] == "Bob"
    assert w.roster(SIG) == {BOB: ("member", "Bob", True)}
    assert w.counts() == {
        "messages_written": 1, "conversations_written": 1, "identities_written": 1, "roster_changes": 1,
    }


def test_group_remote_id_mints_a_group_and_recency_only_moves_forward(store):
    w = World(store, "whatsapp")
    chat = "whatsapp:120363@g.us"
    alice = ref("+4915100", "Alice", platform="whatsapp")
    w.frame([msg(chat, "A1", alice, at=5_000), msg(chat, "A0", alice, at=4_000)])
    assert w.conversation(chat)["kind"] == "group"
    assert w.conversation(chat)["last_message_at_ms"] == 5_000
    w.frame([msg(chat, "A-old", alice, at=3_000)])
    assert w.conversation(chat)["last_message_at_ms"] == 5_000
    w.frame([msg(chat, "A2", alice, at=6_000)])
    assert w.conversation(chat)["last_message_at_ms"] == 6_000
    assert w.counts()["imported"] == 1  # the second message event of the first frame


def test_outgoing_message_keeps_roster_to_the_peers(store):
    w = World(store, "signal")
    me = sref("+15559999", "Me", self_=True)
    w.frame([msg(SIG, "self:1", me, body="yo", at=1_000)])
    m = w.message(SIG, "self:1")
    assert m["direction"] == "outgoing" and m["sender_identity_id"] == w.ident_id("+15559999")
    assert w.identity("+15559999")["is_self"] is True
    assert w.roster(SIG) == {}


def test_redelivered_message_writes_nothing_and_never_undoes_an_edit_or_delete(store):
    w = World(store, "signal")
    first = msg(SIG, "bob:1", sref(BOB, "Bob"), body="hi", at=1_000)
    w.frame([first])
    before = w.dump()
    assert not w.frame([first])
    assert w.dump() == before
    w.frame([edit(SIG, "bob:1", "hi (edited)", at=2_000)])
    assert not w.frame([first])
    assert w.message(SIG, "bob:1")["body"] == "hi (edited)"
    w.frame([delete(SIG, "bob:1", at=3_000)])
    assert not w.frame([first])
    m = w.message(SIG, "bob:1")
    assert m["state"] == "deleted" and m["body"] == ""


def test_message_content_change_updates_the_row(store):
    w = World(store, "google")
    bob = ref("+15550100", "Bob")
    w.frame([gmsg("c1", "m1", bob, body="draft", at=1_000)])
    store.clock.advance(10)
    assert w.frame([gmsg("c1", "m1", bob, body="final", at=1_000)])
    m = w.message("c1", "m1")
    assert m["body"] == "final" and m["updated_at_ms"] == w.now


# -- mutations ---------------------------------------------------------------------------
def test_edits_are_last_writer_wins_and_a_delete_is_terminal(store):
    w = World(store, "signal")
    w.frame([msg(SIG, "bob:1", sref(BOB), body="v0", at=1_000)])
    w.frame([edit(SIG, "bob:1", "v2", at=3_000)])
    assert not w.frame([edit(SIG, "bob:1", "v1", at=2_000)])  # an older edit, retried late
    assert w.message(SIG, "bob:1")["body"] == "v2"
    assert not w.frame([edit(SIG, "bob:1", "v2", at=3_000)])  # the same edit again
    assert w.frame([delete(SIG, "bob:1", at=2_500)])  # a delete wins whatever its time
    assert not w.frame([edit(SIG, "bob:1", "v3", at=4_000)])
    assert not w.frame([delete(SIG, "bob:1", at=5_000)])
    m = w.message(SIG, "bob:1")
    assert (m["state"], m["body"]) == ("deleted", "")
    assert w.counts()["mutations"] == 2


def test_mutation_of_an_unknown_message_is_counted_orphaned(store):
    w = World(store, "signal")
    assert not w.frame([edit(SIG, "bob:404", "x"), delete(SIG, "bob:405")])
    assert w.counts() == {"mutations_orphaned": 2}


# -- delta reactions ---------------------------------------------------------------------
def test_delta_reactions_last_writer_wins_with_tombstones(store):
    w = World(store, "signal")
    w.frame([msg(SIG, "bob:1", sref(BOB), at=1_000)])
    alice = sref("+15550111", "Alice")
    w.frame([react(SIG, "bob:1", alice, "👍", at=2_000)])
    assert w.reactions(SIG, "bob:1") == {w.ident_id("+15550111"): "👍"}
    w.frame([react(SIG, "bob:1", alice, "❤️", action="switch", at=3_000)])
    assert w.reactions(SIG, "bob:1") == {w.ident_id("+15550111"): "❤️"}
    assert not w.frame([react(SIG, "bob:1", alice, "😂", at=2_500)])  # stale add
    w.frame([react(SIG, "bob:1", alice, "", action="remove", at=4_000)])
    assert w.reactions(SIG, "bob:1") == {}
    assert w.reactions(SIG, "bob:1", active_only=False) == {w.ident_id("+15550111"): ("removed", "❤️")}
    assert not w.frame([react(SIG, "bob:1", alice, "👍", at=3_500)])  # older than the removal
    assert w.reactions(SIG, "bob:1") == {}
    counts = w.counts()
    assert counts["reactions_applied"] == 2 and counts["reactions_removed"] == 1


def test_a_frame_that_carries_a_message_and_reactions_to_it_applies_them_all(store):
    """The reactions' target is written by the frame itself: its existence is read after
    that write, never announced before it (D105)."""
    w = World(store, "signal")
    alice = sref("+15550111", "Alice")
    w.frame([msg(SIG, "bob:1", sref(BOB), at=1_000), react(SIG, "bob:1", alice, "👍", at=2_000),
             edit(SIG, "bob:1", "hello again", at=2_500)])
    assert w.reactions(SIG, "bob:1") == {w.ident_id("+15550111"): "👍"}
    counts = w.counts()
    assert counts["reactions_applied"] == 1 and counts["mutations"] == 1
    assert "reactions_orphaned" not in counts and "mutations_orphaned" not in counts


def test_remove_before_add_leaves_a_tombstone_that_fences_the_stale_add(store):
    w = World(store, "whatsapp")
    chat = "whatsapp:4915@s.whatsapp.net"
    bob = ref("+4915", "Bob", platform="whatsapp")
    w.frame([msg(chat, "M1", bob, at=1_000)])
    # The removal (t=3000) is applied before the add it undoes (t=2000), which was deferred.
    assert w.frame([react(chat, "M1", bob, "", action="remove", at=3_000)])
    assert w.reactions(chat, "M1", active_only=False) == {w.ident_id("+4915"): ("removed", "")}
    assert not w.frame([react(chat, "M1", bob, "👍", at=2_000)])
    assert w.reactions(chat, "M1") == {}
    assert w.frame([react(chat, "M1", bob, "🎉", at=4_000)])
    assert w.reactions(chat, "M1") == {w.ident_id("+4915"): "🎉"}


def test_equal_time_reaction_writes_only_when_content_differs(store):
    w = World(store, "signal")
    w.frame([msg(SIG, "bob:1", sref(BOB), at=1_000)])
    a = sref("+15550111")
    assert w.frame([react(SIG, "bob:1", a, "👍", at=2_000)])
    assert not w.frame([react(SIG, "bob:1", a, "👍", at=2_000)], received_at_ms=w.now + 5)
    assert w.frame([react(SIG, "bob:1", a, "🔥", at=2_000)])


def test_self_reaction_uses_the_self_reactor_key(store):
    w = World(store, "signal")
    w.frame([msg(SIG, "bob:1", sref(BOB), at=1_000)])
    w.frame([react(SIG, "bob:1", sref("+15559999", self_=True), "👍", at=2_000)])
    assert w.reactions(SIG, "bob:1") == {"self": "👍"}


def test_delta_reaction_on_an_unknown_message_is_orphaned_and_writes_nothing(store):
    w = World(store, "signal")
    assert not w.frame([react(SIG, "bob:404", sref("+15550111"), "👍")])
    assert w.counts() == {"reactions_orphaned": 1}
    assert w.identity("+15550111") is None  # the actor is not even created


# -- Google snapshot reactions -----------------------------------------------------------
def test_google_snapshot_reactions_and_anonymous_reactors(store):
    w = World(store, "google")
    bob = ref("+15550100", "Bob")
    carol = ref("legacy-participant:77")
    anon = IdentityRef(raw="anon:🎉", kind="anonymous", canonical="anon:🎉")
    w.frame([gmsg("c1", "m1", bob, at=1_000), react("c1", "m1", carol, "👍"), react("c1", "m1", anon, "🎉")],
            received_at_ms=100)
    assert w.reactions("c1", "m1") == {w.ident_id("legacy-participant:77"): "👍", "anon:🎉": "🎉"}
    assert w.fence("c1", "m1") == 100
    assert w.one("SELECT count(*) FROM identities WHERE kind = 'anonymous'")[0] == 0
    # the next snapshot drops carol: her reaction is tombstoned
    w.frame([gmsg("c1", "m1", bob, at=1_000), react("c1", "m1", anon, "🎉")], received_at_ms=200)
    assert w.reactions("c1", "m1") == {"anon:🎉": "🎉"}
    assert w.reactions("c1", "m1", active_only=False)[w.ident_id("legacy-participant:77")] == ("removed", "👍")
    assert w.fence("c1", "m1") == 200


def test_google_reaction_outside_its_frame_is_orphaned(store):
    w = World(store, "google")
    w.frame([gmsg("c1", "m1", ref("+15550100"), at=1_000)])
    w.frame([react("c1", "m1", ref("+15550111"), "👍")])
    assert w.reactions("c1", "m1") == {}
    assert w.counts()["reactions_orphaned"] == 1


# -- receipts ----------------------------------------------------------------------------
def test_read_cursor_moves_on_self_read_receipts_only_and_only_forwards(store):
    w = World(store, "signal")
    me = sref("+15559999", self_=True)
    w.frame([msg(SIG, "bob:1", sref(BOB), at=1_000), msg(SIG, "bob:2", sref(BOB), at=2_000)])
    cursor = lambda: w.one("SELECT last_read_message_id, last_read_at_ms FROM read_cursors WHERE conversation_id = ?",
                           w.conv_id(SIG))
    assert not w.frame([receipt(SIG, ["bob:2"], sref(BOB), status="read")])  # not ours
    assert not w.frame([receipt(SIG, ["bob:2"], me, status="delivered")])  # not a read
    assert not w.frame([receipt(SIG, ["bob:404"], me)])  # nothing it names is stored
    assert cursor() is None
    assert w.frame([receipt(SIG, ["bob:1", "bob:404"], me, at=5_000)])
    assert cursor() == (w.msg_id(SIG, "bob:1"), 5_000)
    assert w.frame([receipt(SIG, ["bob:2", "bob:1"], me, at=6_000)])  # the newest named wins
    assert cursor() == (w.msg_id(SIG, "bob:2"), 6_000)
    assert not w.frame([receipt(SIG, ["bob:1"], me, at=7_000)])  # backwards: no write
    assert not w.frame([receipt(SIG, ["bob:2"], me, at=8_000)])  # same message: no write
    assert cursor() == (w.msg_id(SIG, "bob:2"), 6_000)
    assert w.counts()["receipts_self"] == 2 and w.counts()["receipts_dropped"] == 5


def test_signal_read_sync_finds_a_group_message_by_its_remote_id(store):
    """signal-cli's ``syncMessage.readMessages`` names the sender and the timestamp, never
    the group, so the decoder can only aim the receipt at the sender's direct chat. A
    Signal message id (``<author>:<timestamp>``) is unique on its bridge, so a read the
    direct chat does not hold is looked up by remote id across the bridge: the group's
    cursor moves. Each conversation's cursor moves to its own newest message named."""
    w = World(store, "signal")
    grp = "signal-group:R3JvdXA="
    me = sref("+15559999", self_=True)
    w.frame([msg(grp, "bob:10", sref(BOB), at=1_000), msg(grp, "bob:11", sref(BOB), at=2_000),
             msg(SIG, "bob:20", sref(BOB), at=3_000)])

    def cursor(remote):
        return w.one("SELECT last_read_message_id, last_read_at_ms FROM read_cursors WHERE conversation_id = ?",
                     w.conv_id(remote))

    assert w.frame([receipt(SIG, ["bob:10"], me, at=5_000)])
    assert cursor(grp) == (w.msg_id(grp, "bob:10"), 5_000)
    assert cursor(SIG) is None
    # one receipt naming messages of both conversations moves both cursors
    assert w.frame([receipt(SIG, ["bob:11", "bob:20", "bob:404"], me, at=6_000)])
    assert cursor(grp) == (w.msg_id(grp, "bob:11"), 6_000)
    assert cursor(SIG) == (w.msg_id(SIG, "bob:20"), 6_000)
    assert not w.frame([receipt(SIG, ["bob:10"], me, at=7_000)])  # backwards in the group: no write
    assert w.counts()["receipts_self"] == 3 and w.counts()["receipts_dropped"] == 1
    # an id two conversations hold places nothing: which one was read is unknowable
    other = "signal-group:T3RoZXI="
    w.frame([msg(grp, "bob:30", sref(BOB), at=8_000), msg(other, "bob:30", sref(BOB), at=8_000)])
    assert not w.frame([receipt(SIG, ["bob:30"], me, at=9_000)])
    assert cursor(grp) == (w.msg_id(grp, "bob:11"), 6_000) and cursor(other) is None


def test_a_read_receipt_never_crosses_conversations_off_signal(store):
    """The cross-conversation lookup is Signal's alone: a WhatsApp receipt names its chat,
    and a message of the same remote id in another chat is not the one it read."""
    w = World(store, "whatsapp")
    wa = lambda raw: ref(raw, platform="whatsapp")  # noqa: E731
    me = ref("15559999@s.whatsapp.net", self_=True, platform="whatsapp")
    w.frame([msg("123@g.us", "ABC", wa("15550100@s.whatsapp.net"), at=1_000)])
    assert not w.frame([receipt("15550100@s.whatsapp.net", ["ABC"], me, at=5_000)])
    assert w.one("SELECT COUNT(*) FROM read_cursors") == (0,)


# -- conversations -----------------------------------------------------------------------
def test_conversation_event_writes_row_identities_and_roster(store):
    w = World(store, "google")
    w.frame([conv("g1", [member("+15550100", "Bob", role="admin"), member("+15559999", "Me", self_=True)],
                  title="Team")])
    c = w.conversation("g1")
    assert (c["kind"], c["title"], c["remote_revision"], c["last_message_at_ms"]) == ("group", "Team", None, 0)
    assert w.roster("g1") == {"+15550100": ("admin", "Bob", True), "+15559999": ("member", "Me", True)}
    assert w.identity("+15559999")["is_self"] is True
    # a message later bumps recency without touching updated_at_ms
    store.clock.advance(1000)
    w.frame([gmsg("g1", "m1", ref("+15550100"), at=9_000)])
    c2 = w.conversation("g1")
    assert c2["last_message_at_ms"] == 9_000 and c2["updated_at_ms"] == c["updated_at_ms"]


def test_identity_merge_rule_column_by_column(store):
    """The merge rule of a new sighting (spec §3.3), one column at a time, with the row
    writes counted: ``raw`` is replaced, ``display_name`` only by a non-empty name,
    ``is_self`` only turns on; a sighting that changes nothing writes nothing, and
    ``updated_at_ms`` is the time of the last change. (Pins the projection's own skip,
    which runs before the guarded statement, column by column.)"""
    w = World(store, "signal")
    seq = iter(range(1, 100))

    def sighting(raw, name="", self_=False):
        store.clock.advance(10)
        direction = "incoming"  # the sender's self flag is what is under test, not the direction
        w.frame([msg(SIG, f"m{next(seq)}", sref(raw, name, self_=self_), direction=direction)])
        return w.identity(BOB)

    with WriteCounter(store, ["identities"]) as wc:
        first = sighting(BOB, "Bob")
        created = first["created_at_ms"]
        steps = [
            # (raw, name, self, expected (raw, display_name, is_self), writes)
            ("+1 555 0100", "Bob", False, ("+1 555 0100", "Bob", False), 1),  # a new spelling: raw replaced
            ("+1 555 0100", "", False, ("+1 555 0100", "Bob", False), 0),  # no name: the known name stays
            ("+1 555 0100", "Robert", False, ("+1 555 0100", "Robert", False), 1),  # a new name replaces it
            ("+1 555 0100", "Robert", True, ("+1 555 0100", "Robert", True), 1),  # self turns on
            ("+1 555 0100", "Robert", False, ("+1 555 0100", "Robert", True), 0),  # ... and never off
            (BOB, "", False, (BOB, "Robert", True), 1),  # raw alone, back again
        ]
        last_change = created
        for raw, name, self_, expected, writes in steps:
            wc.reset()
            row = sighting(raw, name, self_)
            assert (row["raw"], row["display_name"], row["is_self"]) == expected, (raw, name, self_)
            assert wc.of("identities") == writes, (raw, name, self_)
            if writes:
                last_change = w.now
            assert (row["created_at_ms"], row["updated_at_ms"]) == (created, last_change), (raw, name, self_)


def test_conversation_refresh_column_by_column(store):
    """A conversation snapshot changing kind, title or revision alone writes the row once
    and moves ``updated_at_ms``; the same snapshot again writes nothing. (Pins the
    projection's skip before the guarded upsert, not only the SQL guard.)"""
    w = World(store, "google")
    people = [member("+15550100", "A")]
    w.frame([conv("g", people, kind="group", title="T", revision=None)])
    state = {"kind": "group", "title": "T", "revision": None}
    with WriteCounter(store, ["conversations"]) as wc:
        for column, value in [("revision", "r1"), ("title", "U"), ("kind", "direct"), ("revision", "r2"),
                              ("title", ""), ("revision", None)]:
            state[column] = value
            for again in (False, True):
                wc.reset()
                store.clock.advance(10)
                w.frame([conv("g", people, **state)])
                assert wc.of("conversations") == (0 if again else 1), (column, value, again)
                c = w.conversation("g")
                assert (c["kind"], c["title"], c["remote_revision"]) == (state["kind"], state["title"],
                                                                         state["revision"]), column
                if not again:
                    changed_at = w.now
                assert c["updated_at_ms"] == changed_at, (column, value, again)


def test_message_minted_google_conversation_is_completed_by_its_snapshot(store):
    w = World(store, "google")
    w.frame([gmsg("g1", "m1", ref("+15550100"), at=9_000)])
    assert w.conversation("g1")["kind"] == "direct" and w.roster("g1") == {}
    store.clock.advance(5)
    w.frame([conv("g1", [member("+15550100"), member("+15550111")], title="Pair")])
    c = w.conversation("g1")
    assert (c["kind"], c["title"], c["last_message_at_ms"], c["updated_at_ms"]) == ("group", "Pair", 9_000, w.now)


def test_roster_repeating_an_identity_is_rejected_and_nothing_is_written(store):
    w = World(store, "google")
    event = conv("g1", [member("+1 555 0100", "Bob"), member("+15550111"), member("+15550100", "Bobby")])
    with pytest.raises(ProjectionError, match="same identity e164:\\+15550100"):
        w.frame([event])
    assert all(not rows for rows in w.dump().values())


@pytest.mark.parametrize("role", ["moderator", "ADMIN"])
def test_unknown_role_is_a_projection_error_naming_it(store, role):
    w = World(store, "google")
    with pytest.raises(ProjectionError, match=f"unknown role '{role}'"):
        w.frame([conv("g1", [member("+15550100", role=role)])])


def test_anonymous_sender_is_a_projection_error(store):
    w = World(store, "google")
    anon = IdentityRef(raw="anon:👍", kind="anonymous", canonical="anon:👍")
    with pytest.raises(ProjectionError, match="anonymous"):
        w.frame([gmsg("c1", "m1", anon)])


def test_not_an_event_is_a_projection_error(store):
    w = World(store, "google")
    with pytest.raises(ProjectionError, match="not one of the five event kinds"):
        w.frame([{"kind": "message"}], validate=False)


# -- frame order, hook, counters ---------------------------------------------------------
def test_events_apply_in_kind_order_whatever_the_decoded_order(store):
    w = World(store, "signal")
    me = sref("+15559999", self_=True)
    w.frame([
        receipt(SIG, ["bob:1"], me, at=9_000),
        react(SIG, "bob:1", sref("+15550111"), "👍", at=8_000),
        edit(SIG, "bob:1", "edited", at=7_000),
        msg(SIG, "bob:1", sref(BOB), body="orig", at=1_000),
    ])
    assert w.message(SIG, "bob:1")["body"] == "edited"
    assert w.reactions(SIG, "bob:1") == {w.ident_id("+15550111"): "👍"}
    assert w.one("SELECT last_read_message_id FROM read_cursors")[0] == w.msg_id(SIG, "bob:1")


def test_on_message_hook_sees_new_incoming_messages_edits_and_deletes(store):
    w = World(store, "signal")
    w.frame([msg(SIG, "bob:1", sref(BOB), body="in", at=1_000),
             msg(SIG, "self:2", sref("+15559999", self_=True), body="out", at=1_100)])
    w.frame([msg(SIG, "bob:1", sref(BOB), body="in", at=1_000)])  # a replay: not new
    w.frame([edit(SIG, "bob:1", "in!", at=2_000)])
    w.frame([edit(SIG, "bob:1", "in!", at=2_000)])  # unchanged: not applied
    w.frame([delete(SIG, "self:2", at=3_000)])
    kinds = [(c.kind, c.remote_message_id, c.body, c.direction) for c in w.changes]
    assert kinds == [("new", "bob:1", "in", "incoming"), ("edit", "bob:1", "in!", "incoming"),
                     ("delete", "self:2", "", "outgoing")]
    new = w.changes[0]
    assert new.bridge_id == w.bridge_id and new.conversation_id == w.conv_id(SIG)
    assert new.message_id == w.msg_id(SIG, "bob:1") and new.sender_identity_id == w.ident_id(BOB)
    assert new.occurred_at_ms == 1_000 and w.changes[1].sender_identity_id == w.ident_id(BOB)


def test_counters_are_added_only_when_the_frame_commits(store):
    w = World(store, "signal")

    class Boom(Exception):
        pass

    def failing(tx, change):
        raise Boom()

    from tidings.ingest.projection import ProjectionContext, project_frame

    ctx = ProjectionContext(w.bridge_id, "signal", "in_x", w.now, w.now, w.counters, on_message=failing)
    with pytest.raises(Boom):
        with store.write() as tx:
            project_frame(tx, ctx, [msg(SIG, "bob:1", sref(BOB))])
    assert w.counts() == {}
    assert w.message(SIG, "bob:1") is None
    # A frame projected completely whose transaction then rolls back (a failed processed
    # mark, a failed commit): its counts are never added either.
    ctx = ProjectionContext(w.bridge_id, "signal", "in_y", w.now, w.now, w.counters)
    with pytest.raises(Boom):
        with store.write() as tx:
            assert project_frame(tx, ctx, [msg(SIG, "bob:2", sref(BOB))])
            raise Boom()
    assert w.counts() == {}
    assert w.message(SIG, "bob:2") is None
    # ... and a frame that commits is counted once, after its commit.
    ctx = ProjectionContext(w.bridge_id, "signal", "in_z", w.now, w.now, w.counters)
    with store.write() as tx:
        assert project_frame(tx, ctx, [msg(SIG, "bob:3", sref(BOB))])
        assert w.counts() == {}
    assert w.counts()["messages_written"] == 1


def test_unknown_platform_is_a_projection_error(store):
    w = World(store, "google")
    w.platform = "irc"
    with pytest.raises(ProjectionError, match="unknown platform"):
        w.frame([gmsg("c1", "m1", ref("+15550100"))])
