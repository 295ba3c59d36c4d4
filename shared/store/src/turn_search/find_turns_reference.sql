-- The stored turns that answer a query, in one round trip (retrieval waits for nothing else
-- between the legs and the lines):
--   word_hits:   the space's turns holding any word of the query ($3), by Okapi BM25 (k1 $4,
--                b $5; N, df and the average length are the space's turns'), the best $6;
--   vector_hits: when a word matched, the $11 turns whose stored vectors (model $7) are nearest
--                the query's turn vector $8 (an exact scan of the space's turn vectors; none
--                without $8: lines are found by their words, the vectors only add turns beside);
--   then every turn either leg found with up to $9 turns either side, each once, with its
--   conversation's segmented_through and its BM25 score and cosine where a leg found it; and,
--   in rows of their own (turn_index NULL), the episodes of those conversations with their time
--   spans. Which episode holds a turn, and which turns may be read, the caller works out from
--   those rows (`turn_search::hold_turns`): joined here, each turn was compared with every
--   episode found, in a nested loop the generic plan chose because it expects one episode, and
--   that join and its sort were a quarter of the statement (issue 41).
-- $1 user, $2 space, $10 whether inactive episodes count, $11 how many turns the vector leg brings.
--
-- The space's turns are read once, in one pass over the primary key (their words' lengths for N
-- and the average length, the words of those that match, and what a line shows): the GIN index
-- over every user's turns would decode a common word's postings across the whole corpus, while
-- this pass costs what the space holds, which the average length needs anyway (issue 41). The
-- lines shown come out of that pass too: fetching each again by its row cost a buffer lookup a
-- line, more than keeping a few hundred bytes of each turn (a long turn's content stays a TOAST
-- pointer until it is shown).
--
-- Only what the assistant may read (this statement reads the conversations that may be read and
-- their episodes; the caller keeps the turns by them): a turn of a segment still open (past the
-- conversation's segmented_through), or one an episode holds. A closed segment's turn without an
-- episode is left out: its episode was forgotten, suppressed by a tombstone, trimmed or found
-- inactive (or it held greetings alone), and its lines must not come back through the turns.
-- Nothing of a conversation that is incognito now is read either.
WITH query AS (
    SELECT engram_any_word_query($3) AS words,
           ARRAY(SELECT lexeme FROM unnest(engram_search_words($3))) AS terms),
-- Each turn of the space once: what a line shows, its length, and its words where any matches the
-- query.
space_turns AS MATERIALIZED (
    SELECT t.conversation_id, t.turn_index, t.role, t.content, t.spoken_at, t.search_length,
           CASE WHEN t.search_document @@ query.words THEN t.search_document END AS matched_document
    FROM conversation_turns t, query
    WHERE t.user_id = $1 AND t.space = $2),
corpus AS MATERIALIZED (
    SELECT count(*)::float8 AS documents, coalesce(avg(search_length), 0)::float8 AS average_length
    FROM space_turns),
postings AS (
    SELECT m.conversation_id, m.turn_index, w.lexeme AS term,
           cardinality(w.positions)::float8 AS frequency, m.search_length::float8 AS length
    FROM space_turns m CROSS JOIN LATERAL unnest(m.matched_document) AS w, query
    WHERE m.matched_document IS NOT NULL AND w.lexeme = ANY(query.terms)),
document_frequency AS (SELECT term, count(*)::float8 AS df FROM postings GROUP BY term),
word_hits AS MATERIALIZED (
    SELECT p.conversation_id, p.turn_index,
           sum(ln(1 + (c.documents - d.df + 0.5) / (d.df + 0.5)) * p.frequency * ($4 + 1)
               / (p.frequency + $4 * (1 - $5 + $5 * p.length / greatest(c.average_length, 1))))::float8
               AS score
    FROM postings p JOIN document_frequency d USING (term) CROSS JOIN corpus c
    GROUP BY p.conversation_id, p.turn_index
    ORDER BY score DESC, p.conversation_id, p.turn_index
    LIMIT $6),
vector_hits AS MATERIALIZED (
    SELECT e.conversation_id, e.turn_index, (1 - (e.embedding <=> $8::vector))::float8 AS score
    FROM conversation_turn_embeddings e
    WHERE $8::vector IS NOT NULL AND EXISTS (SELECT 1 FROM word_hits)
      AND e.user_id = $1 AND e.space = $2 AND e.model = $7
    ORDER BY e.embedding <=> $8::vector, e.conversation_id, e.turn_index
    LIMIT $11),
found AS (
    SELECT conversation_id, turn_index, max(word_score) AS word_score,
           max(vector_score) AS vector_score
    FROM (SELECT conversation_id, turn_index, score AS word_score, NULL::float8 AS vector_score
          FROM word_hits
          UNION ALL
          -- A NaN cosine (a turn whose vector is zero: "!!!") ranks nothing, nor brings its
          -- neighbours.
          SELECT conversation_id, turn_index, NULL::float8, score FROM vector_hits
          WHERE score <> 'NaN'::float8) AS either
    GROUP BY conversation_id, turn_index),
-- The conversations of the turns found that may be read (not incognito now), each read once,
-- and the space's default read once (joined, it was looked up again for every conversation).
readable AS MATERIALIZED (
    SELECT c.conversation_id, c.segmented_through
    FROM conversations c
    WHERE c.user_id = $1 AND c.space = $2
      AND c.conversation_id IN (SELECT DISTINCT conversation_id FROM found)
      AND NOT COALESCE(c.incognito,
                       (SELECT s.incognito_default FROM spaces s
                        WHERE s.user_id = $1 AND s.space = $2),
                       false)),
-- Each turn found and its neighbours, once each, with the scores of the turn itself where a leg
-- found it (a neighbour no leg found has none). The offsets are unnested from an array: a
-- generate_series over parameters is costed at a thousand rows, and that estimate kept the
-- planner from settling on one plan for the statement, so it planned every call anew.
wanted AS (
    SELECT f.conversation_id, f.turn_index + offsets.step AS turn_index,
           max(f.word_score) FILTER (WHERE offsets.step = 0) AS word_score,
           max(f.vector_score) FILTER (WHERE offsets.step = 0) AS vector_score
    FROM found f CROSS JOIN unnest(ARRAY(SELECT generate_series(-$9, $9))) AS offsets(step)
    GROUP BY f.conversation_id, f.turn_index + offsets.step),
-- Those turns as the first pass read them, for the conversations that may be read.
around AS MATERIALIZED (
    SELECT w.conversation_id, w.turn_index, s.role, s.content, s.spoken_at, r.segmented_through,
           w.word_score, w.vector_score
    FROM wanted w
    JOIN readable r USING (conversation_id)
    JOIN space_turns s USING (conversation_id, turn_index)),
-- The episodes of those conversations, read once (not once per turn).
episodes AS MATERIALIZED (
    SELECT m.id, m.conversation_id, m.start_at, m.end_at, m.created_at
    FROM memories m
    WHERE m.user_id = $1 AND m.space = $2
      AND m.conversation_id IN (SELECT conversation_id FROM readable)
      AND m.kind = 'episodic' AND m.invalid_at IS NULL
      AND ($10 OR m.inactive_since IS NULL))
SELECT a.conversation_id, a.turn_index, a.role, a.content, a.spoken_at, a.segmented_through,
       a.word_score, a.vector_score,
       NULL::uuid AS episode_id, NULL::timestamptz AS start_at, NULL::timestamptz AS end_at,
       NULL::timestamptz AS created_at
FROM around a
UNION ALL
SELECT e.conversation_id, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
       e.id, e.start_at, e.end_at, e.created_at
FROM episodes e
