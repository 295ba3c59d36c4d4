-- BM25 over a space's entries of each kind asked for, in a statement of its own ($1 user, $2
-- space, $3 query text; $4 kinds, $6 the category each kind's entries must have, null for any;
-- $5 conversation or null; $7 k1, $8 b, $9 hits per kind, $10 whether inactive entries count).
-- One statement for every kind: the words are looked up once. The scoring is
-- `bm25_scores.sql`, which follows this part; the statement ends with
-- `SELECT … FROM words_found` (see `sparse_search_kinds`).
--
-- The space's entries are read once, in one pass over the scope (their lengths for N and the
-- average length, and the words of those that match): the corpus statistics need that pass
-- anyway, and finding the matches again through the GIN index decoded a common word's postings
-- across every user's entries, so it cost more the larger the whole store grew (same rows over
-- 600 executions in the benchmark's spaces; mean 0.87-1.08 ms became 0.61-0.79 ms; issue 41).
WITH query AS (
    SELECT engram_any_word_query($3) AS words,
           ARRAY(SELECT lexeme FROM unnest(engram_search_words($3))) AS terms),
kind_filters AS (
    SELECT * FROM unnest($4::text[], $6::text[]) AS f(kind, category)),
space_entries AS MATERIALIZED (
    SELECT m.id, m.kind, m.conversation_id, m.category, m.search_length, true AS searched,
           CASE WHEN m.search_document @@ query.words THEN m.search_document END AS matched_document
    FROM memories m, query
    WHERE m.user_id = $1 AND m.space = $2 AND m.kind = ANY($4) AND m.invalid_at IS NULL
      AND ($10 OR m.inactive_since IS NULL)),
