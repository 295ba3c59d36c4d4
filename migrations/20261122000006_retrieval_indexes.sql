-- What retrieval searches.
--
-- Sparse leg: Okapi BM25 is computed in SQL from a tsvector of each entry ('simple'
-- configuration: no stemming or stop words, so every language's words stay as written). The
-- document is the fact plus its tags for semantic memories and the title plus the summary for
-- episodes; its length in tokens is kept beside it for BM25's length normalisation.
--
-- Dense leg: embeddings move to their own table. Retrieval rewrites `last_scores` of the entries
-- it returns on every request; with the vector in the memories row, each such update would copy
-- 1.5 KB and re-insert the vector into the HNSW graph. Apart, updates of memories never touch the
-- vector index, and the exact scan of a small space reads only narrow rows.

CREATE EXTENSION IF NOT EXISTS btree_gin;

-- The searchable text of an entry (also what the trigram fallback compares).
CREATE FUNCTION engram_search_text(kind text, title text, body text, tags text[])
RETURNS text LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN CASE WHEN kind = 'episodic' THEN coalesce(title, '') || ' ' || body
            ELSE body || ' ' || coalesce(array_to_string(tags, ' '), '') END;

-- Number of tokens of a tsvector (the sum of every lexeme's positions).
CREATE FUNCTION engram_token_count(document tsvector)
RETURNS integer LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN (SELECT coalesce(sum(cardinality(positions)), 0)::integer FROM unnest(document));

-- OR of tsqueries, so that a query matches entries holding any of its words (BM25 then ranks).
CREATE AGGREGATE engram_tsquery_any(tsquery) (SFUNC = tsquery_or, STYPE = tsquery);

-- Every distinct word of a query as one OR-query; NULL when the query has no words.
CREATE FUNCTION engram_any_word_query(query text)
RETURNS tsquery LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN (SELECT engram_tsquery_any(plainto_tsquery('simple', lexeme))
        FROM unnest(to_tsvector('simple', query)));

ALTER TABLE memories
    ADD COLUMN search_text text
        GENERATED ALWAYS AS (engram_search_text(kind, title, text, tags)) STORED,
    ADD COLUMN search_document tsvector
        GENERATED ALWAYS AS (to_tsvector('simple'::regconfig, engram_search_text(kind, title, text, tags))) STORED,
    ADD COLUMN search_length integer
        GENERATED ALWAYS AS (engram_token_count(to_tsvector('simple'::regconfig, engram_search_text(kind, title, text, tags)))) STORED;

-- Word matches within one user's entries (btree_gin puts the user id into the same index).
CREATE INDEX memories_search_document ON memories USING gin (user_id, search_document);
-- Trigram similarity, the fallback when no word matches (CJK text has no spaces to split on).
CREATE INDEX memories_search_trigrams ON memories USING gin (user_id, search_text gin_trgm_ops);
-- BM25's corpus statistics (entry count and average length per space and kind) from the index.
CREATE INDEX memories_scope_kind_length ON memories (user_id, space, kind)
    INCLUDE (search_length) WHERE invalid_at IS NULL;

CREATE TABLE memory_embeddings (
    memory_id  uuid        PRIMARY KEY REFERENCES memories (id) ON DELETE CASCADE,
    user_id    uuid        NOT NULL,
    space      text        NOT NULL,
    kind       text        NOT NULL CHECK (kind IN ('semantic', 'episodic')),
    embedding  vector(384) NOT NULL
);

INSERT INTO memory_embeddings (memory_id, user_id, space, kind, embedding)
SELECT id, user_id, space, kind, embedding FROM memories WHERE embedding IS NOT NULL;

ALTER TABLE memories DROP COLUMN embedding;

-- Exact nearest neighbours of a small space: read its vectors through this index and sort.
CREATE INDEX memory_embeddings_scope ON memory_embeddings (user_id, space, kind);
-- Approximate nearest neighbours for large spaces (with pgvector's iterative scans, so the
-- space filter does not starve the result).
CREATE INDEX memory_embeddings_hnsw ON memory_embeddings USING hnsw (embedding vector_cosine_ops);

-- Imports are user actions too.
ALTER TABLE audit_events DROP CONSTRAINT audit_events_action_check;
ALTER TABLE audit_events ADD CONSTRAINT audit_events_action_check CHECK (action IN ('create', 'merge',
    'pin', 'unpin', 'forget', 'settings_change', 'incognito_start', 'incognito_end', 'trim', 'import'));
