"""Batching never changes what a corpus leaves in the store (issue 12).

Property, on both backends: a corpus appended in requests of any sizes (``{"frames":
[...]}``, one transaction each, a savepoint per frame), or left to the worker's drain in
groups of any size (several frames a transaction, a savepoint each), leaves the store
equal, table by table (``tidings.replay.compare``), to the same corpus appended one frame
a request. The clock is pinned, and inbox ids are a function of the corpus line, so the
only thing that differs between the two runs is how the frames were batched.

The corpus is a synthetic one with its malformed payloads, duplicates, edits, reactions
and receipts; frames the HTTP edge would refuse (a 400 fails a whole batch request) are
left out of both runs.
"""

from __future__ import annotations

import json
import os
import secrets
from collections import deque
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st

from helpers import truncate_pg
from tidings.clock import FakeClock
from tidings.errors import TidingsError
from tidings.ingest.engine import Ingest
from tidings.replay.compare import Ignore, compare_stores
from tidings.replay.harness import UNKNOWN_CODEC_PLATFORM, create_bridges
from tidings.replay.synth import synthesize
from tidings.store.engine import Store

FRAMES = 90
SEED = 12
PINNED_MS = 1_718_000_000_000
PG_ADMIN_URL = os.environ.get("TIDINGS_TEST_PG", "postgresql://postgres@127.0.0.1:5432/postgres")


class LineIds:
    """Inbox ids minted from the corpus line of the frame being appended (queued in
    request order), so both runs give a frame the same id however it is batched."""

    def __init__(self) -> None:
        self.lines: deque[int] = deque()

    def __call__(self, now_ms: int) -> str:
        line = self.lines.popleft()
        return f"in_{now_ms:012x}{line:06x}{line:014x}"


def corpus_frames() -> list[tuple[int, str, dict[str, Any]]]:
    """(line, platform, frame) of every corpus line the HTTP edge would accept."""
    from tidings.ingest.decoders import DECODERS
    from tidings.ingest.inbox import parse_frame

    platforms = {codec: dec.platform for codec, dec in DECODERS.items()}
    out = []
    for line, text in enumerate(synthesize(FRAMES, SEED).lines):
        try:
            raw = json.loads(text)
        except ValueError:
            continue
        if not isinstance(raw, dict):
            continue
        codec = raw.get("codec")
        platform = platforms.get(codec, UNKNOWN_CODEC_PLATFORM) if isinstance(codec, str) else UNKNOWN_CODEC_PLATFORM
        try:
            parse_frame(raw, 0, platform=platform, codec_platforms=platforms)
        except TidingsError:
            continue
        out.append((line, platform, raw))
    return out


def run(url: str, frames: list, sizes: list[int] | None, apply_on_append: bool = True, group: int = 1) -> None:
    """Append ``frames`` into a fresh store at ``url``: one a request (``sizes`` None) or
    in consecutive requests of ``sizes`` (split per bridge, corpus order kept within
    each), pumping the worker after every request as the runtime's notify would."""
    clock = FakeClock(PINNED_MS)
    store = Store(url, clock=clock)
    ids = LineIds()
    ingest = Ingest(store=store, faults=store.faults, clock=clock, inbox_ids=ids,
                    apply_on_append=apply_on_append, group_size=group)
    try:
        bridges = create_bridges(store)
        chunks: list[list] = []
        if sizes is None:
            chunks = [[f] for f in frames]
        else:
            at = 0
            for size in sizes:
                if at >= len(frames):
                    break
                chunks.append(frames[at:at + size])
                at += size
            if at < len(frames):
                chunks.append(frames[at:])
        for chunk in chunks:
            per_bridge: dict[str, list] = {}
            for line, platform, raw in chunk:
                per_bridge.setdefault(platform, []).append((line, raw))
            for platform, items in per_bridge.items():
                ids.lines.extend(line for line, _ in items)
                body = items[0][1] if sizes is None else {"frames": [raw for _, raw in items]}
                ingest.append_body(bridges[platform], body, platform)
                ingest.worker.drain_if_due()
        ingest.worker.drain_if_due()
        assert not ids.lines
    finally:
        ingest.stop()
        store.dispose()


def _pg(sql: str) -> None:
    import psycopg

    with psycopg.connect(PG_ADMIN_URL, autocommit=True, connect_timeout=5) as admin:
        admin.execute(sql)


@pytest.fixture
def other_url(backend_url, tmp_path):
    """Where the batched run writes: a new SQLite file per call, or a second PostgreSQL
    database truncated per call."""
    if not backend_url.startswith("postgres"):
        serial = iter(range(10**6))
        yield lambda: str(tmp_path / f"batched_{next(serial)}.db")
        return
    name = f"tidings_batch_{secrets.token_hex(4)}"
    _pg(f'CREATE DATABASE "{name}"')
    url = f"{PG_ADMIN_URL.rsplit('/', 1)[0]}/{name}"
    Store(url).dispose()  # migrated once

    def fresh() -> str:
        truncate_pg(url)
        return url

    try:
        yield fresh
    finally:
        import psycopg

        with psycopg.connect(PG_ADMIN_URL, autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s", (name,))
            admin.execute(f'DROP DATABASE IF EXISTS "{name}"')


@pytest.mark.slow
@pytest.mark.timeout(600)  # two replays an example; the machine may be shared
def test_a_corpus_applied_in_batches_of_any_size_leaves_the_store_it_leaves_one_frame_at_a_time(
    backend_url, other_url
):
    frames = corpus_frames()
    assert len(frames) > FRAMES // 2
    run(backend_url, frames, None)  # the reference: one frame a request

    @settings(max_examples=5, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture],
              phases=[Phase.explicit, Phase.reuse, Phase.generate])  # no shrinking: each example is two replays
    @example(sizes=[40, 40, 40], drain=False, group=1)
    @example(sizes=[7], drain=True, group=12)
    @given(
        sizes=st.lists(st.integers(1, 40), min_size=1, max_size=12),
        drain=st.booleans(),
        group=st.integers(1, 12),
    )
    def batched_equals_one_at_a_time(sizes: list[int], drain: bool, group: int) -> None:
        url = other_url()
        # drain: nothing applied on append; the worker applies it all in groups of ``group``.
        run(url, frames, sizes, apply_on_append=not drain, group=group if drain else 1)
        # schema_migrations holds when each store was migrated, nothing the ingest wrote.
        report = compare_stores(backend_url, url, Ignore.parse(["schema_migrations.applied_at_ms"]))
        differing = {t: r for t, r in report["tables"].items() if r["differences"]}
        assert not differing
        # On PostgreSQL the reference is the session's shared database, where other tests
        # leave scratch tables of their own (t_applied): those are only in A. Every table
        # of the batched store must be compared.
        assert report["tables_only_b"] == []
        assert len(report["tables"]) >= 15

    batched_equals_one_at_a_time()
