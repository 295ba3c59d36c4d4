//! The embedding backfill's statements. `needs_embedding` is the truth: whatever wrote an entry,
//! and whatever happened to any message about it, an entry with the flag set gets embedded.

use chrono::{DateTime, Utc};
use pgvector::Vector;
use sqlx::{PgConnection, PgPool};
use uuid::Uuid;

use crate::StoreError;

/// An entry's key: its user and its id. Every statement here finds an entry by both, so that the
/// primary key serves it (and, on a distributed Postgres, so that it goes to the user's shard).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct EntryKey {
    pub user_id: Uuid,
    pub id: Uuid,
}

/// The keys as two arrays, the form the statements unnest.
pub(crate) fn key_arrays(keys: impl IntoIterator<Item = EntryKey>) -> (Vec<Uuid>, Vec<Uuid>) {
    keys.into_iter().map(|key| (key.user_id, key.id)).unzip()
}

/// An entry waiting for its embedding: what to embed (text, or title and summary of an episode,
/// and the neighbours' text an imported turn is searched with).
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct PendingEmbedding {
    pub id: Uuid,
    pub user_id: Uuid,
    pub text: String,
    pub title: Option<String>,
    pub search_context: Option<String>,
    pub created_at: DateTime<Utc>,
}

impl PendingEmbedding {
    pub fn key(&self) -> EntryKey {
        EntryKey {
            user_id: self.user_id,
            id: self.id,
        }
    }

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
/// `min_age` ago, not claimed by another worker, and not set aside after `max_failures`. A sweep
/// over every user (through the pending entries' partial index): the one statement here that
/// names no user.
pub async fn claim_oldest_pending(
    pool: &PgPool,
    limit: i64,
    max_failures: i32,
    min_age: std::time::Duration,
    lease: std::time::Duration,
) -> Result<Vec<PendingEmbedding>, StoreError> {
    let mut pending = sqlx::query_as::<_, PendingEmbedding>(
        "UPDATE memories m SET embedding_claimed_until = now() + make_interval(secs => $4) \
         FROM ( \
             SELECT user_id, id FROM memories \
             WHERE needs_embedding AND embedding_failures < $2 \
               AND created_at <= now() - make_interval(secs => $3) \
               AND (embedding_claimed_until IS NULL OR embedding_claimed_until < now()) \
             ORDER BY created_at LIMIT $1 FOR UPDATE SKIP LOCKED) due \
         WHERE m.user_id = due.user_id AND m.id = due.id \
         RETURNING m.id, m.user_id, m.text, m.title, m.search_context, m.created_at",
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
pub async fn claim_by_keys(
    pool: &PgPool,
    keys: &[EntryKey],
    lease: std::time::Duration,
) -> Result<Vec<PendingEmbedding>, StoreError> {
    let (users, ids) = key_arrays(keys.iter().copied());
    let mut pending = sqlx::query_as::<_, PendingEmbedding>(
        "UPDATE memories m SET embedding_claimed_until = now() + make_interval(secs => $3) \
         FROM ( \
             SELECT c.user_id, c.id FROM memories c \
             JOIN unnest($1::uuid[], $2::uuid[]) AS k(user_id, id) ON c.user_id = k.user_id AND c.id = k.id \
             WHERE c.needs_embedding \
               AND (c.embedding_claimed_until IS NULL OR c.embedding_claimed_until < now()) \
             FOR UPDATE OF c SKIP LOCKED) due \
         WHERE m.user_id = due.user_id AND m.id = due.id \
         RETURNING m.id, m.user_id, m.text, m.title, m.search_context, m.created_at",
    )
    .bind(&users)
    .bind(&ids)
    .bind(lease.as_secs_f64())
    .fetch_all(pool)
    .await?;
    pending.sort_by_key(|entry| entry.created_at);
    Ok(pending)
}

/// Gives claimed entries back (after a failure that a later attempt may overcome).
pub async fn release_claims(pool: &PgPool, keys: &[EntryKey]) -> Result<(), StoreError> {
    let (users, ids) = key_arrays(keys.iter().copied());
    sqlx::query(
        "UPDATE memories m SET embedding_claimed_until = NULL \
         FROM unnest($1::uuid[], $2::uuid[]) AS k(user_id, id) \
         WHERE m.user_id = k.user_id AND m.id = k.id",
    )
    .bind(&users)
    .bind(&ids)
    .execute(pool)
    .await?;
    Ok(())
}

/// Records a failure that retrying cannot fix; returns whether the entry is now dead-lettered.
pub async fn record_failure(
    pool: &PgPool,
    key: EntryKey,
    reason: &str,
    max_failures: i32,
) -> Result<bool, StoreError> {
    let failures: Option<i32> = sqlx::query_scalar(
        "UPDATE memories SET embedding_failures = embedding_failures + 1, embedding_error = $3, \
             embedding_claimed_until = NULL \
         WHERE user_id = $1 AND id = $2 AND needs_embedding RETURNING embedding_failures",
    )
    .bind(key.user_id)
    .bind(key.id)
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
    embeddings: &[(EntryKey, Vec<f32>)],
    model: &str,
) -> Result<u64, StoreError> {
    if embeddings.is_empty() {
        return Ok(0);
    }
    let (users, ids) = key_arrays(embeddings.iter().map(|(key, _)| *key));
    let vectors: Vec<Vector> = embeddings
        .iter()
        .map(|(_, vector)| Vector::from(vector.clone()))
        .collect();
    let result = sqlx::query(
        "WITH embedded AS ( \
             UPDATE memories m SET embedding_model = $4, needs_embedding = false, embedded_at = now(), \
                 embedding_failures = 0, embedding_error = NULL, embedding_claimed_until = NULL \
             FROM unnest($1::uuid[], $2::uuid[], $3::vector[]) AS e(user_id, id, embedding) \
             WHERE m.user_id = e.user_id AND m.id = e.id AND m.needs_embedding \
             RETURNING m.id, m.user_id, m.space, m.kind, e.embedding) \
         INSERT INTO memory_embeddings (memory_id, user_id, space, kind, embedding) \
         SELECT id, user_id, space, kind, embedding FROM embedded \
         ON CONFLICT (user_id, memory_id) DO UPDATE SET embedding = EXCLUDED.embedding",
    )
    .bind(&users)
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
