-- Deletes the raw turns of the $4 oldest segments of space ($1, $2) closed before $3, and
-- forgets those segments; records how far each conversation's turns are gone and empties the
-- verbatim excerpts of the episodes they fed. One row per conversation touched.
WITH picked AS MATERIALIZED (
    SELECT conversation_id, last_turn_index FROM summarized_segments
    WHERE user_id = $1 AND space = $2 AND closed_at < $3
    ORDER BY closed_at LIMIT $4),
due AS MATERIALIZED (
    SELECT conversation_id, max(last_turn_index) AS through FROM picked GROUP BY conversation_id),
deleted AS (
    DELETE FROM conversation_turns t USING due
    WHERE t.user_id = $1 AND t.space = $2 AND t.conversation_id = due.conversation_id
      AND t.turn_index <= due.through
    RETURNING t.conversation_id, t.spoken_at),
deleted_by_conversation AS MATERIALIZED (
    SELECT conversation_id, count(*) AS turns, max(spoken_at) AS last_spoken
    FROM deleted GROUP BY conversation_id),
segments_done AS (
    DELETE FROM summarized_segments s USING due
    WHERE s.user_id = $1 AND s.space = $2 AND s.conversation_id = due.conversation_id
      AND s.last_turn_index <= due.through),
progress AS (
    UPDATE conversations c SET turns_deleted_through = GREATEST(c.turns_deleted_through, due.through)
    FROM due WHERE c.user_id = $1 AND c.space = $2 AND c.conversation_id = due.conversation_id),
excerpts AS (
    UPDATE memories m SET messages = '[]'::jsonb
    FROM deleted_by_conversation d
    WHERE m.user_id = $1 AND m.space = $2 AND m.kind = 'episodic'
      AND m.conversation_id = d.conversation_id AND m.end_at <= d.last_spoken
      AND m.messages <> '[]'::jsonb
    RETURNING m.conversation_id),
excerpts_by_conversation AS (
    SELECT conversation_id, count(*) AS cleared FROM excerpts GROUP BY conversation_id)
SELECT due.conversation_id, due.through, COALESCE(d.turns, 0) AS turns,
       COALESCE(e.cleared, 0) AS excerpts_cleared
FROM due LEFT JOIN deleted_by_conversation d USING (conversation_id)
     LEFT JOIN excerpts_by_conversation e USING (conversation_id)
ORDER BY due.conversation_id
