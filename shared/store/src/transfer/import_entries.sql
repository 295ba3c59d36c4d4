-- Imports a batch into one space ($1 user, $2 space): $3 the rows as a JSON array, $4 how many
-- were received, $5 the ids among them a live tombstone blocks (`forgotten_among`). Rows stored
-- already (the same id) are left as they were; the others are inserted with their embedding when
-- one is given (else queued for the backfill), and the import is audited once. Returns each row
-- inserted (`suppressed` false) and each forgotten one not stored already (`suppressed` true).
WITH incoming AS (
    SELECT * FROM jsonb_to_recordset($3) AS r(id uuid, kind text, conversation_id uuid, text text,
        role text, category text, valid_at timestamptz, invalid_at timestamptz, title text,
        messages jsonb, surprise float8, start_at timestamptz, end_at timestamptz, stability float8,
        difficulty float8, last_reviewed_at timestamptz, consolidated_at timestamptz,
        created_at timestamptz, simhash int8, tags text[], source_ids text[],
        metadata_confidence float8, importance float8, pinned bool, manually_saved bool,
        embedding jsonb, embedding_model text, text_digest text)),
forgotten AS (
    SELECT unnest($5::uuid[]) AS id),
inserted AS (
    INSERT INTO memories (id, user_id, space, kind, conversation_id, text, role, category, valid_at,
        invalid_at, title, messages, surprise, start_at, end_at, stability, difficulty,
        last_reviewed_at, consolidated_at, created_at, updated_at, simhash, tags, source_ids,
        metadata_confidence, importance, pinned, manually_saved, needs_embedding, embedding_model,
        embedded_at)
    SELECT id, $1, $2, kind, conversation_id, text, role, category, valid_at, invalid_at, title,
        messages, surprise, start_at, end_at, stability, difficulty, last_reviewed_at, consolidated_at,
        created_at, now(), simhash, tags, source_ids, metadata_confidence, importance, pinned,
        manually_saved, embedding IS NULL, CASE WHEN embedding IS NOT NULL THEN embedding_model END,
        CASE WHEN embedding IS NOT NULL THEN now() END
    FROM incoming WHERE id NOT IN (SELECT id FROM forgotten) ORDER BY id
    ON CONFLICT (user_id, id) DO NOTHING
    RETURNING id, kind),
embedded AS (
    INSERT INTO memory_embeddings (memory_id, user_id, space, kind, embedding)
    SELECT i.id, $1, $2, i.kind, r.embedding::text::vector
    FROM inserted i JOIN incoming r ON r.id = i.id WHERE r.embedding IS NOT NULL
    RETURNING 1),
audited AS (
    INSERT INTO audit_events (user_id, space, action, detail)
    SELECT $1, $2, 'import', jsonb_build_object('received', $4::int, 'inserted', count(*),
        'embedded', (SELECT count(*) FROM embedded), 'forgotten', (SELECT count(*) FROM forgotten))
    FROM inserted
    RETURNING 1)
SELECT id, false AS suppressed FROM inserted
UNION ALL SELECT f.id, true FROM forgotten f
    WHERE NOT EXISTS (SELECT 1 FROM memories m WHERE m.user_id = $1 AND m.id = f.id)
