//! Tombstones of forgotten memories: a near-duplicate of a forgotten text is not re-created
//! until the tombstone expires. Only the fingerprint and a digest are kept, never the text.

use chrono::{DateTime, Utc};
use engram_core::{Scope, SimHash};
use sqlx::PgConnection;
use uuid::Uuid;

use crate::StoreError;

pub async fn insert(
    connection: &mut PgConnection,
    scope: &Scope,
    memory_id: Uuid,
    simhash: SimHash,
    text_digest: &[u8],
    expires_at: DateTime<Utc>,
) -> Result<(), StoreError> {
    sqlx::query(
        "INSERT INTO tombstones (user_id, space, memory_id, simhash, text_digest, expires_at) \
         VALUES ($1, $2, $3, $4, $5, $6)",
    )
    .bind(scope.user_id.as_uuid())
    .bind(scope.space.as_str())
    .bind(memory_id)
    .bind(simhash.as_i64())
    .bind(text_digest)
    .bind(expires_at)
    .execute(connection)
    .await?;
    Ok(())
}

/// When the latest live tombstone near `simhash` expires, if there is one.
pub async fn live_near(
    connection: &mut PgConnection,
    scope: &Scope,
    simhash: SimHash,
    text_digest: &[u8],
) -> Result<Option<DateTime<Utc>>, StoreError> {
    let [band0, band1, band2, band3] = simhash.bands();
    let expires_at = sqlx::query_scalar(
        "SELECT max(expires_at) FROM tombstones \
         WHERE user_id = $1 AND space = $2 AND expires_at > now() \
           AND (text_digest = $4 OR ((simhash_band0 = $5 OR simhash_band1 = $6 OR simhash_band2 = $7 \
                OR simhash_band3 = $8) AND bit_count(int8send(simhash # $3)) <= $9))",
    )
    .bind(scope.user_id.as_uuid())
    .bind(scope.space.as_str())
    .bind(simhash.as_i64())
    .bind(text_digest)
    .bind(band0)
    .bind(band1)
    .bind(band2)
    .bind(band3)
    .bind(i64::from(engram_core::simhash::NEAR_DUPLICATE_DISTANCE))
    .fetch_one(connection)
    .await?;
    Ok(expires_at)
}

/// Removes expired tombstones; returns how many.
pub async fn purge_expired(connection: &mut PgConnection) -> Result<u64, StoreError> {
    let result = sqlx::query("DELETE FROM tombstones WHERE expires_at <= now()")
        .execute(connection)
        .await?;
    Ok(result.rows_affected())
}
