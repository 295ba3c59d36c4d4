-- Cheaper writes: derived columns kept by one trigger, and a soft cap enforced by index probes.
--
-- Profiles of the write path (pgbench replaying one Remember at the cap, `perf` on Postgres) showed
-- two costs that did not depend on how much work a write does:
--
-- 1. Stored generated columns. Postgres rebuilds their expressions for every INSERT or UPDATE
--    statement (reading the stored expression trees back and re-planning them, including the SQL
--    function bodies of the search columns), and recomputes all of them on every UPDATE, even one
--    that only rewrites `last_scores`. A plpgsql trigger, whose plans are cached per connection,
--    now keeps the same columns, and runs only when a statement sets one of their inputs.
--    The values are the same as before.
--
-- 2. The soft cap read every entry of a space, ranked them all and sorted them on each write at the
--    cap. Cached totals are now kept in index order, so the policy reads the few entries that can
--    be affected: every entry whose cached score is missing or stale (recomputed, as before), the
--    lowest fresh totals of trimmable entries, and the lowest fresh totals of protected ones (for
--    the alert). The cost no longer grows with the size of the space.
--
-- 3. One index whose upkeep outweighed its use: the trigram GIN index took about a sixth of a
--    write's CPU (every write adds about one key per three characters, and merging its pending
--    list into the index happens in the foreground of some write: 200-400 ms outliers), for a
--    fallback that runs only when no word of a query matches. The fallback now compares against
--    the newest entries of the space through the (user, space, created_at) index instead (see
--    `trigram_search` in the store).
--
-- 4. The BM25 index writes straight into its tree. With GIN's default fast update, inserts append
--    to a pending list that some unlucky write later merges into the index in its own foreground
--    (the 100-400 ms maxima of the ingest benchmark); searches also scan that list. Without it,
--    pgbench replaying a write at the cap ran at least as fast (1,208 against 1,129 writes/s).

-- plpgsql instead of SQL-standard bodies: a plpgsql function is compiled once per connection and
-- its query plan cached, where a SQL body is re-read and re-planned by every statement that calls
-- it. Text without CJK characters (most of it) skips the split entirely.
CREATE OR REPLACE FUNCTION engram_cjk_bigrams(input text)
RETURNS text LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE AS $body$
BEGIN
    IF input !~ '[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff]' THEN
        RETURN input;
    END IF;
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
            'g') WITH ORDINALITY AS m(piece, ordinal));
END $body$;

CREATE OR REPLACE FUNCTION engram_token_count(document tsvector)
RETURNS integer LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $body$
BEGIN
    RETURN (SELECT coalesce(sum(cardinality(positions)), 0)::integer FROM unnest(document));
END $body$;

-- The columns keep their values and their indexes; only who computes them changes.
ALTER TABLE memories
    ALTER COLUMN simhash_band0 DROP EXPRESSION,
    ALTER COLUMN simhash_band1 DROP EXPRESSION,
    ALTER COLUMN simhash_band2 DROP EXPRESSION,
    ALTER COLUMN simhash_band3 DROP EXPRESSION,
    ALTER COLUMN search_text DROP EXPRESSION,
    ALTER COLUMN search_document DROP EXPRESSION,
    ALTER COLUMN search_length DROP EXPRESSION;

-- The columns derived from the text and the fingerprint: SimHash bands, search text and words with
-- their length. The trigger fires only when a statement sets one of their inputs, so score
-- rewrites (retrieval, the soft cap) never reach it; the cached-score columns keep their own
-- trigger (memories_cached_scores, migration 2). Writers never set these columns themselves.
CREATE FUNCTION memories_derive_columns() RETURNS trigger LANGUAGE plpgsql AS $body$
BEGIN
    NEW.simhash_band0 := (NEW.simhash & 65535)::integer;
    NEW.simhash_band1 := ((NEW.simhash >> 16) & 65535)::integer;
    NEW.simhash_band2 := ((NEW.simhash >> 32) & 65535)::integer;
    NEW.simhash_band3 := ((NEW.simhash >> 48) & 65535)::integer;
    -- A merge sets tags on every write; the words are recomputed only when they really change.
    IF TG_OP = 'INSERT' OR NEW.kind IS DISTINCT FROM OLD.kind OR NEW.title IS DISTINCT FROM OLD.title
       OR NEW.text IS DISTINCT FROM OLD.text OR NEW.tags IS DISTINCT FROM OLD.tags THEN
        NEW.search_text := engram_search_text(NEW.kind, NEW.title, NEW.text, NEW.tags);
        NEW.search_document := engram_search_words(NEW.search_text);
        NEW.search_length := engram_token_count(NEW.search_document);
    END IF;
    RETURN NEW;
END $body$;

CREATE TRIGGER memories_derived_columns BEFORE INSERT OR UPDATE OF simhash, kind, title, text, tags
    ON memories FOR EACH ROW EXECUTE FUNCTION memories_derive_columns();

-- The capacity policy's three reads, each an index probe.
DROP INDEX memories_scope_retention;
-- Trimmable entries by cached total, lowest first (the order of the policy's ranking).
CREATE INDEX memories_scope_trim_order ON memories (user_id, space, last_total, created_at, id)
    INCLUDE (last_scored_at) WHERE NOT (pinned OR manually_saved);
-- Entries whose cached score is missing or oldest.
CREATE INDEX memories_scope_scored_at ON memories (user_id, space, last_scored_at NULLS FIRST);
-- Protected entries are found through memories_scope_protected.

DROP INDEX memories_search_trigrams;

ALTER INDEX memories_search_document SET (fastupdate = off);
-- What the pending list already holds moves into the index now, not at the next vacuum.
SELECT gin_clean_pending_list('memories_search_document'::regclass);
