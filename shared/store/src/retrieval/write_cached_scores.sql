-- The cached scores of entries retrievals returned: $1 users, $2 spaces, $3 entries, $4 their
-- new `last_scores`, one row each. An entry's scores are written only when none are cached, the
-- cached ones are over $5 seconds old, or their total is lower. Rows another transaction holds
-- are skipped, never waited for.
WITH batch AS (
    SELECT * FROM unnest($1::uuid[], $2::text[], $3::uuid[], $4::jsonb[])
        AS b(user_id, space, memory_id, scores)),
due AS (
    SELECT c.user_id, c.id, b.scores
    FROM memories c
    JOIN batch b ON b.user_id = c.user_id AND b.memory_id = c.id AND b.space = c.space
    JOIN memory_retention r ON r.user_id = c.user_id AND r.memory_id = c.id
    WHERE r.last_scored_at IS NULL OR r.last_total IS NULL
       OR r.last_scored_at < (b.scores ->> 'computed_at')::timestamptz - make_interval(secs => $5)
       OR r.last_total < (b.scores ->> 'total')::float8
    FOR UPDATE OF c SKIP LOCKED)
UPDATE memories m SET last_scores = due.scores
FROM due
WHERE m.user_id = due.user_id AND m.id = due.id
