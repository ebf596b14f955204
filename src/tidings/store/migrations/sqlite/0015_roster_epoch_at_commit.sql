-- The roster epoch moves at commit on PostgreSQL (its 0015: deferred constraint triggers, so
-- an open roster write holds up no other). SQLite has one writer: nothing waits behind a
-- roster write's lock, and 0014's triggers stay as they are. This file keeps both
-- dialects at the same schema version (`tidings replay compare` checks schema_migrations).
SELECT 1;
