-- The turn search reads a space's closed turns from blocks (issue 41): one row per 32 turns of a
-- conversation, holding what the search reads of them (their places, speakers, contents, times,
-- BM25 lengths and words, and their turn vectors at half precision), so a retrieval reads about
-- one row a conversation instead of a row per turn and a row per turn vector, and the service
-- scores the turns. The turns of the open segment (past `segmented_through`) are read from
-- `conversation_turns` as before, built into the same shape by the same function.
--
-- A block is a copy, so it must never hold what the turns no longer hold (a forgotten or redacted
-- line must not come back through it). It is kept equal to its turns by construction: every
-- statement that inserts, updates or deletes turns or turn vectors, and every change of a
-- conversation's `segmented_through`, rebuilds the blocks it touched from the rows as they are,
-- in the same transaction. The rebuild first locks the conversations' rows (the lock an append
-- and a segment close take too), then reads with a fresh snapshot: two transactions rebuilding
-- one block one after the other each see what the other committed, so the last rebuild is
-- always of the latest rows.
--
-- Invariant: block b of a conversation holds exactly its turns with index in [32b, 32b + 31]
-- and at most `segmented_through`, each with its turn vector if it has a non-zero one; a block
-- with no such turn has no row.

CREATE TABLE conversation_turn_blocks (
    user_id          uuid          NOT NULL,
    space            text          NOT NULL,
    conversation_id  uuid          NOT NULL,
    -- turn_index / 32.
    block            integer       NOT NULL CHECK (block >= 0),
    -- The turns, in order, one element each.
    turn_indexes     integer[]     NOT NULL,
    roles            text[]        NOT NULL,
    contents         text[]        NOT NULL,
    spoken_ats       timestamptz[] NOT NULL,
    -- BM25's document lengths (conversation_turns.search_length).
    search_lengths   integer[]     NOT NULL,
    -- A line per turn, in order: its words (search_document's lexemes) each followed by how
    -- often it occurs, separated by spaces ("knee 2 physio 1").
    words            text          NOT NULL,
    -- The turns that have a non-zero turn vector, with the model that made it, and the vectors
    -- in that order: each is `halfvec_send` of the vector scaled to unit length (a 2-byte
    -- dimension count, 2 unused bytes, then a big-endian half float per dimension).
    vector_turns     integer[]     NOT NULL,
    vector_models    text[]        NOT NULL,
    vectors          bytea         NOT NULL,
    PRIMARY KEY (user_id, space, conversation_id, block),
    FOREIGN KEY (user_id, space, conversation_id)
        REFERENCES conversations (user_id, space, conversation_id) ON DELETE CASCADE
);
-- Half floats do not compress: the vectors go out of line without a compression attempt.
ALTER TABLE conversation_turn_blocks ALTER COLUMN vectors SET STORAGE EXTERNAL;

-- A conversation's turns from p_first to p_last in the block shape, one row (none when no turn
-- is there). Read by the rebuild and by the turn search for the open segment's turns.
CREATE FUNCTION engram_turn_block(p_user uuid, p_space text, p_conversation uuid,
                                  p_first integer, p_last integer)
RETURNS TABLE (turn_indexes integer[], roles text[], contents text[], spoken_ats timestamptz[],
               search_lengths integer[], words text, vector_turns integer[],
               vector_models text[], vectors bytea)
LANGUAGE sql STABLE PARALLEL SAFE
AS $$
    SELECT array_agg(t.turn_index ORDER BY t.turn_index),
           array_agg(t.role ORDER BY t.turn_index),
           array_agg(t.content ORDER BY t.turn_index),
           array_agg(t.spoken_at ORDER BY t.turn_index),
           array_agg(t.search_length ORDER BY t.turn_index),
           string_agg(coalesce((SELECT string_agg(w.lexeme || ' ' || cardinality(w.positions), ' ')
                                FROM unnest(t.search_document) AS w), ''),
                      E'\n' ORDER BY t.turn_index),
           coalesce(array_agg(t.turn_index ORDER BY t.turn_index)
                        FILTER (WHERE e.turn_index IS NOT NULL), '{}'),
           coalesce(array_agg(e.model ORDER BY t.turn_index)
                        FILTER (WHERE e.turn_index IS NOT NULL), '{}'),
           coalesce(string_agg(halfvec_send(l2_normalize(e.embedding)::halfvec), ''::bytea
                               ORDER BY t.turn_index) FILTER (WHERE e.turn_index IS NOT NULL),
                    ''::bytea)
    FROM conversation_turns t
    LEFT JOIN conversation_turn_embeddings e
      ON e.user_id = t.user_id AND e.space = t.space AND e.conversation_id = t.conversation_id
     AND e.turn_index = t.turn_index
     -- A zero vector has no direction: it ranks nothing (pgvector's cosine of it is NaN).
     AND vector_norm(e.embedding) > 0
    WHERE t.user_id = p_user AND t.space = p_space AND t.conversation_id = p_conversation
      AND t.turn_index BETWEEN p_first AND p_last
    HAVING count(*) > 0
$$;

-- Rebuilds the given blocks (user, space, conversation, block; repeats allowed) from the turns
-- as they are: deletes the blocks and writes again those that still hold a closed turn. The
-- caller holds the conversations' row locks (the triggers below take them, or the update that
-- fires them did); each statement of a PL/pgSQL function takes a new snapshot, so the rows read
-- here include whatever that lock waited for.
CREATE FUNCTION engram_rebuild_turn_blocks(p_users uuid[], p_spaces text[],
                                           p_conversations uuid[], p_blocks integer[])
RETURNS void LANGUAGE plpgsql
AS $function$
BEGIN
    DELETE FROM conversation_turn_blocks b
     USING unnest(p_users, p_spaces, p_conversations, p_blocks) AS x(u, s, k, n)
     WHERE b.user_id = x.u AND b.space = x.s AND b.conversation_id = x.k AND b.block = x.n;
    INSERT INTO conversation_turn_blocks (user_id, space, conversation_id, block, turn_indexes,
                                          roles, contents, spoken_ats, search_lengths, words,
                                          vector_turns, vector_models, vectors)
    SELECT x.u, x.s, x.k, x.n, t.turn_indexes, t.roles, t.contents, t.spoken_ats,
           t.search_lengths, t.words, t.vector_turns, t.vector_models, t.vectors
      FROM (SELECT DISTINCT u, s, k, n
              FROM unnest(p_users, p_spaces, p_conversations, p_blocks) AS x(u, s, k, n)) x
      JOIN conversations c ON c.user_id = x.u AND c.space = x.s AND c.conversation_id = x.k
     CROSS JOIN LATERAL engram_turn_block(x.u, x.s, x.k, x.n * 32,
                                          least(x.n * 32 + 31, c.segmented_through)) t
     WHERE x.n * 32 <= c.segmented_through;
END;
$function$;

-- Turns or turn vectors changed: rebuild the blocks of the changed rows that are closed. The
-- rows come from the statement's transition table (`changed`). An insert of turns past
-- `segmented_through` (every append, which holds the conversation's lock already) touches no
-- block and takes no lock. Any other change locks the conversations first (in key order, so two
-- rebuilds never wait for each other in a cycle) and only then reads how far they are closed: a
-- turn vector written while its segment closes is either seen by the close's rebuild or finds
-- its turn closed here.
CREATE FUNCTION conversation_turn_blocks_after_change() RETURNS trigger LANGUAGE plpgsql
AS $function$
DECLARE
    users uuid[];
    spaces text[];
    conversations uuid[];
    blocks integer[];
BEGIN
    IF TG_OP = 'INSERT' AND TG_TABLE_NAME = 'conversation_turns'
       AND NOT EXISTS (SELECT 1 FROM changed n
                       JOIN conversations c ON c.user_id = n.user_id AND c.space = n.space
                                           AND c.conversation_id = n.conversation_id
                       WHERE n.turn_index <= c.segmented_through) THEN
        RETURN NULL;
    END IF;
    PERFORM 1
      FROM conversations c
      JOIN (SELECT DISTINCT user_id, space, conversation_id FROM changed) n
        ON c.user_id = n.user_id AND c.space = n.space AND c.conversation_id = n.conversation_id
     ORDER BY c.user_id, c.space, c.conversation_id
       FOR NO KEY UPDATE OF c;
    SELECT array_agg(n.user_id), array_agg(n.space), array_agg(n.conversation_id),
           array_agg(n.turn_index / 32)
      INTO users, spaces, conversations, blocks
      FROM changed n
      JOIN conversations c ON c.user_id = n.user_id AND c.space = n.space
                          AND c.conversation_id = n.conversation_id
     WHERE n.turn_index <= c.segmented_through;
    IF users IS NOT NULL THEN
        PERFORM engram_rebuild_turn_blocks(users, spaces, conversations, blocks);
    END IF;
    RETURN NULL;
END;
$function$;

CREATE TRIGGER conversation_turn_blocks_after_turn_insert AFTER INSERT ON conversation_turns
    REFERENCING NEW TABLE AS changed
    FOR EACH STATEMENT EXECUTE FUNCTION conversation_turn_blocks_after_change();
CREATE TRIGGER conversation_turn_blocks_after_turn_update AFTER UPDATE ON conversation_turns
    REFERENCING NEW TABLE AS changed
    FOR EACH STATEMENT EXECUTE FUNCTION conversation_turn_blocks_after_change();
CREATE TRIGGER conversation_turn_blocks_after_turn_delete AFTER DELETE ON conversation_turns
    REFERENCING OLD TABLE AS changed
    FOR EACH STATEMENT EXECUTE FUNCTION conversation_turn_blocks_after_change();
CREATE TRIGGER conversation_turn_blocks_after_vector_insert
    AFTER INSERT ON conversation_turn_embeddings
    REFERENCING NEW TABLE AS changed
    FOR EACH STATEMENT EXECUTE FUNCTION conversation_turn_blocks_after_change();
CREATE TRIGGER conversation_turn_blocks_after_vector_update
    AFTER UPDATE ON conversation_turn_embeddings
    REFERENCING NEW TABLE AS changed
    FOR EACH STATEMENT EXECUTE FUNCTION conversation_turn_blocks_after_change();
CREATE TRIGGER conversation_turn_blocks_after_vector_delete
    AFTER DELETE ON conversation_turn_embeddings
    REFERENCING OLD TABLE AS changed
    FOR EACH STATEMENT EXECUTE FUNCTION conversation_turn_blocks_after_change();

-- A conversation's closed range moved: rebuild the blocks between the old and the new end
-- (a segment closed adds its turns; a range that shrank drops them). The row is locked by the
-- update itself.
CREATE FUNCTION conversation_turn_blocks_after_segmentation() RETURNS trigger LANGUAGE plpgsql
AS $function$
DECLARE
    low integer := least(OLD.segmented_through, NEW.segmented_through) + 1;
    high integer := greatest(OLD.segmented_through, NEW.segmented_through);
    blocks integer[];
BEGIN
    blocks := ARRAY(SELECT generate_series(low / 32, high / 32));
    PERFORM engram_rebuild_turn_blocks(
        array_fill(NEW.user_id, ARRAY[cardinality(blocks)]),
        array_fill(NEW.space, ARRAY[cardinality(blocks)]),
        array_fill(NEW.conversation_id, ARRAY[cardinality(blocks)]),
        blocks);
    RETURN NULL;
END;
$function$;

CREATE TRIGGER conversation_turn_blocks_after_segmentation
    AFTER UPDATE OF segmented_through ON conversations
    FOR EACH ROW WHEN (OLD.segmented_through IS DISTINCT FROM NEW.segmented_through)
    EXECUTE FUNCTION conversation_turn_blocks_after_segmentation();

-- Blocks of the closed turns already stored.
SELECT engram_rebuild_turn_blocks(array_agg(t.user_id), array_agg(t.space),
                                  array_agg(t.conversation_id), array_agg(t.turn_index / 32))
FROM (SELECT DISTINCT t.user_id, t.space, t.conversation_id, t.turn_index / 32 AS turn_index
      FROM conversation_turns t
      JOIN conversations c ON c.user_id = t.user_id AND c.space = t.space
                          AND c.conversation_id = t.conversation_id
      WHERE t.turn_index <= c.segmented_through) t;
