-- What retrievals leave on the entries they returned, in one update of each entry's narrow
-- memory_retention row (never the wide memories row): $1 users, $2 spaces, $3 entries, one row
-- each; $4 when each was last returned; $5 its new `last_scores`, or null when no retrieval
-- scored it (an episode shown only for its lines).
-- The note that it was returned is rewritten only when over $6 seconds older (the inactivity
-- rule counts in days). The scores are written only when none are cached, the cached ones are
-- over $7 seconds older than these, or their total is lower; with them go the total and time the
-- soft cap ranks by, none of them an index key, so the update stays on its page (HOT) where there
-- is room. An entry with neither due is not written at all. Rows another transaction
-- holds (a concurrent batch, a writer's through the memories_retention_after_update trigger) are
-- skipped, never waited for. The update finds each row it locked where the lock found it
-- (`row_at`: the version locked, which nothing else can replace before this statement ends),
-- not through the primary key a second time: a third of the statement's buffers (issue 41).
WITH batch AS (
    SELECT * FROM unnest($1::uuid[], $2::text[], $3::uuid[], $4::timestamptz[], $5::jsonb[])
        AS b(user_id, space, memory_id, returned_at, scores)),
due AS (
    SELECT r.ctid AS row_at, r.user_id, r.memory_id, b.returned_at, b.scores, d.note_due, d.scores_due
    FROM memory_retention r
    JOIN batch b ON b.user_id = r.user_id AND b.memory_id = r.memory_id AND b.space = r.space
    CROSS JOIN LATERAL (
        SELECT r.last_returned_at IS NULL
                   OR r.last_returned_at < b.returned_at - make_interval(secs => $6) AS note_due,
               b.scores IS NOT NULL AND (
                   r.last_scored_at IS NULL OR r.last_total IS NULL
                   OR r.last_scored_at
                      < (b.scores ->> 'computed_at')::timestamptz - make_interval(secs => $7)
                   OR r.last_total < (b.scores ->> 'total')::float8) AS scores_due) AS d
    WHERE d.note_due OR d.scores_due
    FOR UPDATE OF r SKIP LOCKED)
UPDATE memory_retention r
SET last_returned_at = CASE WHEN due.note_due THEN due.returned_at ELSE r.last_returned_at END,
    last_scores = CASE WHEN due.scores_due THEN due.scores ELSE r.last_scores END,
    last_total = CASE WHEN due.scores_due THEN engram_cached_total(due.scores) ELSE r.last_total END,
    last_scored_at = CASE WHEN due.scores_due THEN engram_cached_at(due.scores) ELSE r.last_scored_at END
FROM due
WHERE r.ctid = due.row_at AND r.user_id = due.user_id AND r.memory_id = due.memory_id
