-- The bridge outbox (PostgreSQL): what the hub owes a network. One row per outbound action,
-- written in the transaction of the hub change that causes it (a post, an edit, a delete,
-- a reaction), drained in seq order by the bridge's own process through the pull API.
-- await_settle: an agent's post waits for its delivery pass (messages.mentions_routed_at),
-- so a held mid-turn reply is not visible to the bridge before the turn settles.
CREATE TABLE outbox (
    seq                BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    id                 TEXT NOT NULL UNIQUE,
    bridge_id          TEXT NOT NULL REFERENCES bridges (id) ON DELETE CASCADE,
    conversation_id    TEXT NOT NULL REFERENCES conversations (id) ON DELETE CASCADE,
    channel_id         TEXT NOT NULL,
    message_id         TEXT NOT NULL,
    kind               TEXT NOT NULL CHECK (kind IN ('send', 'reply', 'react', 'edit', 'delete')),
    body               TEXT NOT NULL DEFAULT '',
    target_remote_id   TEXT,
    emoji              TEXT NOT NULL DEFAULT '',
    await_settle       BOOLEAN NOT NULL DEFAULT FALSE,
    state              TEXT NOT NULL DEFAULT 'pending' CHECK (state IN ('pending', 'sent', 'failed')),
    attempts           INTEGER NOT NULL DEFAULT 0,
    not_before_ms      BIGINT NOT NULL DEFAULT 0,
    remote_id          TEXT,
    cause              TEXT,
    echo_message_id    TEXT,
    created_at_ms      BIGINT NOT NULL,
    updated_at_ms      BIGINT NOT NULL,
    CHECK (state <> 'sent' OR remote_id IS NOT NULL),
    CHECK (state <> 'failed' OR cause IS NOT NULL)
);
CREATE INDEX outbox_pending_idx ON outbox (bridge_id, seq) WHERE state = 'pending';
CREATE INDEX outbox_message_idx ON outbox (message_id, seq);
CREATE INDEX outbox_remote_idx ON outbox (bridge_id, remote_id) WHERE remote_id IS NOT NULL;
