-- Indexed search, network times and attachments (PostgreSQL).
--
-- Search: a stored generated tsvector column ('simple' configuration: no stemming, no stop
-- words, the same words as SQLite's unicode61) with a GIN index, on the hub's message text
-- and on the bridge messages' bodies. Being generated, it is rewritten in the same row write
-- as the text, so the index is always in step with the transaction that wrote it.

ALTER TABLE messages ADD COLUMN search_tsv tsvector GENERATED ALWAYS AS (to_tsvector('simple', text)) STORED;
CREATE INDEX messages_search_idx ON messages USING GIN (search_tsv);
ALTER TABLE bridge_messages ADD COLUMN search_tsv tsvector GENERATED ALWAYS AS (to_tsvector('simple', body)) STORED;
CREATE INDEX bridge_messages_search_idx ON bridge_messages USING GIN (search_tsv);

-- Network time: when a message posted from a network (a bridge link) was sent there.
-- NULL for messages written in the hub. Channels still order by channel_seq.
ALTER TABLE messages ADD COLUMN occurred_at_ms BIGINT;

-- Attachment metadata of bridge messages, one row per attachment, written with the message
-- (first insert only). remote_id: the codec's own reference (Signal attachment id, Google
-- media id, WhatsApp file hash or direct path); sha256: the content address when the codec
-- names it (WhatsApp), else found through attachment_uploads.
CREATE TABLE attachments (
    message_id   TEXT NOT NULL REFERENCES bridge_messages (id) ON DELETE CASCADE,
    ordinal      INTEGER NOT NULL CHECK (ordinal >= 0),
    bridge_id    TEXT NOT NULL REFERENCES bridges (id) ON DELETE CASCADE,
    name         TEXT NOT NULL DEFAULT '',
    content_type TEXT NOT NULL DEFAULT '',
    size_bytes   BIGINT,
    width        INTEGER,
    height       INTEGER,
    caption      TEXT NOT NULL DEFAULT '',
    remote_id    TEXT NOT NULL DEFAULT '',
    sha256       TEXT,
    PRIMARY KEY (message_id, ordinal)
);

-- Bytes a bridge uploaded for one of its attachments, by the codec's reference.
CREATE TABLE attachment_uploads (
    bridge_id      TEXT NOT NULL REFERENCES bridges (id) ON DELETE CASCADE,
    remote_id      TEXT NOT NULL CHECK (remote_id <> ''),
    sha256         TEXT NOT NULL,
    size_bytes     BIGINT NOT NULL,
    uploaded_at_ms BIGINT NOT NULL,
    PRIMARY KEY (bridge_id, remote_id)
);
