-- BM25 for Chinese, Japanese and Korean, without English stop words.
--
-- The 'simple' text-search parser splits on spaces and punctuation, so a CJK sentence, written
-- without spaces, became one single "word" that no query could match. Search documents and
-- queries now index every run of CJK characters as its overlapping character bigrams (周末去爬山
-- -> 周末 末去 去爬 爬山), the approach of Lucene's CJK analyzer: no dictionary, and a two-character
-- query word matches wherever it occurs. Other text is unchanged. search_text, what the trigram
-- fallback compares, keeps the original text.

-- Set-based (one pass over the characters, pairs by lag()): a plpgsql loop appending to a
-- string was quadratic, 40x slower on an 8,000-character text, and this runs on every write.
CREATE FUNCTION engram_cjk_bigrams(input text)
RETURNS text LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
RETURN (
    SELECT coalesce(string_agg(
        CASE
            WHEN m.piece[1] IS NULL THEN m.piece[2]
            WHEN char_length(m.piece[1]) = 1 THEN ' ' || m.piece[1] || ' '
            ELSE ' ' || (
                SELECT string_agg(pairs.previous || pairs.current, ' ' ORDER BY pairs.position)
                FROM (SELECT c.current, c.position,
                             lag(c.current) OVER (ORDER BY c.position) AS previous
                      FROM unnest(string_to_array(m.piece[1], NULL)) WITH ORDINALITY AS c(current, position)) pairs
                WHERE pairs.previous IS NOT NULL) || ' '
        END, '' ORDER BY m.ordinal), '')
    FROM regexp_matches(input,
        '([\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff]+)|([^\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff]+)',
        'g') WITH ORDINALITY AS m(piece, ordinal)
);


-- The words of a text as BM25 counts them: the 'english' configuration drops stop words ("the",
-- "what", "do" would otherwise match nearly every entry) and stems (Snowball: "meetings" finds
-- "meeting"); `make eval` measured it against 'simple' (docs/eval/retrieval.md). CJK bigrams
-- pass through unchanged.
CREATE FUNCTION engram_search_words(input text)
RETURNS tsvector LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
RETURN to_tsvector('english'::regconfig, engram_cjk_bigrams(input));

CREATE OR REPLACE FUNCTION engram_any_word_query(query text)
RETURNS tsquery LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN (SELECT engram_tsquery_any(plainto_tsquery('simple', lexeme))
        FROM unnest(engram_search_words(query)));

DROP INDEX memories_search_document;
DROP INDEX memories_scope_kind_length;
ALTER TABLE memories DROP COLUMN search_document, DROP COLUMN search_length;
ALTER TABLE memories
    ADD COLUMN search_document tsvector
        GENERATED ALWAYS AS (engram_search_words(engram_search_text(kind, title, text, tags))) STORED,
    ADD COLUMN search_length integer
        GENERATED ALWAYS AS (engram_token_count(engram_search_words(engram_search_text(kind, title, text, tags)))) STORED;
CREATE INDEX memories_search_document ON memories USING gin (user_id, search_document);
CREATE INDEX memories_scope_kind_length ON memories (user_id, space, kind)
    INCLUDE (search_length) WHERE invalid_at IS NULL;

-- Searches that start within one conversation (RetrieveMemory with a conversation_id) find its
-- entries without reading the rest of the space.
CREATE INDEX memories_scope_conversation ON memories (user_id, space, conversation_id)
    WHERE conversation_id IS NOT NULL;
