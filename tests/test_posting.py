"""The post path on both backends: gap-free, commit-ordered channel_seq; idempotency races."""

from __future__ import annotations

import threading

from tidings.hub import accounts as accounts_hub
from tidings.hub import channels as channels_hub
from tidings.hub.tokens import Principal
from tidings.store import messages as messages_store


def _world(runtime, n_people=4):
    people = [
        accounts_hub.create_account(runtime.store, kind="human", handle=f"p{i}") for i in range(n_people)
    ]
    owner = Principal(scope="account", account_id=people[0].id, kind="human")
    ch = channels_hub.create_channel(runtime.store, owner, name="busy", members=[p.id for p in people[1:]])
    return people, ch["id"]


def test_concurrent_posts_get_gap_free_channel_seqs_and_a_pager_never_skips(runtime):
    people, channel_id = _world(runtime)
    per_writer = 25
    done = threading.Event()
    seen: list[int] = []
    errors: list[BaseException] = []

    def writer(author_id: str) -> None:
        try:
            for i in range(per_writer):
                runtime.posting.post(author_id=author_id, channel_id=channel_id, text=f"{author_id} {i}")
        except BaseException as exc:  # pragma: no cover - surfaced below
            errors.append(exc)

    def pager() -> None:
        # Reads strictly after the last channel_seq it saw, as every cursor does. If a
        # message could commit below a seq already seen, this reader would skip it.
        last = 0
        while True:
            finished = done.is_set()
            with runtime.store.read() as tx:
                rows = messages_store.messages_after(tx, channel_id, last, 1000)
            for row in rows:
                seen.append(row["channel_seq"])
                last = row["channel_seq"]
            if finished and not rows:
                return

    threads = [threading.Thread(target=writer, args=(p.id,)) for p in people]
    reader = threading.Thread(target=pager)
    reader.start()
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    done.set()
    reader.join(timeout=60)
    assert not errors
    total = per_writer * len(people)
    with runtime.store.read() as tx:
        seqs = [r[0] for r in tx.raw(
            "SELECT channel_seq FROM messages ORDER BY channel_seq").fetchall()]
    assert seqs == list(range(1, total + 1))
    assert seen == list(range(1, total + 1))


def test_same_client_request_id_racing_from_threads_stores_one_row_and_no_gap(runtime):
    people, channel_id = _world(runtime, n_people=1)
    author = people[0].id
    results: list[tuple[str, bool]] = []
    barrier = threading.Barrier(6)

    def poster() -> None:
        barrier.wait(timeout=10)
        row, inserted = runtime.posting.post(
            author_id=author, channel_id=channel_id, text="once", client_request_id="same"
        )
        results.append((row["id"], inserted))

    threads = [threading.Thread(target=poster) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert len(results) == 6
    assert len({mid for mid, _ in results}) == 1
    assert sum(1 for _, inserted in results if inserted) == 1
    runtime.posting.post(author_id=author, channel_id=channel_id, text="next")
    with runtime.store.read() as tx:
        seqs = [r[0] for r in tx.raw("SELECT channel_seq FROM messages ORDER BY channel_seq").fetchall()]
    assert seqs == [1, 2]  # the losing races rolled their channel_seq back


def test_a_post_that_loses_the_client_request_race_returns_the_stored_message_and_leaves_no_gap(
    runtime, monkeypatch
):
    """Deterministic form of the race above: the loser's reads ran before the winner
    committed (its read finds no stored message), so its insert meets the used id after
    taking the channel's next seq. It must roll that seq back and return the stored row."""
    import dataclasses

    people, channel_id = _world(runtime, n_people=1)
    author = people[0].id
    first, inserted = runtime.posting.post(author_id=author, channel_id=channel_id, text="once",
                                           client_request_id="same")
    assert inserted
    original = messages_store.post_context

    def read_before_the_winner_committed(tx, **kwargs):
        ctx = original(tx, **kwargs)
        return None if ctx is None else dataclasses.replace(ctx, existing=None)

    monkeypatch.setattr(messages_store, "post_context", read_before_the_winner_committed)
    again, inserted = runtime.posting.post(author_id=author, channel_id=channel_id, text="once",
                                           client_request_id="same")
    assert not inserted and again["id"] == first["id"]
    monkeypatch.undo()
    runtime.posting.post(author_id=author, channel_id=channel_id, text="next")
    with runtime.store.read() as tx:
        seqs = [r[0] for r in tx.raw("SELECT channel_seq FROM messages ORDER BY channel_seq").fetchall()]
        last = tx.raw("SELECT last_seq FROM channels").fetchone()[0]
    assert seqs == [1, 2] and last == 2  # the loser's channel_seq was rolled back
