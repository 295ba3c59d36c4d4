-- The insert half of `write_entries`: the new semantic memories of the JSON document $2 inserted
-- (`inserted`), each audited as `create` (and `pin` when pinned) and announced in the outbox when
-- it carries an event. A fragment of a WITH list; `write_entries` composes it.
insert_batch AS (
    SELECT * FROM jsonb_to_recordset($2) AS r(id uuid, user_id uuid, space text,
        conversation_id uuid, text text, role text, category text, simhash int8, tags text[],
        source_ids text[], metadata_confidence float8, importance float8, pinned boolean,
        manually_saved boolean, last_scores jsonb, source_episode_ids uuid[], fact_subject text,
        fact_value text, valid_at timestamptz, audit_detail jsonb, event_message_id uuid,
        event_routing_key text, event_type_name text, event_payload text,
        event_trace_headers jsonb)),
inserted AS (
    INSERT INTO memories (id, user_id, space, kind, conversation_id, text, role, category,
        valid_at, simhash, tags, source_ids, metadata_confidence, importance, pinned,
        manually_saved, needs_embedding, last_scores, source_episode_ids, fact_subject, fact_value)
    SELECT id, user_id, space, 'semantic', conversation_id, text, role, category,
        COALESCE(valid_at, now()), simhash, tags, source_ids, metadata_confidence, importance,
        pinned, manually_saved, true, last_scores, source_episode_ids, fact_subject, fact_value
    FROM insert_batch
    RETURNING *),
inserts_audited AS (
    INSERT INTO audit_events (user_id, space, action, memory_id, conversation_id, detail)
    SELECT i.user_id, i.space, e.action, i.id, i.conversation_id, e.detail
    FROM inserted i JOIN insert_batch b ON b.id = i.id
    CROSS JOIN LATERAL (VALUES (1, 'create', b.audit_detail), (2, 'pin', '{}'::jsonb))
        AS e(position, action, detail)
    WHERE e.action = 'create' OR i.pinned
    ORDER BY i.id, e.position),
outboxed AS (
    INSERT INTO outbox_events (message_id, routing_key, type_name, payload, trace_headers)
    SELECT b.event_message_id, b.event_routing_key, b.event_type_name, decode(b.event_payload, 'hex'),
           b.event_trace_headers
    FROM inserted i JOIN insert_batch b ON b.id = i.id
    WHERE b.event_message_id IS NOT NULL)
