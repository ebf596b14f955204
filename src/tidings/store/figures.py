"""The durable figures of a hub, read straight from the store (true for any process):
frames not yet processed and quarantined frames per bridge, owed mentions not acked."""

from __future__ import annotations

from typing import Any

from .engine import Tx
from .inbox import backlog_by_bridge, quarantined_count_by_bridge
from .sql import Stmt

OPEN_OWED = Stmt("SELECT count(*) FROM owed_mentions WHERE acked_at_ms IS NULL")


def durable(tx: Tx) -> dict[str, Any]:
    backlog = {k: int(v) for k, v in backlog_by_bridge(tx).items()}
    quarantined = {k: int(v) for k, v in quarantined_count_by_bridge(tx).items()}
    return {
        "backlog": backlog,
        "backlog_total": sum(backlog.values()),
        "quarantined": quarantined,
        "quarantined_total": sum(quarantined.values()),
        "owed": int(tx.scalar(OPEN_OWED, {}) or 0),
    }
