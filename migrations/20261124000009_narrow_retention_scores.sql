-- The soft cap's view of each entry moves to a narrow table of its own, so that rewriting an
-- entry's cached scores no longer rewrites the wide, heavily indexed memories row.
--
-- Retrieval caches the scores of every entry it returns (last_scores). While the cached total and
-- its time were indexed columns of memories (for the soft cap), each such rewrite was a non-HOT
-- update: a new version of the whole row and a new entry in every index of memories, the BM25 GIN
-- index's words among them (about 0.1 ms per entry for short facts, far more for long episodes;
-- a retrieval returns ~25 entries). Now memories keeps only last_scores (not indexed), and
-- `memory_retention` keeps what the soft cap ranks by, indexed. A score rewrite becomes a HOT
-- update of memories (no index touched; free room on the page is kept for it, see fillfactor) and
-- an update of one narrow row.
--
-- Writers still set only memories.last_scores (and importance, pinned, manually_saved); triggers
-- keep memory_retention in step within the same statement, whoever writes: ingest, import,
-- retrieval, the soft cap itself.

-- No writer may slip between the backfill below and the triggers that take over from it.
LOCK TABLE memories IN SHARE ROW EXCLUSIVE MODE;

-- No foreign key: it would add a row lock and a lookup to every insert and a per-row cascade to
-- every delete of the write path; the triggers below keep the two tables in step instead
-- (TRUNCATE included), and an insert heals a leftover row of the same id rather than failing.
CREATE TABLE memory_retention (
    memory_id       uuid        PRIMARY KEY,
    user_id         uuid        NOT NULL,
    space           text        NOT NULL,
    created_at      timestamptz NOT NULL,
    importance      double precision NOT NULL,
    -- Pinned or manually saved: never trimmed.
    protected       boolean     NOT NULL,
    -- From last_scores: NULL when it is missing or malformed (the soft cap recomputes it).
    last_total      double precision NULL,
    last_scored_at  timestamptz NULL
) WITH (fillfactor = 80);

-- The soft cap's three reads, each an index probe: trimmable entries by cached total (lowest
-- first, the order of the policy's ranking), protected ones in the same order (for the alert), and
-- entries whose cached score is missing or oldest.
CREATE INDEX memory_retention_trim_order ON memory_retention (user_id, space, last_total, created_at, memory_id)
    INCLUDE (last_scored_at) WHERE NOT protected;
CREATE INDEX memory_retention_protected_order ON memory_retention (user_id, space, last_total, created_at, memory_id)
    INCLUDE (last_scored_at) WHERE protected;
CREATE INDEX memory_retention_scored_at ON memory_retention (user_id, space, last_scored_at NULLS FIRST);

-- The cached total and its time, from last_scores (NULL when missing or malformed).
CREATE FUNCTION engram_cached_total(scores jsonb) RETURNS double precision
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $body$
    SELECT CASE WHEN jsonb_typeof(scores -> 'total') = 'number'
                     AND jsonb_typeof(scores -> 'computed_at') = 'string'
                THEN (scores ->> 'total')::double precision END
$body$;

CREATE FUNCTION engram_cached_at(scores jsonb) RETURNS timestamptz
LANGUAGE sql STABLE PARALLEL SAFE AS $body$
    SELECT CASE WHEN jsonb_typeof(scores -> 'total') = 'number'
                     AND jsonb_typeof(scores -> 'computed_at') = 'string'
                THEN (scores ->> 'computed_at')::timestamptz END
$body$;

INSERT INTO memory_retention (memory_id, user_id, space, created_at, importance, protected, last_total, last_scored_at)
SELECT id, user_id, space, created_at, importance, pinned OR manually_saved,
       engram_cached_total(last_scores), engram_cached_at(last_scores)
FROM memories;

-- New and deleted entries: one statement per writing statement (a group commit's batch, an import
-- batch, a trim), not one per row.
CREATE FUNCTION memories_retention_insert() RETURNS trigger LANGUAGE plpgsql AS $body$
BEGIN
    INSERT INTO memory_retention (memory_id, user_id, space, created_at, importance, protected, last_total, last_scored_at)
    SELECT id, user_id, space, created_at, importance, pinned OR manually_saved,
           engram_cached_total(last_scores), engram_cached_at(last_scores)
    FROM new_rows
    ON CONFLICT (memory_id) DO UPDATE SET
        user_id = EXCLUDED.user_id, space = EXCLUDED.space, created_at = EXCLUDED.created_at,
        importance = EXCLUDED.importance, protected = EXCLUDED.protected,
        last_total = EXCLUDED.last_total, last_scored_at = EXCLUDED.last_scored_at;
    RETURN NULL;
END $body$;

CREATE FUNCTION memories_retention_delete() RETURNS trigger LANGUAGE plpgsql AS $body$
BEGIN
    -- An array of ids, so that the cached plan probes the primary key whatever it guessed about
    -- the number of deleted rows.
    DELETE FROM memory_retention WHERE memory_id = ANY (ARRAY(SELECT id FROM old_rows));
    RETURN NULL;
END $body$;

CREATE FUNCTION memories_retention_truncate() RETURNS trigger LANGUAGE plpgsql AS $body$
BEGIN
    TRUNCATE memory_retention;
    RETURN NULL;
END $body$;

CREATE TRIGGER memories_retention_after_insert AFTER INSERT ON memories
    REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION memories_retention_insert();
CREATE TRIGGER memories_retention_after_delete AFTER DELETE ON memories
    REFERENCING OLD TABLE AS old_rows FOR EACH STATEMENT EXECUTE FUNCTION memories_retention_delete();
CREATE TRIGGER memories_retention_after_truncate AFTER TRUNCATE ON memories
    FOR EACH STATEMENT EXECUTE FUNCTION memories_retention_truncate();

-- Updates of what the soft cap ranks by (created_at never changes once written, but an
-- operator's correction must not leave the two tables apart). Row-level, so that the many updates that change none of
-- these columns (embeddings, FSRS reviews, ...) never reach it.
CREATE FUNCTION memories_retention_update() RETURNS trigger LANGUAGE plpgsql AS $body$
BEGIN
    UPDATE memory_retention SET
        created_at = NEW.created_at,
        importance = NEW.importance,
        protected = NEW.pinned OR NEW.manually_saved,
        last_total = engram_cached_total(NEW.last_scores),
        last_scored_at = engram_cached_at(NEW.last_scores)
    WHERE memory_id = NEW.id;
    RETURN NULL;
END $body$;

CREATE TRIGGER memories_retention_after_update AFTER UPDATE OF last_scores, importance, pinned, manually_saved, created_at
    ON memories FOR EACH ROW EXECUTE FUNCTION memories_retention_update();

-- What memories no longer needs to carry.
DROP TRIGGER memories_cached_scores ON memories;
DROP FUNCTION memories_derive_cached_scores();
DROP INDEX memories_scope_trim_order;
DROP INDEX memories_scope_scored_at;
DROP INDEX memories_scope_protected;
ALTER TABLE memories DROP COLUMN last_total, DROP COLUMN last_scored_at;

-- Room on each page for the new version of a row whose scores are rewritten, so that the rewrite
-- stays on the page (a HOT update) instead of adding an entry to every index. Applies to pages
-- written from now on.
ALTER TABLE memories SET (fillfactor = 85);
