-- One retrieval_metrics row per retrieval: each parameter is one column's array, in order. A row
-- of a conversation forgotten at or after the retrieval is not written: ForgetConversation
-- deleted the conversation's rows (they hold its queries) while this one waited for its batch.
INSERT INTO retrieval_metrics (user_id, space, conversation_id, created_at, query, sparse_hits,
    dense_hits, trigram_hits, used_fallback, retrieval_path, ranking_profile, scope_widened,
    context_items, estimated_tokens, truncated, latency_embed_ms, latency_retrieval_ms, error_stage)
SELECT row.*
FROM unnest($1::uuid[], $2::text[], $3::uuid[], $4::timestamptz[], $5::text[],
    $6::int4[], $7::int4[], $8::int4[], $9::bool[], $10::text[], $11::text[], $12::bool[],
    $13::int4[], $14::int4[], $15::bool[], $16::float4[], $17::float4[], $18::text[])
    AS row(user_id, space, conversation_id, created_at, query, sparse_hits, dense_hits,
        trigram_hits, used_fallback, retrieval_path, ranking_profile, scope_widened,
        context_items, estimated_tokens, truncated, latency_embed_ms, latency_retrieval_ms,
        error_stage)
WHERE row.conversation_id IS NULL
   OR NOT EXISTS (
       SELECT 1 FROM audit_events a
       WHERE a.user_id = row.user_id AND a.space = row.space
         AND a.conversation_id = row.conversation_id AND a.action = 'forget_conversation'
         AND a.created_at >= row.created_at)
