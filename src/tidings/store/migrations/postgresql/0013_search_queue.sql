-- The search index's queue of changes (SQLite only, see migrations/sqlite/0013).
--
-- PostgreSQL keeps its generated search_tsv columns (migration 0010), written by the
-- row's own statement, so it has nothing to queue. This file keeps the two dialects'
-- migration versions the same (the replay's store comparison compares schema_migrations).
SELECT 1;
