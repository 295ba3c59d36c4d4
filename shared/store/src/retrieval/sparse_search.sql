-- BM25 over a space's entries of one kind ($1 user, $2 space, $3 query text, $4 kind, $5
-- conversation or null, $6 category or null, $7 k1, $8 b, $9 limit, $10 whether inactive
-- entries count): corpus statistics over the whole scope, so a score means the same with or
-- without the conversation or category filter.
WITH query AS (
    SELECT engram_any_word_query($3) AS words,
           ARRAY(SELECT lexeme FROM unnest(engram_search_words($3))) AS terms),
corpus AS MATERIALIZED (
    SELECT count(*)::float8 AS documents, coalesce(avg(search_length), 0)::float8 AS average_length
    FROM memories WHERE user_id = $1 AND space = $2 AND kind = $4 AND invalid_at IS NULL
      AND ($10 OR inactive_since IS NULL)),
matched AS MATERIALIZED (
    SELECT m.id, m.conversation_id, m.category, m.search_length, m.search_document
    FROM memories m, query
    WHERE m.user_id = $1 AND m.space = $2 AND m.kind = $4 AND m.invalid_at IS NULL
      AND ($10 OR m.inactive_since IS NULL) AND m.search_document @@ query.words),
postings AS (
    SELECT matched.id, t.lexeme AS term, cardinality(t.positions)::float8 AS frequency,
           matched.search_length::float8 AS length
    FROM matched CROSS JOIN LATERAL unnest(matched.search_document) AS t, query
    WHERE t.lexeme = ANY(query.terms)),
document_frequency AS (SELECT term, count(*)::float8 AS df FROM postings GROUP BY term)
SELECT p.id, sum(ln(1 + (c.documents - d.df + 0.5) / (d.df + 0.5)) * p.frequency * ($7 + 1)
         / (p.frequency + $7 * (1 - $8 + $8 * p.length / greatest(c.average_length, 1))))::float8 AS score
FROM postings p JOIN document_frequency d USING (term) JOIN matched m ON m.id = p.id CROSS JOIN corpus c
WHERE ($5::uuid IS NULL OR m.conversation_id = $5) AND ($6::text IS NULL OR m.category = $6)
GROUP BY p.id ORDER BY score DESC, p.id LIMIT $9
