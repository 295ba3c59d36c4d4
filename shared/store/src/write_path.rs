//! The statements of the write path, shaped for few round trips: one query reads everything a
//! write decides on, one statement inserts and audits, one statement enforces the soft cap.

use chrono::{DateTime, Utc};
use engram_core::{ConversationId, RetentionPolicy, Scope, SimHash};
use sqlx::PgConnection;
use uuid::Uuid;

use crate::StoreError;
use crate::memories::{MemoryRecord, NewSemanticMemory};

/// What a write needs to know about its space, its conversation and the text's near-duplicate,
/// read in one query (after the space lock is held, so it cannot change underneath).
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct WriteContext {
    pub memory_enabled: bool,
    pub incognito_default: bool,
    pub soft_cap: Option<i32>,
    pub memory_count: i64,
    /// The conversation's explicit incognito state, if it has one.
    pub conversation_incognito: Option<bool>,
    /// Expiry of a live tombstone matching the text (same digest or SimHash within distance 3).
    pub tombstone_expires_at: Option<DateTime<Utc>>,
    /// The semantic memory this text would merge into (nearest within distance 3), if any.
    pub near_duplicate_id: Option<Uuid>,
}

pub async fn write_context(
    connection: &mut PgConnection,
    scope: &Scope,
    conversation: Option<ConversationId>,
    simhash: SimHash,
    text_digest: &[u8],
) -> Result<WriteContext, StoreError> {
    let context = sqlx::query_as::<_, WriteContext>(concat!(
        "SELECT COALESCE(s.memory_enabled, true) AS memory_enabled, \
                COALESCE(s.incognito_default, false) AS incognito_default, \
                s.soft_cap, \
                COALESCE(s.memory_count, 0) AS memory_count, \
                (SELECT c.incognito FROM conversations c \
                  WHERE c.user_id = $1 AND c.space = $2 AND c.conversation_id = $3) AS conversation_incognito, \
                (SELECT max(t.expires_at) FROM tombstones t \
                  WHERE t.user_id = $1 AND t.space = $2 AND ",
        live_tombstone_matches!("$4", "$5", "$6"),
        ") AS tombstone_expires_at, \
                duplicate.id AS near_duplicate_id \
         FROM (SELECT 1) AS one LEFT JOIN spaces s ON s.user_id = $1 AND s.space = $2 \
         LEFT JOIN LATERAL (",
        near_duplicate_lookup!("id", "$1", "$2", "$4", "$6"),
        ") AS duplicate ON true"
    ))
    .bind(scope.user_id.as_uuid())
    .bind(scope.space.as_str())
    .bind(conversation.map(|c| c.as_uuid()))
    .bind(simhash.as_i64())
    .bind(text_digest)
    .bind(i64::from(engram_core::simhash::NEAR_DUPLICATE_DISTANCE))
    .fetch_one(connection)
    .await?;
    Ok(context)
}

/// Inserts a semantic memory, its `create` audit event and (when given) the outbox event that asks
/// for its embedding, in one statement and so in one transaction.
pub async fn insert_semantic_audited(
    connection: &mut PgConnection,
    scope: &Scope,
    memory: &NewSemanticMemory,
    audit_detail: serde_json::Value,
    event: Option<&crate::outbox::NewOutboxEvent>,
) -> Result<MemoryRecord, StoreError> {
    let sql = concat!(
        "WITH inserted AS ( \
             INSERT INTO memories (id, user_id, space, kind, conversation_id, text, role, category, \
                 valid_at, simhash, tags, source_ids, metadata_confidence, importance, pinned, \
                 manually_saved, needs_embedding, last_scores) \
             VALUES ($1, $2, $3, 'semantic', $4, $5, $6, $7, now(), $8, $9, $10, $11, $12, $13, $14, true, $16) \
             RETURNING *), \
         audited AS ( \
             INSERT INTO audit_events (user_id, space, action, memory_id, conversation_id, detail) \
             SELECT user_id, space, 'create', id, conversation_id, $15 FROM inserted), \
         outboxed AS ( \
             INSERT INTO outbox_events (message_id, routing_key, type_name, payload, trace_headers) \
             SELECT $17, $18, $19, $20, $21 FROM inserted WHERE $17::uuid IS NOT NULL) \
         SELECT ",
        memory_columns!(),
        " FROM inserted"
    );
    let record = sqlx::query_as::<_, MemoryRecord>(sql)
        .bind(memory.id)
        .bind(scope.user_id.as_uuid())
        .bind(scope.space.as_str())
        .bind(memory.conversation_id)
        .bind(&memory.text)
        .bind(memory.role)
        .bind(memory.category)
        .bind(memory.simhash.as_i64())
        .bind(&memory.tags)
        .bind(&memory.source_ids)
        .bind(memory.metadata_confidence)
        .bind(memory.importance)
        .bind(memory.pinned)
        .bind(memory.manually_saved)
        .bind(audit_detail)
        .bind(crate::memories::scores_json(&memory.last_scores)?)
        .bind(event.map(|e| e.message_id))
        .bind(event.map(|e| e.routing_key.as_str()))
        .bind(event.map(|e| e.type_name.as_str()))
        .bind(event.map(|e| e.payload.as_slice()))
        .bind(event.map(|e| e.trace_headers_json()))
        .fetch_one(connection)
        .await?;
    Ok(record)
}

/// The outcome of enforcing the soft cap.
#[derive(Debug, Clone, Default, PartialEq, sqlx::FromRow)]
pub struct TrimOutcome {
    /// Deleted entries, lowest total first.
    pub trimmed: Vec<Uuid>,
    /// Pinned or saved entries that ranked among the lowest `overage` totals (alerts).
    pub protected_would_be_victims: Vec<Uuid>,
}

/// Enforces the soft cap in one statement: the capacity policy of
/// [`engram_core::capacity::plan_trim`] (the reference, which a test holds this SQL to), run
/// where the rows are so that a write at the cap does not ship the whole space to the service.
///
/// Cached totals are used while fresh; missing or stale ones are recomputed as
/// recency exp(−Δt/τ) + importance (relevance 0) and cached; the `overage` lowest totals among
/// entries that are neither pinned nor manually saved are deleted and audited as trims.
///
/// Only the entries that can matter are read, each set through an index: all entries with a
/// missing or stale cache (recomputed), and the `overage` lowest fresh totals of trimmable and of
/// protected entries. The lowest `overage` entries of the whole space are among them, so the
/// ranking is the reference's, at a cost that does not grow with the space.
pub async fn enforce_soft_cap(
    connection: &mut PgConnection,
    scope: &Scope,
    overage: i64,
    policy: &RetentionPolicy,
) -> Result<TrimOutcome, StoreError> {
    let tau_secs = policy.recency_tau.num_milliseconds() as f64 / 1000.0;
    let staleness_secs = policy.score_staleness.num_milliseconds() as f64 / 1000.0;
    let outcome = sqlx::query_as::<_, TrimOutcome>(
        "WITH uncached AS ( \
             SELECT id, created_at, importance, pinned OR manually_saved AS protected, \
                    exp(-greatest(extract(epoch FROM now() - created_at)::float8, 0) / $4) AS recency \
             FROM memories \
             WHERE user_id = $1 AND space = $2 \
               AND (last_scored_at IS NULL OR last_scored_at < now() - make_interval(secs => $5))), \
         lowest_trimmable AS ( \
             SELECT id, created_at, last_total FROM memories \
             WHERE user_id = $1 AND space = $2 AND NOT (pinned OR manually_saved) \
               AND last_scored_at >= now() - make_interval(secs => $5) \
             ORDER BY last_total, created_at, id LIMIT $3), \
         lowest_protected AS ( \
             SELECT id, created_at, last_total FROM memories \
             WHERE user_id = $1 AND space = $2 AND (pinned OR manually_saved) \
               AND last_scored_at >= now() - make_interval(secs => $5) \
             ORDER BY last_total, created_at, id LIMIT $3), \
         ranked AS ( \
             SELECT id, protected, total, \
                    row_number() OVER (ORDER BY total, created_at, id) AS position \
             FROM (SELECT id, created_at, protected, recency + importance AS total FROM uncached \
                   UNION ALL SELECT id, created_at, false, last_total FROM lowest_trimmable \
                   UNION ALL SELECT id, created_at, true, last_total FROM lowest_protected) AS candidates), \
         victims AS ( \
             SELECT id, total FROM ranked WHERE NOT protected ORDER BY position LIMIT $3), \
         rescored AS ( \
             UPDATE memories m SET last_scores = jsonb_build_object('relevance', 0.0, 'recency', u.recency, \
                 'importance', u.importance, 'total', u.recency + u.importance, 'computed_at', now()) \
             FROM uncached u \
             WHERE m.user_id = $1 AND m.space = $2 AND m.id = u.id \
               AND u.id NOT IN (SELECT id FROM victims)), \
         deleted AS ( \
             DELETE FROM memories m USING victims v \
             WHERE m.user_id = $1 AND m.space = $2 AND m.id = v.id RETURNING m.id, v.total), \
         audited AS ( \
             INSERT INTO audit_events (user_id, space, action, memory_id, detail) \
             SELECT $1, $2, 'trim', id, jsonb_build_object('reason', 'soft cap exceeded', 'total_score', total) \
             FROM deleted) \
         SELECT COALESCE((SELECT array_agg(v.id ORDER BY r.position) FROM victims v JOIN ranked r USING (id) \
                          WHERE v.id IN (SELECT id FROM deleted)), '{}') AS trimmed, \
                COALESCE((SELECT array_agg(id ORDER BY position) FROM ranked \
                          WHERE position <= $3 AND protected), '{}') AS protected_would_be_victims",
    )
    .bind(scope.user_id.as_uuid())
    .bind(scope.space.as_str())
    .bind(overage)
    .bind(tau_secs)
    .bind(staleness_secs)
    .fetch_one(connection)
    .await?;
    Ok(outcome)
}
