"""The post path on both backends: gap-free, commit-ordered channel_seq; idempotency races."""

from __future__ import annotations

import threading

import pytest

from tidings.errors import BadRequest, Forbidden, NotFound
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


@pytest.mark.postgres_only
def test_a_post_that_waited_for_the_channel_lock_takes_the_seq_after_the_one_that_held_it(runtime):
    """Deterministic: one post holds the channel row lock (its transaction open) while a
    second one's statement waits for it; once the first commits, the second takes the next
    ``channel_seq``, read from the locked row, not from the snapshot its statement began with."""
    import psycopg

    people, channel_id = _world(runtime)
    author = people[0].id
    first, _created = runtime.posting.post(author_id=author, channel_id=channel_id, text="first")
    topic_id = first["topic_id"]

    def insert(tx, message_id: str) -> tuple[int, int] | None:
        return messages_store.insert_next_message(
            tx, id=message_id, channel_id=channel_id, topic_id=topic_id, author=author, now=2,
            blocks=[], text=message_id, client_request_id="")

    taken: dict[str, object] = {}

    def waiter() -> None:
        try:
            with runtime.store.write() as tx:
                taken["waiter"] = insert(tx, "msg_waiter")
        except BaseException as exc:  # surfaced below
            taken["waiter"] = exc

    with runtime.store.write() as tx:
        taken["holder"] = insert(tx, "msg_holder")
        thread = threading.Thread(target=waiter)
        thread.start()
        # Until the waiter's statement waits on a lock (the channel row): a condition on the
        # server, asked until it holds, never a guess at how long it takes.
        with psycopg.connect(runtime.store.url, autocommit=True) as watch:
            for _ in range(100_000):
                waiting = watch.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                    "AND wait_event_type = 'Lock'").fetchone()
                if waiting is not None and waiting[0] >= 1:
                    break
            else:  # pragma: no cover
                pytest.fail("the second post never waited for the channel lock")
    thread.join(timeout=60)
    assert taken["holder"][1] == 2 and taken["waiter"][1] == 3, taken  # type: ignore[index]
    with runtime.store.read() as tx:
        seqs = [r[0] for r in tx.raw("SELECT channel_seq FROM messages ORDER BY channel_seq").fetchall()]
    assert seqs == [1, 2, 3]


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


def _last_seq(runtime, channel_id):
    with runtime.store.read() as tx:
        mark = "%s" if runtime.store.dialect == "postgresql" else "?"
        return tx.raw(f"SELECT last_seq FROM channels WHERE id = {mark}", (channel_id,)).fetchone()[0]


@pytest.mark.parametrize("case", ["stranger", "owner_only", "retry", "crid_elsewhere", "new_topic", "unknown"])
def test_a_post_its_one_statement_does_not_admit_gets_the_answer_of_its_reads(runtime, case):
    """PostgreSQL's one-statement post (D110) writes nothing when any check fails, and the
    post's reads decide: a refusal, the stored message of a retry, or the transaction a
    new topic needs. The channel's seq moves only for a stored message (both backends)."""
    people, channel_id = _world(runtime, n_people=2)
    owner, member = people
    stranger = accounts_hub.create_account(runtime.store, kind="human", handle="stranger")
    other = channels_hub.create_channel(
        runtime.store, Principal(scope="account", account_id=owner.id, kind="human"), name="other", members=[member.id])
    first, _ = runtime.posting.post(author_id=member.id, channel_id=channel_id, text="one", client_request_id="c1")
    before = _last_seq(runtime, channel_id)
    post = runtime.posting.post
    if case == "stranger":
        with pytest.raises(NotFound):
            post(author_id=stranger.id, channel_id=channel_id, text="let me in")
    elif case == "owner_only":
        with runtime.store.write() as tx:
            mark = "%s" if runtime.store.dialect == "postgresql" else "?"
            tx.raw(f"UPDATE channels SET post_policy = 'owner_only' WHERE id = {mark}", (channel_id,))
        with pytest.raises(Forbidden):
            post(author_id=member.id, channel_id=channel_id, text="not mine to say")
        row, inserted = post(author_id=owner.id, channel_id=channel_id, text="the owner may")
        assert inserted and row["channel_seq"] == before + 1
        return
    elif case == "retry":
        row, inserted = post(author_id=member.id, channel_id=channel_id, text="one", client_request_id="c1")
        assert not inserted and row["id"] == first["id"]
    elif case == "crid_elsewhere":
        with pytest.raises(BadRequest):
            post(author_id=member.id, channel_id=other["id"], text="one", client_request_id="c1")
        assert _last_seq(runtime, other["id"]) == 0
    elif case == "new_topic":
        row, inserted = post(author_id=member.id, channel_id=channel_id, text="two", topic="Elsewhere")
        assert inserted and row["channel_seq"] == before + 1 and row["topic_id"] != first["topic_id"]
        again, _ = post(author_id=member.id, channel_id=channel_id, text="three", topic="elsewhere")
        assert again["topic_id"] == row["topic_id"] and again["channel_seq"] == before + 2  # folded name
        return
    else:
        with pytest.raises(NotFound):
            post(author_id=member.id, channel_id="ch_nope", text="where")
    assert _last_seq(runtime, channel_id) == before


@pytest.mark.postgres_only
def test_a_one_statement_post_that_meets_a_concurrent_use_of_its_request_id_returns_the_stored_row(
    runtime, backend_url
):
    """The race inside D110's one statement: its check saw the client request id unused,
    but another transaction inserts it first. The statement waits on that insert, fails
    whole when it commits (nothing bumped), and the post returns the stored message."""
    import psycopg

    from tidings.ids import new_id

    people, channel_id = _world(runtime, n_people=2)
    author = people[1].id
    runtime.posting.post(author_id=author, channel_id=channel_id, text="makes the topic")
    with runtime.store.read() as tx:
        topic_id = tx.raw("SELECT topic_id FROM messages").fetchone()[0]
    before = _last_seq(runtime, channel_id)
    winner = psycopg.connect(backend_url)
    rival_id = new_id("msg")
    winner.execute(
        "INSERT INTO messages (id, channel_id, channel_seq, topic_id, author_account_id, at_unix_ms, blocks, "
        "text, client_request_id) VALUES (%s, %s, 1000, %s, %s, 1, '[]', 'won', 'same')",
        (rival_id, channel_id, topic_id, author),
    )
    result: dict = {}
    poster = threading.Thread(target=lambda: result.update(r=runtime.posting.post(
        author_id=author, channel_id=channel_id, text="lost", client_request_id="same")))
    poster.start()
    with psycopg.connect(backend_url, autocommit=True) as watch:
        for _ in range(10_000):  # until the post's statement waits on the winner's row
            waiting = watch.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = current_database()"
            ).fetchone()[0]
            if waiting:
                break
            watch.execute("SELECT pg_sleep(0.001)")
    winner.commit()
    winner.close()
    poster.join(30)
    row, inserted = result["r"]
    assert not inserted and row["id"] == rival_id
    assert _last_seq(runtime, channel_id) == before
