-- Notes that retrievals returned entries: $1 users, $2 spaces, $3 entries, $4 when each was last
-- returned. A note is rewritten only when over $5 seconds older. Rows another transaction holds
-- (a concurrent note, a retrieval's cached scores, a writer's through the
-- memories_retention_after_update trigger)
-- are skipped, never waited for.
WITH batch AS (
    SELECT * FROM unnest($1::uuid[], $2::text[], $3::uuid[], $4::timestamptz[])
        AS b(user_id, space, memory_id, returned_at)),
due AS (
    SELECT r.user_id, r.memory_id, b.returned_at
    FROM memory_retention r
    JOIN batch b ON b.user_id = r.user_id AND b.memory_id = r.memory_id AND b.space = r.space
    WHERE r.last_returned_at IS NULL
       OR r.last_returned_at < b.returned_at - make_interval(secs => $5)
    FOR UPDATE OF r SKIP LOCKED)
UPDATE memory_retention r SET last_returned_at = due.returned_at
FROM due
WHERE r.user_id = due.user_id AND r.memory_id = due.memory_id
