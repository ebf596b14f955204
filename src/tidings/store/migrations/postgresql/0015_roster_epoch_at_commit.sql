-- The roster epoch moves at commit, not at the write (supersedes 0014's statement triggers).
--
-- 0014 bumped the one epoch row inside the statement that changed a roster input, so the
-- row stayed locked for the rest of that transaction: every other roster write on the
-- database, from any process, waited for it (and a transaction left open after a
-- membership write held them all up). Now the triggers are deferred constraint triggers:
-- they run as the transaction commits, so the row is locked only from then until the
-- commit is durable, and a transaction that never commits never locks it.
-- The bump is what it was to the consumer: the epoch and the roster change become
-- visible in the same commit, and a rolled-back write (or savepoint) bumps nothing.
-- Constraint triggers are row triggers; `bumped_by` makes a transaction bump once
-- however many rows it changed (the later calls match no row and write nothing).

ALTER TABLE roster_epoch ADD COLUMN bumped_by xid8;

CREATE OR REPLACE FUNCTION roster_epoch_bump() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE roster_epoch SET epoch = epoch + 1, bumped_by = pg_current_xact_id()
     WHERE id = 1 AND bumped_by IS DISTINCT FROM pg_current_xact_id();
    RETURN NULL;
END
$$;

DROP TRIGGER channel_members_roster ON channel_members;
DROP TRIGGER accounts_roster ON accounts;
DROP TRIGGER channels_roster ON channels;

CREATE CONSTRAINT TRIGGER channel_members_roster
    AFTER INSERT OR DELETE OR UPDATE OF channel_id, account_id, subscribed ON channel_members
    DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW EXECUTE FUNCTION roster_epoch_bump();
CREATE CONSTRAINT TRIGGER accounts_roster
    AFTER UPDATE OF kind, handle, wake_json, home_channel_id ON accounts
    DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW EXECUTE FUNCTION roster_epoch_bump();
CREATE CONSTRAINT TRIGGER channels_roster
    AFTER UPDATE OF mandatory_subscription ON channels
    DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW EXECUTE FUNCTION roster_epoch_bump();
