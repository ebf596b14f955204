-- The ingest inbox (SQLite): every frame a bridge hands over, durable before it is
-- answered 202, kept until it is applied or quarantined (with its cause), and kept after
-- that too, so a dedupe key is remembered for good. Times are unix milliseconds.

CREATE TABLE inbox (
    inbox_id              TEXT PRIMARY KEY,
    bridge_id             TEXT NOT NULL REFERENCES bridges (id),
    -- '' means "the transport has no stable id": never deduplicated.
    dedupe_key            TEXT NOT NULL DEFAULT '',
    codec                 TEXT NOT NULL CHECK (codec <> ''),
    codec_version         INTEGER NOT NULL CHECK (codec_version >= 0),
    -- Server clock at append: the drain order and the Google reaction-fence sequence.
    received_at_ms        INTEGER NOT NULL CHECK (received_at_ms > 0),
    -- The bridge's own receive time, when it sent one (informational only).
    client_received_at_ms INTEGER,
    -- The frame payload as JSON text (an object), or the string the bridge sent.
    payload               TEXT NOT NULL,
    -- NULL while unprocessed; set together with the outcome, in the transaction that
    -- applied the frame's projection, or in the one that quarantined it.
    processed_at_ms       INTEGER,
    outcome               TEXT CHECK (outcome IN ('applied', 'quarantined')),
    cause                 TEXT,
    CHECK ((processed_at_ms IS NULL) = (outcome IS NULL)),
    CHECK (COALESCE(outcome = 'quarantined', 0) = (cause IS NOT NULL))
);
CREATE UNIQUE INDEX inbox_dedupe_uq ON inbox (bridge_id, dedupe_key) WHERE dedupe_key <> '';
-- The drain's only access path: a row-value range seek over unprocessed positions.
CREATE INDEX inbox_unprocessed_idx ON inbox (received_at_ms, inbox_id) WHERE processed_at_ms IS NULL;
CREATE INDEX inbox_quarantine_idx ON inbox (bridge_id, received_at_ms) WHERE outcome = 'quarantined';
