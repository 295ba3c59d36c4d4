-- During a rolling upgrade, ingest pods of the release before migration 17 still store turn
-- vectors, without naming their embedder: those are the sentence model's. Keep that as the
-- column's default, so their rows are labelled right instead of refused (code since then always
-- names its embedder).
ALTER TABLE conversation_turn_embeddings
    ALTER COLUMN model SET DEFAULT 'sentence-transformers/all-MiniLM-L6-v2';
