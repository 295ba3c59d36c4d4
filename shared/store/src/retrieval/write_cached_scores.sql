-- The cached scores of entries retrievals returned: $1 users, $2 spaces, $3 entries, $4 their
-- new `last_scores`, one row each. An entry's scores are written only when none are cached, the
-- cached ones are over $5 seconds old, or their total is lower. They go to the narrow
-- memory_retention row alone (with the total and time the soft cap ranks by), never to the wide
-- memories row. Rows another transaction holds are skipped, never waited for.
WITH batch AS (
    SELECT * FROM unnest($1::uuid[], $2::text[], $3::uuid[], $4::jsonb[])
        AS b(user_id, space, memory_id, scores)),
due AS (
    SELECT r.user_id, r.memory_id, b.scores
    FROM memory_retention r
    JOIN batch b ON b.user_id = r.user_id AND b.memory_id = r.memory_id AND b.space = r.space
    WHERE r.last_scored_at IS NULL OR r.last_total IS NULL
       OR r.last_scored_at < (b.scores ->> 'computed_at')::timestamptz - make_interval(secs => $5)
       OR r.last_total < (b.scores ->> 'total')::float8
    FOR UPDATE OF r SKIP LOCKED)
UPDATE memory_retention r
SET last_scores = due.scores,
    last_total = engram_cached_total(due.scores),
    last_scored_at = engram_cached_at(due.scores)
FROM due
WHERE r.user_id = due.user_id AND r.memory_id = due.memory_id
