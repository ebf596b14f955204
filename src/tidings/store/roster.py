"""The roster epoch (migration 0014) and the consumer's copy of channel rosters.

A channel's roster is what fan-out and mention routing read about its agent members
(``sweep.ChannelAgent``: id, handle, wake settings, in the sweep set or not). Triggers move
``roster_epoch.epoch`` in the same transaction as every write to a roster input
(``channel_members``; ``accounts.kind``, ``handle``, ``wake_json``, ``home_channel_id``;
``channels.mandatory_subscription``), so the epoch a statement reads changes whenever a
roster it could read has changed.

``RosterCache`` keeps rosters read at one epoch. The invariant: a roster is served from it
only by a statement that read the same epoch, in the same snapshot as its other rows
(``delivery.messages_with_agents``); at any other epoch, or with no epoch row, every roster
the statement needs is read again. So a cached roster is never older than the rows it is
used with, which is what reading it afresh in that statement would give.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .sweep import ChannelAgent

#: Derived data: the replay's write counter and store comparison leave it out.
ROSTER_EPOCH_TABLE = "roster_epoch"
#: The epoch bound when nothing is cached; the statement reads a missing row as -1.
NO_EPOCH = -2
#: More channels than this and the copy starts again empty (memory stays bounded).
MAX_CACHED_CHANNELS = 4096


@dataclass
class RosterCache:
    """Rosters by channel id, valid at ``epoch`` (None: nothing is valid)."""

    epoch: int | None = None
    rosters: dict[str, list[ChannelAgent]] = field(default_factory=dict)
    #: Rosters served from here, and rosters read again (the delivery status reports both).
    hits: int = 0
    misses: int = 0

    def cached(self, channel_ids: list[str]) -> set[str]:
        """The channels of ``channel_ids`` held at the current epoch."""
        if self.epoch is None:
            return set()
        return {c for c in channel_ids if c in self.rosters}

    def bound_epoch(self) -> int:
        return NO_EPOCH if self.epoch is None else self.epoch

    def settle(self, read_epoch: int | None, fetched: dict[str, list[ChannelAgent]],
               uncached: set[str]) -> dict[str, list[ChannelAgent]]:
        """The rosters after a statement that read ``read_epoch`` and returned ``fetched``
        (a key for every channel asked for, empty rosters included). At the epoch held, the
        statement re-read only ``uncached`` and the rest come from here; at any other epoch
        it re-read every channel, and what was held is forgotten."""
        if read_epoch is None or read_epoch != self.epoch:
            self.rosters.clear()
            self.epoch = read_epoch
            self.misses += len(fetched)
            if read_epoch is not None:
                self.rosters.update(fetched)
            return fetched
        out = {cid: roster if cid in uncached else self.rosters[cid] for cid, roster in fetched.items()}
        self.misses += len(uncached)
        self.hits += len(fetched) - len(uncached)
        if len(self.rosters) + len(uncached) > MAX_CACHED_CHANNELS:
            self.rosters.clear()
        self.rosters.update((cid, out[cid]) for cid in uncached)
        return out
