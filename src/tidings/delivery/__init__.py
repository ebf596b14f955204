"""Delivery: every committed message reaches the agents it is owed to, and a mention of an
agent member is never silently dropped (docs/api.md §3.6, §7.2).

Modules:
  engine.py    Delivery: the engine the runtime builds; connect/disconnect/state/ack/owed
  consumer.py  Consumer: the one thread that holds, settles, fans out, sweeps and scans
  mentions.py  the mention grammar and resolution (the only copy)
  sessions.py  SessionRegistry and Session (bounded outbound queue), Dispatch, SessionEnd
  wakers.py    WakeDispatcher (coalesced, off-thread) and SystemWaker (webhook / command)

The sweep-set predicate lives in ``store/delivery.py``; cursors and owed mentions in
``store/cursors.py``.
"""
