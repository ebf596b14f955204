-- The projection of bridge traffic (PostgreSQL): identities, conversations and their rosters,
-- bridge messages, reactions with the Google snapshot fence, read cursors.
-- Everything is partitioned by bridge. Ids are derived from the bridge and the natural key
-- (sha256, see tidings.ingest.projection.derive_id), so a replay reproduces them.
-- updated_at_ms is the time of the last content change (never of a no-op refresh).

CREATE TABLE identities (
    id            TEXT PRIMARY KEY,
    bridge_id     TEXT NOT NULL REFERENCES bridges (id) ON DELETE CASCADE,
    kind          TEXT NOT NULL CHECK (kind IN ('e164', 'signal_aci', 'jid', 'email', 'legacy_participant', 'username')),
    canonical     TEXT NOT NULL CHECK (canonical <> ''),
    raw           TEXT NOT NULL CHECK (trim(raw) <> ''),
    display_name  TEXT NOT NULL DEFAULT '',
    is_self       BOOLEAN NOT NULL DEFAULT false,
    metadata      TEXT NOT NULL DEFAULT '{}',
    created_at_ms BIGINT NOT NULL,
    updated_at_ms BIGINT NOT NULL,
    UNIQUE (bridge_id, kind, canonical)
);

CREATE TABLE conversations (
    id                     TEXT PRIMARY KEY,
    bridge_id              TEXT NOT NULL REFERENCES bridges (id) ON DELETE CASCADE,
    remote_conversation_id TEXT NOT NULL CHECK (remote_conversation_id <> ''),
    kind                   TEXT NOT NULL CHECK (kind IN ('direct', 'group', 'broadcast', 'system')),
    title                  TEXT NOT NULL DEFAULT '',
    remote_revision        TEXT,
    -- Occurrence time of the newest message; moved only by a strictly newer message.
    last_message_at_ms     BIGINT NOT NULL DEFAULT 0 CHECK (last_message_at_ms >= 0),
    created_at_ms          BIGINT NOT NULL,
    updated_at_ms          BIGINT NOT NULL,
    UNIQUE (bridge_id, remote_conversation_id)
);
CREATE INDEX conversations_recency_idx ON conversations (bridge_id, last_message_at_ms DESC, id DESC);

CREATE TABLE conversation_participants (
    conversation_id TEXT NOT NULL REFERENCES conversations (id) ON DELETE CASCADE,
    identity_id     TEXT NOT NULL REFERENCES identities (id),
    bridge_id       TEXT NOT NULL REFERENCES bridges (id) ON DELETE CASCADE,
    role            TEXT NOT NULL DEFAULT 'member' CHECK (role IN ('member', 'admin', 'owner', 'unknown')),
    display_name    TEXT NOT NULL DEFAULT '',
    is_active       BOOLEAN NOT NULL DEFAULT true,
    PRIMARY KEY (conversation_id, identity_id)
);

-- The natural key (bridge, conversation, remote_message_id) is the preimage of the derived
-- primary key, so the primary key is its uniqueness; no second unique index to maintain.
CREATE TABLE bridge_messages (
    id                 TEXT PRIMARY KEY,
    bridge_id          TEXT NOT NULL REFERENCES bridges (id) ON DELETE CASCADE,
    conversation_id    TEXT NOT NULL REFERENCES conversations (id) ON DELETE CASCADE,
    remote_message_id  TEXT NOT NULL CHECK (remote_message_id <> ''),
    sender_identity_id TEXT REFERENCES identities (id),
    direction          TEXT NOT NULL CHECK (direction IN ('incoming', 'outgoing')),
    body               TEXT NOT NULL DEFAULT '',
    reply_to_remote_id TEXT CHECK (reply_to_remote_id IS NULL OR reply_to_remote_id <> ''),
    state              TEXT NOT NULL DEFAULT 'active' CHECK (state IN ('active', 'edited', 'deleted')),
    occurred_at_ms     BIGINT NOT NULL CHECK (occurred_at_ms > 0),
    -- Occurrence time of the last applied edit or delete (last writer wins), else NULL.
    mutated_at_ms      BIGINT,
    created_at_ms      BIGINT NOT NULL,
    updated_at_ms      BIGINT NOT NULL
);
CREATE INDEX bridge_messages_conversation_idx ON bridge_messages (conversation_id, occurred_at_ms DESC, id DESC);

-- One row per (message, reactor); a removal is a tombstone (state 'removed'), never a delete.
-- reactor_key: 'self', 'anon:<emoji>' (an anonymous Google reactor) or an identity id.
CREATE TABLE reactions (
    message_id          TEXT NOT NULL REFERENCES bridge_messages (id) ON DELETE CASCADE,
    reactor_key         TEXT NOT NULL CHECK (reactor_key <> ''),
    bridge_id           TEXT NOT NULL REFERENCES bridges (id) ON DELETE CASCADE,
    conversation_id     TEXT NOT NULL,
    reactor_identity_id TEXT REFERENCES identities (id),
    reactor_is_self     BOOLEAN NOT NULL DEFAULT false,
    emoji               TEXT NOT NULL DEFAULT '' CHECK (char_length(emoji) <= 64),
    state               TEXT NOT NULL CHECK (state IN ('active', 'removed')),
    occurred_at_ms      BIGINT NOT NULL CHECK (occurred_at_ms > 0),
    source_seq_ms       BIGINT NOT NULL DEFAULT 0 CHECK (source_seq_ms >= 0),
    created_at_ms       BIGINT NOT NULL,
    updated_at_ms       BIGINT NOT NULL,
    PRIMARY KEY (message_id, reactor_key),
    CHECK (state = 'removed' OR emoji <> '')
);

-- The Google reaction-snapshot fence: the receipt time of the newest snapshot applied to a
-- message. A separate table because an empty snapshot writes no reaction row yet must
-- still advance the fence (an older snapshot retried later must not resurrect reactions).
CREATE TABLE reaction_fences (
    message_id    TEXT PRIMARY KEY REFERENCES bridge_messages (id) ON DELETE CASCADE,
    bridge_id     TEXT NOT NULL REFERENCES bridges (id) ON DELETE CASCADE,
    source_seq_ms BIGINT NOT NULL CHECK (source_seq_ms >= 0),
    updated_at_ms BIGINT NOT NULL
);

-- Where our own side has read up to, per conversation (moved by self read receipts only,
-- and only forwards).
CREATE TABLE read_cursors (
    conversation_id         TEXT PRIMARY KEY REFERENCES conversations (id) ON DELETE CASCADE,
    bridge_id               TEXT NOT NULL REFERENCES bridges (id) ON DELETE CASCADE,
    last_read_message_id    TEXT NOT NULL REFERENCES bridge_messages (id) ON DELETE CASCADE,
    last_read_message_at_ms BIGINT NOT NULL,
    last_read_at_ms         BIGINT NOT NULL,
    updated_at_ms           BIGINT NOT NULL
);
