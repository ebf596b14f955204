"""Grouping (a throughput option of the drain): several ready frames in one transaction.

With ``group_size > 1`` several consecutive ready frames share one transaction, each inside
its own SAVEPOINT, so a failing frame rolls back only its own work. A transient error ends
the group: what came before it commits, the rest go through the one-frame path. A failed
group commit replays the group one frame at a time.
"""

from __future__ import annotations

from collections.abc import Callable

import structlog

from ..store import inbox as inbox_store
from ..store.engine import Dedicated, is_transient
from ..store.retry import reconnect_if_broken
from .apply import GONE, QUARANTINED, Attempt, FrameApplier, Gone, Outcome, StagedCounters, cause_of

log = structlog.get_logger("tidings.ingest")

#: The one-frame path: ``(inbox_id, first_try) -> outcome``.
ProcessOne = Callable[[str, int], Outcome]


def process_group(
    ids: list[str], *, conn: Dedicated, applier: FrameApplier, process_one: ProcessOne
) -> list[tuple[str, Outcome]]:
    """Several frames in one transaction, a SAVEPOINT each (see the module docstring)."""
    if len(ids) == 1:
        return [(ids[0], process_one(ids[0], 0))]
    done: list[tuple[str, Outcome]] = []
    staged_all: list[StagedCounters] = []
    quarantined: list[tuple[str, str | None, str | None, str]] = []
    leftover: list[str] = []
    try:
        with conn.write() as tx:
            for index, inbox_id in enumerate(ids):
                att = Attempt()
                try:
                    with tx.savepoint():
                        outcome, staged = applier.apply(tx, inbox_id, att)
                except Gone:
                    done.append((inbox_id, GONE))
                    continue
                except Exception as exc:  # noqa: BLE001 - classified below: transient or quarantined
                    if is_transient(exc):
                        if att.bridge_id is not None:
                            applier.counters.of(att.bridge_id).incr("transient_retries")
                        leftover = ids[index:]
                        break
                    cause = cause_of(exc)
                    with tx.savepoint():
                        marked = inbox_store.mark_quarantined(tx, inbox_id, applier.clock.now_ms(), cause)
                    if marked:
                        quarantined.append((inbox_id, att.bridge_id, att.codec, cause))
                        done.append((inbox_id, QUARANTINED))
                    else:
                        done.append((inbox_id, GONE))
                    continue
                done.append((inbox_id, outcome))
                if staged is not None:
                    staged_all.append(staged)
    except Exception as exc:  # noqa: BLE001 - nothing of the group committed: one frame at a time
        if not is_transient(exc):
            log.error("ingest group failed; replaying it frame by frame", error=f"{type(exc).__name__}: {exc}")
        reconnect_if_broken(conn)
        return [(inbox_id, process_one(inbox_id, 0)) for inbox_id in ids]
    for staged in staged_all:
        staged.commit()
        staged.target.incr("projected")
    for inbox_id, bridge_id, codec, cause in quarantined:
        applier.quarantined(inbox_id, bridge_id, codec, cause)
    if leftover:
        done.append((leftover[0], process_one(leftover[0], 1)))
        done.extend((inbox_id, process_one(inbox_id, 0)) for inbox_id in leftover[1:])
    return done
