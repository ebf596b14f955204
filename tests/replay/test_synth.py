"""The synthetic corpus (issue 5 item 1): deterministic, decodable, shaped like bridge traffic."""

from __future__ import annotations

import hashlib
import json
import os
import re
import statistics
import subprocess
import sys
from collections import Counter, defaultdict

import pytest
from typer.testing import CliRunner

from tidings.cli import app
from tidings.ingest.decoders import DECODERS, DecodeError, decode_frame
from tidings.ingest.events import (
    ConversationEvent,
    MessageEvent,
    MessageMutationEvent,
    ReactionEvent,
    ReceiptEvent,
)
from tidings.replay.synth import CODEC_SHARE, synthesize

N = 5000
SEED = 11
FRAME_KEYS = ["codec", "codec_version", "dedupe_key", "received_at_ms", "payload"]
MENTION = re.compile(r"(?i)@([a-z0-9][a-z0-9._-]*)")  # CONTRACT §2, Messages


@pytest.fixture(scope="module")
def corpus():
    return synthesize(N, SEED)


@pytest.fixture(scope="module")
def frames(corpus) -> list[dict]:
    return [json.loads(line) for line in corpus.lines]


@pytest.fixture(scope="module")
def decoded(frames) -> list:
    """Per frame: its events, or the DecodeError it raised."""
    out: list = []
    for f in frames:
        try:
            out.append(decode_frame(f["codec"], f["codec_version"], f["payload"]))
        except DecodeError as exc:
            out.append(exc)
    return out


def _good(frames, decoded):
    for f, evs in zip(frames, decoded):
        if not isinstance(evs, DecodeError):
            yield f, evs


# ---------------------------------------------------------------------------- determinism


def test_same_seed_same_bytes_other_seed_differs() -> None:
    a = synthesize(2000, 5).lines
    assert a == synthesize(2000, 5).lines
    b = synthesize(2000, 6).lines
    assert a != b
    assert len(b) == 2000


def test_independent_of_hash_randomisation() -> None:
    code = (
        "import hashlib; from tidings.replay.synth import synthesize; "
        "print(hashlib.sha256('\\n'.join(synthesize(1500, 9).lines).encode()).hexdigest())"
    )
    digests = set()
    for hash_seed in ("1", "2"):
        env = dict(os.environ, PYTHONHASHSEED=hash_seed)
        run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                             text=True, timeout=60, check=True)
        digests.add(run.stdout.strip())
    expected = hashlib.sha256("\n".join(synthesize(1500, 9).lines).encode()).hexdigest()
    assert digests == {expected}


@pytest.mark.parametrize("n", [1, 2, 7, 60, 250])
def test_small_corpora_have_exactly_n_decodable_lines(n: int) -> None:
    corpus = synthesize(n, 3)
    assert len(corpus.lines) == n == corpus.stats.frames
    for i, line in enumerate(corpus.lines):
        f = json.loads(line)
        if i in corpus.stats.malformed_indices:
            continue
        decode_frame(f["codec"], f["codec_version"], f["payload"])


# ---------------------------------------------------------------------------- shape and mix


def test_every_line_is_a_contract_frame(corpus, frames) -> None:
    assert len(frames) == N
    for f in frames:
        assert list(f) == FRAME_KEYS
        assert isinstance(f["codec"], str) and isinstance(f["dedupe_key"], str)
        assert isinstance(f["received_at_ms"], int) and f["received_at_ms"] > 1_700_000_000_000
        assert isinstance(f["payload"], (dict, str)), "CONTRACT §4.2: an object or a string"
        assert isinstance(f["codec_version"], int) and f["codec_version"] >= 0
    good = [f for i, f in enumerate(frames) if i not in set(corpus.stats.malformed_indices)]
    assert all(f["codec_version"] == 1 and isinstance(f["payload"], dict) for f in good)
    span_h = (frames[-1]["received_at_ms"] - frames[0]["received_at_ms"]) / 3_600_000
    assert 6 < span_h < 24 * 30, "a plausible capture spans hours to weeks"


def test_codec_mix_matches_the_reference_corpus(frames) -> None:
    counts = Counter(f["codec"] for f in frames)
    for codec, share in CODEC_SHARE.items():
        assert abs(counts[codec] / N - share) < 0.03, (codec, counts[codec] / N)
    assert sum(counts[c] for c in CODEC_SHARE) >= N * 0.99


def test_good_frames_decode_and_malformed_ones_are_rejected(corpus, frames, decoded) -> None:
    failed = [i for i, evs in enumerate(decoded) if isinstance(evs, DecodeError)]
    assert failed == corpus.stats.malformed_indices
    assert 0.003 <= len(failed) / N <= 0.007
    kinds = corpus.stats.malformed_by_type
    assert sum(kinds.values()) == len(failed)
    assert len(kinds) >= 4, kinds  # truncated JSON, wrong types, missing fields, codecs...
    strings = [frames[i] for i in failed if isinstance(frames[i]["payload"], str)]
    assert strings, "some malformed frames carry a broken JSON string payload"
    for f in strings:
        with pytest.raises(ValueError):
            json.loads(f["payload"])
    assert any(frames[i]["codec"] not in DECODERS or frames[i]["codec_version"] != 1 for i in failed)


def test_every_event_kind_and_variant_is_present(frames, decoded) -> None:
    kinds: Counter = Counter()
    variants: Counter = Counter()
    for f, evs in _good(frames, decoded):
        for ev in evs:
            kinds[type(ev)] += 1
            if isinstance(ev, ConversationEvent):
                variants["conversation", ev.kind] += 1
            elif isinstance(ev, MessageEvent):
                variants["message", f["codec"], ev.direction] += 1
                if ev.reply_to_remote_id:
                    variants["reply"] += 1
                if ev.attachments:
                    variants["attachment"] += 1
            elif isinstance(ev, MessageMutationEvent):
                variants["mutation", f["codec"], ev.kind] += 1
            elif isinstance(ev, ReactionEvent):
                variants["reaction", ev.action] += 1
                variants["reaction_by", ev.actor.is_self] += 1
            elif isinstance(ev, ReceiptEvent):
                variants["receipt", ev.status, ev.actor.is_self] += 1
    nothing = Counter(f["codec"] for f, evs in _good(frames, decoded) if not evs)
    assert nothing, "some real frames decode to nothing (timers, stickers, retry receipts)"
    for kind in (ConversationEvent, MessageEvent, MessageMutationEvent, ReactionEvent, ReceiptEvent):
        assert kinds[kind] >= 20, (kind.__name__, kinds)
    assert kinds[MessageEvent] > N * 0.3
    expected = [
        ("conversation", "direct"), ("conversation", "group"),
        ("reply",), ("attachment",),
        ("reaction", "add"), ("reaction", "remove"), ("reaction_by", True), ("reaction_by", False),
        ("receipt", "delivered", False), ("receipt", "read", False), ("receipt", "read", True),
        ("receipt", "delivered", True),
    ]
    for codec in ("signal.jsonrpc", "whatsapp.event", "google.json"):
        expected += [("message", codec, "incoming"), ("message", codec, "outgoing")]
    for codec in ("signal.jsonrpc", "whatsapp.event"):
        expected += [("mutation", codec, "edit"), ("mutation", codec, "delete")]
    for key in expected:
        key = key if len(key) > 1 else key[0]
        assert variants[key] > 0, key


def test_conversations_are_many_and_some_people_are_in_many(frames, decoded) -> None:
    convs: dict[str, set] = defaultdict(set)
    senders: dict[str, set] = defaultdict(set)
    group_sizes = []
    for _, evs in _good(frames, decoded):
        for ev in evs:
            if isinstance(ev, MessageEvent):
                convs[ev.sender.canonical].add(ev.remote_conversation_id)
                senders[ev.remote_conversation_id].add(ev.sender.canonical)
            if isinstance(ev, ConversationEvent) and ev.kind == "group":
                group_sizes.append(len(ev.participants))
    all_convs = set().union(*convs.values())
    assert len(all_convs) >= 40
    per_person = sorted((len(v) for k, v in convs.items()), reverse=True)
    assert per_person[0] >= 3 and statistics.median(per_person) <= 2
    assert min(group_sizes) >= 3, "a Google group is us and at least two others"
    groups = [c for c in senders if c.startswith("signal-group:") or c.endswith("@g.us")]
    directs = [c for c in senders if c not in groups]
    assert len(groups) >= 5 and len(directs) >= 10
    assert max(len(senders[c]) for c in groups) >= 6
    assert all(len(senders[c]) <= 2 for c in directs if c.startswith("whatsapp:"))


def test_bodies_look_like_chat(frames, decoded) -> None:
    bodies = [ev.body for _, evs in _good(frames, decoded) for ev in evs
              if isinstance(ev, MessageEvent) and ev.body]
    lengths = [len(b) for b in bodies]
    assert 5 <= statistics.median(lengths) <= 60
    assert max(lengths) > 150
    assert len(set(bodies)) > len(bodies) * 0.4
    assert sum(1 for b in bodies if MENTION.search(b)) > 20
    assert sum(1 for b in bodies if not b.isascii()) > len(bodies) * 0.05
    assert any(any(0x1F300 <= ord(ch) <= 0x1FAFF for ch in b) for b in bodies)


# ---------------------------------------------------------------------------- imperfections


def test_dedupe_keys_look_like_the_bridges(corpus, frames) -> None:
    patterns = {
        "signal.jsonrpc": re.compile(r"env:[^:]+:\d{13}|line:[0-9a-f]{16}"),
        "google.json": re.compile(r"(msg|conv):\d+:[0-9a-f]{8}"),
        "whatsapp.event": re.compile(r"wa:[0-9A-F]{20,32}|hist:\d+"),
    }
    bad = set(corpus.stats.malformed_indices)
    empty = Counter()
    for i, f in enumerate(frames):
        key = f["dedupe_key"]
        if not key:
            empty[f["codec"]] += 1
            continue
        assert patterns[f["codec"]].fullmatch(key), key
        if f["codec"] == "google.json" and i not in bad:
            kind = f["payload"]["kind"]
            inner = json.dumps(f["payload"][kind], ensure_ascii=False, separators=(",", ":"))
            ident = f["payload"][kind]["messageID" if kind == "message" else "conversationID"]
            assert key == f"{'msg' if kind == 'message' else 'conv'}:{ident}:" + \
                hashlib.sha256(inner.encode()).hexdigest()[:8]
    assert empty["whatsapp.event"] > 0 and sum(empty.values()) < N * 0.25


def test_duplicates_repeat_key_and_payload(frames) -> None:
    first: dict[tuple, tuple[int, str]] = {}
    gaps = []
    for i, f in enumerate(frames):
        if not f["dedupe_key"]:
            continue
        key = (f["codec"], f["dedupe_key"])
        payload = json.dumps(f["payload"], sort_keys=True)
        if key in first:
            j, seen = first[key]
            assert seen == payload, f"key {key} re-used for a different payload"
            gaps.append(i - j)
        else:
            first[key] = (i, payload)
    assert len(gaps) > N * 0.01
    assert any(g == 1 for g in gaps) and any(3 <= g <= 50 for g in gaps)


def test_google_snapshots_resent_unchanged_with_some_roster_and_title_changes(frames, decoded) -> None:
    last: dict[str, ConversationEvent] = {}
    keys: set[str] = set()
    same_bytes = same_event = roster = title = 0
    for f, evs in _good(frames, decoded):
        for ev in evs:
            if not isinstance(ev, ConversationEvent):
                continue
            prev = last.get(ev.remote_conversation_id)
            if f["dedupe_key"] in keys:
                same_bytes += 1
            elif prev is not None and prev == ev:
                same_event += 1
            elif prev is not None:
                if prev.title != ev.title and prev.participants == ev.participants:
                    title += 1
                elif prev.participants != ev.participants:
                    roster += 1
            keys.add(f["dedupe_key"])
            last[ev.remote_conversation_id] = ev
    assert same_bytes > 10, "byte-identical re-sends (same dedupe key)"
    assert same_event > 50, "new key, but nothing the projection keeps has changed"
    assert roster >= 1 and title >= 1, (roster, title)


def test_google_reaction_snapshots_change_over_time_down_to_empty(frames, decoded) -> None:
    state: dict[str, dict] = {}
    switched = emptied = 0
    for f, evs in _good(frames, decoded):
        if f["codec"] != "google.json" or not evs or not isinstance(evs[0], MessageEvent):
            continue
        assert evs[0].reactions_snapshot
        now = {ev.actor.canonical: ev.emoji for ev in evs[1:]}
        prev = state.get(evs[0].remote_message_id)
        if prev:
            if not now:
                emptied += 1
            if any(actor in now and now[actor] != emoji for actor, emoji in prev.items()):
                switched += 1
        state[evs[0].remote_message_id] = now
    assert emptied >= 1 and switched >= 1, (emptied, switched)


def test_receipt_times_mostly_increase_with_some_out_of_order(corpus, frames, decoded) -> None:
    times = [f["received_at_ms"] for f in frames]
    backwards = sum(1 for a, b in zip(times, times[1:]) if b < a)
    assert 0 < backwards < N * 0.05
    assert corpus.stats.stale_snapshots > 0

    # a message frame written after its own edit or reaction
    targeted: set[tuple[str, str]] = set()
    late = 0
    for _, evs in _good(frames, decoded):
        for ev in evs:
            if isinstance(ev, ReactionEvent):
                targeted.add((ev.remote_conversation_id, ev.target_remote_message_id))
            elif isinstance(ev, MessageMutationEvent):
                targeted.add((ev.remote_conversation_id, ev.remote_message_id))
            elif isinstance(ev, MessageEvent) and not ev.reactions_snapshot:
                late += (ev.remote_conversation_id, ev.remote_message_id) in targeted
    assert late > 0 and corpus.stats.late_messages > 0


# ---------------------------------------------------------------------------- the command


def test_cli_writes_the_corpus_and_summarises(tmp_path) -> None:
    runner = CliRunner()
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    for path in (a, b):
        result = runner.invoke(app, ["corpus", "synth", "--frames", "400", "--seed", "4", "-o", str(path)])
        assert result.exit_code == 0, result.output
    assert a.read_bytes() == b.read_bytes()
    lines = a.read_text(encoding="utf-8").splitlines()
    assert len(lines) == 400 and lines == synthesize(400, 4).lines
    assert "400 frames" in result.output and "malformed" in result.output and "duplicates" in result.output

    missing = tmp_path / "nowhere" / "c.jsonl"
    result = runner.invoke(app, ["corpus", "synth", "--frames", "10", "-o", str(missing)])
    assert result.exit_code == 1
    assert not missing.exists()
