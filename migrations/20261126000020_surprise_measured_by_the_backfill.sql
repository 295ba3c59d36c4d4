-- Segmentation no longer waits for the model to embed a new episode for its surprise: an
-- episode written without the LLM's judgement starts neutral with this mark, and the embedding
-- backfill, which embeds it for search anyway, measures its surprise and sets its initial FSRS
-- state in the transaction that stores the embedding (a review meanwhile clears the mark).
-- A constant default: no table rewrite on a large table.
ALTER TABLE memories ADD COLUMN surprise_pending boolean NOT NULL DEFAULT false;
