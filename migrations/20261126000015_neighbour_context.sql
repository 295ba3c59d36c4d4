-- Context for short turns. A chat history imported turn by turn (ImportMemories with
-- context_turns) stores beside each turn the text of its neighbours, for search only: it joins the
-- words BM25 matches (and the text the backfill embeds), never the text shown. "Yes, I went there
-- last week!" is then found by what the turns around it name.
ALTER TABLE memories ADD COLUMN search_context text NULL;

CREATE OR REPLACE FUNCTION memories_derive_columns() RETURNS trigger LANGUAGE plpgsql AS $body$
BEGIN
    NEW.simhash_band0 := (NEW.simhash & 65535)::integer;
    NEW.simhash_band1 := ((NEW.simhash >> 16) & 65535)::integer;
    NEW.simhash_band2 := ((NEW.simhash >> 32) & 65535)::integer;
    NEW.simhash_band3 := ((NEW.simhash >> 48) & 65535)::integer;
    -- A merge sets tags on every write; the words are recomputed only when they really change.
    IF TG_OP = 'INSERT' OR NEW.kind IS DISTINCT FROM OLD.kind OR NEW.title IS DISTINCT FROM OLD.title
       OR NEW.text IS DISTINCT FROM OLD.text OR NEW.tags IS DISTINCT FROM OLD.tags
       OR NEW.search_context IS DISTINCT FROM OLD.search_context THEN
        -- search_text stays the entry's own (the trigram fallback compares it).
        NEW.search_text := engram_search_text(NEW.kind, NEW.title, NEW.text, NEW.tags);
        -- With a context, the entry's own words count twice: a turn that says what was asked
        -- ranks above its neighbours, which are found by the same words once.
        NEW.search_document := engram_search_words(CASE WHEN NEW.search_context IS NULL THEN NEW.search_text
            ELSE NEW.search_text || ' ' || NEW.search_text || ' ' || NEW.search_context END);
        NEW.search_length := engram_token_count(NEW.search_document);
    END IF;
    RETURN NEW;
END $body$;

DROP TRIGGER memories_derived_columns ON memories;
CREATE TRIGGER memories_derived_columns
    BEFORE INSERT OR UPDATE OF simhash, kind, title, text, tags, search_context
    ON memories FOR EACH ROW EXECUTE FUNCTION memories_derive_columns();
