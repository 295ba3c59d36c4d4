//! The `memories` table: semantic facts and episodic memories in one model.

use chrono::{DateTime, Utc};
use engram_core::{MemoryKind, Scope, Scores, SimHash, TrimCandidate};
use sqlx::{FromRow, PgConnection, PgPool, Row};
use uuid::Uuid;

use crate::StoreError;

/// Every column but the embedding, which never leaves the store through this type. A macro, so
/// that queries stay `&'static str` literals (sqlx refuses SQL built at run time).
///
/// `last_scores` has two sources. `()` reads the copy in `memories`, what the entry's writer
/// computed: right for what a write returns (its retention row is made after the statement),
/// for what a delete returns (never shown with its scores), and for retrieval's loads (a
/// retrieval computes its own scores and leaves whether they replace the cache to its trace
/// writer, so the request path never reads the rows that writer updates). `(cached)` reads the
/// cache in `memory_retention`, which retrievals write and which every API reader of an entry
/// shows; it needs the row source to be named `memories`.
macro_rules! memory_columns {
    () => {
        concat!(memory_columns!(@before_scores), "last_scores, ", memory_columns!(@after_scores))
    };
    (cached) => {
        concat!(
            memory_columns!(@before_scores),
            "(SELECT r.last_scores FROM memory_retention r \
              WHERE r.user_id = memories.user_id AND r.memory_id = memories.id) AS last_scores, ",
            memory_columns!(@after_scores)
        )
    };
    (@before_scores) => {
        "id, user_id, space, kind, conversation_id, text, role, category, valid_at, invalid_at, \
         title, messages, surprise, start_at, end_at, stability, difficulty, last_reviewed_at, \
         consolidated_at, created_at, updated_at, needs_embedding, embedding_model, simhash, \
         repeat_count, tags, source_ids, metadata_confidence, importance, pinned, manually_saved, "
    };
    (@after_scores) => {
        "source_episode_ids, fact_subject, fact_value, superseded_by, structured_summary, \
         inactive_since"
    };
}

/// One stored memory, as read back.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct MemoryRecord {
    pub id: Uuid,
    pub user_id: Uuid,
    pub space: String,
    pub kind: String,
    pub conversation_id: Option<Uuid>,
    pub text: String,
    pub role: String,
    pub category: Option<String>,
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
    pub updated_at: DateTime<Utc>,
    pub needs_embedding: bool,
    pub embedding_model: Option<String>,
    pub simhash: i64,
    pub repeat_count: i32,
    pub tags: Vec<String>,
    pub source_ids: Vec<String>,
    pub metadata_confidence: f64,
    pub importance: f64,
    pub pinned: bool,
    pub manually_saved: bool,
    pub last_scores: Option<serde_json::Value>,
    /// Facts consolidated from conversations: the episodes that support them.
    pub source_episode_ids: Vec<Uuid>,
    /// The subject and value a fact states (`engram_core::conflict`), when the rules see one.
    pub fact_subject: Option<String>,
    pub fact_value: Option<String>,
    /// The newer fact that superseded this one.
    pub superseded_by: Option<Uuid>,
    /// Episodes: what the segment established.
    pub structured_summary: Option<serde_json::Value>,
    /// When retention found the entry unused (`engram_core::retention`): left out of retrieval
    /// by default, deleted after the space's grace period unless used again.
    pub inactive_since: Option<DateTime<Utc>>,
}

impl MemoryRecord {
    /// The entry's memory model (the table's CHECK allows only the two).
    pub fn memory_kind(&self) -> MemoryKind {
        MemoryKind::from_stored(&self.kind).unwrap_or(MemoryKind::Semantic)
    }
}

impl MemoryRecord {
    /// The cached scores, if present and well-formed (a malformed cache counts as missing and is
    /// recomputed).
    pub fn scores(&self) -> Option<Scores> {
        self.last_scores
            .clone()
            .and_then(|value| serde_json::from_value(value).ok())
    }
}

/// A new semantic memory, fully decided by the write path.
#[derive(Debug, Clone)]
pub struct NewSemanticMemory {
    pub id: Uuid,
    pub conversation_id: Option<Uuid>,
    pub text: String,
    pub role: &'static str,
    pub category: &'static str,
    pub simhash: SimHash,
    pub tags: Vec<String>,
    pub source_ids: Vec<String>,
    pub metadata_confidence: f64,
    pub importance: f64,
    pub pinned: bool,
    pub manually_saved: bool,
    /// Scores as of creation (relevance 0 outside a retrieval), cached so the capacity policy
    /// need not compute them.
    pub last_scores: Scores,
    /// Episodes the fact was consolidated from.
    pub source_episode_ids: Vec<Uuid>,
    /// The subject and value the fact states (`engram_core::conflict`).
    pub fact_subject: Option<String>,
    pub fact_value: Option<String>,
    /// When the fact became true; `None` is now.
    pub valid_at: Option<DateTime<Utc>>,
}

/// SQL: the `columns` of the valid semantic memory (or, with `$kind`, the entry of that kind) of
/// `$user` / `$space` nearest to SimHash
/// `$simhash` within `$distance` bits, nearest then oldest first. The band equalities let Postgres
/// probe the four band indexes instead of scanning the space (two fingerprints within distance 3
/// share a band). One definition for the write path, which folds it into its context query, and
/// [`find_near_duplicate`]. A macro so that queries stay `&'static str`.
macro_rules! near_duplicate_lookup {
    ($columns:expr, $user:literal, $space:literal, $simhash:literal, $distance:literal) => {
        near_duplicate_lookup!($columns, $user, $space, $simhash, $distance, "'semantic'")
    };
    ($columns:expr, $user:literal, $space:literal, $simhash:literal, $distance:literal, $kind:literal) => {
        concat!(
            "SELECT ",
            $columns,
            " FROM memories \
             WHERE user_id = ",
            $user,
            " AND space = ",
            $space,
            " AND kind = ",
            $kind,
            " AND invalid_at IS NULL \
               AND (simhash_band0 = (",
            $simhash,
            " & 65535)::integer \
                 OR simhash_band1 = ((",
            $simhash,
            " >> 16) & 65535)::integer \
                 OR simhash_band2 = ((",
            $simhash,
            " >> 32) & 65535)::integer \
                 OR simhash_band3 = ((",
            $simhash,
            " >> 48) & 65535)::integer) \
               AND bit_count(int8send(simhash # ",
            $simhash,
            ")) <= ",
            $distance,
            " \
             ORDER BY bit_count(int8send(simhash # ",
            $simhash,
            ")), created_at, id \
             LIMIT 1"
        )
    };
}

/// SQL: the episode of `$1` / `$2` nearest to SimHash `$3` within `$4` bits (id, repeat count,
/// importance): what a new episode of the same text repeats.
macro_rules! episodic_near_duplicate_lookup {
    () => {
        near_duplicate_lookup!(
            "id, repeat_count, importance",
            "$1",
            "$2",
            "$3::int8",
            "$4",
            "'episodic'"
        )
    };
}

/// The near-duplicate of a fingerprint in a space (what a Remember of that text would merge into).
pub async fn find_near_duplicate(
    connection: &mut PgConnection,
    scope: &Scope,
    simhash: SimHash,
) -> Result<Option<MemoryRecord>, StoreError> {
    let sql = near_duplicate_lookup!(memory_columns!(), "$1", "$2", "$3::int8", "$4");
    let record = sqlx::query_as::<_, MemoryRecord>(sql)
        .bind(scope.user_id.as_uuid())
        .bind(scope.space.as_str())
        .bind(simhash.as_i64())
        .bind(i64::from(engram_core::simhash::NEAR_DUPLICATE_DISTANCE))
        .fetch_optional(connection)
        .await?;
    Ok(record)
}

/// What a near-duplicate write changes on the canonical entry.
#[derive(Debug, Clone)]
pub struct MergeUpdate {
    pub repeat_count: i32,
    pub importance: f64,
    pub manually_saved: bool,
    pub pinned: bool,
    pub tags: Vec<String>,
    pub source_ids: Vec<String>,
    pub metadata_confidence: f64,
    /// Recomputed with the new importance.
    pub last_scores: Scores,
    pub source_episode_ids: Vec<Uuid>,
}

pub async fn get(
    connection: &mut PgConnection,
    scope: &Scope,
    id: Uuid,
) -> Result<Option<MemoryRecord>, StoreError> {
    let sql = concat!(
        "SELECT ",
        memory_columns!(cached),
        " FROM memories WHERE user_id = $1 AND space = $2 AND id = $3"
    );
    let record = sqlx::query_as::<_, MemoryRecord>(sql)
        .bind(scope.user_id.as_uuid())
        .bind(scope.space.as_str())
        .bind(id)
        .fetch_optional(connection)
        .await?;
    Ok(record)
}

/// A pin or unpin applied: the entry as it is now, and whether it was otherwise before (a repeated
/// Pin or Unpin changes nothing, and leaves no audit event).
#[derive(Debug, Clone, PartialEq)]
pub struct PinChange {
    pub record: MemoryRecord,
    pub changed: bool,
}

/// Sets or clears the pin; `None` when the space holds no such memory.
pub async fn set_pinned(
    connection: &mut PgConnection,
    scope: &Scope,
    id: Uuid,
    pinned: bool,
) -> Result<Option<PinChange>, StoreError> {
    // The entry's row lock is taken by the first statement, so `was_pinned` is what this update
    // replaces, even with a concurrent Pin of the same entry.
    let sql = concat!(
        "WITH previous AS ( \
             SELECT id AS previous_id, pinned AS was_pinned FROM memories \
             WHERE user_id = $1 AND space = $2 AND id = $3 FOR UPDATE) \
         UPDATE memories SET pinned = $4, \
             updated_at = CASE WHEN was_pinned = $4 THEN updated_at ELSE now() END, \
             inactive_since = CASE WHEN $4 THEN NULL ELSE inactive_since END \
         FROM previous WHERE user_id = $1 AND id = previous_id RETURNING was_pinned, ",
        memory_columns!(cached),
        ""
    );
    let row = sqlx::query(sql)
        .bind(scope.user_id.as_uuid())
        .bind(scope.space.as_str())
        .bind(id)
        .bind(pinned)
        .fetch_optional(connection)
        .await?;
    row.map(|row| {
        let was_pinned: bool = row.try_get("was_pinned")?;
        Ok(PinChange {
            record: MemoryRecord::from_row(&row)?,
            changed: was_pinned != pinned,
        })
    })
    .transpose()
}

/// Deletes the given memories of the space and returns what was deleted. A neighbour that was
/// searched with a deleted memory's words (an imported turn's `search_context`) loses its
/// context and is embedded again without it: what the user forgot must not be found through
/// another entry.
pub async fn delete(
    connection: &mut PgConnection,
    scope: &Scope,
    ids: &[Uuid],
) -> Result<Vec<MemoryRecord>, StoreError> {
    let entries: Vec<(&Scope, Uuid)> = ids.iter().map(|id| (scope, *id)).collect();
    delete_across(connection, &entries).await
}

/// [`delete`] for entries of several spaces at once (each given with its space; an id that is
/// not in that space is not deleted).
pub async fn delete_across(
    connection: &mut PgConnection,
    entries: &[(&Scope, Uuid)],
) -> Result<Vec<MemoryRecord>, StoreError> {
    if entries.is_empty() {
        return Ok(Vec::new());
    }
    let sql = concat!(
        // The given entries' columns are named apart from memories', which RETURNING names bare.
        "DELETE FROM memories \
         USING unnest($1::uuid[], $2::text[], $3::uuid[]) AS given(given_user, given_space, given_id) \
         WHERE user_id = given_user AND space = given_space AND id = given_id RETURNING ",
        memory_columns!(),
        ""
    );
    let records = sqlx::query_as::<_, MemoryRecord>(sql)
        .bind(
            entries
                .iter()
                .map(|(scope, _)| scope.user_id.as_uuid())
                .collect::<Vec<_>>(),
        )
        .bind(
            entries
                .iter()
                .map(|(scope, _)| scope.space.as_str())
                .collect::<Vec<_>>(),
        )
        .bind(entries.iter().map(|(_, id)| *id).collect::<Vec<_>>())
        .fetch_all(&mut *connection)
        .await?;
    if !records.is_empty() {
        sqlx::query(
            "UPDATE memories n SET search_context = NULL, needs_embedding = true \
             FROM unnest($1::uuid[], $2::text[], $3::text[]) AS forgotten(user_id, space, text) \
             WHERE n.user_id = forgotten.user_id AND n.space = forgotten.space \
               AND n.search_context IS NOT NULL \
               AND position(forgotten.text IN n.search_context) > 0",
        )
        .bind(
            records
                .iter()
                .map(|record| record.user_id)
                .collect::<Vec<_>>(),
        )
        .bind(
            records
                .iter()
                .map(|record| record.space.as_str())
                .collect::<Vec<_>>(),
        )
        .bind(
            records
                .iter()
                .map(|record| record.text.as_str())
                .collect::<Vec<_>>(),
        )
        .execute(connection)
        .await?;
    }
    Ok(records)
}

#[derive(sqlx::FromRow)]
struct TrimRow {
    id: Uuid,
    created_at: DateTime<Utc>,
    importance: f64,
    pinned: bool,
    manually_saved: bool,
    last_scores: Option<serde_json::Value>,
}

/// Every entry of the space with what the capacity policy needs.
pub async fn trim_candidates(
    connection: &mut PgConnection,
    scope: &Scope,
) -> Result<Vec<TrimCandidate>, StoreError> {
    let rows = sqlx::query_as::<_, TrimRow>(
        "SELECT m.id, m.created_at, m.importance, m.pinned, m.manually_saved, r.last_scores \
         FROM memories m \
         LEFT JOIN memory_retention r ON r.user_id = m.user_id AND r.memory_id = m.id \
         WHERE m.user_id = $1 AND m.space = $2",
    )
    .bind(scope.user_id.as_uuid())
    .bind(scope.space.as_str())
    .fetch_all(connection)
    .await?;
    Ok(rows
        .into_iter()
        .map(|row| TrimCandidate {
            id: row.id,
            created_at: row.created_at,
            importance: row.importance,
            pinned: row.pinned,
            manually_saved: row.manually_saved,
            last_scores: row
                .last_scores
                .and_then(|value| serde_json::from_value(value).ok()),
        })
        .collect())
}

/// Filters and paging of [`list`].
#[derive(Debug, Clone, Default)]
pub struct ListFilter {
    pub pinned: Option<bool>,
    pub manually_saved: Option<bool>,
    /// `semantic`, `episodic`, or both when `None`.
    pub kind: Option<MemoryKind>,
    /// Continue after this (created_at, id), exclusive; newest first.
    pub after: Option<(DateTime<Utc>, Uuid)>,
    pub limit: i64,
}

/// Entries of the space, newest first. The cursor is always a row comparison (never "no cursor
/// OR ..."), so it stays an index condition under a generic prepared-statement plan.
pub async fn list(
    pool: &PgPool,
    scope: &Scope,
    filter: &ListFilter,
) -> Result<Vec<MemoryRecord>, StoreError> {
    let (after_created, after_id) = filter.after.unzip();
    let sql = concat!(
        "SELECT ",
        memory_columns!(cached),
        " FROM memories \
         WHERE user_id = $1 AND space = $2 \
           AND ($3::boolean IS NULL OR pinned = $3) \
           AND ($4::boolean IS NULL OR manually_saved = $4) \
           AND ($5::text IS NULL OR kind = $5) \
           AND (created_at, id) < (COALESCE($6::timestamptz, 'infinity'::timestamptz), \
                                   COALESCE($7::uuid, 'ffffffff-ffff-ffff-ffff-ffffffffffff'::uuid)) \
         ORDER BY created_at DESC, id DESC \
         LIMIT $8"
    );
    let records = sqlx::query_as::<_, MemoryRecord>(sql)
        .bind(scope.user_id.as_uuid())
        .bind(scope.space.as_str())
        .bind(filter.pinned)
        .bind(filter.manually_saved)
        .bind(filter.kind.map(MemoryKind::as_str))
        .bind(after_created)
        .bind(after_id)
        .bind(filter.limit)
        .fetch_all(pool)
        .await?;
    Ok(records)
}

/// How many memories the space holds, counted (tests check the maintained counter against it).
pub async fn count(pool: &PgPool, scope: &Scope) -> Result<i64, StoreError> {
    let count =
        sqlx::query_scalar("SELECT count(*) FROM memories WHERE user_id = $1 AND space = $2")
            .bind(scope.user_id.as_uuid())
            .bind(scope.space.as_str())
            .fetch_one(pool)
            .await?;
    Ok(count)
}
