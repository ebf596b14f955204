"""Several ``tidings serve`` processes on one PostgreSQL database, behaving as one hub.

``node.ClusterNode`` is one process's membership: its node row and heartbeat, its LISTEN
connection feeding the local bus, the shared session table, and the leader lock.
``events`` is the notification payload format (ids only). ``guard`` keeps SQLite honest:
one server per file.
"""
