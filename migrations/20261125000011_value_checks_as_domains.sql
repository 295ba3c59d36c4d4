-- The single-column CHECKs of the tables every write touches become domains, with the same rules.
--
-- Postgres rebuilds a table's CHECK constraints from their stored text for every statement that
-- writes the table: it parses each expression again, simplifies it and compiles it. A Remember
-- batch writes memories, audit_events and spaces in several statements (and the triggers' own), so
-- the ingest benchmark's write backends spent about 5 % of their CPU re-reading the same dozen
-- expressions (perf with DWARF call graphs, 2026-11-25). A domain's constraints are read once per
-- connection and kept in its type cache. On a copy of the benchmark database, dropping these
-- checks altogether gave 7–13 % more writes/s; the domains keep the rules and most of that.
--
-- The checks that relate two columns (semantic_fields, episodic_fields) stay table constraints.
-- Clients see no difference: a domain column reads back as its base type.

CREATE DOMAIN engram_unit_interval AS double precision CHECK (VALUE BETWEEN 0 AND 1);
CREATE DOMAIN engram_memory_kind AS text CHECK (VALUE IN ('semantic', 'episodic'));
CREATE DOMAIN engram_speaker_role AS text CHECK (VALUE IN ('user', 'assistant', 'system'));
CREATE DOMAIN engram_category AS text
    CHECK (VALUE IN ('fact', 'preference', 'experience', 'guideline', 'decision', 'todo', 'goal'));
CREATE DOMAIN engram_nonempty_text AS text CHECK (length(VALUE) > 0);
CREATE DOMAIN engram_fsrs_stability AS double precision CHECK (VALUE > 0);
CREATE DOMAIN engram_fsrs_difficulty AS double precision CHECK (VALUE BETWEEN 1 AND 10);
CREATE DOMAIN engram_repeat_count AS integer CHECK (VALUE >= 0);
CREATE DOMAIN engram_soft_cap AS integer CHECK (VALUE BETWEEN 1 AND 1000000);
CREATE DOMAIN engram_entry_count AS bigint CHECK (VALUE >= 0);
CREATE DOMAIN engram_audit_action AS text CHECK (VALUE IN ('create', 'merge', 'pin', 'unpin',
    'forget', 'settings_change', 'incognito_start', 'incognito_end', 'trim', 'import', 'suppress'));

-- Two column-list triggers name columns whose type changes; they are recreated as they were, in
-- the same transaction.
DROP TRIGGER memories_derived_columns ON memories;
DROP TRIGGER memories_retention_after_update ON memories;

-- Same base types, so no table is rewritten; each column's values are checked against its domain.
ALTER TABLE memories
    DROP CONSTRAINT memories_kind_check,
    DROP CONSTRAINT memories_text_check,
    DROP CONSTRAINT memories_role_check,
    DROP CONSTRAINT memories_category_check,
    DROP CONSTRAINT memories_surprise_check,
    DROP CONSTRAINT memories_stability_check,
    DROP CONSTRAINT memories_difficulty_check,
    DROP CONSTRAINT memories_repeat_count_check,
    DROP CONSTRAINT memories_metadata_confidence_check,
    DROP CONSTRAINT memories_importance_check,
    ALTER COLUMN kind TYPE engram_memory_kind,
    ALTER COLUMN text TYPE engram_nonempty_text,
    ALTER COLUMN role TYPE engram_speaker_role,
    ALTER COLUMN category TYPE engram_category,
    ALTER COLUMN surprise TYPE engram_unit_interval,
    ALTER COLUMN stability TYPE engram_fsrs_stability,
    ALTER COLUMN difficulty TYPE engram_fsrs_difficulty,
    ALTER COLUMN repeat_count TYPE engram_repeat_count,
    ALTER COLUMN metadata_confidence TYPE engram_unit_interval,
    ALTER COLUMN importance TYPE engram_unit_interval;

CREATE TRIGGER memories_derived_columns BEFORE INSERT OR UPDATE OF simhash, kind, title, text, tags
    ON memories FOR EACH ROW EXECUTE FUNCTION memories_derive_columns();
CREATE TRIGGER memories_retention_after_update AFTER UPDATE OF last_scores, importance, pinned, manually_saved, created_at
    ON memories FOR EACH ROW EXECUTE FUNCTION memories_retention_update();

ALTER TABLE audit_events
    DROP CONSTRAINT audit_events_action_check,
    ALTER COLUMN action TYPE engram_audit_action;

-- NULL soft_cap: the global default applies (a domain's CHECK passes NULL, as the old one did).
ALTER TABLE spaces
    DROP CONSTRAINT spaces_soft_cap_check,
    DROP CONSTRAINT spaces_memory_count_check,
    ALTER COLUMN soft_cap TYPE engram_soft_cap,
    ALTER COLUMN memory_count TYPE engram_entry_count;
