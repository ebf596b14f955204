-- A bridge message by its remote id, in any conversation of its bridge (sqlite). Signal's read
-- syncs name a message (author and timestamp) but not its group; a Signal message id is
-- unique on its bridge, so the projection finds the group message through this index.
CREATE INDEX bridge_messages_remote_idx ON bridge_messages (bridge_id, remote_message_id);
