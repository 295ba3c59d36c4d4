-- Scale-out (docs/architecture.md, "Scale-out past one Postgres"): on a distributed Postgres every
-- tenant table is distributed by user_id, and a primary key or unique index can only be enforced
-- there if it includes user_id. These seven keys were made before that rule. The ids in them are
-- random UUIDs or sequence numbers, so adding user_id in front changes no row's uniqueness; it lets
-- statements that name the user (all of them do) find a row through the key.
--
-- Cost on an existing database: each key's index is rebuilt while the table is locked against
-- writes (reads go on), seconds per million rows; and code of earlier releases names the old
-- keys in ON CONFLICT, so ingest and review of those releases are stopped first (k8s/README.md,
-- "Upgrades": the one upgrade that stops writers).

-- memory_embeddings points at memories by (user_id, memory_id) from now on: the old reference is
-- dropped before the key it depends on.
ALTER TABLE memory_embeddings DROP CONSTRAINT memory_embeddings_memory_id_fkey;

ALTER TABLE memories DROP CONSTRAINT memories_pkey, ADD PRIMARY KEY (user_id, id);

ALTER TABLE memory_embeddings
    DROP CONSTRAINT memory_embeddings_pkey,
    ADD PRIMARY KEY (user_id, memory_id),
    ADD CONSTRAINT memory_embeddings_memory_fkey FOREIGN KEY (user_id, memory_id)
        REFERENCES memories (user_id, id) ON DELETE CASCADE;

ALTER TABLE memory_retention DROP CONSTRAINT memory_retention_pkey, ADD PRIMARY KEY (user_id, memory_id);

ALTER TABLE applied_reviews
    DROP CONSTRAINT applied_reviews_pkey, ADD PRIMARY KEY (user_id, segment_id, memory_id);

ALTER TABLE audit_events DROP CONSTRAINT audit_events_pkey, ADD PRIMARY KEY (user_id, id);
ALTER TABLE tombstones DROP CONSTRAINT tombstones_pkey, ADD PRIMARY KEY (user_id, id);
ALTER TABLE retrieval_metrics DROP CONSTRAINT retrieval_metrics_pkey, ADD PRIMARY KEY (user_id, id);

-- The triggers that keep memory_retention beside memories find its rows by the new key.
CREATE OR REPLACE FUNCTION memories_retention_insert() RETURNS trigger LANGUAGE plpgsql AS $body$
BEGIN
    INSERT INTO memory_retention (memory_id, user_id, space, created_at, importance, protected, last_total, last_scored_at)
    SELECT id, user_id, space, created_at, importance, pinned OR manually_saved,
           engram_cached_total(last_scores), engram_cached_at(last_scores)
    FROM new_rows
    ON CONFLICT (user_id, memory_id) DO UPDATE SET
        space = EXCLUDED.space, created_at = EXCLUDED.created_at,
        importance = EXCLUDED.importance, protected = EXCLUDED.protected,
        last_total = EXCLUDED.last_total, last_scored_at = EXCLUDED.last_scored_at;
    RETURN NULL;
END $body$;

CREATE OR REPLACE FUNCTION memories_retention_delete() RETURNS trigger LANGUAGE plpgsql AS $body$
DECLARE
    users uuid[];
    ids uuid[];
BEGIN
    -- Two arrays filled by one pass, so their elements pair up; probing by arrays keeps the cached
    -- plan on the key whatever it guessed about the number of deleted rows.
    SELECT array_agg(user_id), array_agg(id) INTO users, ids FROM old_rows;
    DELETE FROM memory_retention r USING unnest(users, ids) AS gone(user_id, id)
    WHERE r.user_id = gone.user_id AND r.memory_id = gone.id;
    RETURN NULL;
END $body$;

CREATE OR REPLACE FUNCTION memories_retention_update() RETURNS trigger LANGUAGE plpgsql AS $body$
BEGIN
    UPDATE memory_retention SET
        created_at = NEW.created_at,
        importance = NEW.importance,
        protected = NEW.pinned OR NEW.manually_saved,
        last_total = engram_cached_total(NEW.last_scores),
        last_scored_at = engram_cached_at(NEW.last_scores)
    WHERE user_id = NEW.user_id AND memory_id = NEW.id;
    RETURN NULL;
END $body$;
