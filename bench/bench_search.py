"""Search bench (issue 15 item 2): the full-text index against the LIKE scan it replaced.

    uv run python bench/bench_search.py [--messages 1000000] [--backend sqlite|postgresql|both]
                                        [--queries 30] [--json FILE]

Also ``bench/run.py --only search [--search-messages N]``.

One fresh database per backend, migrated, loaded with ``--messages`` hub messages (synthetic
text: 8–20 words drawn from a Zipf-like vocabulary of 20,000 words) spread over 50
channels, the searching account a member of 10 of them. Loading goes through the real
schema, so the index queue (SQLite, then caught up in batches, timed as part of the load)
and the generated tsvector with its GIN index (PostgreSQL) are maintained; the load rate is
reported as the write cost.
SQLite loads with ``executemany`` in one transaction, PostgreSQL with ``COPY``.

Queries: single words in three bands (rare: ~10 messages per million, medium: ~1,000,
common: ~50,000), ``--queries`` of each band, the same words for both engines, each engine
answering "the 20 best (index) / newest (LIKE) messages in my channels containing this
word". Reported per engine and band: queries/s (sequential, one connection) and p50/p99.
Wall-clock time on a shared machine: the figures are noisy; nothing here is pinned.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
if str(BENCH_DIR) not in sys.path:
    sys.path.insert(0, str(BENCH_DIR))

import benchlib  # noqa: E402

VOCABULARY = 20_000
CHANNELS = 50
MEMBER_OF = 10
LIMIT = 20
BANDS = ("rare", "medium", "common")


def _vocabulary(rng: random.Random) -> list[str]:
    letters = "abcdefghijklmnopqrstuvwxyz"
    words: set[str] = set()
    while len(words) < VOCABULARY:
        words.add("".join(rng.choice(letters) for _ in range(rng.randint(4, 9))))
    return sorted(words)


def _texts(n: int, seed: int = 7) -> tuple[list[str], dict[str, list[str]]]:
    """``n`` texts and, per band, words whose message frequency falls in it."""
    rng = random.Random(seed)
    vocab = _vocabulary(rng)
    # Zipf-like weights: word i has weight 1/(i+1).
    weights = [1.0 / (i + 1) for i in range(len(vocab))]
    cum: list[float] = []
    total = 0.0
    for w in weights:
        total += w
        cum.append(total)
    texts = []
    counts: dict[str, int] = {}
    for _ in range(n):
        words = rng.choices(vocab, cum_weights=cum, k=rng.randint(8, 20))
        texts.append(" ".join(words))
        for w in set(words):
            counts[w] = counts.get(w, 0) + 1
    per_million = {w: c * 1_000_000 / max(n, 1) for w, c in counts.items()}
    bands = {
        "rare": [w for w, f in per_million.items() if 5 <= f <= 20],
        "medium": [w for w, f in per_million.items() if 500 <= f <= 2_000],
        "common": [w for w, f in per_million.items() if 30_000 <= f <= 80_000],
    }
    for band, words in bands.items():
        if not words:  # tiny sizes: take the nearest frequencies
            target = {"rare": 10, "medium": 1_000, "common": 50_000}[band]
            words.extend(sorted(per_million, key=lambda w: abs(per_million[w] - target))[:5])
    return texts, bands


def _load(url: str, texts: list[str]) -> dict[str, Any]:
    """Accounts, channels, memberships and the messages; returns the searcher and timings."""
    from tidings.store.engine import Store

    Store(url).dispose()  # migrate
    conn = benchlib.raw_connect(url)
    pg = not isinstance(conn, __import__("sqlite3").Connection)
    ph = "%s" if pg else "?"
    now = 1_700_000_000_000
    poster, searcher = "acc_bench_poster", "acc_bench_searcher"
    channels = [f"ch_bench{i:03d}" for i in range(CHANNELS)]
    setup = [
        (f"INSERT INTO accounts (id, kind, handle, created_at_ms) VALUES ({ph}, 'human', {ph}, {ph})",
         [(poster, "poster", now), (searcher, "searcher", now)]),
        (f"INSERT INTO channels (id, name, created_at_ms, last_seq) VALUES ({ph}, {ph}, {ph}, 0)",
         [(c, c, now) for c in channels]),
        (f"INSERT INTO topics (id, channel_id, name, name_folded, created_at_ms) VALUES ({ph}, {ph}, 'general', "
         f"'general', {ph})", [(f"top_{c}", c, now) for c in channels]),
        (f"INSERT INTO channel_members (channel_id, account_id, subscribed, added_at_ms) VALUES ({ph}, {ph}, "
         f"{'false' if pg else '0'}, {ph})",
         [(c, poster, now) for c in channels] + [(c, searcher, now) for c in channels[:MEMBER_OF]]),
    ]
    rows = []
    seqs = [0] * CHANNELS
    for i, text in enumerate(texts):
        c = i % CHANNELS
        seqs[c] += 1
        blocks = json.dumps([{"kind": "text", "text": text}], separators=(",", ":"))
        rows.append((f"msg_b{i:010d}", channels[c], seqs[c], f"top_{channels[c]}", poster, now + i, blocks, text, ""))
    started = time.perf_counter()
    if pg:
        with conn.transaction():
            cur = conn.cursor()
            for sql, params in setup:
                cur.executemany(sql, params)
            with cur.copy("COPY messages (id, channel_id, channel_seq, topic_id, author_account_id, at_unix_ms, "
                          "blocks, text, client_request_id) FROM STDIN") as copy:
                for row in rows:
                    copy.write_row(row)
        conn.execute("ANALYZE messages")
    else:
        conn.execute("BEGIN")
        for sql, params in setup:
            conn.executemany(sql, params)
        conn.executemany(
            "INSERT INTO messages (id, channel_id, channel_seq, topic_id, author_account_id, at_unix_ms, blocks, "
            "text, client_request_id) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)", rows)
        conn.execute("COMMIT")
        conn.execute("ANALYZE")
    conn.close()
    index_s = _index(url)
    load_s = time.perf_counter() - started
    return {"searcher": searcher, "load_s": round(load_s, 2), "load_rows_per_s": round(len(texts) / load_s),
            "index_catch_up_s": round(index_s, 2)}


def _index(url: str) -> float:
    """SQLite: index the loaded rows (the queue the load filled, in batches, as the hub's
    background pass or the first search would); part of the load time. PostgreSQL: 0."""
    from tidings.store.engine import Store
    from tidings.store.search_index import catch_up_all

    store = Store(url)
    try:
        started = time.perf_counter()
        catch_up_all(store)
        return time.perf_counter() - started
    finally:
        store.dispose()


def _measure(url: str, searcher: str, bands: dict[str, list[str]], queries: int, seed: int = 11) -> dict[str, Any]:
    from tidings.store import like_search as like_queries
    from tidings.store import search as search_store
    from tidings.store.engine import Store

    rng = random.Random(seed)
    store = Store(url)
    out: dict[str, Any] = {}
    try:
        for band in BANDS:
            words = [rng.choice(bands[band]) for _ in range(queries)]
            for engine in ("index", "like"):
                times, found = [], 0
                with store.read() as tx:
                    for word in words:
                        t0 = time.perf_counter()
                        if engine == "index":
                            rows = search_store.hub_messages(tx, [word], account_id=searcher, all_channels=False,
                                                             limit=LIMIT)
                        else:
                            rows = like_queries.search_channel_messages(tx, searcher, word, LIMIT)
                        times.append(time.perf_counter() - t0)
                        found += len(rows)
                total = sum(times)
                out.setdefault(band, {})[engine] = {
                    **benchlib.latency_ms(times),
                    "queries_per_s": round(len(times) / total, 1) if total else None,
                    "mean_hits": round(found / max(len(words), 1), 1),
                }
            out[band]["speedup_qps"] = benchlib.ratio(out[band]["index"]["queries_per_s"],
                                                      out[band]["like"]["queries_per_s"], 1)
    finally:
        store.dispose()
    return out


def run(backends: list[str], messages: int, queries: int, dbs: Any = None, reporter: Any = None) -> dict[str, Any]:
    """The section: per backend, load then measure; the databases are dropped after."""
    own = dbs is None
    dbs = dbs or benchlib.Databases()
    texts, bands = _texts(messages)
    results: dict[str, Any] = {"messages": messages, "queries_per_band": queries, "limit": LIMIT,
                               "channels": CHANNELS, "searcher_channels": MEMBER_OF}
    try:
        for backend in backends:
            url = dbs.fresh(backend, "search")
            try:
                loaded = _load(url, texts)
                measured = _measure(url, loaded.pop("searcher"), bands, queries)
                results[backend] = {**loaded, **measured}
            finally:
                dbs.drop(url)
    finally:
        if own:
            dbs.close()
    return results


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--messages", type=int, default=1_000_000)
    p.add_argument("--queries", type=int, default=30, help="queries per frequency band and engine")
    p.add_argument("--backend", default="both", choices=["sqlite", "postgresql", "postgres", "both"])
    p.add_argument("--json", default=None, help="also write the results here")
    args = p.parse_args(argv)
    backends = ["sqlite", "postgresql"] if args.backend == "both" else [
        "postgresql" if args.backend.startswith("postgres") else "sqlite"]
    benchlib.configure_logs()
    results = run(backends, args.messages, args.queries)
    text = json.dumps(results, indent=2)
    print(text)
    if args.json:
        Path(args.json).write_text(text + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
