"""Agent session rows (``agent_sessions``): bookkeeping of who was connected when.

Liveness itself lives in memory (the delivery engine's session registry); these rows only
record starts, ends (with a reason) and the last reported state. A previous process's
open rows end with reason ``restart`` when the consumer opens.
"""

from __future__ import annotations

from .engine import Tx
from .sql import Stmt

INSERT_SESSION = Stmt(
    "INSERT INTO agent_sessions (session_id, agent_id, started_at_ms) VALUES (:session_id, :agent_id, :now) "
    "ON CONFLICT (session_id) DO NOTHING",
    name="insert_session",
)
END_SESSION = Stmt(
    "UPDATE agent_sessions SET ended_at_ms = :now, end_reason = :reason "
    "WHERE session_id = :session_id AND ended_at_ms IS NULL",
    name="end_session",
)
SET_SESSION_STATE = Stmt(
    "UPDATE agent_sessions SET last_state = :state WHERE session_id = :session_id", name="set_session_state"
)
END_STALE_SESSIONS = Stmt(
    "UPDATE agent_sessions SET ended_at_ms = :now, end_reason = 'restart' WHERE ended_at_ms IS NULL",
    name="end_stale_sessions",
)



def insert_session(tx: Tx, session_id: str, agent_id: str, now: int) -> None:
    tx.execute(INSERT_SESSION, {"session_id": session_id, "agent_id": agent_id, "now": now})


def end_session(tx: Tx, session_id: str, reason: str, now: int) -> None:
    tx.execute(END_SESSION, {"session_id": session_id, "reason": reason, "now": now})


def set_session_state(tx: Tx, session_id: str, state: str) -> None:
    tx.execute(SET_SESSION_STATE, {"session_id": session_id, "state": state})


def end_stale_sessions(tx: Tx, now: int) -> int:
    """Sessions a previous process left open (it crashed) end with reason ``restart``."""
    return tx.rowcount(END_STALE_SESSIONS, {"now": now})
