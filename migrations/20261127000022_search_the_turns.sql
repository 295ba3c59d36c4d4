-- Retrieval searches the stored turns themselves (issue 38): the Markdown shows the lines of a
-- conversation that answer a query, found among every turn of the space, not only inside the
-- episodes that ranked first. A turn's words are derived from its content, which never changes,
-- so they are generated columns (adding them rewrites the table without firing the
-- immutability trigger, and an insert computes them).
ALTER TABLE conversation_turns
    ADD COLUMN search_document tsvector GENERATED ALWAYS AS (engram_search_words(content)) STORED,
    ADD COLUMN search_length integer
        GENERATED ALWAYS AS (engram_token_count(engram_search_words(content))) STORED;

-- The sparse leg over turns: the space's turns holding any word of the query.
CREATE INDEX conversation_turns_search_document ON conversation_turns
    USING gin (user_id, search_document);
