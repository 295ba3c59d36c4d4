-- Turn vectors for the topic rules (segmentation) and the review grader now come from static
-- token vectors distilled from the local model (engram-embed's TokenVectorEmbedder), not from
-- the model's sentence embeddings: they live in a space of their own. Each stored turn vector
-- says which embedder made it, and readers use only their own embedder's; the vectors stored
-- before are the sentence model's.
ALTER TABLE conversation_turn_embeddings
    ADD COLUMN model text NOT NULL DEFAULT 'sentence-transformers/all-MiniLM-L6-v2';
ALTER TABLE conversation_turn_embeddings ALTER COLUMN model DROP DEFAULT;
