-- Delivery: an ack leaves a tombstone on the owed mention instead of deleting it, so a
-- later pass over the same message (a retried flush, the recovery scan, a settle that
-- fires after the agent already acked the message) can never owe it again. "Owed" means
-- acked_at_ms IS NULL.
ALTER TABLE owed_mentions ADD COLUMN acked_at_ms INTEGER;
CREATE INDEX owed_mentions_open_idx ON owed_mentions (agent_id, message_id) WHERE acked_at_ms IS NULL;
