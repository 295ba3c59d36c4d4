-- Trims each space of a batch to its soft cap ($1 users, $2 spaces, $3 entries over the cap each,
-- $4 the recency time constant in seconds, $5 how old a cached score may be in seconds, $6 the
-- decay exponent below which recency counts as 0). Entries whose cached score is stale are
-- scored afresh (and the score cached); the lowest-scoring unprotected entries are deleted and
-- audited as `trim`. Returns, per space in input order, the trimmed ids and the protected entries
-- that would have gone were they not protected.
WITH target AS (
    SELECT * FROM unnest($1::uuid[], $2::text[], $3::int8[])
        WITH ORDINALITY AS t(user_id, space, overage, position)),
-- Each space's entries, read once through the index on the space (a score write changes no key
-- of it, so retrieval rewrites scores in place; issue 41), then ranked here.
space_entries AS MATERIALIZED (
    SELECT t.position, r.memory_id AS id, r.created_at, r.importance, r.protected, r.last_total,
           r.last_scored_at >= now() - make_interval(secs => $5) AS fresh
    FROM target t JOIN memory_retention r ON r.user_id = t.user_id AND r.space = t.space),
-- Entries without a cached score, or with one older than $5 seconds: scored afresh below.
uncached AS (
    SELECT e.position, e.id, e.created_at, e.importance, e.protected,
           CASE WHEN u.decay_exponent < $6 THEN 0::float8 ELSE exp(u.decay_exponent) END AS recency
    FROM space_entries e
      CROSS JOIN LATERAL (SELECT
          -greatest(extract(epoch FROM now() - e.created_at)::float8, 0) / $4 AS decay_exponent) AS u
    WHERE e.fresh IS NOT TRUE),
-- The lowest cached totals of each space, unprotected and protected apart, at most its overage
-- of each.
lowest_cached AS (
    SELECT c.position, c.id, c.created_at, c.protected, c.last_total
    FROM (SELECT e.*, row_number() OVER (PARTITION BY e.position, e.protected
                                         ORDER BY e.last_total, e.created_at, e.id) AS place
          FROM space_entries e WHERE e.fresh) AS c
    JOIN target t ON t.position = c.position
    WHERE c.place <= t.overage),
ranked AS (
    SELECT position, id, protected, total,
           row_number() OVER (PARTITION BY position ORDER BY total, created_at, id) AS rank
    FROM (SELECT position, id, created_at, protected, recency + importance AS total FROM uncached
          UNION ALL SELECT position, id, created_at, protected, last_total FROM lowest_cached)
         AS candidates),
victims AS (
    SELECT r.position, r.id, r.total, r.rank
    FROM (SELECT *, row_number() OVER (PARTITION BY position ORDER BY rank) AS victim_rank
          FROM ranked WHERE NOT protected) AS r
    JOIN target t ON t.position = r.position
    WHERE r.victim_rank <= t.overage),
rescored AS (
    UPDATE memories m SET last_scores = jsonb_build_object('relevance', 0.0, 'recency', u.recency,
        'importance', u.importance, 'total', u.recency + u.importance, 'computed_at', now())
    FROM uncached u JOIN target t ON t.position = u.position
    WHERE m.user_id = t.user_id AND m.space = t.space AND m.id = u.id
      AND u.id NOT IN (SELECT id FROM victims)),
deleted AS (
    DELETE FROM memories m USING victims v JOIN target t ON t.position = v.position
    WHERE m.user_id = t.user_id AND m.space = t.space AND m.id = v.id
    RETURNING m.id, m.user_id, m.space, v.total),
audited AS (
    INSERT INTO audit_events (user_id, space, action, memory_id, detail)
    SELECT user_id, space, 'trim', id,
           jsonb_build_object('reason', 'soft cap exceeded', 'total_score', total)
    FROM deleted)
SELECT t.position,
       COALESCE((SELECT array_agg(v.id ORDER BY v.rank) FROM victims v
                 WHERE v.position = t.position AND v.id IN (SELECT id FROM deleted)), '{}') AS trimmed,
       COALESCE((SELECT array_agg(r.id ORDER BY r.rank) FROM ranked r
                 WHERE r.position = t.position AND r.rank <= t.overage AND r.protected), '{}')
           AS protected_would_be_victims
FROM target t ORDER BY t.position
