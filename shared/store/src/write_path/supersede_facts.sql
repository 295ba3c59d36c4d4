-- New facts that state a value of a subject ($1 users, $2 spaces, $3 the new facts, $4 their
-- subjects, $5 their values, $6 their conversations), against the valid facts of the same
-- subject with another value, in time order of when each was said (`valid_at`), whatever the
-- order they were written in:
-- * an older one said no later than the new one stops being true when the new one was said;
-- * the new one, when a fact said after it already stands, is written as superseded by the
--   first of those, from when that one was said (consolidation writes a conversation's
--   sessions in any order, and a history may be imported out of order).
-- Each change is audited as `supersede`. Returns (superseded, by) pairs.
WITH incoming AS (
    SELECT i.*, COALESCE(n.valid_at, n.created_at, now()) AS said_at
    FROM unnest($1::uuid[], $2::text[], $3::uuid[], $4::text[], $5::text[], $6::uuid[])
        AS i(user_id, space, new_fact, subject, value, conversation_id)
    LEFT JOIN memories n ON n.user_id = i.user_id AND n.id = i.new_fact),
superseded AS (
    UPDATE memories m SET invalid_at = i.said_at, superseded_by = i.new_fact, updated_at = now()
    FROM incoming i
    WHERE m.user_id = i.user_id AND m.space = i.space AND m.kind = 'semantic'
      AND m.fact_subject = i.subject AND m.invalid_at IS NULL AND m.id <> i.new_fact
      AND m.fact_value IS DISTINCT FROM i.value
      AND COALESCE(m.valid_at, m.created_at) <= i.said_at
    RETURNING m.id, m.user_id, m.space, i.new_fact AS by_fact, i.subject, i.conversation_id),
born_superseded AS (
    UPDATE memories m SET invalid_at = later.valid_at, superseded_by = later.id, updated_at = now()
    FROM incoming i
    CROSS JOIN LATERAL (
        SELECT n.id, n.valid_at FROM memories n
        WHERE n.user_id = i.user_id AND n.space = i.space AND n.kind = 'semantic'
          AND n.fact_subject = i.subject AND n.invalid_at IS NULL AND n.id <> i.new_fact
          AND n.fact_value IS DISTINCT FROM i.value AND n.valid_at > i.said_at
        ORDER BY n.valid_at
        LIMIT 1) later
    WHERE m.user_id = i.user_id AND m.id = i.new_fact AND m.invalid_at IS NULL
      -- (a new fact a newer one of the same batch supersedes is already done above)
      AND m.id NOT IN (SELECT id FROM superseded)
    RETURNING m.id, m.user_id, m.space, later.id AS by_fact, i.subject, i.conversation_id),
changed AS (
    SELECT * FROM superseded UNION ALL SELECT * FROM born_superseded),
audited AS (
    INSERT INTO audit_events (user_id, space, action, memory_id, conversation_id, detail)
    SELECT user_id, space, 'supersede', id, conversation_id,
           jsonb_build_object('superseded_by', by_fact, 'subject', subject)
    FROM changed)
SELECT id, by_fact FROM changed
