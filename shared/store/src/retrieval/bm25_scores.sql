-- Okapi BM25 over `space_entries`, the one formula of both statements that score the entries'
-- words (the word leg's own, `sparse_search.sql`, and the exact search's in retrieval.rs).
-- It needs the CTEs `query` (words: the tsquery of any query word; terms: their lexemes),
-- `kind_filters` (kind, category: each kind asked, with the category its hits must have) and
-- `space_entries` (id, kind, conversation_id, category, search_length; searched: in the
-- corpus; matched_document: a searched entry's search_document when it holds a query word),
-- and the parameters $5 (conversation or null), $7 k1, $8 b and $9 (hits per kind).
-- It defines `words_found` (id, kind, score): each kind's best $9, ties by id.
-- Each kind is ranked on its own, with its own corpus statistics over the whole scope, so a
-- score means the same with or without the conversation or category filter, and whichever
-- kinds are searched together. Each posting carries its entry's conversation and category, so
-- the scores never join the matches back: the generic plan joined them in a nested loop,
-- quadratic in the entries that match (7.3 million comparisons, 650 ms, for a common word in a
-- space of 16,000; issue 41).
corpus AS (
    SELECT kind, count(*)::float8 AS documents, coalesce(avg(search_length), 0)::float8 AS average_length
    FROM space_entries WHERE searched GROUP BY kind),
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
    JOIN kind_filters f ON f.kind = p.kind
    WHERE ($5::uuid IS NULL OR p.conversation_id = $5) AND (f.category IS NULL OR p.category = f.category)
    GROUP BY p.id, p.kind),
words_found AS MATERIALIZED (
    SELECT id, kind, score FROM (
        SELECT id, kind, score, row_number() OVER (PARTITION BY kind ORDER BY score DESC, id) AS rank
        FROM scored) AS ranked
    WHERE rank <= $9)
