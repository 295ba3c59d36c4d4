-- What the turn search needs of a space, in one round trip, for the service to score (issue 41):
--   part 0: the query's words ($3), as BM25 matches them (one row);
--   part 1: the space's conversations, each with segmented_through and whether it may be read
--           now (not incognito);
--   part 2: the blocks of the closed turns (conversation_turn_blocks, a row per 32 turns);
--   part 3: the turns of each open segment (past segmented_through), built into the same shape
--           by the same function the blocks are built by;
--   part 4: the episodes of the conversations that may be read, with their time spans (which
--           episode holds a turn, and so which closed turns may be read, the caller works out:
--           `turn_search::hold_turns`).
-- $1 user, $2 space, $3 query, $4 whether the turn vectors are wanted (the vector leg runs),
-- $5 whether inactive episodes count.
--
-- Every turn of the space comes back, with its words and length: BM25's N and average length
-- are the space's. A block row costs about what one turn row did, and a conversation of fewer
-- than 32 turns is one block, so this reads a row a conversation where the statement before it
-- read a row a turn and a row a turn vector.
WITH space_conversations AS MATERIALIZED (
    SELECT c.conversation_id, c.segmented_through, c.next_turn_index,
           NOT COALESCE(c.incognito,
                        (SELECT s.incognito_default FROM spaces s
                         WHERE s.user_id = $1 AND s.space = $2),
                        false) AS readable
    FROM conversations c
    WHERE c.user_id = $1 AND c.space = $2)
SELECT 0 AS part, NULL::uuid AS conversation_id, NULL::int4 AS segmented_through,
       NULL::bool AS readable,
       ARRAY(SELECT lexeme FROM unnest(engram_search_words($3))) AS terms,
       NULL::int4[] AS turn_indexes, NULL::text[] AS roles, NULL::text[] AS contents,
       NULL::timestamptz[] AS spoken_ats, NULL::int4[] AS search_lengths, NULL::text AS words,
       NULL::int4[] AS vector_turns, NULL::text[] AS vector_models, NULL::bytea AS vectors,
       NULL::uuid AS episode_id, NULL::timestamptz AS start_at, NULL::timestamptz AS end_at,
       NULL::timestamptz AS created_at
UNION ALL
SELECT 1, c.conversation_id, c.segmented_through, c.readable, NULL, NULL, NULL, NULL, NULL,
       NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL
FROM space_conversations c
UNION ALL
SELECT 2, b.conversation_id, NULL, NULL, NULL, b.turn_indexes, b.roles, b.contents,
       b.spoken_ats, b.search_lengths, b.words,
       CASE WHEN $4 THEN b.vector_turns END, CASE WHEN $4 THEN b.vector_models END,
       CASE WHEN $4 THEN b.vectors END,
       NULL, NULL, NULL, NULL
FROM conversation_turn_blocks b
WHERE b.user_id = $1 AND b.space = $2
UNION ALL
SELECT 3, c.conversation_id, NULL, NULL, NULL, o.turn_indexes, o.roles, o.contents,
       o.spoken_ats, o.search_lengths, o.words,
       CASE WHEN $4 THEN o.vector_turns END, CASE WHEN $4 THEN o.vector_models END,
       CASE WHEN $4 THEN o.vectors END,
       NULL, NULL, NULL, NULL
FROM space_conversations c
CROSS JOIN LATERAL engram_turn_block($1, $2, c.conversation_id, c.segmented_through + 1,
                                     2147483647) AS o
WHERE c.next_turn_index - 1 > c.segmented_through
UNION ALL
SELECT 4, m.conversation_id, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
       NULL, m.id, m.start_at, m.end_at, m.created_at
FROM memories m
WHERE m.user_id = $1 AND m.space = $2 AND m.kind = 'episodic' AND m.invalid_at IS NULL
  AND ($5 OR m.inactive_since IS NULL)
  AND m.conversation_id IN (SELECT conversation_id FROM space_conversations WHERE readable)
