-- SQLite runs one server per file (a second one refuses to start); the tables exist so
-- both dialects share one schema, and stay empty here.
-- Cluster: several hub processes ("nodes") on one PostgreSQL database. A node row carries
-- its heartbeat; an agent is live when it has a row here on a node whose heartbeat is
-- fresh. One row per agent (one live session per agent across the cluster). Times are
-- unix milliseconds.
CREATE TABLE cluster_nodes (
    node_id         TEXT PRIMARY KEY,
    address         TEXT NOT NULL DEFAULT '',
    started_at_ms   BIGINT NOT NULL,
    heartbeat_at_ms BIGINT NOT NULL
);
CREATE TABLE cluster_sessions (
    agent_id      TEXT PRIMARY KEY,
    session_id    TEXT NOT NULL,
    node_id       TEXT NOT NULL,
    started_at_ms BIGINT NOT NULL
);
CREATE INDEX cluster_sessions_node_idx ON cluster_sessions (node_id);
