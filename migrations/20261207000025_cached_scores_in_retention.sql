-- Retrieval's cached scores move to the narrow table (issue 41): a retrieval rewrites the scores
-- of every entry it returns whose cached ones are missing, stale or lower, about 25 a retrieval
-- when a space is first asked in an hour. Each rewrite was an update of the wide memories row (a
-- new version of the whole row, about 60 µs an entry) and, through a row trigger, of its
-- memory_retention row: 2,500 entries took 200-330 ms, where the narrow row alone takes about 45.
--
-- memory_retention.last_scores is now the cache every reader reads (the ranking, the API's
-- last_scores, the soft cap). Retrieval writes it, and the total and time derived from it, in the
-- narrow row only. memories.last_scores stays what the entry's writers compute (ingest, imports,
-- merges, the soft cap's recomputation): the triggers copy it into memory_retention whenever a
-- writer sets it, so a writer's scores replace a retrieval's as they did.

-- No writer may slip between the backfill below and the triggers that take over from it.
LOCK TABLE memories IN SHARE ROW EXCLUSIVE MODE;

ALTER TABLE memory_retention ADD COLUMN last_scores jsonb NULL;

UPDATE memory_retention r SET last_scores = m.last_scores
FROM memories m
WHERE m.user_id = r.user_id AND m.id = r.memory_id AND m.last_scores IS NOT NULL;

CREATE OR REPLACE FUNCTION memories_retention_insert() RETURNS trigger LANGUAGE plpgsql AS $body$
BEGIN
    INSERT INTO memory_retention (memory_id, user_id, space, created_at, importance, protected,
                                  last_scores, last_total, last_scored_at)
    SELECT id, user_id, space, created_at, importance, pinned OR manually_saved,
           last_scores, engram_cached_total(last_scores), engram_cached_at(last_scores)
    FROM new_rows
    ON CONFLICT (user_id, memory_id) DO UPDATE SET
        space = EXCLUDED.space, created_at = EXCLUDED.created_at,
        importance = EXCLUDED.importance, protected = EXCLUDED.protected,
        last_scores = EXCLUDED.last_scores, last_total = EXCLUDED.last_total,
        last_scored_at = EXCLUDED.last_scored_at;
    RETURN NULL;
END $body$;

-- An update that sets memories.last_scores to what it held (an importance change, a pin) leaves
-- the cache alone: a retrieval may have written newer scores there since.
CREATE OR REPLACE FUNCTION memories_retention_update() RETURNS trigger LANGUAGE plpgsql AS $body$
DECLARE
    scores_written boolean := NEW.last_scores IS DISTINCT FROM OLD.last_scores;
BEGIN
    UPDATE memory_retention SET
        created_at = NEW.created_at,
        importance = NEW.importance,
        protected = NEW.pinned OR NEW.manually_saved,
        last_scores = CASE WHEN scores_written THEN NEW.last_scores ELSE last_scores END,
        last_total = CASE WHEN scores_written THEN engram_cached_total(NEW.last_scores) ELSE last_total END,
        last_scored_at = CASE WHEN scores_written THEN engram_cached_at(NEW.last_scores) ELSE last_scored_at END
    WHERE user_id = NEW.user_id AND memory_id = NEW.id;
    RETURN NULL;
END $body$;
