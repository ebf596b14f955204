-- The roster epoch: one counter that moves whenever a channel's agent roster may change.
--
-- The delivery consumer keeps the agents of the channels it fans out to (who is a member,
-- their handles and wake settings, who is in the sweep set) between batches, and each
-- batch's one read tells it whether that copy still holds: the read carries this counter,
-- and the copy is kept only while the counter is the one it was read with. The counter is
-- moved by triggers in the same transaction as the write that changes a roster input, so
-- no code path can change a roster without it, and a rolled-back write rolls it back too.
-- Roster inputs: channel_members (every row), the account columns kind, handle, wake_json
-- and home_channel_id, and channels.mandatory_subscription. The triggers name their
-- columns (UPDATE OF), so the post path's update of channels.last_seq fires none.
-- The counter is derived data: the replay's write counter and store comparison leave it out.

CREATE TABLE roster_epoch (
    id    INTEGER PRIMARY KEY CHECK (id = 1),
    epoch INTEGER NOT NULL
);
INSERT INTO roster_epoch (id, epoch) VALUES (1, 0);

CREATE TRIGGER channel_members_roster_insert AFTER INSERT ON channel_members BEGIN
    UPDATE roster_epoch SET epoch = epoch + 1 WHERE id = 1;
END;
CREATE TRIGGER channel_members_roster_update AFTER UPDATE OF channel_id, account_id, subscribed ON channel_members
BEGIN
    UPDATE roster_epoch SET epoch = epoch + 1 WHERE id = 1;
END;
CREATE TRIGGER channel_members_roster_delete AFTER DELETE ON channel_members BEGIN
    UPDATE roster_epoch SET epoch = epoch + 1 WHERE id = 1;
END;
CREATE TRIGGER accounts_roster_update AFTER UPDATE OF kind, handle, wake_json, home_channel_id ON accounts BEGIN
    UPDATE roster_epoch SET epoch = epoch + 1 WHERE id = 1;
END;
CREATE TRIGGER channels_roster_update AFTER UPDATE OF mandatory_subscription ON channels BEGIN
    UPDATE roster_epoch SET epoch = epoch + 1 WHERE id = 1;
END;
