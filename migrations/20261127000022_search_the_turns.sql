-- Retrieval searches the stored turns themselves (issue 38): the Markdown shows the lines of a
-- conversation that answer a query, found among every turn of the space, not only inside the
-- episodes that ranked first. A turn's words are derived from its content, which never changes,
-- so they are generated columns (adding them rewrites the table without firing the
-- immutability trigger, and an insert computes them).
--
-- Cost on an existing database: the table is rewritten (every turn's words computed) and the
-- index built while it is locked, so appends wait (reads of other tables go on) for about the
-- time a full copy of the turns takes; earlier releases' code reads and writes the table
-- unchanged, so a rolling upgrade needs no stop, only a quiet moment for the lock.
ALTER TABLE conversation_turns
    ADD COLUMN search_document tsvector GENERATED ALWAYS AS (engram_search_words(content)) STORED,
    ADD COLUMN search_length integer
        GENERATED ALWAYS AS (engram_token_count(engram_search_words(content))) STORED;

-- The sparse leg over turns: the space's turns holding any word of the query.
CREATE INDEX conversation_turns_search_document ON conversation_turns
    USING gin (user_id, search_document);
