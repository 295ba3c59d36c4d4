-- Okapi BM25 of the space's turns holding any word of the query ($3), best first.
-- $1 user, $2 space, $4 k1, $5 b, $6 limit.
WITH query AS (
    SELECT engram_any_word_query($3) AS words,
           ARRAY(SELECT lexeme FROM unnest(engram_search_words($3))) AS terms),
corpus AS MATERIALIZED (
    SELECT count(*)::float8 AS documents, coalesce(avg(search_length), 0)::float8 AS average_length
    FROM conversation_turns WHERE user_id = $1 AND space = $2),
matched AS MATERIALIZED (
    SELECT t.conversation_id, t.turn_index, t.search_length, t.search_document
    FROM conversation_turns t, query
    WHERE t.user_id = $1 AND t.space = $2 AND t.search_document @@ query.words),
postings AS (
    SELECT m.conversation_id, m.turn_index, w.lexeme AS term,
           cardinality(w.positions)::float8 AS frequency, m.search_length::float8 AS length
    FROM matched m CROSS JOIN LATERAL unnest(m.search_document) AS w, query
    WHERE w.lexeme = ANY(query.terms)),
document_frequency AS (SELECT term, count(*)::float8 AS df FROM postings GROUP BY term)
SELECT p.conversation_id, p.turn_index,
       sum(ln(1 + (c.documents - d.df + 0.5) / (d.df + 0.5)) * p.frequency * ($4 + 1)
           / (p.frequency + $4 * (1 - $5 + $5 * p.length / greatest(c.average_length, 1))))::float8 AS score
FROM postings p JOIN document_frequency d USING (term) CROSS JOIN corpus c
GROUP BY p.conversation_id, p.turn_index
ORDER BY score DESC, p.conversation_id, p.turn_index
LIMIT $6
