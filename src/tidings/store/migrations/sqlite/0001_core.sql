-- Tidings core schema (SQLite): accounts, tokens, bridges, channels, topics, messages,
-- delivery cursors, owed mentions, agent sessions. Times are unix milliseconds.

CREATE TABLE accounts (
    id              TEXT PRIMARY KEY,
    kind            TEXT NOT NULL CHECK (kind IN ('human', 'agent', 'system')),
    handle          TEXT NOT NULL UNIQUE,
    display_name    TEXT NOT NULL DEFAULT '',
    owner_id        TEXT REFERENCES accounts (id),
    home_channel_id TEXT,
    wake_json       TEXT,
    created_at_ms   INTEGER NOT NULL
);
CREATE INDEX accounts_owner_idx ON accounts (owner_id);

CREATE TABLE bridges (
    id            TEXT PRIMARY KEY,
    platform      TEXT NOT NULL CHECK (platform IN ('signal', 'whatsapp', 'google')),
    name          TEXT NOT NULL,
    owner_id      TEXT REFERENCES accounts (id),
    account_id    TEXT NOT NULL REFERENCES accounts (id),
    created_at_ms INTEGER NOT NULL
);

-- Tokens are stored as SHA-256 of the secret, never in clear.
CREATE TABLE api_tokens (
    token_hash    TEXT PRIMARY KEY,
    scope         TEXT NOT NULL CHECK (scope IN ('admin', 'account', 'bridge')),
    account_id    TEXT REFERENCES accounts (id),
    bridge_id     TEXT REFERENCES bridges (id),
    label         TEXT NOT NULL DEFAULT '',
    created_at_ms INTEGER NOT NULL,
    revoked_at_ms INTEGER,
    CHECK ((scope = 'bridge') = (bridge_id IS NOT NULL))
);
CREATE INDEX api_tokens_account_idx ON api_tokens (account_id);

CREATE TABLE channels (
    id                     TEXT PRIMARY KEY,
    name                   TEXT NOT NULL,
    kind                   TEXT NOT NULL DEFAULT 'channel' CHECK (kind IN ('channel', 'home', 'dm')),
    post_policy            TEXT NOT NULL DEFAULT 'open' CHECK (post_policy IN ('open', 'owner_only')),
    owner_account_id       TEXT REFERENCES accounts (id),
    mandatory_subscription BOOLEAN NOT NULL DEFAULT 0,
    -- Head of this channel's gap-free, commit-ordered channel_seq; bumped under the row
    -- lock inside the post transaction.
    last_seq               INTEGER NOT NULL DEFAULT 0,
    created_by             TEXT REFERENCES accounts (id),
    created_at_ms          INTEGER NOT NULL
);

CREATE TABLE channel_members (
    channel_id  TEXT NOT NULL REFERENCES channels (id),
    account_id  TEXT NOT NULL REFERENCES accounts (id),
    subscribed  BOOLEAN NOT NULL DEFAULT 0,
    added_at_ms INTEGER NOT NULL,
    PRIMARY KEY (channel_id, account_id)
);
CREATE INDEX channel_members_account_idx ON channel_members (account_id);

CREATE TABLE topics (
    id            TEXT PRIMARY KEY,
    channel_id    TEXT NOT NULL REFERENCES channels (id),
    name          TEXT NOT NULL,
    name_folded   TEXT NOT NULL,
    created_by    TEXT REFERENCES accounts (id),
    created_at_ms INTEGER NOT NULL,
    UNIQUE (channel_id, name_folded)
);

CREATE TABLE messages (
    seq                INTEGER PRIMARY KEY AUTOINCREMENT,
    id                 TEXT NOT NULL UNIQUE,
    channel_id         TEXT NOT NULL REFERENCES channels (id),
    channel_seq        INTEGER NOT NULL,
    topic_id           TEXT NOT NULL REFERENCES topics (id),
    author_account_id  TEXT NOT NULL REFERENCES accounts (id),
    at_unix_ms         INTEGER NOT NULL,
    blocks             TEXT NOT NULL,
    text               TEXT NOT NULL DEFAULT '',
    client_request_id  TEXT NOT NULL DEFAULT '',
    -- NULL until the settle-edge mention pass for this message completed (RIG-2490).
    mentions_routed_at INTEGER,
    edited_at_ms       INTEGER,
    deleted_at_ms      INTEGER,
    UNIQUE (channel_id, channel_seq)
);
CREATE UNIQUE INDEX messages_idem_idx ON messages (author_account_id, client_request_id)
    WHERE client_request_id <> '';
CREATE INDEX messages_unrouted_idx ON messages (seq) WHERE mentions_routed_at IS NULL;
CREATE INDEX messages_author_channel_idx ON messages (author_account_id, channel_id, channel_seq);

-- Per (agent, channel): every channel_seq <= acked_seq is settled; above_seqs (a JSON
-- array) holds acked channel_seqs above it.
CREATE TABLE agent_cursors (
    agent_id    TEXT NOT NULL REFERENCES accounts (id),
    channel_id  TEXT NOT NULL REFERENCES channels (id),
    acked_seq   INTEGER NOT NULL DEFAULT 0,
    above_seqs  TEXT NOT NULL DEFAULT '[]',
    acked_at_ms INTEGER,
    PRIMARY KEY (agent_id, channel_id)
);

CREATE TABLE owed_mentions (
    agent_id       TEXT NOT NULL REFERENCES accounts (id) ON DELETE CASCADE,
    message_id     TEXT NOT NULL REFERENCES messages (id) ON DELETE CASCADE,
    channel_id     TEXT NOT NULL REFERENCES channels (id) ON DELETE CASCADE,
    recorded_at_ms INTEGER NOT NULL,
    PRIMARY KEY (agent_id, message_id)
);

CREATE TABLE agent_sessions (
    session_id    TEXT PRIMARY KEY,
    agent_id      TEXT NOT NULL REFERENCES accounts (id),
    started_at_ms INTEGER NOT NULL,
    ended_at_ms   INTEGER,
    end_reason    TEXT,
    last_state    TEXT
);
CREATE INDEX agent_sessions_agent_idx ON agent_sessions (agent_id, started_at_ms);
