"""The consumer's copy of channel rosters and the roster epoch that guards it (D108).

The consumer keeps the agents of a channel between batches and serves them only to a
batched read that saw the same ``roster_epoch``; triggers move the epoch with every write
to a roster input. These tests change each input between two posts and check that the
second post's fan-out sees the change, on both backends (the copy is on by default on
PostgreSQL only; here it is on for both).
"""

from __future__ import annotations

import pytest
from delivery_world import World

from tidings.errors import Conflict


@pytest.fixture
def world_options() -> dict:
    return {"roster_cache": True}


def _epoch(world: World) -> int:
    with world.store.read() as tx:
        return int(tx.raw("SELECT epoch FROM roster_epoch WHERE id = 1").fetchone()[0])


def _set(world: World, table: str, column: str, value: object, where: str, key: str) -> None:
    """A direct write (no API changes these columns); DBAPI placeholders per dialect."""
    mark = "%s" if world.store.dialect == "postgresql" else "?"
    with world.store.write() as tx:
        tx.raw(f"UPDATE {table} SET {column} = {mark} WHERE {where} = {mark}", (value, key))


def _two_agents(world: World) -> tuple[str, str, str, str]:
    hu = world.human("hu")
    aa, bb = world.agent("aa", owner=hu), world.agent("bb", owner=hu)
    ch = world.channel("room", hu, members=(aa, bb), subscribe=(aa,))
    world.connect(aa)
    world.connect(bb)
    world.pump()
    return hu, ch, aa, bb


def test_an_unchanged_roster_is_served_from_the_copy(world):
    hu, ch, aa, bb = _two_agents(world)
    m1 = world.post(hu, ch, "one")
    world.pump()
    read_after_first = world.counters()["rosters_read"]
    m2 = world.post(hu, ch, "two")
    world.pump()
    m3 = world.post(hu, ch, "three")
    world.pump()
    assert world.got(aa) == [("deliver", m1), ("deliver", m2), ("deliver", m3)]
    assert world.got(bb) == []
    assert world.counters()["rosters_cached"] == 2
    assert world.counters()["rosters_read"] == read_after_first


def test_each_membership_change_reaches_the_next_fan_out(world):
    hu, ch, aa, bb = _two_agents(world)
    m1 = world.post(hu, ch, "before")
    world.pump()
    world.subscribe(ch, bb)  # bb joins the sweep set
    m2 = world.post(hu, ch, "after subscribe")
    world.pump()
    world.unsubscribe(ch, aa)  # aa leaves it
    m3 = world.post(hu, ch, "after unsubscribe")
    world.pump()
    world.remove(ch, bb)  # bb is no member any more
    m4 = world.post(hu, ch, "@bb after remove")
    world.pump()
    assert world.got(aa) == [("deliver", m1), ("deliver", m2)]
    assert world.got(bb) == [("deliver", m2), ("deliver", m3)]
    assert m4 and world.owed() == []  # a removed agent is not mentioned into the channel


def test_a_mention_resolves_a_handle_changed_since_the_last_batch(world):
    hu, ch, aa, bb = _two_agents(world)
    m1 = world.post(hu, ch, "warm the copy")
    world.pump()
    _set(world, "accounts", "handle", "bee", "id", bb)
    m2 = world.post(hu, ch, "@bee look")
    world.pump()
    assert world.got(bb) == [("steer", m2)]
    assert world.got(aa) == [("deliver", m1), ("deliver", m2)]


def test_a_mandatory_channel_delivers_to_every_member_from_the_next_batch(world):
    hu, ch, aa, bb = _two_agents(world)
    m1 = world.post(hu, ch, "one")
    world.pump()
    _set(world, "channels", "mandatory_subscription", True, "id", ch)
    m2 = world.post(hu, ch, "two")
    world.pump()
    assert world.got(bb) == [("deliver", m2)]
    assert world.got(aa) == [("deliver", m1), ("deliver", m2)]


@pytest.mark.parametrize("write", ["add", "subscribe", "unsubscribe", "remove", "home", "handle", "wake",
                                   "mandatory"])
def test_every_roster_input_moves_the_epoch(world, write):
    hu, ch, aa, bb = _two_agents(world)
    cc = world.agent("cc", owner=hu)
    before = _epoch(world)
    if write == "add":
        world.add(ch, cc)
    elif write == "subscribe":
        world.subscribe(ch, bb)
    elif write == "unsubscribe":
        world.unsubscribe(ch, aa)
    elif write == "remove":
        world.remove(ch, bb)
    else:
        column, value, table, row = {
            "home": ("home_channel_id", ch, "accounts", aa),
            "handle": ("handle", "renamed", "accounts", aa),
            "wake": ("wake_json", '{"kind": "none"}', "accounts", aa),
            "mandatory": ("mandatory_subscription", True, "channels", ch),
        }[write]
        _set(world, table, column, value, "id", row)
    assert _epoch(world) > before


def test_posts_and_rolled_back_roster_writes_leave_the_epoch_alone(world):
    hu, ch, aa, bb = _two_agents(world)
    before = _epoch(world)
    world.post(hu, ch, "a post updates channels.last_seq, not a roster column")
    world.pump()
    mark = "%s" if world.store.dialect == "postgresql" else "?"
    with pytest.raises(Conflict), world.store.write() as tx:
        tx.raw(f"UPDATE channel_members SET subscribed = {mark} WHERE channel_id = {mark}", (True, ch))
        raise Conflict("roll it back")
    assert _epoch(world) == before


@pytest.mark.parametrize("setting", [False, None])
def test_without_the_copy_every_batch_reads_its_rosters(runtime, setting):
    """Off, or the default (None): on PostgreSQL only."""
    world = World(runtime, roster_cache=setting)
    try:
        hu, ch, aa, bb = _two_agents(world)
        for text in ("one", "two", "three"):
            world.post(hu, ch, text)
            world.pump()
        kept = setting is None and world.store.dialect == "postgresql"
        assert world.counters()["rosters_cached"] == (2 if kept else 0)
        assert len(world.got(aa)) == 3
    finally:
        world.close()


def test_a_roster_change_made_by_another_process_reaches_the_next_fan_out(world, backend_url, clock):
    """Another hub process (its own store and pool) changes a subscription: the epoch is a
    row of the shared database, so this process's copy is read again."""
    from tidings.hub import channels as channels_hub
    from tidings.hub.tokens import Principal
    from tidings.runtime import Runtime

    hu, ch, aa, bb = _two_agents(world)
    m1 = world.post(hu, ch, "one")
    world.pump()
    other = Runtime(backend_url, clock=clock, admin_token="tdg_test_other")
    try:
        admin = Principal("admin", other.system_account_id, kind="system")
        channels_hub.update_members(other.store, admin, ch, {"subscribe": [bb], "unsubscribe": [aa]})
    finally:
        other.stop()
    m2 = world.post(hu, ch, "two")
    world.pump()
    assert world.got(aa) == [("deliver", m1)]
    assert world.got(bb) == [("deliver", m2)]


@pytest.mark.postgres_only
def test_an_open_roster_write_holds_up_no_other_roster_write(world, backend_url):
    """The epoch row is locked only at commit (a deferred trigger): a transaction that
    changed a roster and is still open does not make another roster write wait for it,
    and each committed transaction moves the epoch once, whatever its row count."""
    import psycopg

    hu, ch, aa, bb = _two_agents(world)
    other = world.channel("other", hu, members=(aa, bb))
    before = _epoch(world)
    with psycopg.connect(backend_url) as held, psycopg.connect(backend_url) as second:
        held.execute("UPDATE channel_members SET subscribed = true WHERE channel_id = %s", (ch,))
        held.execute("UPDATE channel_members SET subscribed = false WHERE channel_id = %s", (ch,))
        second.execute("SET lock_timeout = '5s'")
        second.execute("UPDATE channel_members SET subscribed = true WHERE channel_id = %s", (other,))
        second.commit()  # without the deferred bump: LockNotAvailable after 5 s
        assert _epoch(world) == before + 1
        held.commit()
    assert _epoch(world) == before + 2


def _batched_reads(monkeypatch) -> list[str]:
    """The names of the consumer's batched-read statements, as they run."""
    from tidings.store import delivery as delivery_store
    from tidings.store.engine import Tx

    reads = {delivery_store.MESSAGES_AND_EPOCH, delivery_store.MESSAGES_AND_UNHELD_AGENTS,
             delivery_store.MESSAGES_AND_AGENTS}
    names: list[str] = []
    original = Tx.all

    def spied(self, stmt, params=None):
        if stmt in reads:
            names.append(stmt.name)
        return original(self, stmt, params)

    monkeypatch.setattr(Tx, "all", spied)
    return names


def test_a_batch_whose_rosters_are_all_held_reads_only_its_rows_and_the_epoch(world, monkeypatch):
    """D126: every roster held, the batch's statement joins nothing (rows and epoch only);
    at a moved epoch the rosters are read again in a second statement, with the rows, in
    one snapshot, and the change reaches this very fan-out."""
    hu, ch, aa, bb = _two_agents(world)
    names = _batched_reads(monkeypatch)
    m1 = world.post(hu, ch, "warm the copy")
    world.pump()
    assert names == ["messages_and_unheld_agents"]  # nothing held yet
    names.clear()
    m2 = world.post(hu, ch, "held")
    world.pump()
    assert names == ["messages_and_epoch"]
    names.clear()
    world.subscribe(ch, bb)
    m3 = world.post(hu, ch, "after subscribe")
    world.pump()
    assert names == ["messages_and_epoch", "messages_and_unheld_agents"]
    names.clear()
    m4 = world.post(hu, ch, "held again")
    world.pump()
    assert names == ["messages_and_epoch"]
    assert world.got(aa) == [("deliver", m1), ("deliver", m2), ("deliver", m3), ("deliver", m4)]
    assert world.got(bb) == [("deliver", m3), ("deliver", m4)]
    assert world.counters()["rosters_cached"] == 2
