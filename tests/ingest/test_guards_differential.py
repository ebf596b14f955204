"""Guard differential (spec §6.3): the guarded writes against the naive, unguarded statements.

The guarded side is each table family's batch (``store/batch_rows.py``, D115), one
operation a batch: its rows read, the operation applied, the batch flushed (``once``).

The naive statements are kept verbatim below as the reference. Every property runs the
same random operations against both, on two bridges of the same store (the guarded one
and the reference one), each operation in its own savepoint, and after every step
requires:

* every row equal in every column except ``updated_at_ms`` (ids compared without their
  bridge part; for reactions, the bookkeeping columns ``occurred_at_ms``/``source_seq_ms``
  that the reference rewrites on every snapshot are left out too);
* errors of the same class (a CHECK failure is an integrity error on both sides; a
  repeated roster identity is ``RosterError`` on the guarded side, a primary-key
  violation on the reference side: both "rejected, nothing changed");
* the guarded ``updated_at_ms`` = the time of the last content change, never later than
  the reference's.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_projection_support import make_bridge, once

from tidings.store.bridge_messages import Messages
from tidings.store.conversations import Conversations, RosterError, RosterRow
from tidings.store.engine import is_integrity_error
from tidings.store.identities import Identities
from tidings.store.reactions import Reactions, SnapshotEntry
from tidings.store.sql import PerDialect, Stmt

SETTINGS = settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    database=None,
)

# -- the reference: the naive statements, verbatim --------------------------------------
LEGACY_UPSERT_IDENTITY = Stmt(
    "INSERT INTO identities (id, bridge_id, kind, canonical, raw, display_name, is_self, metadata, "
    "created_at_ms, updated_at_ms) VALUES (:id, :bridge_id, :kind, :canonical, :raw, :display_name, "
    ":is_self, :metadata, :now, :now) "
    "ON CONFLICT (bridge_id, kind, canonical) DO UPDATE SET raw = excluded.raw, "
    "display_name = excluded.display_name, is_self = excluded.is_self, metadata = excluded.metadata, "
    "updated_at_ms = excluded.updated_at_ms"
)
LEGACY_UPSERT_CONVERSATION = Stmt(
    "INSERT INTO conversations (id, bridge_id, remote_conversation_id, kind, title, remote_revision, "
    "last_message_at_ms, created_at_ms, updated_at_ms) VALUES (:id, :bridge_id, :remote_id, :kind, "
    ":title, :remote_revision, 0, :now, :now) "
    "ON CONFLICT (bridge_id, remote_conversation_id) DO UPDATE SET kind = excluded.kind, "
    "title = excluded.title, remote_revision = excluded.remote_revision, "
    "updated_at_ms = excluded.updated_at_ms"
)
LEGACY_BUMP_RECENCY = PerDialect(
    sqlite="UPDATE conversations SET last_message_at_ms = MAX(COALESCE(last_message_at_ms, 0), :at) WHERE id = :id",
    postgresql="UPDATE conversations SET last_message_at_ms = GREATEST(COALESCE(last_message_at_ms, 0), :at) "
    "WHERE id = :id",
)
LEGACY_DELETE_ROSTER = Stmt("DELETE FROM conversation_participants WHERE conversation_id = :conversation_id")
LEGACY_INSERT_PARTICIPANT = Stmt(
    "INSERT INTO conversation_participants (conversation_id, identity_id, bridge_id, role, display_name, "
    "is_active) VALUES (:conversation_id, :identity_id, :bridge_id, :role, :display_name, :is_active)"
)
LEGACY_CONVERSATION_EXISTS = Stmt("SELECT 1 FROM conversations WHERE id = :conversation_id")
LEGACY_FENCE = Stmt("SELECT source_seq_ms FROM reaction_fences WHERE message_id = :message_id")
LEGACY_UPSERT_REACTION = Stmt(
    "INSERT INTO reactions (message_id, reactor_key, bridge_id, conversation_id, reactor_identity_id, "
    "reactor_is_self, emoji, state, occurred_at_ms, source_seq_ms, created_at_ms, updated_at_ms) VALUES "
    "(:message_id, :reactor_key, :bridge_id, :conversation_id, :identity_id, :is_self, :emoji, 'active', "
    ":now, :seq, :now, :now) "
    "ON CONFLICT (message_id, reactor_key) DO UPDATE SET reactor_identity_id = excluded.reactor_identity_id, "
    "reactor_is_self = excluded.reactor_is_self, emoji = excluded.emoji, state = excluded.state, "
    "occurred_at_ms = excluded.occurred_at_ms, source_seq_ms = excluded.source_seq_ms, "
    "updated_at_ms = excluded.updated_at_ms"
)
LEGACY_ACTIVE_REACTORS = Stmt("SELECT reactor_key FROM reactions WHERE message_id = :message_id AND state = 'active'")
LEGACY_TOMBSTONE = Stmt(
    "UPDATE reactions SET state = 'removed', occurred_at_ms = :now, source_seq_ms = :seq, updated_at_ms = :now "
    "WHERE message_id = :message_id AND reactor_key = :reactor_key AND state = 'active'"
)
LEGACY_FENCE_WRITE = Stmt(
    "INSERT INTO reaction_fences (message_id, bridge_id, source_seq_ms, updated_at_ms) "
    "VALUES (:message_id, :bridge_id, :seq, :now) "
    "ON CONFLICT (message_id) DO UPDATE SET source_seq_ms = excluded.source_seq_ms, "
    "updated_at_ms = excluded.updated_at_ms"
)
# The message upsert without its guard terms; ``state = 'active'`` is a rule of both
# (a re-delivered original never undoes an edit or a delete), not a write guard.
LEGACY_UPSERT_MESSAGE = Stmt(
    "INSERT INTO bridge_messages (id, bridge_id, conversation_id, remote_message_id, sender_identity_id, "
    "direction, body, reply_to_remote_id, state, occurred_at_ms, created_at_ms, updated_at_ms) VALUES "
    "(:id, :bridge_id, :conversation_id, :remote_message_id, :sender, :direction, :body, :reply_to, "
    "'active', :occurred, :now, :now) "
    "ON CONFLICT (id) DO UPDATE SET sender_identity_id = excluded.sender_identity_id, "
    "direction = excluded.direction, body = excluded.body, reply_to_remote_id = excluded.reply_to_remote_id, "
    "occurred_at_ms = excluded.occurred_at_ms, updated_at_ms = excluded.updated_at_ms "
    "WHERE bridge_messages.state = 'active'"
)


def legacy_replace_roster(tx, *, conversation_id, bridge_id, rows):
    if tx.one(LEGACY_CONVERSATION_EXISTS, {"conversation_id": conversation_id}) is None:
        raise LookupError("no such conversation")
    tx.execute(LEGACY_DELETE_ROSTER, {"conversation_id": conversation_id})
    for r in rows:
        tx.execute(LEGACY_INSERT_PARTICIPANT, {"conversation_id": conversation_id, "identity_id": r.identity_id,
                                               "bridge_id": bridge_id, "role": r.role,
                                               "display_name": r.display_name, "is_active": r.is_active})


def legacy_replace_reactions(tx, *, message_id, bridge_id, conversation_id, entries, seq, now):
    fence = tx.scalar(LEGACY_FENCE, {"message_id": message_id})
    if fence is not None and seq < fence:
        return False
    for key, e in entries.items():
        tx.execute(LEGACY_UPSERT_REACTION, {"message_id": message_id, "reactor_key": key, "bridge_id": bridge_id,
                                            "conversation_id": conversation_id, "identity_id": e.identity_id,
                                            "is_self": e.is_self, "emoji": e.emoji, "seq": seq, "now": now})
    for (key,) in tx.all(LEGACY_ACTIVE_REACTORS, {"message_id": message_id}):
        if key not in entries:
            tx.execute(LEGACY_TOMBSTONE, {"message_id": message_id, "reactor_key": key, "seq": seq, "now": now})
    tx.execute(LEGACY_FENCE_WRITE, {"message_id": message_id, "bridge_id": bridge_id, "seq": seq, "now": now})
    return True


# -- harness -----------------------------------------------------------------------------
def outcome(tx, fn):
    try:
        with tx.savepoint():
            return ("ok", fn())
    except RosterError as exc:
        return ("error", "missing" if "does not exist" in str(exc) else "rejected")
    except LookupError:
        return ("error", "missing")
    except Exception as exc:  # noqa: BLE001 - classified below
        if is_integrity_error(exc):
            return ("error", "rejected")
        raise


def same_errors(a, b):
    assert (a[0], a[1] if a[0] == "error" else None) == (b[0], b[1] if b[0] == "error" else None), (a, b)


def local(value, bridge):
    """An id without its bridge part (ids here are "<bridge>/<rest>")."""
    return value.split("/", 1)[1] if isinstance(value, str) and value.startswith(bridge + "/") else value


_READS: dict[str, Stmt] = {}
CONVERSATION_ID = Stmt("SELECT id FROM conversations WHERE bridge_id = :b AND remote_conversation_id = :r")
LAST_MESSAGE_AT = Stmt("SELECT last_message_at_ms FROM conversations WHERE id = :id")
UPDATED_AT = Stmt("SELECT updated_at_ms FROM conversations WHERE id = :id")


def table(tx, sql, bridge, key_len):
    """{natural key: (row, updated_at_ms)} of a bridge; the last column of ``sql`` is updated_at_ms."""
    stmt = _READS.get(sql) or _READS.setdefault(sql, Stmt(sql))
    rows = tx.all(stmt, {"bridge_id": bridge})
    return {tuple(local(v, bridge) for v in r[:key_len]): (tuple(local(v, bridge) for v in r[key_len:-1]), r[-1])
            for r in rows}


def compare(tx, sql, guarded, reference, key_len, model_updated=None):
    g = table(tx, sql, guarded, key_len)
    r = table(tx, sql, reference, key_len)
    assert {k: v[0] for k, v in g.items()} == {k: v[0] for k, v in r.items()}
    for k, (_, updated) in g.items():
        assert updated <= r[k][1], (k, updated, r[k][1])
        if model_updated is not None:
            assert updated == model_updated[k], (k, updated, model_updated[k])
    return g


# -- identities --------------------------------------------------------------------------
IDENTITY_SQL = ("SELECT kind, canonical, id, raw, display_name, is_self, metadata, created_at_ms, updated_at_ms "
                "FROM identities WHERE bridge_id = :bridge_id")

identity_ops = st.lists(
    st.tuples(
        st.integers(0, 2),  # which identity
        st.integers(0, 1),  # id variant (a conflict under another primary key keeps the stored id)
        st.sampled_from(["", " ", "spaced"]),  # raw spelling ("" = canonical; " " = blank: a CHECK failure)
        st.sampled_from(["", "Bob", "Robert"]),
        st.booleans(),
        st.sampled_from(["{}", '{"a": 1}']),
        st.sampled_from(["e164", "e164", "bogus"]),  # a bogus kind fails the CHECK
        st.integers(0, 2),  # clock advance
    ),
    min_size=1,
    max_size=12,
)


@SETTINGS
@given(ops=identity_ops)
def test_upsert_identity_matches_the_unguarded_upsert(store, ops):
    guarded, reference = make_bridge(store), make_bridge(store)
    now = 1_000
    model: dict[tuple, tuple] = {}  # key -> (content, updated)
    with store.write() as tx:
        for who, variant, spelling, name, is_self, metadata, kind, advance in ops:
            now += advance
            canonical = f"+1555000{who}"
            raw = {"": canonical, " ": "  ", "spaced": f"+1 555 000{who}"}[spelling]
            results = []
            for bridge in (guarded, reference):
                params = {"id": f"{bridge}/{who}/{variant}", "kind": kind, "canonical": canonical, "raw": raw,
                          "display_name": name, "is_self": is_self, "metadata": metadata, "now": now}
                if bridge == guarded:
                    results.append(outcome(tx, lambda: once(tx, Identities, guarded, lambda r: r.upsert(**params))))
                else:
                    results.append(outcome(tx, lambda: tx.rowcount(LEGACY_UPSERT_IDENTITY,
                                                                   {**params, "bridge_id": bridge})))
            same_errors(*results)
            if results[0][0] == "ok":
                key = (kind, canonical)
                content = (raw, name, is_self, metadata)
                changed = model.get(key, (None,))[0] != content
                if changed:
                    model[key] = (content, now)
                assert results[0][1] == (1 if changed else 0)  # a write iff the content changed
            compare(tx, IDENTITY_SQL, guarded, reference, 2, {k: v[1] for k, v in model.items()})


# -- conversations and recency -----------------------------------------------------------
CONVERSATION_SQL = ("SELECT remote_conversation_id, id, kind, title, remote_revision, last_message_at_ms, "
                    "created_at_ms, updated_at_ms FROM conversations WHERE bridge_id = :bridge_id")

conversation_ops = st.lists(
    st.one_of(
        st.tuples(
            st.just("upsert"),
            st.integers(0, 2),
            st.integers(0, 1),
            st.sampled_from(["direct", "group", "group", "bogus"]),
            st.sampled_from(["", "T", "U"]),
            st.sampled_from([None, "1", "2"]),
            st.integers(0, 2),
        ),
        st.tuples(st.just("bump"), st.integers(0, 2), st.integers(0, 5)),
    ),
    min_size=1,
    max_size=14,
)


@SETTINGS
@given(ops=conversation_ops)
def test_upsert_conversation_and_recency_match_the_unguarded_statements(store, ops):
    guarded, reference = make_bridge(store), make_bridge(store)
    now = 1_000
    model: dict[tuple, tuple] = {}
    with store.write() as tx:
        for op in ops:
            if op[0] == "upsert":
                _, which, variant, kind, title, revision, advance = op
                now += advance
                remote = f"r{which}"
                results = []
                for bridge in (guarded, reference):
                    params = {"id": f"{bridge}/{which}/{variant}", "remote_id": remote, "kind": kind, "title": title,
                              "remote_revision": revision, "now": now}
                    if bridge == guarded:
                        results.append(outcome(tx, lambda: once(tx, Conversations, guarded,
                                                                lambda r: r.upsert(**params))))
                    else:
                        results.append(outcome(tx, lambda: tx.rowcount(LEGACY_UPSERT_CONVERSATION,
                                                                       {**params, "bridge_id": bridge})))
                same_errors(*results)
                if results[0][0] == "ok":
                    content = (kind, title, revision)
                    if model.get((remote,), (None,))[0] != content:
                        model[(remote,)] = (content, now)
            else:
                _, which, at = op
                at *= 1_000
                ids = {bridge: tx.scalar(CONVERSATION_ID, {"b": bridge, "r": f"r{which}"})
                       for bridge in (guarded, reference)}
                if ids[guarded] is None:
                    assert ids[reference] is None
                    continue
                current = tx.scalar(LAST_MESSAGE_AT, {"id": ids[guarded]})
                wrote = once(tx, Conversations, guarded, lambda r: r.mint_or_bump(
                    id=ids[guarded], remote_id=f"r{which}", kind="group", at_ms=at, now=now))
                assert wrote == (current < at)  # exactly one row iff strictly newer
                tx.execute(LEGACY_BUMP_RECENCY, {"id": ids[reference], "at": at})
            compare(tx, CONVERSATION_SQL, guarded, reference, 1, {k: v[1] for k, v in model.items()})


# -- rosters -----------------------------------------------------------------------------
ROSTER_SQL = ("SELECT conversation_id, identity_id, role, display_name, is_active, 0 "
              "FROM conversation_participants WHERE bridge_id = :bridge_id")

roster_ops = st.lists(
    st.tuples(
        st.sampled_from([False] * 6 + [True]),  # target a conversation that does not exist (rarely)
        st.lists(
            st.tuples(st.integers(0, 3), st.sampled_from(["member", "admin", "member", "bogus"]),
                      st.sampled_from(["", "A"]), st.booleans()),
            max_size=5,
        ),
        st.integers(0, 2),
    ),
    min_size=1,
    max_size=10,
)


def _roster_world(tx, bridge, now):
    once(tx, Conversations, bridge, lambda r: r.upsert(id=f"{bridge}/c", remote_id="c", kind="group", title="",
                                                       remote_revision=None, now=now))
    for i in range(4):
        once(tx, Identities, bridge, lambda r: r.upsert(id=f"{bridge}/i{i}", kind="username", canonical=f"u{i}",
                                                        raw=f"u{i}", display_name="", is_self=False, now=now))


def _sync(tx, bridge, cid, rows, now):
    def op(convs):
        convs.get("c")  # the conversation as the projection has it, read before its roster
        return convs.rosters.sync(conversation_id=cid, rows=rows, touched_at_ms=now)

    return once(tx, Conversations, bridge, op)


@SETTINGS
@given(ops=roster_ops)
def test_roster_sync_matches_delete_and_reinsert(store, ops):
    guarded, reference = make_bridge(store), make_bridge(store)
    now = 1_000
    with store.write() as tx:
        for bridge in (guarded, reference):
            _roster_world(tx, bridge, now)
        last_change = now
        for missing, entries, advance in ops:
            now += advance
            before = table(tx, ROSTER_SQL, guarded, 2)
            results = []
            for bridge in (guarded, reference):
                rows = [RosterRow(f"{bridge}/i{i}", role, name, active) for i, role, name, active in entries]
                cid = f"{bridge}/missing" if missing else f"{bridge}/c"
                if bridge == guarded:
                    fn = lambda: _sync(tx, bridge, cid, rows, now)
                else:
                    fn = lambda: legacy_replace_roster(tx, conversation_id=cid, bridge_id=bridge, rows=rows)
                results.append(outcome(tx, fn))
            same_errors(*results)
            after = compare(tx, ROSTER_SQL, guarded, reference, 2)
            if results[0][0] == "ok":
                assert (results[0][1] > 0) == (after != before)  # writes iff the roster changed
                if after != before:
                    last_change = max(last_change, now)
            updated = tx.scalar(UPDATED_AT, {"id": f"{guarded}/c"})
            assert updated == last_change


# -- reaction snapshots and the fence ----------------------------------------------------
REACTION_SQL = ("SELECT message_id, reactor_key, reactor_identity_id, reactor_is_self, emoji, state, 0 "
                "FROM reactions WHERE bridge_id = :bridge_id")
FENCE_SQL = "SELECT message_id, source_seq_ms, updated_at_ms FROM reaction_fences WHERE bridge_id = :bridge_id"

snapshot_ops = st.lists(
    st.tuples(
        st.integers(0, 1),  # message
        st.dictionaries(st.sampled_from(["self", "anon", "x"]), st.sampled_from(["👍", "❤️"]), max_size=3),
        st.sampled_from([100, 150, 200, 250, 300]),
        st.integers(0, 2),
    ),
    min_size=1,
    max_size=12,
)


def _message_world(tx, bridge, now):
    once(tx, Conversations, bridge, lambda r: r.upsert(id=f"{bridge}/c", remote_id="c", kind="group", title="",
                                                       remote_revision=None, now=now))
    once(tx, Identities, bridge, lambda r: r.upsert(id=f"{bridge}/x", kind="username", canonical="x", raw="x",
                                                    display_name="", is_self=False, now=now))
    for i in range(2):
        once(tx, Messages, bridge, lambda r: r.upsert(
            id=f"{bridge}/m{i}", conversation_id=f"{bridge}/c", remote_message_id=f"m{i}", sender_identity_id=None,
            direction="incoming", body="", reply_to_remote_id=None, occurred_at_ms=1, now=now))


@SETTINGS
@given(ops=snapshot_ops)
def test_reaction_snapshot_matches_the_unguarded_fence(store, ops):
    guarded, reference = make_bridge(store), make_bridge(store)
    now = 1_000
    fence_advanced: dict[tuple, int] = {}
    with store.write() as tx:
        for bridge in (guarded, reference):
            _message_world(tx, bridge, now)
        for which, chosen, seq, advance in ops:
            now += advance
            accepted = []
            for bridge in (guarded, reference):
                entries = {}
                for who, emoji in chosen.items():
                    if who == "self":
                        entries["self"] = SnapshotEntry(f"{bridge}/x", True, emoji, 5)
                    elif who == "anon":
                        entries[f"anon:{emoji}"] = SnapshotEntry(None, False, emoji, 5)
                    else:
                        entries[f"{bridge}/x"] = SnapshotEntry(f"{bridge}/x", False, emoji, 5)
                kw = dict(message_id=f"{bridge}/m{which}", conversation_id=f"{bridge}/c", entries=entries)
                if bridge == guarded:
                    before = tx.scalar(LEGACY_FENCE, {"message_id": f"{bridge}/m{which}"})
                    result = once(tx, Reactions, bridge, lambda r: r.apply_snapshot(**kw, source_seq_ms=seq, now=now))
                    accepted.append(result.accepted)
                    assert result.fence_written == (result.accepted and (before is None or seq > before))
                    if result.fence_written:
                        fence_advanced[(f"m{which}",)] = now
                else:
                    accepted.append(legacy_replace_reactions(tx, **kw, bridge_id=bridge, seq=seq, now=now))
            assert accepted[0] == accepted[1]
            assert accepted[0] == (seq >= (tx.scalar(LEGACY_FENCE, {"message_id": f"{reference}/m{which}"}) or 0))
            compare(tx, REACTION_SQL, guarded, reference, 2)
            compare(tx, FENCE_SQL, guarded, reference, 1, fence_advanced)


# -- messages ----------------------------------------------------------------------------
MESSAGE_SQL = ("SELECT remote_message_id, id, sender_identity_id, direction, body, reply_to_remote_id, state, "
               "occurred_at_ms, created_at_ms, updated_at_ms FROM bridge_messages WHERE bridge_id = :bridge_id")

message_ops = st.lists(
    st.one_of(
        st.tuples(st.just("upsert"), st.integers(0, 1), st.booleans(), st.sampled_from(["incoming", "outgoing"]),
                  st.sampled_from(["", "a", "b"]), st.sampled_from([None, "m1"]), st.sampled_from([10, 20]),
                  st.integers(0, 2)),
        st.tuples(st.just("edit"), st.integers(0, 1), st.sampled_from(["e1", "e2"]), st.integers(1, 3)),
        st.tuples(st.just("delete"), st.integers(0, 1)),
    ),
    min_size=1,
    max_size=12,
)


@SETTINGS
@given(ops=message_ops)
def test_message_upsert_matches_the_unguarded_upsert(store, ops):
    guarded, reference = make_bridge(store), make_bridge(store)
    now = 1_000
    model: dict[tuple, tuple] = {}
    with store.write() as tx:
        for bridge in (guarded, reference):
            _message_world(tx, bridge, now)
            tx.raw("DELETE FROM bridge_messages WHERE bridge_id = " + ("?" if store.dialect == "sqlite" else "%s"),
                   (bridge,))
        for op in ops:
            if op[0] == "upsert":
                _, which, has_sender, direction, body, reply, occurred, advance = op
                now += advance
                for bridge in (guarded, reference):
                    values = dict(id=f"{bridge}/m{which}", conversation_id=f"{bridge}/c",
                                  remote_message_id=f"m{which}",
                                  sender_identity_id=f"{bridge}/x" if has_sender else None, direction=direction,
                                  body=body, reply_to_remote_id=reply, occurred_at_ms=occurred, now=now)
                    if bridge == guarded:
                        result = once(tx, Messages, bridge, lambda r: r.upsert(**values))
                    else:
                        tx.execute(LEGACY_UPSERT_MESSAGE, {
                            "id": values["id"], "bridge_id": bridge, "conversation_id": values["conversation_id"],
                            "remote_message_id": values["remote_message_id"], "sender": values["sender_identity_id"],
                            "direction": direction, "body": body, "reply_to": reply, "occurred": occurred,
                            "now": now})
                key = (f"m{which}",)
                content = (has_sender, direction, body, reply, occurred)
                if key not in model:
                    assert result == "inserted"
                    model[key] = (content, now, "active")
                elif model[key][2] == "active" and model[key][0] != content:
                    assert result == "updated"
                    model[key] = (content, now, "active")
                else:
                    assert result is None
            else:
                which = op[1]
                now += 1
                changes = []
                for bridge in (guarded, reference):
                    if op[0] == "edit":
                        changes.append(once(tx, Messages, bridge, lambda r: r.edit(
                            id=f"{bridge}/m{which}", body=op[2], at_ms=op[3], now=now)))
                    else:
                        changes.append(once(tx, Messages, bridge, lambda r: r.delete(
                            id=f"{bridge}/m{which}", at_ms=5, now=now)))
                assert (changes[0] is None) == (changes[1] is None)
                key = (f"m{which}",)
                if changes[0] is not None:
                    model[key] = (None, now, "deleted" if op[0] == "delete" else "edited")
            compare(tx, MESSAGE_SQL, guarded, reference, 1, {k: v[1] for k, v in model.items()})
