-- When an entry got its embedding: the time from write to embedding is a service-level metric
-- (backfill latency), and re-embedding after a model change needs to know what is current.
ALTER TABLE memories ADD COLUMN embedded_at timestamptz NULL;

-- Entries whose embedding failed for a reason retrying cannot fix (the endpoint rejects the
-- input): counted, with the last reason, so that one poison entry never blocks the backlog. After
-- the configured number of failures the backfill leaves the entry alone (dead-lettered) until a
-- re-embed request resets it.
ALTER TABLE memories
    ADD COLUMN embedding_failures integer NOT NULL DEFAULT 0,
    ADD COLUMN embedding_error text NULL;
