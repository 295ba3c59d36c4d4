-- The sweep and the bus consumer may look at the same entries; a short lease makes each entry's
-- embedding computed by one of them only. An expired lease (a worker that died) frees the entry.
ALTER TABLE memories ADD COLUMN embedding_claimed_until timestamptz NULL;
