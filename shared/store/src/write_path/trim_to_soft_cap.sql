-- Trims each space of a batch to its soft cap ($1 users, $2 spaces, $3 entries over the cap each,
-- $4 the recency time constant in seconds, $5 how old a cached score may be in seconds, $6 the
-- decay exponent below which recency counts as 0). Entries whose cached score is stale are
-- scored afresh (and the score cached); the lowest-scoring unprotected entries are deleted and
-- audited as `trim`. Returns, per space in input order, the trimmed ids and the protected entries
-- that would have gone were they not protected.
WITH target AS (
    SELECT * FROM unnest($1::uuid[], $2::text[], $3::int8[])
        WITH ORDINALITY AS t(user_id, space, overage, position)),
uncached AS (
    SELECT t.position, u.id, u.created_at, u.importance, u.protected,
           CASE WHEN u.decay_exponent < $6 THEN 0::float8 ELSE exp(u.decay_exponent) END AS recency
    FROM target t CROSS JOIN LATERAL (
        SELECT memory_id AS id, created_at, importance, protected
        FROM memory_retention r WHERE r.user_id = t.user_id AND r.space = t.space
          AND r.last_scored_at IS NULL
        UNION ALL
        SELECT memory_id, created_at, importance, protected
        FROM memory_retention r WHERE r.user_id = t.user_id AND r.space = t.space
          AND r.last_scored_at < now() - make_interval(secs => $5)
        OFFSET 0) AS c
      CROSS JOIN LATERAL (SELECT c.*,
          -greatest(extract(epoch FROM now() - c.created_at)::float8, 0) / $4 AS decay_exponent) AS u),
lowest_trimmable AS (
    SELECT t.position, l.id, l.created_at, l.last_total
    FROM target t CROSS JOIN LATERAL (
        SELECT memory_id AS id, created_at, last_total FROM memory_retention r
        WHERE r.user_id = t.user_id AND r.space = t.space AND NOT r.protected
          AND r.last_scored_at >= now() - make_interval(secs => $5)
        ORDER BY last_total, created_at, memory_id LIMIT t.overage) AS l),
lowest_protected AS (
    SELECT t.position, l.id, l.created_at, l.last_total
    FROM target t CROSS JOIN LATERAL (
        SELECT memory_id AS id, created_at, last_total FROM memory_retention r
        WHERE r.user_id = t.user_id AND r.space = t.space AND r.protected
          AND r.last_scored_at >= now() - make_interval(secs => $5)
        ORDER BY last_total, created_at, memory_id LIMIT t.overage) AS l),
ranked AS (
    SELECT position, id, protected, total,
           row_number() OVER (PARTITION BY position ORDER BY total, created_at, id) AS rank
    FROM (SELECT position, id, created_at, protected, recency + importance AS total FROM uncached
          UNION ALL SELECT position, id, created_at, false, last_total FROM lowest_trimmable
          UNION ALL SELECT position, id, created_at, true, last_total FROM lowest_protected) AS candidates),
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
