"""The ingest fast path (docs/decisions.md, "Ingest fast path"), pinned:

* apply on append decodes the object the request already parsed (``Frame.doc``): the
  events (or the decode error) are exactly those of the stored text the drain decodes;
* decoders canonicalise each identity once (``events.identity_ref``): the ref carries the
  proof, ``validate_event`` and the projection use it, and the proof cannot be forged by
  the constructor nor survive ``dataclasses.replace``;
* SQLite appends run on connections the engine keeps (no pool checkout per request),
  one thread at a time each, a few kept idle, closed at stop;
* a bridge's platform is read once per process, and an unknown bridge is never
  remembered;
* the statements of one applied-on-append frame, pinned (downwards only).
"""

from __future__ import annotations

import dataclasses
import json
import threading
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_decoders import FUZZ, JSON, SEEDS, _mutate, all_fixture_names, codec_of, load

from tidings.bridges.registry import create_bridge
from tidings.counters import Counters
from tidings.errors import BadRequest, NotFound
from tidings.ingest import events as events_mod
from tidings.ingest.counters import INGEST_COUNTERS
from tidings.ingest.decoders import DECODERS, DecodeError, decode_frame
from tidings.ingest.engine import Ingest
from tidings.ingest.events import (
    IdentityRef,
    InvalidEvent,
    MessageEvent,
    identity_key,
    identity_ref,
    validate_event,
)
from tidings.ingest.inbox import parse_frame
from tidings.ingest.projection import key_of
from tidings.ingest.worker import StagedCounters
from tidings.store import inbox as inbox_store
from tidings.store.engine import Tx
from tidings.store.sql import Stmt

FIXTURES = Path(__file__).parent / "fixtures"


def _outcome(codec: str, payload: Any) -> tuple[str, Any]:
    try:
        return "events", decode_frame(codec, 1, payload)
    except DecodeError as exc:
        return "error", exc.cause


def _same_as_the_stored_text(codec: str, raw_payload: Any) -> None:
    """If the frame is accepted, decoding its parsed object == decoding its stored text."""
    try:
        frame = parse_frame({"codec": codec, "codec_version": 1, "dedupe_key": "", "payload": raw_payload}, 0)
    except BadRequest:
        return  # refused at append: never stored, never decoded
    if isinstance(raw_payload, str):
        assert frame.doc is None
        return
    assert frame.doc is raw_payload
    assert _outcome(codec, frame.doc) == _outcome(codec, frame.payload)


# -- decoding the parsed object ------------------------------------------------------------------
@pytest.mark.parametrize("name", all_fixture_names())
def test_fixtures_decode_the_same_from_the_parsed_object_and_from_the_stored_text(name: str) -> None:
    _same_as_the_stored_text(codec_of(name), load(name))


def test_a_synthetic_corpus_decodes_the_same_from_the_parsed_object_and_from_the_stored_text() -> None:
    from tidings.replay.synth import synthesize

    checked = 0
    for line in synthesize(1500, 11).lines:
        try:
            raw = json.loads(line)
        except ValueError:
            continue
        if isinstance(raw, dict) and raw.get("codec") in DECODERS and isinstance(raw.get("payload"), dict):
            _same_as_the_stored_text(raw["codec"], raw["payload"])
            checked += 1
    assert checked > 1000


@pytest.mark.parametrize("codec", sorted(DECODERS))
@settings(FUZZ, max_examples=200)
@given(data=st.data())
def test_fuzzed_payloads_decode_the_same_from_the_parsed_object_and_from_the_stored_text(codec, data) -> None:
    payload = _mutate(data.draw(st.sampled_from(SEEDS[codec]), label="fixture"), data)
    _same_as_the_stored_text(codec, payload)
    _same_as_the_stored_text(codec, {"kind": "message", "x": data.draw(JSON, label="value")})


def test_object_and_string_payloads_and_values_that_are_not_json() -> None:
    base = {"codec": "x", "codec_version": 1, "dedupe_key": ""}
    text = parse_frame({**base, "payload": '{"a": 1}'}, 0)
    assert (text.payload, text.doc) == ('{"a": 1}', None)
    obj = {"a": "é", "b": [1, 2.5, None]}
    frame = parse_frame({**base, "payload": obj}, 0)
    assert frame.payload == '{"a":"é","b":[1,2.5,null]}' and frame.doc is obj
    surrogate = parse_frame({**base, "payload": {"a": "\ud800"}}, 0)
    assert surrogate.payload == '{"a":"\\ud800"}' and json.loads(surrogate.payload) == surrogate.doc
    for bad in ({"a": float("nan")}, {"a": float("inf")}, {"a": {1, 2}}):
        with pytest.raises(BadRequest, match="payload is not valid JSON"):
            parse_frame({**base, "payload": bad}, 3)


# -- identities: one canonicalisation, carried as a proof ----------------------------------------
def test_identity_ref_carries_the_proof_and_nothing_else_can() -> None:
    ref = identity_ref("signal", " +1 (415) 555-0111 ", "Alice", False)
    assert (ref.kind, ref.canonical, ref.platform) == ("e164", "+14155550111", "signal")
    assert ref == IdentityRef(" +1 (415) 555-0111 ", "Alice", False, "e164", "+14155550111")  # not compared
    assert "platform" not in repr(ref)
    with pytest.raises(TypeError):
        IdentityRef("+1", platform="signal")  # type: ignore[call-arg]
    assert dataclasses.replace(ref, name="Bob").platform == ""  # a changed ref is not proven
    with pytest.raises(dataclasses.FrozenInstanceError):
        ref.raw = "+2"  # type: ignore[misc]
    with pytest.raises(InvalidEvent):
        identity_ref("signal", "+")
    with pytest.raises(ValueError, match="unknown platform"):
        identity_ref("telegram", "+1555")


def test_validation_canonicalises_unproven_identities_only(monkeypatch) -> None:
    calls = []
    real = events_mod._canonicalise
    monkeypatch.setattr(events_mod, "_canonicalise", lambda p, raw: calls.append(raw) or real(p, raw))
    proven = identity_ref("whatsapp", "123@LID")
    calls.clear()
    ev = MessageEvent("whatsapp:123@lid", "m1", proven, "incoming", "hi", 1_000)
    validate_event(ev)
    assert calls == []
    validate_event(dataclasses.replace(ev, sender=IdentityRef("123@LID", kind="jid", canonical="123@lid")))
    assert calls == ["123@LID"]
    with pytest.raises(InvalidEvent, match="cannot be canonicalised"):
        validate_event(dataclasses.replace(ev, sender=IdentityRef("+")))


@pytest.mark.parametrize("name", all_fixture_names())
def test_decoders_canonicalise_each_identity_once_and_every_ref_is_proven(name: str, monkeypatch) -> None:
    codec = codec_of(name)
    platform = DECODERS[codec].platform
    doc = load(name)
    calls = []
    real = events_mod._canonicalise
    monkeypatch.setattr(events_mod, "_canonicalise", lambda p, raw: calls.append(raw) or real(p, raw))
    built = DECODERS[codec]._decode(doc)  # the decoder's own work: one canonicalisation per sighting
    sightings = len(calls)
    calls.clear()
    decoded = DECODERS[codec].decode(doc)  # the same, then validate_event on every event
    assert decoded == built and len(calls) == sightings  # validation canonicalised nothing again
    refs = list(_refs(decoded))
    assert all(r.platform == platform for r in refs)
    for r in refs:
        assert identity_key(platform, r.raw) == (r.kind, r.canonical)
    calls.clear()
    for r in refs:
        assert key_of(platform, r, "x") == (r.kind, r.canonical)
    assert calls == []  # the projection used the proofs


def test_the_projection_canonicalises_a_ref_proven_for_another_platform() -> None:
    ref = identity_ref("google", "5E0C1A7E-3F7B-4B8E-9C61-2A4D8F1B0A11")
    assert ref.kind == "username"
    assert key_of("signal", ref, "x") == ("signal_aci", "5e0c1a7e-3f7b-4b8e-9c61-2a4d8f1b0a11")


def _refs(evs):
    for ev in evs:
        for name in ("sender", "actor"):
            value = getattr(ev, name, None)
            if isinstance(value, IdentityRef):
                yield value
        for part in getattr(ev, "participants", ()):
            yield part.identity


# -- staged counters ----------------------------------------------------------------------------------
def test_staged_counters_hold_counts_until_commit_and_refuse_unknown_names() -> None:
    target = Counters(INGEST_COUNTERS)
    staged = StagedCounters(target)
    staged.incr("messages_written")
    staged.incr("messages_written", 2)
    assert staged.get("messages_written") == 3 and staged.snapshot()["identities_written"] == 0
    assert set(staged.snapshot()) == set(INGEST_COUNTERS)
    with pytest.raises(KeyError):
        staged.incr("no_such_counter")
    assert target.get("messages_written") == 0
    staged.commit()
    assert target.get("messages_written") == 3


# -- append connections and the bridge read -----------------------------------------------------------
def signal_body(n: int, key: str | None = None) -> dict:
    payload = json.loads((FIXTURES / "signal_text_direct.json").read_text())
    env = payload["params"]["envelope"]
    env["timestamp"] += n
    env["dataMessage"]["timestamp"] += n
    env["dataMessage"]["message"] = f"message {n}"
    return {"codec": "signal.jsonrpc", "codec_version": 1, "dedupe_key": key if key is not None else f"k{n}",
            "payload": payload}


@pytest.fixture
def ingest(store, faults):
    ing = Ingest(store=store, faults=faults)
    yield ing
    ing.stop()


def outcomes(store) -> dict[str, int]:
    with store.read() as tx:
        rows = tx.raw("SELECT coalesce(outcome, 'unprocessed'), count(*) FROM inbox GROUP BY 1").fetchall()
    return {r[0]: int(r[1]) for r in rows}


def sent_by_a_second_frame(store, ingest, platform: str, body_of) -> dict[str, int]:
    """What ``body_of(1)`` costs (``Store.meter``) once ``body_of(0)`` has minted its rows
    on a fresh bridge of ``platform``."""
    bridge = create_bridge(store, platform=platform, name="p")["id"]
    ingest.append_body(bridge, body_of(0), platform)  # first sighting: reads the bridge, mints rows
    before = store.meter.snapshot()
    ingest.append_body(bridge, body_of(1), platform)
    after = store.meter.snapshot()
    return {k: after[k] - before[k] for k in after}


def test_one_applied_frame_costs_these_statements_and_a_known_bridge_is_not_read_again(store, ingest, monkeypatch):
    bridge = create_bridge(store, platform="signal", name="p")["id"]
    ingest.append_body(bridge, signal_body(0), "signal")  # first sighting: reads the bridge, mints rows
    names: list[str] = []
    real, real_later, real_many = Tx.execute, Tx.later, Tx.execute_many

    def counting(tx, stmt, params=None):
        names.append(stmt.name or str(stmt.clause))
        return real(tx, stmt, params)

    def counting_many(tx, stmt, rows):
        names.append(stmt.name)
        return real_many(tx, stmt, rows)

    def counting_later(tx, stmt, params=None):
        if tx.write_behind:  # sent behind; otherwise it runs now, through ``execute``
            names.append(stmt.name or str(stmt.clause))
        return real_later(tx, stmt, params)

    monkeypatch.setattr(Tx, "execute", counting)
    monkeypatch.setattr(Tx, "later", counting_later)
    monkeypatch.setattr(Tx, "execute_many", counting_many)
    before = store.meter.snapshot()
    ingest.append_body(bridge, signal_body(1), "signal")
    after = store.meter.snapshot()
    sent = {k: after[k] - before[k] for k in after}
    # The request's stored dedupe keys are read, and the frame's rows by one statement per
    # table family (D115): the sender, the conversation, the sender's place in its roster,
    # the message; the changed rows are written by one statement each: the conversation's
    # recency, the message; then the request's inbox row (D113).
    reads = ["inbox.stored_by_dedupe_keys", "identities.read_by_keys", "conversations.read_by_remote_ids",
             "participants.read_members", "bridge_messages.read_by_ids"]
    writes = ["conversations.write_rows", "bridge_messages.write_rows", "inbox.insert_frames"]
    if store.dialect == "postgresql":
        # The bridge's append lock is deferred (Tx.defer); the reads and the held-up check's
        # read (speculative, D82) go out together, announced ahead; the writes go behind,
        # with the COMMIT.
        assert names == [*reads, "inbox.older_unprocessed", *writes]
        # [BEGIN, lock, the 5 reads, held-up read] [the 3 writes, COMMIT]
        assert sent == {"statements": 12, "round_trips": 2, "commits": 1}
    else:
        assert names == ["inbox.older_unprocessed", *reads, *writes]
        # BEGIN IMMEDIATE, the nine, COMMIT: each one call, and no savepoint (a frame that
        # cannot call the link hook writes nothing until the flush).
        assert sent == {"statements": 11, "round_trips": 11, "commits": 1}
    assert outcomes(store) == {"applied": 2}


def sync_sent_body(n: int) -> dict:
    payload = json.loads((FIXTURES / "signal_sync_sent_direct.json").read_text())
    env = payload["params"]["envelope"]
    env["timestamp"] += n
    env["syncMessage"]["sentMessage"]["timestamp"] += n
    env["syncMessage"]["sentMessage"]["message"] = f"sent {n}"
    return {"codec": "signal.jsonrpc", "codec_version": 1, "dedupe_key": f"s{n}", "payload": payload}


def test_an_outgoing_message_takes_the_echo_lock_in_the_round_trip_of_its_echo_read(store, ingest):
    sent = sent_by_a_second_frame(store, ingest, "signal", sync_sent_body)
    if store.dialect == "postgresql":
        # [BEGIN, lock, dedupe read, sender, conversation and message reads, echo lock, echo
        # read, held-up read] [recency bump, message insert, inbox row, COMMIT]: the echo
        # lock and read are announced with the batch's other reads (D115), the lock first.
        assert sent == {"statements": 13, "round_trips": 2, "commits": 1}
    else:
        # BEGIN IMMEDIATE, held-up read, dedupe read, the three reads (SQLite has one writer:
        # no echo lock), the echo read, the two writes, the inbox row, COMMIT.
        assert sent == {"statements": 11, "round_trips": 11, "commits": 1}
    assert outcomes(store) == {"applied": 2}


def test_an_unknown_bridge_is_404_every_time_and_never_remembered(store, ingest):
    with pytest.raises(NotFound):
        ingest.append_body("br_nope", signal_body(0), "signal")
    assert "br_nope" not in ingest.worker.applier.platforms
    bridge = create_bridge(store, platform="signal", name="p")["id"]
    ingest.append_body(bridge, signal_body(0), "signal")
    assert ingest.worker.applier.platforms == {bridge: "signal"}
    with pytest.raises(NotFound):
        ingest.append_body("br_nope", signal_body(1), "signal")
    with pytest.raises(NotFound):  # the same without apply on append
        Ingest(store=store, apply_on_append=False).append_body("br_nope", signal_body(1), "signal")


@pytest.mark.sqlite_only
def test_sqlite_appends_take_no_pool_checkout_per_request(store, ingest, monkeypatch):
    bridge = create_bridge(store, platform="signal", name="p")["id"]
    ingest.append_body(bridge, signal_body(0), "signal")
    checkouts = []
    real = store.engine.raw_connection
    monkeypatch.setattr(store.engine, "raw_connection", lambda: checkouts.append(1) or real())
    for n in range(1, 20):
        ingest.append_body(bridge, signal_body(n), "signal")
    assert checkouts == []
    assert outcomes(store) == {"applied": 20}
    ingest.stop()
    assert ingest._connections._idle == []


def test_postgres_appends_keep_the_pool(store, ingest):
    assert (ingest._connections is None) == (store.dialect == "postgresql")


def test_concurrent_appends_each_get_a_connection_of_their_own_and_apply_in_order(store, ingest):
    bridges = [create_bridge(store, platform="signal", name=f"p{i}")["id"] for i in range(2)]
    errors: list[BaseException] = []
    per_thread = 25

    def run(t: int) -> None:
        try:
            for n in range(per_thread):
                ingest.append_body(bridges[t % 2], signal_body(t * 1000 + n), "signal")
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(t,)) for t in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(60)
    assert errors == []
    assert outcomes(store) == {"applied": 4 * per_thread}
    with store.read() as tx:
        assert tx.raw("SELECT count(*) FROM bridge_messages").fetchone()[0] == 4 * per_thread
    if ingest._connections is not None:
        assert len(ingest._connections._idle) <= ingest._connections.keep


@pytest.mark.sqlite_only
def test_a_failed_append_transaction_leaves_its_connection_usable(store, ingest):
    bridge = create_bridge(store, platform="signal", name="p")["id"]
    ingest.append_body(bridge, signal_body(0), "signal")

    def poison(tx, ctx, evs):  # the COMMIT fails on a deferred foreign key
        tx.raw("PRAGMA defer_foreign_keys = ON")
        tx.raw("INSERT INTO read_cursors (conversation_id, bridge_id, last_read_message_id, "
               "last_read_message_at_ms, last_read_at_ms, updated_at_ms) VALUES ('nope', ?, 'nope', 1, 1, 1)",
               (ctx.bridge_id,))
        return True

    from tidings.ingest import projection

    ingest.worker.applier.project = poison
    with pytest.raises(Exception):
        ingest.append_body(bridge, signal_body(1), "signal")
    ingest.worker.applier.project = projection.project_frame
    ingest.append_body(bridge, signal_body(2), "signal")
    assert outcomes(store) == {"applied": 2}
    with store.read() as tx:
        assert inbox_store.backlog(tx) == 0


def google_body(fixture: str, n: int) -> dict:
    """The Google fixture ``fixture`` as frame ``n`` (the same snapshot under its own key)."""
    payload = json.loads((FIXTURES / fixture).read_text())
    return {"codec": "google.json", "codec_version": 1, "dedupe_key": f"{fixture}:{n}", "payload": payload}


def test_a_roster_snapshot_reads_its_participants_in_the_round_trip_of_its_conversation_read(store, ingest):
    """A conversation snapshot names N participants: their identities are read ahead with
    the conversation's own read, so the frame costs the same round trips for any N."""
    sent = sent_by_a_second_frame(store, ingest, "google",
                                  lambda n: google_body("google_conversation_group.json", n))
    if store.dialect == "postgresql":
        # [BEGIN, lock, dedupe read, identities read (all 3 at once), conversation read,
        # roster read, held-up read] [inbox row, COMMIT]: every read is one statement a table
        # family (D115), and an unchanged snapshot writes nothing more.
        assert sent == {"statements": 9, "round_trips": 2, "commits": 1}
    else:
        # BEGIN IMMEDIATE, held-up read, dedupe read, the identities, conversation and roster
        # reads, the inbox row, COMMIT.
        assert sent == {"statements": 8, "round_trips": 8, "commits": 1}
    assert outcomes(store) == {"applied": 2}


def test_a_reaction_snapshot_reads_its_fence_and_its_reactions_in_one_round_trip(store, ingest):
    """An unchanged reaction snapshot of a stored message reads the message's fence and its
    reactions, and writes nothing; on PostgreSQL the two reads share a round trip."""
    sent = sent_by_a_second_frame(store, ingest, "google",
                                  lambda n: google_body("google_message_reactions.json", n))
    # PostgreSQL: the stored fence and the stored reactions are read with the batch's other
    # reads (D103, D115), in the inbox insert's round trip, and nothing changed is written;
    # SQLite: every statement is one call.
    assert sent["round_trips"] == {"postgresql": 2, "sqlite": 10}[store.dialect], sent
    assert outcomes(store) == {"applied": 2}


# -- writes sent behind on append (D105) ---------------------------------------------------
_ORPHAN_CURSOR = Stmt(
    "INSERT INTO read_cursors (conversation_id, bridge_id, last_read_message_id, last_read_message_at_ms, "
    "last_read_at_ms, updated_at_ms) VALUES ('nope', :bridge_id, 'nope', 1, 1, 1)"
)


def poisoned(bad_bodies: set[str]):
    """The real projection, plus, for a frame whose message body is in ``bad_bodies``, a
    write sent behind that the database refuses (a read cursor of no conversation)."""
    from tidings.ingest import projection

    def project(tx, ctx, events):
        changed = projection.project_frame(tx, ctx, events)
        if any(getattr(ev, "body", None) in bad_bodies for ev in events):
            tx.later(_ORPHAN_CURSOR, {"bridge_id": ctx.bridge_id})
        return changed

    return project


def message_bodies(store) -> list[str]:
    with store.read() as tx:
        return [r[0] for r in tx.raw("SELECT body FROM bridge_messages ORDER BY body").fetchall()]


def test_a_frame_whose_write_behind_fails_at_commit_is_stored_for_the_drain_which_quarantines_it(store, ingest):
    """The write fails where no savepoint of its frame can take it back (PostgreSQL: at
    COMMIT), so the append is made again without apply on append; the drain then applies
    each frame alone, eagerly, and quarantines this one with the database's cause. SQLite
    runs the write at once, inside the frame's savepoint: quarantined on append."""
    bridge = create_bridge(store, platform="signal", name="p")["id"]
    ingest.append_body(bridge, signal_body(0), "signal")
    ingest.worker.applier.project = poisoned({"message 1"})
    [r] = ingest.append_body(bridge, signal_body(1), "signal")
    assert not r.replay
    if store.dialect == "postgresql":
        assert outcomes(store) == {"applied": 1, "unprocessed": 1}  # nothing projected
        assert message_bodies(store) == ["message 0"]
        ingest.worker.drain_if_due()
    assert outcomes(store) == {"applied": 1, "quarantined": 1}
    with store.read() as tx:
        [q] = inbox_store.quarantined(tx, bridge, 10)
    assert q["inbox_id"] == r.inbox_id
    assert q["cause"].startswith("projection rejected by the database"), q["cause"]
    assert message_bodies(store) == ["message 0"]


def test_a_write_behind_that_fails_with_the_next_frame_never_quarantines_that_frame(store, ingest):
    """In a batch, frame 1's write goes out with frame 2's first statements; its failure is
    frame 1's, never frame 2's: the request is appended again without apply on append and
    the drain applies 0 and 2 and quarantines 1 alone."""
    bridge = create_bridge(store, platform="signal", name="p")["id"]
    ingest.worker.applier.project = poisoned({"message 1"})
    results = ingest.append_body(bridge, {"frames": [signal_body(n) for n in range(3)]}, "signal")
    ingest.worker.drain_if_due()
    assert outcomes(store) == {"applied": 2, "quarantined": 1}
    with store.read() as tx:
        [q] = inbox_store.quarantined(tx, bridge, 10)
    assert q["inbox_id"] == results[1].inbox_id
    assert message_bodies(store) == ["message 0", "message 2"]


def test_a_batch_of_frames_costs_two_round_trips_whatever_its_size(store, ingest):
    """A request's frames are decoded first; one read brings the rows they all touch, in
    the first frame's round trip; the frames are projected in memory; their changed rows
    and inbox rows go out behind, with the COMMIT (D113, D115)."""
    bridge = create_bridge(store, platform="signal", name="p")["id"]
    ingest.append_body(bridge, signal_body(0), "signal")  # first sighting: reads the bridge, mints rows
    before = store.meter.snapshot()
    ingest.append_body(bridge, {"frames": [signal_body(n) for n in range(1, 11)]}, "signal")
    after = store.meter.snapshot()
    sent = {k: after[k] - before[k] for k in after}
    if store.dialect == "postgresql":
        # [BEGIN, lock, dedupe read, the 4 reads, held-up read] then [the 2 writes, the inbox
        # rows, COMMIT]: 2 round trips for 10 frames.
        assert sent == {"statements": 12, "round_trips": 2, "commits": 1}, sent
    else:
        # The same statements, each one call: no statement a frame.
        assert sent == {"statements": 11, "round_trips": 11, "commits": 1}, sent
    assert outcomes(store) == {"applied": 11}


def drained_second_frame(store, platform: str, body_of, *, write_behind: bool = True) -> dict[str, int]:
    """What the drain sends to apply frame 1 of a fresh bridge (``write_behind=False``: the
    eager drain, every write at once)."""
    ingest = Ingest(store=store, apply_on_append=False)
    ingest.worker.write_behind = write_behind
    try:
        bridge = create_bridge(store, platform=platform, name="p")["id"]
        ingest.append_body(bridge, body_of(0), platform)
        ingest.worker.drain_if_due()
        ingest.append_body(bridge, body_of(1), platform)
        before = store.meter.snapshot()
        ingest.worker.drain_if_due()
        after = store.meter.snapshot()
    finally:
        ingest.stop()
    return {k: after[k] - before[k] for k in after}


def test_the_eager_drain_reads_a_frames_rows_in_one_round_trip(store):
    """Without write behind, the drain still reads a frame's rows in one round trip (D115):
    the roster's identities with the conversation and its roster, the fence with the
    reactions; and an unchanged snapshot writes nothing."""
    roster = drained_second_frame(store, "google", lambda n: google_body("google_conversation_group.json", n),
                                  write_behind=False)
    reactions = drained_second_frame(store, "google", lambda n: google_body("google_message_reactions.json", n),
                                     write_behind=False)
    assert outcomes(store) == {"applied": 4}
    if store.dialect == "postgresql":
        # [page listing, autocommit] [BEGIN, claim] [lock, the reads] [COMMIT]
        assert (roster["round_trips"], reactions["round_trips"]) == (4, 4), (roster, reactions)
    else:
        assert roster["round_trips"] == roster["statements"] and reactions["round_trips"] == reactions["statements"]


@pytest.mark.parametrize("shape", ["signal message", "google roster", "google reactions"])
def test_the_drain_sends_a_frames_writes_behind_and_its_reads_ahead(store, shape):
    """A drained frame is claimed (its row comes back), decoded, its rows read in one round
    trip and its writes sent with the COMMIT (D106, D115): the page listing, the claim, the
    reads, the commit. SQLite: one call per statement, as before."""
    body_of = {
        "signal message": ("signal", signal_body),
        "google roster": ("google", lambda n: google_body("google_conversation_group.json", n)),
        "google reactions": ("google", lambda n: google_body("google_message_reactions.json", n)),
    }[shape]
    sent = drained_second_frame(store, *body_of)
    assert outcomes(store) == {"applied": 2}
    if store.dialect == "postgresql":
        # [page listing, autocommit] [BEGIN, claim] [lock, the reads] [writes, COMMIT]
        assert sent["round_trips"] == 4 and sent["commits"] == 1, sent
    else:
        assert sent["round_trips"] == sent["statements"] and sent["commits"] == 1, sent


def test_a_drained_frame_whose_write_behind_fails_is_quarantined_alone_with_the_databases_cause(store):
    """The drain's frame is its own transaction: a write sent behind that the database
    refuses at COMMIT rolls back that frame alone, and the frame is quarantined with the
    database's error as its cause, exactly as the eager drain would; the next frame applies."""
    ingest = Ingest(store=store, apply_on_append=False)
    try:
        bridge = create_bridge(store, platform="signal", name="p")["id"]
        ingest.worker.applier.project = poisoned({"message 1"})
        results = [ingest.append_body(bridge, signal_body(n), "signal")[0] for n in range(3)]
        ingest.worker.drain_if_due()
    finally:
        ingest.stop()
    assert outcomes(store) == {"applied": 2, "quarantined": 1}
    with store.read() as tx:
        [q] = inbox_store.quarantined(tx, bridge, 10)
    assert q["inbox_id"] == results[1].inbox_id
    assert q["cause"].startswith("projection rejected by the database"), q["cause"]
    assert message_bodies(store) == ["message 0", "message 2"]


def test_a_redelivered_message_applied_on_append_writes_nothing(store, ingest, clock):
    """The message upsert sent behind keeps the write guard (PostgreSQL: one statement)."""
    bridge = create_bridge(store, platform="signal", name="p")["id"]
    ingest.append_body(bridge, signal_body(0), "signal")
    with store.read() as tx:
        before = tx.raw("SELECT id, updated_at_ms FROM bridge_messages").fetchall()
    clock.advance(60_000)
    ingest.append_body(bridge, signal_body(0, key="again"), "signal")  # the same message, re-delivered
    with store.read() as tx:
        assert tx.raw("SELECT id, updated_at_ms FROM bridge_messages").fetchall() == before
    assert outcomes(store) == {"applied": 2}
    assert ingest.counters.of(bridge).snapshot()["messages_written"] == 1


@pytest.mark.postgres_only
def test_a_drained_frame_whose_write_behind_fails_transiently_is_tried_again_not_quarantined(store):
    """A transient error of a write that waited for the COMMIT (here a serialization failure
    the first time a function runs) is the database's own error to the retry loop: the
    frame is tried again and applies, with one transient retry counted."""
    with store.write() as tx:
        tx.raw("CREATE SEQUENCE flaky_once")
        tx.raw(
            "CREATE FUNCTION flaky_once() RETURNS int LANGUAGE plpgsql AS $$ BEGIN "
            "IF nextval('flaky_once') = 1 THEN RAISE EXCEPTION 'try again' USING ERRCODE = '40001'; END IF; "
            "RETURN 1; END $$"
        )
    flaky = Stmt("SELECT flaky_once()")
    from tidings.ingest import projection

    def project(tx, ctx, events):
        changed = projection.project_frame(tx, ctx, events)
        tx.later(flaky)
        return changed

    ingest = Ingest(store=store, apply_on_append=False, sleep=lambda _s: None)
    try:
        bridge = create_bridge(store, platform="signal", name="p")["id"]
        ingest.worker.applier.project = project
        ingest.append_body(bridge, signal_body(0), "signal")
        ingest.worker.drain_if_due()
    finally:
        ingest.stop()
    assert outcomes(store) == {"applied": 1}
    assert ingest.counters.of(bridge).snapshot()["transient_retries"] == 1
    assert message_bodies(store) == ["message 0"]


def test_an_applied_frame_leaves_no_reference_cycle_behind(store, ingest):
    """A frame's batch, its table families and its transaction are freed when the append
    returns, not by the garbage collector (a cycle per frame made Python's collector run
    every few dozen frames). Frames of each shape: a message, a roster snapshot, reactions."""
    import gc

    from tidings.store.conversations import Conversations
    from tidings.store.engine import Tx as StoreTx

    bridge = create_bridge(store, platform="google", name="p")["id"]
    signal = create_bridge(store, platform="signal", name="s")["id"]
    ingest.append_body(signal, signal_body(0), "signal")  # first sightings: mint the rows
    ingest.append_body(bridge, google_body("google_conversation_group.json", 0), "google")
    gc.collect()
    was = gc.get_debug()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)  # what a collection finds is kept in gc.garbage, for the assert
    try:
        for n in range(1, 4):
            ingest.append_body(signal, signal_body(n), "signal")
            ingest.append_body(bridge, google_body("google_conversation_group.json", n), "google")
            ingest.append_body(bridge, google_body("google_message_reactions.json", n), "google")
        gc.collect()
        left = [type(o).__name__ for o in gc.garbage if isinstance(o, Conversations | StoreTx)]
    finally:
        gc.set_debug(was)
        gc.garbage.clear()
        gc.enable()
    assert left == []
    assert outcomes(store) == {"applied": 11}
