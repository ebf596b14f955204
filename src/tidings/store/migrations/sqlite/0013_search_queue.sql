-- The search index catches up in batches (SQLite; supersedes 0010's triggers in part).
--
-- 0010 kept the FTS5 tables in step with triggers that wrote the index inside every
-- message's transaction, and FTS5 writes a new index segment at every commit that touched
-- it. Now a write only queues the change, durably, in its own transaction:
-- <table>_fts_pending holds one row per change of indexed text, in write order. rid is the
-- content row's rowid (the FTS rowid); old_text is the text the index held for that row
-- before this change (NULL: the row was new, the index held nothing for it). The index is
-- brought up to date by store/search_index.py: first by every search, then by the
-- hub's background pass; each catch-up is one transaction (one FTS5 commit for the batch).
-- The queue rows are derived data like the index itself (their names start with the index
-- table's name, so the replay's write counter and store comparison leave them out).
-- At this migration the index is exact (0010's triggers kept it so), so the queue starts empty.

DROP TRIGGER messages_fts_insert;
DROP TRIGGER messages_fts_update;
DROP TRIGGER messages_fts_delete;
DROP TRIGGER bridge_messages_fts_insert;
DROP TRIGGER bridge_messages_fts_update;
DROP TRIGGER bridge_messages_fts_delete;

CREATE TABLE messages_fts_pending (
    id       INTEGER PRIMARY KEY,
    rid      INTEGER NOT NULL,
    old_text TEXT
);
CREATE TRIGGER messages_fts_queue_insert AFTER INSERT ON messages BEGIN
    INSERT INTO messages_fts_pending (rid) VALUES (new.seq);
END;
CREATE TRIGGER messages_fts_queue_update AFTER UPDATE OF text ON messages WHEN old.text IS NOT new.text BEGIN
    INSERT INTO messages_fts_pending (rid, old_text) VALUES (old.seq, old.text);
END;
CREATE TRIGGER messages_fts_queue_delete AFTER DELETE ON messages BEGIN
    INSERT INTO messages_fts_pending (rid, old_text) VALUES (old.seq, old.text);
END;

CREATE TABLE bridge_messages_fts_pending (
    id       INTEGER PRIMARY KEY,
    rid      INTEGER NOT NULL,
    old_text TEXT
);
CREATE TRIGGER bridge_messages_fts_queue_insert AFTER INSERT ON bridge_messages BEGIN
    INSERT INTO bridge_messages_fts_pending (rid) VALUES (new.rowid);
END;
CREATE TRIGGER bridge_messages_fts_queue_update AFTER UPDATE OF body ON bridge_messages
WHEN old.body IS NOT new.body BEGIN
    INSERT INTO bridge_messages_fts_pending (rid, old_text) VALUES (old.rowid, old.body);
END;
CREATE TRIGGER bridge_messages_fts_queue_delete AFTER DELETE ON bridge_messages BEGIN
    INSERT INTO bridge_messages_fts_pending (rid, old_text) VALUES (old.rowid, old.body);
END;
