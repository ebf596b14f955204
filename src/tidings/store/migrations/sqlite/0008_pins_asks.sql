-- Channel pins: at most 5 per channel (enforced by the hub under a channel row lock),
-- ordered by position; a position is unique within its channel.
CREATE TABLE channel_pins (
    channel_id   TEXT NOT NULL REFERENCES channels (id),
    message_id   TEXT NOT NULL REFERENCES messages (id),
    position     INTEGER NOT NULL,
    pinned_at_ms INTEGER NOT NULL,
    pinned_by    TEXT NOT NULL REFERENCES accounts (id),
    PRIMARY KEY (channel_id, message_id)
);
CREATE UNIQUE INDEX channel_pins_position_idx ON channel_pins (channel_id, position);

-- Ask answers: one row per answered ask (the primary key makes "exactly once" a
-- constraint). The row is also the asking agent's owed answer: owed while acked_at_ms IS
-- NULL; dispatched_at_ms stays NULL until the delivery consumer pushed it to a live
-- session or woke the agent, so the recovery scan finds an answer whose dispatch a crash
-- lost.
CREATE TABLE ask_answers (
    message_id       TEXT NOT NULL REFERENCES messages (id),
    ask_id           TEXT NOT NULL,
    channel_id       TEXT NOT NULL REFERENCES channels (id),
    asker_id         TEXT NOT NULL REFERENCES accounts (id),
    answered_by      TEXT NOT NULL REFERENCES accounts (id),
    answered_at_ms   INTEGER NOT NULL,
    answers          TEXT NOT NULL,
    dispatched_at_ms INTEGER,
    acked_at_ms      INTEGER,
    PRIMARY KEY (message_id, ask_id)
);
CREATE INDEX ask_answers_owed_idx ON ask_answers (asker_id, answered_at_ms) WHERE acked_at_ms IS NULL;
CREATE INDEX ask_answers_undispatched_idx ON ask_answers (answered_at_ms) WHERE dispatched_at_ms IS NULL;
