//! Moving whole spaces in and out: export pages through a space in a stable order; import inserts
//! entries as given (with their ids derived from the client's ids, so importing the same batch
//! twice changes nothing).

use chrono::{DateTime, Utc};
use engram_core::Scope;
use pgvector::Vector;
use serde::Serialize;
use sqlx::{PgConnection, PgPool};
use uuid::Uuid;

use crate::StoreError;
use crate::memories::MemoryRecord;

/// An entry with its embedding, as exported.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct ExportedMemory {
    #[sqlx(flatten)]
    pub record: MemoryRecord,
    pub embedding: Option<Vector>,
}

/// Up to `limit` entries after `after` (created_at, id), oldest first.
pub async fn export_page(
    pool: &PgPool,
    scope: &Scope,
    after: Option<(DateTime<Utc>, Uuid)>,
    limit: i64,
    with_embeddings: bool,
) -> Result<Vec<ExportedMemory>, StoreError> {
    let sql = concat!(
        "SELECT m.*, CASE WHEN $6 THEN e.embedding END AS embedding FROM (SELECT ",
        memory_columns!(cached),
        " FROM memories WHERE user_id = $1 AND space = $2 \
           AND (created_at, id) > (COALESCE($3, '-infinity'::timestamptz), \
                                   COALESCE($4, '00000000-0000-0000-0000-000000000000'::uuid)) \
         ORDER BY created_at, id LIMIT $5) m \
         LEFT JOIN memory_embeddings e ON e.user_id = $1 AND e.memory_id = m.id AND $6 \
         ORDER BY m.created_at, m.id"
    );
    let page = sqlx::query_as::<_, ExportedMemory>(sql)
        .bind(scope.user_id.as_uuid())
        .bind(scope.space.as_str())
        .bind(after.map(|(created_at, _)| created_at))
        .bind(after.map(|(_, id)| id))
        .bind(limit)
        .bind(with_embeddings)
        .fetch_all(pool)
        .await?;
    Ok(page)
}

/// One validated entry to import (serialized as a JSON record for `jsonb_to_recordset`).
#[derive(Debug, Clone, Serialize)]
pub struct ImportRow {
    pub id: Uuid,
    pub kind: &'static str,
    pub conversation_id: Option<Uuid>,
    pub text: String,
    pub role: &'static str,
    pub category: Option<&'static str>,
    pub valid_at: Option<DateTime<Utc>>,
    pub invalid_at: Option<DateTime<Utc>>,
    pub title: Option<String>,
    pub messages: Option<serde_json::Value>,
    pub surprise: Option<f64>,
    pub start_at: Option<DateTime<Utc>>,
    pub end_at: Option<DateTime<Utc>>,
    pub stability: Option<f64>,
    pub difficulty: Option<f64>,
    pub last_reviewed_at: Option<DateTime<Utc>>,
    pub consolidated_at: Option<DateTime<Utc>>,
    pub created_at: DateTime<Utc>,
    pub simhash: i64,
    /// Hex SHA-256 of the normalized text, matched against tombstones like Remember does.
    pub text_digest: String,
    pub tags: Vec<String>,
    pub source_ids: Vec<String>,
    pub metadata_confidence: f64,
    pub importance: f64,
    pub pinned: bool,
    pub manually_saved: bool,
    /// Stored as given (the caller checked model and dimension); `None` queues the entry for the
    /// embedding backfill.
    pub embedding: Option<Vec<f32>>,
    pub embedding_model: Option<String>,
}

/// What an import did with each row it did not find already stored.
#[derive(Debug, Default)]
pub struct ImportOutcome {
    pub inserted: Vec<Uuid>,
    /// Rows matching a live tombstone (the user forgot that memory): not stored, like Remember.
    pub suppressed: Vec<Uuid>,
}

/// The rows a live tombstone of the space blocks (the user forgot that memory): what Remember
/// would not store either.
async fn forgotten_among(
    connection: &mut PgConnection,
    scope: &Scope,
    rows: &[ImportRow],
) -> Result<Vec<Uuid>, StoreError> {
    let ids: Vec<Uuid> = rows.iter().map(|row| row.id).collect();
    let simhashes: Vec<i64> = rows.iter().map(|row| row.simhash).collect();
    let digests: Vec<&str> = rows.iter().map(|row| row.text_digest.as_str()).collect();
    Ok(sqlx::query_scalar(concat!(
        "SELECT r.id FROM unnest($3::uuid[], $4::int8[], $5::text[]) AS r(id, simhash, digest) \
         WHERE EXISTS (SELECT 1 FROM tombstones t WHERE t.user_id = $1 AND t.space = $2 AND ",
        live_tombstone_matches!("r.simhash", "decode(r.digest, 'hex')", "$6"),
        ")"
    ))
    .bind(scope.user_id.as_uuid())
    .bind(scope.space.as_str())
    .bind(&ids)
    .bind(&simhashes)
    .bind(&digests)
    .bind(i64::from(engram_core::simhash::NEAR_DUPLICATE_DISTANCE))
    .fetch_all(connection)
    .await?)
}

/// Sets the search context of imported entries (`(id, context)`), in the import's transaction.
pub async fn set_search_contexts(
    connection: &mut PgConnection,
    scope: &Scope,
    contexts: &[(Uuid, String)],
) -> Result<(), StoreError> {
    if contexts.is_empty() {
        return Ok(());
    }
    let ids: Vec<Uuid> = contexts.iter().map(|(id, _)| *id).collect();
    let texts: Vec<&str> = contexts.iter().map(|(_, text)| text.as_str()).collect();
    sqlx::query(
        "UPDATE memories m SET search_context = c.context \
         FROM unnest($3::uuid[], $4::text[]) AS c(id, context) \
         WHERE m.user_id = $1 AND m.space = $2 AND m.id = c.id",
    )
    .bind(scope.user_id.as_uuid())
    .bind(scope.space.as_str())
    .bind(&ids)
    .bind(&texts)
    .execute(connection)
    .await?;
    Ok(())
}

/// Inserts the rows that are neither stored yet nor forgotten (a live tombstone within SimHash
/// distance 3, or the same digest), with one `import` audit event.
pub async fn import(
    connection: &mut PgConnection,
    scope: &Scope,
    rows: &[ImportRow],
) -> Result<ImportOutcome, StoreError> {
    let forgotten = forgotten_among(&mut *connection, scope, rows).await?;
    let records = serde_json::to_value(rows)
        .map_err(|error| StoreError::Corrupt(format!("cannot encode import rows: {error}")))?;
    let rows_out: Vec<(Uuid, bool)> = sqlx::query_as(include_str!("transfer/import_entries.sql"))
        .bind(scope.user_id.as_uuid())
        .bind(scope.space.as_str())
        .bind(records)
        .bind(rows.len() as i32)
        .bind(&forgotten)
        .fetch_all(connection)
        .await?;
    let mut outcome = ImportOutcome::default();
    for (id, suppressed) in rows_out {
        if suppressed {
            outcome.suppressed.push(id);
        } else {
            outcome.inserted.push(id);
        }
    }
    Ok(outcome)
}
