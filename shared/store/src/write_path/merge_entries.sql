-- The merge half of `write_entries`: the merges of the JSON document $1 applied (`updated`), each
-- audited as `merge` (and `pin` when it pins). A fragment of a WITH list; `write_entries` composes it.
merge_batch AS (
    SELECT * FROM jsonb_to_recordset($1) AS r(id uuid, user_id uuid, space text,
        repeat_count integer, importance float8, manually_saved boolean, pinned boolean,
        tags text[], source_ids text[], metadata_confidence float8, last_scores jsonb,
        source_episode_ids uuid[], conversation_id uuid, audit_detail jsonb, pins boolean)),
updated AS (
    UPDATE memories m SET repeat_count = b.repeat_count, importance = b.importance,
        manually_saved = b.manually_saved, pinned = b.pinned, tags = b.tags,
        source_ids = b.source_ids, metadata_confidence = b.metadata_confidence,
        last_scores = b.last_scores, source_episode_ids = b.source_episode_ids,
        updated_at = now(), inactive_since = NULL
    FROM merge_batch b
    WHERE m.user_id = b.user_id AND m.space = b.space AND m.id = b.id
    RETURNING m.*),
merges_audited AS (
    INSERT INTO audit_events (user_id, space, action, memory_id, conversation_id, detail)
    SELECT u.user_id, u.space, e.action, u.id, b.conversation_id, e.detail
    FROM updated u JOIN merge_batch b ON b.id = u.id
    CROSS JOIN LATERAL (VALUES (1, 'merge', b.audit_detail), (2, 'pin', '{}'::jsonb))
        AS e(position, action, detail)
    WHERE e.action = 'merge' OR b.pins
    ORDER BY u.id, e.position)
