"""A small world for delivery tests: a hub plus a delivery engine, with shortcuts.

By default the engine is synchronous (``threaded=False``): nothing happens until the test
calls ``pump()``, so every test is deterministic by construction. ``restart()`` is a crash:
a new Runtime (fresh bus, fresh engine, no sessions, nothing held) over the same database;
the old engine is abandoned without a clean shutdown.
"""

from __future__ import annotations

import threading
from typing import Any

from helpers import truncate_pg
from tidings.delivery.engine import Delivery
from tidings.delivery.sessions import Dispatch, Session, SessionEnd
from tidings.hub import accounts as accounts_hub
from tidings.hub import channels as channels_hub
from tidings.hub.tokens import Principal
from tidings.runtime import Runtime
from tidings.store import cursors as cursors_store
from tidings.store import messages as messages_store
from tidings.store import owed as owed_store

ADMIN_TOKEN = "tdg_test_admin"


class FakeWaker:
    """Records wakes; optionally blocks each wake until ``release`` is set."""

    def __init__(self, block: threading.Event | None = None, fail: bool = False) -> None:
        self.calls: list[tuple[str, str]] = []
        self.block = block
        self.fail = fail
        self.started = threading.Event()
        self._cond = threading.Condition()

    def wake(self, agent_id: str, config: Any, reason: str) -> bool:
        self.started.set()
        if self.block is not None:
            self.block.wait(10)
        if self.fail:
            raise RuntimeError("waker is broken")
        with self._cond:
            self.calls.append((agent_id, reason))
            self._cond.notify_all()
        return True

    def of(self, agent_id: str) -> list[str]:
        with self._cond:
            return [reason for a, reason in self.calls if a == agent_id]

    def wait_for(self, n: int, timeout: float = 10.0) -> bool:
        with self._cond:
            return self._cond.wait_for(lambda: len(self.calls) >= n, timeout)


class World:
    def __init__(self, runtime: Runtime, *, waker: Any = None, **options: Any) -> None:
        self.rt = runtime
        self.url = runtime.store.url
        self.clock = runtime.clock
        self.faults = runtime.faults
        self.waker = waker if waker is not None else FakeWaker()
        self.options = {"threaded": False, **options}
        self.ids: dict[str, str] = {}
        self.owner_of: dict[str, str] = {}
        self.sessions: dict[str, Session] = {}
        self._abandoned: list[Runtime] = []
        self._install(runtime)

    def _install(self, runtime: Runtime, **overrides: Any) -> None:
        self.rt = runtime
        self.d = Delivery(runtime, waker=self.waker, **{**self.options, **overrides})
        runtime.delivery = self.d
        # Only delivery starts: the ingest engine is not under test here (no worker thread).
        self.d.start()
        runtime.started = True

    @property
    def store(self):
        return self.rt.store

    # -- building the world -------------------------------------------------------------
    def human(self, handle: str) -> str:
        self.ids[handle] = accounts_hub.create_account(self.store, kind="human", handle=handle).id
        return self.ids[handle]

    def agent(self, handle: str, owner: str | None = None, wake: Any = None) -> str:
        if owner is None:
            owner = self.ids.get("owner") or self.human("owner")
        created = accounts_hub.create_account(self.store, kind="agent", handle=handle, owner=owner, wake=wake)
        self.ids[handle] = created.id
        self.owner_of[created.id] = owner
        self.ids[f"{handle}.home"] = created.home_channel_id
        return created.id

    def principal(self, account_id: str) -> Principal:
        with self.store.read() as tx:
            from tidings.store import accounts as accounts_store

            kind = accounts_store.account(tx, account_id)["kind"]
        return Principal("account", account_id, kind=kind)

    def channel(
        self,
        name: str,
        owner: str,
        members: tuple[str, ...] | list[str] = (),
        subscribe: tuple[str, ...] | list[str] = (),
        mandatory: bool = False,
    ) -> str:
        ch = channels_hub.create_channel(
            self.store, self.principal(owner), name=name, members=list(members), mandatory_subscription=mandatory
        )
        self.ids[name] = ch["id"]
        if subscribe:
            self.subscribe(ch["id"], *subscribe, by=owner)
        return ch["id"]

    def subscribe(self, channel_id: str, *agents: str, by: str | None = None) -> None:
        who = Principal("admin", self.rt.system_account_id, kind="system") if by is None else self.principal(by)
        channels_hub.update_members(self.store, who, channel_id, {"subscribe": list(agents)})

    def unsubscribe(self, channel_id: str, *agents: str) -> None:
        who = Principal("admin", self.rt.system_account_id, kind="system")
        channels_hub.update_members(self.store, who, channel_id, {"unsubscribe": list(agents)})

    def add(self, channel_id: str, *accounts: str) -> None:
        who = Principal("admin", self.rt.system_account_id, kind="system")
        channels_hub.update_members(self.store, who, channel_id, {"add": list(accounts)})

    def remove(self, channel_id: str, *accounts: str) -> None:
        who = Principal("admin", self.rt.system_account_id, kind="system")
        channels_hub.update_members(self.store, who, channel_id, {"remove": list(accounts)})

    def post(self, author: str, channel_id: str, text: str, **kw: Any) -> str:
        row, _ = self.rt.posting.post(author_id=author, channel_id=channel_id, text=text, **kw)
        return row["id"]

    def edit(self, author: str, message_id: str, text: str) -> None:
        self.rt.posting.edit(author_id=author, message_id=message_id, blocks=[{"kind": "text", "text": text}])

    # -- sessions --------------------------------------------------------------------------
    def connect(self, agent_id: str) -> Session:
        session = self.d.connect(agent_id)
        self.sessions[agent_id] = session
        return session

    def disconnect(self, agent_id: str, reason: str = "closed") -> None:
        session = self.sessions.pop(agent_id, None)
        if session is not None:
            self.d.disconnect(session, reason)

    def settle(self, agent_id: str, state: str = "ready") -> None:
        self.d.set_state(agent_id, self.sessions[agent_id].session_id, state)

    def pump(self) -> int:
        return self.d.pump()

    def idle(self) -> None:
        """Everything so far processed: pump (synchronous) or wait (threaded)."""
        if self.options["threaded"]:
            self.d.wait_idle()
        else:
            self.d.pump()

    def got(self, agent_id: str, session: Session | None = None) -> list[tuple[str, str]]:
        """Drain the agent's current session: [(kind, message_id)]; ends are ("end", reason)."""
        session = session or self.sessions[agent_id]
        out = []
        for item in session.drain():
            if isinstance(item, SessionEnd):
                out.append(("end", item.reason))
            else:
                assert isinstance(item, Dispatch)
                out.append((item.kind, item.message_id))
        return out

    def ack(self, agent_id: str, message_id: str) -> dict[str, Any]:
        return self.d.ack(agent_id, message_id)

    # -- store views -----------------------------------------------------------------------
    def owed(self, agent_id: str | None = None) -> list[str] | list[tuple[str, str]]:
        with self.store.read() as tx:
            if agent_id is not None:
                return [r["message_id"] for r in owed_store.owed_of(tx, agent_id)]
            return [
                tuple(r)
                for r in tx.raw("SELECT agent_id, message_id FROM owed_mentions WHERE acked_at_ms IS NULL").fetchall()
            ]

    def cursor(self, agent_id: str, channel_id: str) -> tuple[int, tuple[int, ...]] | None:
        with self.store.read() as tx:
            c = cursors_store.cursor(tx, agent_id, channel_id)
        return None if c is None else (c.acked_seq, c.above)

    def seq(self, message_id: str) -> int:
        with self.store.read() as tx:
            return messages_store.message(tx, message_id)["channel_seq"]

    def routed(self, message_id: str) -> bool:
        with self.store.read() as tx:
            return messages_store.message(tx, message_id)["mentions_routed_at"] is not None

    def counters(self) -> dict[str, int]:
        return self.d.status()

    # -- crash and restart --------------------------------------------------------------------
    def restart(self, **overrides: Any) -> None:
        """A crash: a fresh Runtime (fresh bus that never saw earlier publishes) over the same
        database; the old engine is abandoned, its sessions and held ids die with it."""
        self._abandoned.append(self.rt)
        fresh = Runtime(self.url, clock=self.clock, faults=self.faults, admin_token=ADMIN_TOKEN)
        self.sessions = {}
        self._install(fresh, **overrides)

    def close(self) -> None:
        for old in self._abandoned:
            old.delivery.consumer.close()
            old.delivery.started = False
            old.started = False  # a crashed process never shuts down cleanly
            old.store.dispose()
        self._abandoned = []
        if self.rt is not None:
            self.rt.stop()


def general_channel(world: Any, agents: tuple[str, ...], *, subscribed, live=(), settle=None) -> tuple[str, str, dict[str, str]]:
    """The usual scene: a human ``hu``, one agent per handle (owned by ``hu``), and
    ``#general`` with ``hu`` and every agent as members; ``subscribed`` and ``live`` name the
    agents that are subscribed and connected. Then ``settle()`` (e.g. ``world.pump``), if
    given. Returns ``(hu, channel id, {handle: agent id})``."""
    hu = world.human("hu")
    ids = {h: world.agent(h, owner=hu) for h in agents}
    ch = world.channel("general", hu, members=[ids[h] for h in agents], subscribe=[ids[h] for h in subscribed])
    for h in live:
        world.connect(ids[h])
    if settle is not None:
        settle()
    return hu, ch, ids


def fresh_database_urls(backend_url: str, tmp_path: Any, prefix: str):
    """A factory of empty, migrated databases for one example each (Hypothesis): a new
    SQLite file per call, or the PostgreSQL test database with every table truncated."""
    import itertools

    counter = itertools.count()

    def fresh() -> str:
        if backend_url.startswith("postgresql"):
            truncate_pg(backend_url)
            return backend_url
        return str(tmp_path / f"{prefix}-{next(counter)}.db")

    return fresh
