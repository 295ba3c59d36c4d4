-- Retention: a per-space policy for how long data is kept, inactive memories that fade out of
-- retrieval before they are deleted, and the closed segments whose raw turns are still stored.
-- The retention job (services/ingest/src/retention.rs) carries it out.

-- Days, 0 meaning "never" (the rule is off). 36,500 days is the longest anything is kept for.
CREATE DOMAIN engram_retention_days AS integer CHECK (VALUE BETWEEN 0 AND 36500);

-- NULL: the service-wide default applies (ENGRAM_RETENTION__*).
ALTER TABLE spaces
    -- Raw conversation turns are deleted this long after their segment closed (and became an
    -- episode, or was found to hold nothing worth one).
    ADD COLUMN turn_retention_days engram_retention_days NULL,
    -- Entries neither pinned nor saved by the user are deleted at this age.
    ADD COLUMN max_age_days        engram_retention_days NULL,
    -- An entry left unused this long (see engram_core::retention) becomes inactive ...
    ADD COLUMN inactive_after_days engram_retention_days NULL,
    -- ... and is deleted when it has been inactive this long.
    ADD COLUMN inactive_grace_days engram_retention_days NULL;

-- When the retention job found the entry inactive: retrieval leaves it out unless asked for it,
-- and the job deletes it after the grace period. Cleared when the entry is used again (reviewed,
-- repeated, pinned or saved).
ALTER TABLE memories ADD COLUMN inactive_since timestamptz NULL;
CREATE INDEX memories_scope_inactive ON memories (user_id, space, inactive_since)
    WHERE inactive_since IS NOT NULL;

-- When a retrieval (RetrieveMemory, ContextPreRetrieve) last returned the entry, at most a day
-- stale (it is rewritten only when older): with the entry's own updated_at (every write of it:
-- create, merge, pin, review) it says when the entry was last used. Not the cached scores'
-- time, which the soft cap also rewrites.
ALTER TABLE memory_retention ADD COLUMN last_returned_at timestamptz NULL;

-- Deleting entries clears the search context of neighbours that quoted them (memories::delete):
-- only entries imported with context_turns have one, so that lookup reads them alone instead of
-- the whole space, batch after batch of a retention run.
CREATE INDEX memories_scope_with_context ON memories (user_id, space)
    WHERE search_context IS NOT NULL;

-- Closed segments whose raw turns are still stored: the job deletes a segment's turns when it
-- has been closed longer than the space's turn retention, then its row. Segmentation adds a
-- row in the transaction that closes the segment; ForgetConversation removes them with the
-- turns. The table only ever holds segments whose turns are waiting, so it stays small.
CREATE TABLE summarized_segments (
    user_id          uuid        NOT NULL,
    space            text        NOT NULL,
    conversation_id  uuid        NOT NULL,
    -- The segment's last turn: every turn up to it is in a closed segment.
    last_turn_index  integer     NOT NULL,
    closed_at        timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (user_id, space, conversation_id, last_turn_index)
);
CREATE INDEX summarized_segments_scope_closed ON summarized_segments (user_id, space, closed_at);

-- The job goes through the spaces table: a space that so far only holds conversations gets its
-- row (with the defaults) when a segment closes; these are the ones from before.
INSERT INTO spaces (user_id, space)
SELECT DISTINCT user_id, space FROM conversations
ON CONFLICT DO NOTHING;

-- Turns up to this index were deleted by retention (GetConversation says so); -1: none.
ALTER TABLE conversations ADD COLUMN turns_deleted_through integer NOT NULL DEFAULT -1;

-- Segments closed before this migration: their retention starts now.
INSERT INTO summarized_segments (user_id, space, conversation_id, last_turn_index)
SELECT user_id, space, conversation_id, segmented_through FROM conversations
WHERE segmented_through >= 0;

-- Retention deletes an entry ('retention_delete', the reason in the detail) or a conversation's
-- summarized turns, and sums up each run per space ('retention_run').
ALTER DOMAIN engram_audit_action DROP CONSTRAINT engram_audit_action_check;
ALTER DOMAIN engram_audit_action ADD CONSTRAINT engram_audit_action_check CHECK (VALUE IN ('create',
    'merge', 'pin', 'unpin', 'forget', 'settings_change', 'incognito_start', 'incognito_end',
    'trim', 'import', 'suppress', 'supersede', 'forget_conversation', 'segment', 'review',
    'retention_delete', 'retention_run'));
