-- BM25 for Chinese, Japanese and Korean.
--
-- The 'simple' text-search parser splits on spaces and punctuation, so a CJK sentence, written
-- without spaces, became one single "word" that no query could match. Search documents and
-- queries now index every run of CJK characters as its overlapping character bigrams (周末去爬山
-- -> 周末 末去 去爬 爬山), the approach of Lucene's CJK analyzer: no dictionary, and a two-character
-- query word matches wherever it occurs. Other text is unchanged. search_text, what the trigram
-- fallback compares, keeps the original text.

CREATE FUNCTION engram_cjk_bigrams(input text)
RETURNS text LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE AS $$
DECLARE
    piece text[];
    run text;
    output text := '';
BEGIN
    FOR piece IN
        SELECT regexp_matches(input,
            '([\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff]+)|([^\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff]+)',
            'g')
    LOOP
        IF piece[1] IS NULL THEN
            output := output || piece[2];
        ELSE
            run := piece[1];
            IF char_length(run) = 1 THEN
                output := output || ' ' || run || ' ';
            ELSE
                FOR position IN 1 .. char_length(run) - 1 LOOP
                    output := output || ' ' || substr(run, position, 2);
                END LOOP;
                output := output || ' ';
            END IF;
        END IF;
    END LOOP;
    RETURN output;
END $$;

-- The words of a text as BM25 counts them.
CREATE FUNCTION engram_search_words(input text)
RETURNS tsvector LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
RETURN to_tsvector('simple'::regconfig, engram_cjk_bigrams(input));

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
