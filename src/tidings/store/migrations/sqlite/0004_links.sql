-- Bridge links (SQLite): a bridge conversation whose new messages are posted into a channel.
CREATE TABLE bridge_links (
    conversation_id TEXT NOT NULL REFERENCES conversations (id) ON DELETE CASCADE,
    channel_id      TEXT NOT NULL REFERENCES channels (id),
    bridge_id       TEXT NOT NULL REFERENCES bridges (id) ON DELETE CASCADE,
    created_by      TEXT REFERENCES accounts (id),
    created_at_ms   INTEGER NOT NULL,
    PRIMARY KEY (conversation_id, channel_id)
) WITHOUT ROWID;
CREATE INDEX bridge_links_channel_idx ON bridge_links (channel_id);
