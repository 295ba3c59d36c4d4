-- The turns ($3 conversations, $4 turn indexes) and up to $5 turns either side of each, each
-- once, in conversation order, with the episode whose time span holds the turn (the newest, if
-- two segments share a boundary instant). $1 user, $2 space, $6 whether inactive episodes count.
--
-- Only what the assistant may read: a turn of a segment still open (past the conversation's
-- segmented_through), or one an episode holds. A closed segment's turn without an episode is
-- left out: its episode was forgotten, suppressed by a tombstone, trimmed or found inactive
-- (or it held greetings alone), and its lines must not come back through the turns. Nothing of
-- a conversation that is incognito now is read either.
SELECT DISTINCT ON (t.conversation_id, t.turn_index)
       t.conversation_id, t.turn_index, t.role, t.content, t.spoken_at, episode.id AS episode_id
FROM unnest($3::uuid[], $4::int4[]) AS wanted(conversation_id, turn_index)
JOIN conversations c
  ON c.user_id = $1 AND c.space = $2 AND c.conversation_id = wanted.conversation_id
LEFT JOIN spaces s ON s.user_id = $1 AND s.space = $2
JOIN conversation_turns t
  ON t.user_id = $1 AND t.space = $2 AND t.conversation_id = wanted.conversation_id
 AND t.turn_index BETWEEN wanted.turn_index - $5 AND wanted.turn_index + $5
LEFT JOIN LATERAL (
    SELECT m.id FROM memories m
    WHERE m.user_id = $1 AND m.space = $2 AND m.conversation_id = t.conversation_id
      AND m.kind = 'episodic' AND m.invalid_at IS NULL
      AND ($6 OR m.inactive_since IS NULL)
      AND t.spoken_at BETWEEN m.start_at AND m.end_at
    ORDER BY m.created_at DESC, m.id
    LIMIT 1) AS episode ON true
WHERE NOT COALESCE(c.incognito, s.incognito_default, false)
  AND (episode.id IS NOT NULL OR t.turn_index > c.segmented_through)
ORDER BY t.conversation_id, t.turn_index
