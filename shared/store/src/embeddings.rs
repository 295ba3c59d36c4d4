//! The embedding backfill's statements. `needs_embedding` is the truth: whatever wrote an entry,
//! and whatever happened to any message about it, an entry with the flag set gets embedded.

use chrono::{DateTime, Utc};
use pgvector::Vector;
use sqlx::{PgConnection, PgPool};
use uuid::Uuid;

use crate::StoreError;

/// An entry waiting for its embedding: what to embed (text, or title and summary of an episode,
/// and the neighbours' text an imported turn is searched with).
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct PendingEmbedding {
    pub id: Uuid,
    pub text: String,
    pub title: Option<String>,
    pub search_context: Option<String>,
    pub created_at: DateTime<Utc>,
}

impl PendingEmbedding {
    /// The text the embedding represents: the entry's own, then its search context.
    pub fn embedding_input(&self) -> String {
        let own = embedding_input(self.title.as_deref(), &self.text);
        match &self.search_context {
            Some(context) if !context.is_empty() => format!("{own}\n{context}"),
            _ => own,
        }
    }
}

/// The text an entry's embedding represents: its title (an episode's) over its text.
pub fn embedding_input(title: Option<&str>, text: &str) -> String {
    match title {
        Some(title) if !title.is_empty() => format!("{title}\n{text}"),
        _ => text.to_owned(),
    }
}

/// Claims (for `lease`) the oldest entries still needing an embedding, written at least
/// `min_age` ago, not claimed by another worker, and not set aside after `max_failures`.
pub async fn claim_oldest_pending(
    pool: &PgPool,
    limit: i64,
    max_failures: i32,
    min_age: std::time::Duration,
    lease: std::time::Duration,
) -> Result<Vec<PendingEmbedding>, StoreError> {
    let mut pending = sqlx::query_as::<_, PendingEmbedding>(
        "UPDATE memories SET embedding_claimed_until = now() + make_interval(secs => $4) \
         WHERE id IN ( \
             SELECT id FROM memories \
             WHERE needs_embedding AND embedding_failures < $2 \
               AND created_at <= now() - make_interval(secs => $3) \
               AND (embedding_claimed_until IS NULL OR embedding_claimed_until < now()) \
             ORDER BY created_at LIMIT $1 FOR UPDATE SKIP LOCKED) \
         RETURNING id, text, title, search_context, created_at",
    )
    .bind(limit)
    .bind(max_failures)
    .bind(min_age.as_secs_f64())
    .bind(lease.as_secs_f64())
    .fetch_all(pool)
    .await?;
    pending.sort_by_key(|entry| entry.created_at);
    Ok(pending)
}

/// Claims (for `lease`) those of the given entries that still need an embedding and are not
/// claimed by another worker. Entries already embedded are not returned: handling the same
/// request twice changes nothing.
pub async fn claim_by_ids(
    pool: &PgPool,
    ids: &[Uuid],
    lease: std::time::Duration,
) -> Result<Vec<PendingEmbedding>, StoreError> {
    let mut pending = sqlx::query_as::<_, PendingEmbedding>(
        "UPDATE memories SET embedding_claimed_until = now() + make_interval(secs => $2) \
         WHERE id IN ( \
             SELECT id FROM memories WHERE id = ANY($1) AND needs_embedding \
               AND (embedding_claimed_until IS NULL OR embedding_claimed_until < now()) \
             FOR UPDATE SKIP LOCKED) \
         RETURNING id, text, title, search_context, created_at",
    )
    .bind(ids)
    .bind(lease.as_secs_f64())
    .fetch_all(pool)
    .await?;
    pending.sort_by_key(|entry| entry.created_at);
    Ok(pending)
}

/// Gives claimed entries back (after a failure that a later attempt may overcome).
pub async fn release_claims(pool: &PgPool, ids: &[Uuid]) -> Result<(), StoreError> {
    sqlx::query("UPDATE memories SET embedding_claimed_until = NULL WHERE id = ANY($1)")
        .bind(ids)
        .execute(pool)
        .await?;
    Ok(())
}

/// Records a failure that retrying cannot fix; returns whether the entry is now dead-lettered.
pub async fn record_failure(
    pool: &PgPool,
    id: Uuid,
    reason: &str,
    max_failures: i32,
) -> Result<bool, StoreError> {
    let failures: Option<i32> = sqlx::query_scalar(
        "UPDATE memories SET embedding_failures = embedding_failures + 1, embedding_error = $2, \
             embedding_claimed_until = NULL \
         WHERE id = $1 AND needs_embedding RETURNING embedding_failures",
    )
    .bind(id)
    .bind(reason)
    .fetch_optional(pool)
    .await?;
    Ok(failures.is_some_and(|failures| failures >= max_failures))
}

/// Stores embeddings (in `memory_embeddings`, beside the entries) and clears the flag. Rows
/// embedded meanwhile (flag already clear) are left alone, so the same work done twice changes
/// nothing. Returns how many entries got their embedding.
pub async fn store(
    connection: &mut PgConnection,
    embeddings: &[(Uuid, Vec<f32>)],
    model: &str,
) -> Result<u64, StoreError> {
    if embeddings.is_empty() {
        return Ok(0);
    }
    let ids: Vec<Uuid> = embeddings.iter().map(|(id, _)| *id).collect();
    let vectors: Vec<Vector> = embeddings
        .iter()
        .map(|(_, vector)| Vector::from(vector.clone()))
        .collect();
    let result = sqlx::query(
        "WITH embedded AS ( \
             UPDATE memories m SET embedding_model = $3, needs_embedding = false, embedded_at = now(), \
                 embedding_failures = 0, embedding_error = NULL, embedding_claimed_until = NULL \
             WHERE m.id = ANY($1) AND m.needs_embedding \
             RETURNING m.id, m.user_id, m.space, m.kind) \
         INSERT INTO memory_embeddings (memory_id, user_id, space, kind, embedding) \
         SELECT embedded.id, embedded.user_id, embedded.space, embedded.kind, e.embedding \
         FROM embedded JOIN UNNEST($1::uuid[], $2::vector[]) AS e(id, embedding) ON e.id = embedded.id \
         ON CONFLICT (memory_id) DO UPDATE SET embedding = EXCLUDED.embedding",
    )
    .bind(&ids)
    .bind(&vectors)
    .bind(model)
    .execute(connection)
    .await?;
    Ok(result.rows_affected())
}

/// Backlog size and the age of the oldest pending entry.
#[derive(Debug, Clone, Copy, PartialEq, sqlx::FromRow)]
pub struct Backlog {
    pub pending: i64,
    pub oldest_created_at: Option<DateTime<Utc>>,
}

pub async fn backlog(pool: &PgPool, max_failures: i32) -> Result<Backlog, StoreError> {
    let backlog = sqlx::query_as::<_, Backlog>(
        "SELECT count(*) AS pending, min(created_at) AS oldest_created_at FROM memories \
         WHERE needs_embedding AND embedding_failures < $1",
    )
    .bind(max_failures)
    .fetch_one(pool)
    .await?;
    Ok(backlog)
}

/// The dimension of stored embeddings, as the schema declares it.
pub async fn stored_dimension(pool: &PgPool) -> Result<usize, StoreError> {
    let typmod: i32 = sqlx::query_scalar(
        "SELECT atttypmod FROM pg_attribute \
         WHERE attrelid = 'memory_embeddings'::regclass AND attname = 'embedding'",
    )
    .fetch_one(pool)
    .await?;
    usize::try_from(typmod)
        .map_err(|_| StoreError::Corrupt(format!("embedding column has no dimension ({typmod})")))
}

/// Flags entries for a fresh embedding (one space, or all when `scope` is `None`), optionally only
/// those not embedded by `current_model`; failure counts are reset. Existing embeddings stay until
/// replaced. Returns how many entries were flagged.
pub async fn request_reembedding(
    pool: &PgPool,
    scope: Option<&engram_core::Scope>,
    only_other_than: Option<&str>,
) -> Result<u64, StoreError> {
    let result = sqlx::query(
        "UPDATE memories SET needs_embedding = true, embedding_failures = 0, embedding_error = NULL, \
             embedding_claimed_until = NULL \
         WHERE ($1::uuid IS NULL OR (user_id = $1 AND space = $2)) \
           AND ($3::text IS NULL OR embedding_model IS DISTINCT FROM $3)",
    )
    .bind(scope.map(|s| s.user_id.as_uuid()))
    .bind(scope.map(|s| s.space.as_str()))
    .bind(only_other_than)
    .execute(pool)
    .await?;
    Ok(result.rows_affected())
}
