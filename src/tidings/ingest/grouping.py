"""Grouping (the drain's group size): several ready frames in one transaction, projected in
one batch per bridge (D118).

With ``group_size > 1`` the drain takes consecutive ready frames together: one statement
claims them all (loads them and marks them applied) and takes their bridges' locks; each is
decoded; one ``Batch`` a bridge reads the rows its frames touch, all in one round trip; the
frames are projected in receipt order, each taken back whole from its batch when it fails
(a frame that may call the link hook in a savepoint of its own), and a frame that fails
deterministically is marked quarantined with its cause in the same transaction; the
batches write their rows once, and one commit ends the group.

A transient error inside a frame's savepoint ends the group there: the frames before it
commit, the frames from it on are released (unprocessed again) and go through the
one-frame path, that frame's group attempt counted as its first try. A transient error, or
any database error, outside a savepoint ends the group whole: nothing of it is stored, and
every frame goes through the one-frame path, in order. So does a group whose commit fails.
A projection test seam (no batch) is decoded frame by frame, when reached.
"""

from __future__ import annotations

from collections.abc import Callable

import structlog

from ..store import inbox as inbox_store
from ..store.engine import Dedicated, is_database_error, is_transient
from ..store.retry import reconnect_if_broken
from .apply import GONE, QUARANTINED, Attempt, Decoded, FrameApplier, Outcome, StagedCounters, cause_of, frame_scope
from .batch import Batch

log = structlog.get_logger("tidings.ingest")

#: The drain's default group size (``Ingest``; ``TIDINGS_INGEST_GROUP`` sets another, 1 turns
#: grouping off; D119). A backlog drains ×2.5 (SQLite) to ×5.7 (PostgreSQL) faster than a
#: frame a transaction (``bench/run.py``, section 1, "the drain"); a group holds its frames'
#: payloads in memory (at most 32 MiB of 1 MiB frames) and its bridges' locks until it commits.
DRAIN_GROUP = 32

#: The one-frame path: ``(inbox_id, first_try) -> outcome``.
ProcessOne = Callable[[str, int], Outcome]


class _GroupLost(Exception):
    """A frame's error that no savepoint took back: the group's transaction is lost."""

    def __init__(self, inbox_id: str, att: Attempt) -> None:
        super().__init__()
        self.inbox_id = inbox_id
        self.att = att


def process_group(
    ids: list[str], *, conn: Dedicated, applier: FrameApplier, process_one: ProcessOne, write_behind: bool = True,
) -> list[tuple[str, Outcome]]:
    """Several frames in one transaction, one batch a bridge (see the module docstring)."""
    if len(ids) == 1:
        return [(ids[0], process_one(ids[0], 0))]
    done: list[tuple[str, Outcome]] = []
    staged_all: list[StagedCounters] = []
    quarantined: list[tuple[str, str | None, str | None, str]] = []
    left: list[str] = []  # from the frame a transient error stopped at, in order
    try:
        with conn.write() as tx:
            tx.write_behind = write_behind and tx.dialect == "postgresql"
            rows = applier.claim_group(tx, ids)
            atts: dict[str, Attempt] = {inbox_id: Attempt() for inbox_id in rows}
            decoded: dict[str, Decoded] = {}
            batches: dict[str, Batch] = {}
            if applier.batches:
                of_bridge: dict[str, list[Decoded]] = {}
                for inbox_id in ids:
                    row = rows.get(inbox_id)
                    if row is not None:
                        decoded[inbox_id] = applier.decode_ahead(tx, atts[inbox_id], row)
                        of_bridge.setdefault(row[0], []).append(decoded[inbox_id])
                for bridge_id, frames in of_bridge.items():
                    batch = applier.batch(tx, bridge_id, frames)
                    if batch is not None:
                        batch.announce()  # every bridge's reads in one round trip
                        batches[bridge_id] = batch
                for batch in batches.values():
                    batch.read()
            for index, inbox_id in enumerate(ids):
                row = rows.get(inbox_id)
                if row is None:
                    done.append((inbox_id, GONE))  # finished elsewhere since it was listed
                    continue
                att, frame = atts[inbox_id], decoded.get(inbox_id)
                batch = batches.get(row[0])
                scope, own = frame_scope(tx, batch, frame)
                try:
                    with scope:
                        outcome, staged = applier.apply(tx, inbox_id, att, row, mark=False, decoded=frame,
                                                        batch=batch)
                except Exception as exc:  # noqa: BLE001 - classified below: the group's, the rest's, or quarantined
                    if not own and is_database_error(exc):
                        raise _GroupLost(inbox_id, att) from exc
                    if is_transient(exc):
                        applier.retried(att)
                        left = ids[index:]
                        inbox_store.release_claimed(tx, [i for i in left if i in rows])
                        break
                    cause = cause_of(exc)
                    inbox_store.quarantine_claimed(tx, inbox_id, applier.clock.now_ms(), cause)
                    quarantined.append((inbox_id, att.bridge_id, att.codec, cause))
                    done.append((inbox_id, QUARANTINED))
                    continue
                done.append((inbox_id, outcome))
                if staged is not None:
                    staged_all.append(staged)
            for batch in batches.values():
                batch.flush()
    except Exception as exc:  # noqa: BLE001 - nothing of the group committed: one frame at a time
        error = exc.__cause__ if isinstance(exc, _GroupLost) and exc.__cause__ is not None else exc
        first = ""  # the frame whose transient error lost the group: its try counted
        if isinstance(exc, _GroupLost) and is_transient(error):
            applier.retried(exc.att)
            first = exc.inbox_id
        elif not is_transient(error):
            log.error("ingest group failed; replaying it frame by frame", error=f"{type(error).__name__}: {error}")
        reconnect_if_broken(conn)
        return [(inbox_id, process_one(inbox_id, 1 if inbox_id == first else 0)) for inbox_id in ids]
    for staged in staged_all:
        staged.commit("projected")
    for inbox_id, of, codec, why in quarantined:
        applier.quarantined(inbox_id, of, codec, why)
    if left:
        done.append((left[0], process_one(left[0], 1)))
        done.extend((inbox_id, process_one(inbox_id, 0)) for inbox_id in left[1:])
    return done
