"""The worker with the real decoders and the real projection, on both backends.

* every fixture of every codec goes through append -> drain and is applied;
* a transient failure inside the projection's reactions step (after the identities,
  conversation and message rows were written) leaves the frame unprocessed and the bridge
  tables untouched, and the frame applies fully on its retry (one transaction per frame);
* Hypothesis-fuzzed frames (mutated fixtures, random objects, unknown codecs) never crash
  the worker: each ends applied, or quarantined with its cause.
"""

from __future__ import annotations

import copy
import json
import sqlite3
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tidings.bridges.registry import create_bridge
from tidings.ids import new_id
from tidings.ingest import projection
from tidings.ingest.decoders import DECODERS
from tidings.ingest.engine import Ingest
from tidings.store import inbox as inbox_store

FIXTURES = Path(__file__).parent / "fixtures"
CODEC_OF_PREFIX = {"signal": "signal.jsonrpc", "whatsapp": "whatsapp.event", "google": "google.json"}
BRIDGE_TABLES = ("identities", "conversations", "conversation_participants", "bridge_messages", "reactions",
                 "reaction_fences", "read_cursors")


def fixtures():
    out = []
    for path in sorted(FIXTURES.glob("*.json")):
        prefix = path.name.split("_", 1)[0]
        out.append((prefix, CODEC_OF_PREFIX[prefix], json.loads(path.read_text())))
    return out


FIXTURE_PAYLOADS = fixtures()


def frame(codec, payload, key=""):
    return {"codec": codec, "codec_version": 1, "dedupe_key": key, "payload": payload}


def table_counts(store):
    with store.read() as tx:
        return {t: tx.raw(f"SELECT count(*) FROM {t}").fetchone()[0] for t in BRIDGE_TABLES}


def outcomes(store):
    with store.read() as tx:
        return tx.raw("SELECT inbox_id, outcome, cause, processed_at_ms FROM inbox").fetchall()


@pytest.fixture
def ingest(store, faults):
    ing = Ingest(store=store, faults=faults, sleep=lambda s: None, apply_on_append=False)  # the drain path
    yield ing
    ing.stop()


def test_every_fixture_of_every_codec_is_applied(store, ingest, clock):
    bridges = {p: create_bridge(store, platform=p, name=p)["id"] for p in CODEC_OF_PREFIX}
    for prefix, codec, payload in FIXTURE_PAYLOADS:
        ingest.append_body(bridges[prefix], frame(codec, payload), prefix)
        clock.advance(1)
    stats = ingest.drain()
    rows = outcomes(store)
    assert stats.applied == len(FIXTURE_PAYLOADS) == len(rows)
    assert all(outcome == "applied" and cause is None for _, outcome, cause, _ in rows)
    assert table_counts(store)["bridge_messages"] > 0
    per_bridge = ingest.status()["per_bridge"]
    assert sum(c["projected"] for c in per_bridge.values()) == len(FIXTURE_PAYLOADS)


def test_a_signal_read_sync_moves_the_group_cursor_through_the_real_decoder(store, ingest, clock):
    """signal-cli's read sync names Bob and the timestamp of his message in the Family
    group, not the group: the real decoder aims it at Bob's direct chat, and the
    projection finds the group message by its remote id (``signal_group_quote.json`` is the
    message ``signal_sync_read.json`` reads)."""
    bridge = create_bridge(store, platform="signal", name="s")["id"]
    for name in ("signal_group_quote.json", "signal_sync_read.json"):
        payload = json.loads((FIXTURES / name).read_text())
        ingest.append_body(bridge, frame("signal.jsonrpc", payload), "signal")
        clock.advance(1)
    assert ingest.drain().applied == 2
    with store.read() as tx:
        rows = tx.raw(
            "SELECT c.remote_conversation_id, m.remote_message_id, r.last_read_at_ms FROM read_cursors r "
            "JOIN conversations c ON c.id = r.conversation_id JOIN bridge_messages m ON m.id = r.last_read_message_id"
        ).fetchall()
    group = "signal-group:q2Vn0aRZ8f0yX8Tt6cJmK1x4Wn9bYl3eQvPzA5oHs7c="
    assert [tuple(r) for r in rows] == [(group, "9b2f6d3c-8e4a-4f1d-a7c2-5d3e1f0b9c22:1717160300000", 1717161200000)]
    assert ingest.status()["per_bridge"][bridge]["receipts_self"] == 1


def test_transient_failure_in_the_reactions_step_rolls_the_whole_frame_back(store, ingest, clock, monkeypatch):
    bridge = create_bridge(store, platform="google", name="g")["id"]
    payload = json.loads((FIXTURES / "google_message_reactions.json").read_text())
    original = projection._Frame.reactions
    calls = {"n": 0}

    def failing_reactions(self, reacts):
        calls["n"] += 1
        original(self, reacts)  # the reaction rows and the fence are written...
        if calls["n"] <= 4:
            exc = sqlite3.OperationalError("database is locked")
            exc.sqlite_errorcode = 5
            raise exc  # ...then the step fails transiently

    monkeypatch.setattr(projection._Frame, "reactions", failing_reactions)
    empty = table_counts(store)
    [res] = ingest.append_body(bridge, frame("google.json", payload), "google")
    stats = ingest.drain()
    assert stats.deferred == 1 and calls["n"] == 4
    [(inbox_id, outcome, cause, processed)] = outcomes(store)
    assert (outcome, cause, processed) == (None, None, None)
    assert table_counts(store) == empty  # nothing of the frame survived: not even its message
    clock.advance(1000)
    assert ingest.drain().applied == 1
    after = table_counts(store)
    assert after["bridge_messages"] == 1 and after["reactions"] >= 1 and after["reaction_fences"] == 1
    [(inbox_id, outcome, cause, processed)] = outcomes(store)
    assert outcome == "applied" and processed == clock.now_ms()
    c = ingest.status()["per_bridge"][bridge]
    assert c["projected"] == 1 and c["deferred"] == 1 and c["reactions_applied"] >= 1


# -- fuzz ----------------------------------------------------------------------------------------
json_leaf = st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(allow_nan=False, allow_infinity=False),
                      st.text(max_size=12))
json_value = st.recursive(
    json_leaf,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)),
    max_leaves=12,
)


def _paths(doc, prefix=()):
    if isinstance(doc, dict):
        for k, v in doc.items():
            yield prefix + (k,)
            yield from _paths(v, prefix + (k,))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            yield prefix + (i,)
            yield from _paths(v, prefix + (i,))


@st.composite
def fuzzed_frame(draw):
    kind = draw(st.sampled_from(["mutated", "mutated", "random", "unknown"]))
    if kind == "random":
        codec = draw(st.sampled_from(sorted(DECODERS)))
        return codec, draw(st.dictionaries(st.text(max_size=10), json_value, max_size=6))
    if kind == "unknown":
        return draw(st.sampled_from(["signal.future", "x"])), {"any": draw(json_value)}
    prefix, codec, payload = draw(st.sampled_from(FIXTURE_PAYLOADS))
    doc = copy.deepcopy(payload)
    for _ in range(draw(st.integers(1, 4))):
        paths = list(_paths(doc))
        if not paths:
            break
        path = draw(st.sampled_from(paths))
        parent = doc
        for step in path[:-1]:
            parent = parent[step]
        if draw(st.booleans()) and isinstance(parent, dict):
            del parent[path[-1]]
        else:
            parent[path[-1]] = draw(json_value)
    return codec, doc


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                  HealthCheck.too_slow])
@given(frames=st.lists(fuzzed_frame(), min_size=1, max_size=8))
def test_fuzzed_frames_never_crash_the_worker(store, faults, clock, frames):
    with store.write() as tx:
        tx.raw("DELETE FROM inbox")
    ing = Ingest(store=store, faults=faults, sleep=lambda s: None)
    try:
        bridges = {p: create_bridge(store, platform=p, name=new_id("f"))["id"] for p in CODEC_OF_PREFIX}
        platform_of = {codec: p for p, codec in CODEC_OF_PREFIX.items()}
        for codec, payload in frames:
            platform = platform_of.get(codec, "signal")
            ing.append_body(bridges[platform], frame(codec, payload), platform)
            clock.advance(1)
        stats = ing.drain()
        assert stats.complete and stats.deferred == 0
        rows = [r for r in outcomes(store)]
        assert len(rows) == len(frames)
        for _, outcome, cause, processed in rows:
            assert processed is not None
            assert (outcome == "applied" and cause is None) or (outcome == "quarantined" and cause)
        with store.read() as tx:
            assert inbox_store.backlog(tx) == 0
    finally:
        ing.stop()
