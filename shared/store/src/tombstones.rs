//! Tombstones of forgotten memories: a near-duplicate of a forgotten text is not re-created
//! until the tombstone expires. Only the fingerprint and a digest are kept, never the text.

use chrono::{DateTime, Utc};
use engram_core::{Scope, SimHash};
use sqlx::PgConnection;
use uuid::Uuid;

use crate::StoreError;

/// SQL condition: tombstone `t` is live and matches a text with SimHash `$simhash` and digest
/// `$digest` (the same digest, or a fingerprint within `$distance` bits; the band equalities let
/// Postgres probe the band indexes instead of scanning the space's tombstones). The one definition
/// Remember and ImportMemories share; the caller filters `t` by user and space. A macro so that
/// queries stay `&'static str`.
macro_rules! live_tombstone_matches {
    ($simhash:literal, $digest:literal, $distance:literal) => {
        concat!(
            "t.expires_at > now() AND (t.text_digest = ",
            $digest,
            " OR ((t.simhash_band0 = (",
            $simhash,
            " & 65535)::integer",
            " OR t.simhash_band1 = ((",
            $simhash,
            " >> 16) & 65535)::integer",
            " OR t.simhash_band2 = ((",
            $simhash,
            " >> 32) & 65535)::integer",
            " OR t.simhash_band3 = ((",
            $simhash,
            " >> 48) & 65535)::integer)",
            " AND bit_count(int8send(t.simhash # ",
            $simhash,
            ")) <= ",
            $distance,
            "))"
        )
    };
}

pub async fn insert(
    connection: &mut PgConnection,
    scope: &Scope,
    memory_id: Uuid,
    simhash: SimHash,
    text_digest: &[u8],
    expires_at: DateTime<Utc>,
) -> Result<(), StoreError> {
    let tombstone = (memory_id, simhash, text_digest.to_vec());
    insert_many(connection, &[(scope, tombstone)], expires_at).await
}

/// A tombstone to write: the deleted memory, its SimHash and the digest of its normalized text.
pub type NewTombstone = (Uuid, SimHash, Vec<u8>);

/// [`insert`] for many memories, each with its space, in one statement.
pub async fn insert_many(
    connection: &mut PgConnection,
    tombstones: &[(&Scope, NewTombstone)],
    expires_at: DateTime<Utc>,
) -> Result<(), StoreError> {
    if tombstones.is_empty() {
        return Ok(());
    }
    sqlx::query(
        "INSERT INTO tombstones (user_id, space, memory_id, simhash, text_digest, expires_at) \
         SELECT t.user_id, t.space, t.memory_id, t.simhash, t.text_digest, $6 \
         FROM unnest($1::uuid[], $2::text[], $3::uuid[], $4::int8[], $5::bytea[]) \
              AS t(user_id, space, memory_id, simhash, text_digest)",
    )
    .bind(
        tombstones
            .iter()
            .map(|(scope, _)| scope.user_id.as_uuid())
            .collect::<Vec<_>>(),
    )
    .bind(
        tombstones
            .iter()
            .map(|(scope, _)| scope.space.as_str())
            .collect::<Vec<_>>(),
    )
    .bind(
        tombstones
            .iter()
            .map(|(_, (id, _, _))| *id)
            .collect::<Vec<_>>(),
    )
    .bind(
        tombstones
            .iter()
            .map(|(_, (_, simhash, _))| simhash.as_i64())
            .collect::<Vec<_>>(),
    )
    .bind(
        tombstones
            .iter()
            .map(|(_, (_, _, digest))| digest.as_slice())
            .collect::<Vec<_>>(),
    )
    .bind(expires_at)
    .execute(connection)
    .await?;
    Ok(())
}

/// Removes expired tombstones; returns how many.
pub async fn purge_expired(connection: &mut PgConnection) -> Result<u64, StoreError> {
    let result = sqlx::query("DELETE FROM tombstones WHERE expires_at <= now()")
        .execute(connection)
        .await?;
    Ok(result.rows_affected())
}
