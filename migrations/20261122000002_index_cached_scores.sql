-- The capacity policy reads every entry of a space on each write at the soft cap. Keep the two
-- values it needs from last_scores (the cached total and when it was computed) in plain columns,
-- derived by a trigger so last_scores stays the one thing writers set, and cover them in an index
-- so the policy reads a few index pages instead of one heap page per entry.

ALTER TABLE memories
    ADD COLUMN last_total double precision NULL,
    ADD COLUMN last_scored_at timestamptz NULL;

CREATE FUNCTION memories_derive_cached_scores() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.last_scores IS NOT NULL
       AND jsonb_typeof(NEW.last_scores -> 'total') = 'number'
       AND jsonb_typeof(NEW.last_scores -> 'computed_at') = 'string' THEN
        NEW.last_total := (NEW.last_scores ->> 'total')::double precision;
        NEW.last_scored_at := (NEW.last_scores ->> 'computed_at')::timestamptz;
    ELSE
        -- Missing or malformed: the capacity policy recomputes it.
        NEW.last_total := NULL;
        NEW.last_scored_at := NULL;
    END IF;
    RETURN NEW;
END $$;

CREATE TRIGGER memories_cached_scores BEFORE INSERT OR UPDATE OF last_scores ON memories
    FOR EACH ROW EXECUTE FUNCTION memories_derive_cached_scores();

UPDATE memories SET last_scores = last_scores WHERE last_scores IS NOT NULL;

CREATE INDEX memories_scope_retention ON memories (user_id, space)
    INCLUDE (id, created_at, importance, pinned, manually_saved, last_total, last_scored_at);
