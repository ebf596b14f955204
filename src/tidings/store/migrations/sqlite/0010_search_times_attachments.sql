-- Indexed search, network times and attachments (SQLite).
--
-- Search: FTS5 tables over the hub's message text and the bridge messages' bodies, with
-- external content (the text is stored once, in its own table) and triggers, so the index
-- changes in the very transaction that writes the row. The FTS rowid is the content row's
-- rowid: messages.seq (an INTEGER PRIMARY KEY, stable) and bridge_messages' implicit rowid
-- (stable as long as nobody runs VACUUM; after a VACUUM run
-- INSERT INTO bridge_messages_fts (bridge_messages_fts) VALUES ('rebuild')).
-- The tokenizer is unicode61 without diacritic folding, to match PostgreSQL's 'simple'.

CREATE VIRTUAL TABLE messages_fts USING fts5(
    text, content = 'messages', content_rowid = 'seq', tokenize = 'unicode61 remove_diacritics 0'
);
CREATE TRIGGER messages_fts_insert AFTER INSERT ON messages BEGIN
    INSERT INTO messages_fts (rowid, text) VALUES (new.seq, new.text);
END;
CREATE TRIGGER messages_fts_update AFTER UPDATE OF text ON messages WHEN old.text IS NOT new.text BEGIN
    INSERT INTO messages_fts (messages_fts, rowid, text) VALUES ('delete', old.seq, old.text);
    INSERT INTO messages_fts (rowid, text) VALUES (new.seq, new.text);
END;
CREATE TRIGGER messages_fts_delete AFTER DELETE ON messages BEGIN
    INSERT INTO messages_fts (messages_fts, rowid, text) VALUES ('delete', old.seq, old.text);
END;
INSERT INTO messages_fts (messages_fts) VALUES ('rebuild');

CREATE VIRTUAL TABLE bridge_messages_fts USING fts5(
    body, content = 'bridge_messages', content_rowid = 'rowid', tokenize = 'unicode61 remove_diacritics 0'
);
CREATE TRIGGER bridge_messages_fts_insert AFTER INSERT ON bridge_messages BEGIN
    INSERT INTO bridge_messages_fts (rowid, body) VALUES (new.rowid, new.body);
END;
CREATE TRIGGER bridge_messages_fts_update AFTER UPDATE OF body ON bridge_messages WHEN old.body IS NOT new.body BEGIN
    INSERT INTO bridge_messages_fts (bridge_messages_fts, rowid, body) VALUES ('delete', old.rowid, old.body);
    INSERT INTO bridge_messages_fts (rowid, body) VALUES (new.rowid, new.body);
END;
CREATE TRIGGER bridge_messages_fts_delete AFTER DELETE ON bridge_messages BEGIN
    INSERT INTO bridge_messages_fts (bridge_messages_fts, rowid, body) VALUES ('delete', old.rowid, old.body);
END;
INSERT INTO bridge_messages_fts (bridge_messages_fts) VALUES ('rebuild');

-- Network time: when a message posted from a network (a bridge link) was sent there.
-- NULL for messages written in the hub. Channels still order by channel_seq.
ALTER TABLE messages ADD COLUMN occurred_at_ms INTEGER;

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
    size_bytes   INTEGER,
    width        INTEGER,
    height       INTEGER,
    caption      TEXT NOT NULL DEFAULT '',
    remote_id    TEXT NOT NULL DEFAULT '',
    sha256       TEXT,
    PRIMARY KEY (message_id, ordinal)
) WITHOUT ROWID;

-- Bytes a bridge uploaded for one of its attachments, by the codec's reference.
CREATE TABLE attachment_uploads (
    bridge_id      TEXT NOT NULL REFERENCES bridges (id) ON DELETE CASCADE,
    remote_id      TEXT NOT NULL CHECK (remote_id <> ''),
    sha256         TEXT NOT NULL,
    size_bytes     INTEGER NOT NULL,
    uploaded_at_ms INTEGER NOT NULL,
    PRIMARY KEY (bridge_id, remote_id)
) WITHOUT ROWID;
