-- The turn search reads a space's turns in one pass over the primary key (issue 41): their
-- lengths for BM25's average length, and the words of those matching the query. The GIN index
-- over (user_id, search_document) no longer serves any statement. It cost every appended turn an
-- index insertion, and a search through it decoded a common word's postings across every user's
-- turns (a multi-column GIN index keeps the user and the words as separate keys), so its cost
-- grew with the whole corpus, not with the space searched.
--
-- A release before this one still runs its statement without the index (its planner reads the
-- space's turns by the primary key and filters them): slower, never wrong.
DROP INDEX IF EXISTS conversation_turns_search_document;
