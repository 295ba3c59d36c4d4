-- BM25 over a space's entries of each kind asked for ($1 user, $2 space, $3 query text; $4
-- kinds, $6 the category each kind's entries must have, null for any; $5 conversation or null;
-- $7 k1, $8 b, $9 hits per kind, $10 whether inactive entries count). Each kind is ranked on its
-- own, with its own corpus statistics over the whole scope, so a score means the same with or
-- without the conversation or category filter, and whichever kinds are searched together. One
-- statement for every kind: the words are looked up once.
--
-- Each posting carries its entry's conversation and category, so the scores never join the
-- matches back: the generic plan joined them in a nested loop, quadratic in the entries that
-- match (7.3 million comparisons, 650 ms, for a common word in a space of 16,000; issue 41).
--
-- The space's entries are read once, in one pass over the scope (their lengths for N and the
-- average length, and the words of those that match): the corpus statistics need that pass
-- anyway, and finding the matches again through the GIN index decoded a common word's postings
-- across every user's entries, so it cost more the larger the whole store grew (same rows over
-- 600 executions in the benchmark's spaces; mean 0.87-1.08 ms became 0.61-0.79 ms; issue 41).
WITH query AS (
    SELECT engram_any_word_query($3) AS words,
           ARRAY(SELECT lexeme FROM unnest(engram_search_words($3))) AS terms),
wanted AS (
    SELECT * FROM unnest($4::text[], $6::text[]) AS w(kind, category)),
space_entries AS MATERIALIZED (
    SELECT m.id, m.kind, m.conversation_id, m.category, m.search_length,
           CASE WHEN m.search_document @@ query.words THEN m.search_document END AS matched_document
    FROM memories m, query
    WHERE m.user_id = $1 AND m.space = $2 AND m.kind = ANY($4) AND m.invalid_at IS NULL
      AND ($10 OR m.inactive_since IS NULL)),
corpus AS (
    SELECT kind, count(*)::float8 AS documents, coalesce(avg(search_length), 0)::float8 AS average_length
    FROM space_entries GROUP BY kind),
postings AS (
    SELECT e.id, e.kind, e.conversation_id, e.category, t.lexeme AS term,
           cardinality(t.positions)::float8 AS frequency, e.search_length::float8 AS length
    FROM space_entries e CROSS JOIN LATERAL unnest(e.matched_document) AS t, query
    WHERE e.matched_document IS NOT NULL AND t.lexeme = ANY(query.terms)),
document_frequency AS (SELECT kind, term, count(*)::float8 AS df FROM postings GROUP BY kind, term),
scored AS (
    SELECT p.id, p.kind,
           sum(ln(1 + (c.documents - d.df + 0.5) / (d.df + 0.5)) * p.frequency * ($7 + 1)
               / (p.frequency + $7 * (1 - $8 + $8 * p.length / greatest(c.average_length, 1))))::float8
               AS score
    FROM postings p
    JOIN document_frequency d USING (kind, term)
    JOIN corpus c ON c.kind = p.kind
    JOIN wanted w ON w.kind = p.kind
    WHERE ($5::uuid IS NULL OR p.conversation_id = $5) AND (w.category IS NULL OR p.category = w.category)
    GROUP BY p.id, p.kind),
ranked AS (
    SELECT id, kind, score, row_number() OVER (PARTITION BY kind ORDER BY score DESC, id) AS rank
    FROM scored)
SELECT id, kind, score FROM ranked WHERE rank <= $9 ORDER BY kind, rank
