//! The statements of review: the memories a segment's reviews name, the rating applied to each
//! (recorded once per segment and memory, so a redelivered segment applies nothing twice), the
//! FSRS update, and the statistics of a space's reviews.

use chrono::{DateTime, Utc};
use engram_core::Scope;
use sqlx::{PgConnection, PgPool};
use uuid::Uuid;

use crate::StoreError;

/// What grading needs of a memory, and its FSRS state.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct ReviewedMemory {
    pub id: Uuid,
    pub kind: String,
    pub title: Option<String>,
    pub text: String,
    pub stability: Option<f64>,
    pub difficulty: Option<f64>,
    pub last_reviewed_at: Option<DateTime<Utc>>,
}

/// The memories of the space among `ids` (those forgotten or trimmed since are simply absent).
pub async fn memories(
    pool: &PgPool,
    scope: &Scope,
    ids: &[Uuid],
) -> Result<Vec<ReviewedMemory>, StoreError> {
    let memories = sqlx::query_as(
        "SELECT id, kind, title, text, stability, difficulty, last_reviewed_at FROM memories \
         WHERE user_id = $1 AND space = $2 AND id = ANY($3::uuid[])",
    )
    .bind(scope.user_id.as_uuid())
    .bind(scope.space.as_str())
    .bind(ids)
    .fetch_all(pool)
    .await?;
    Ok(memories)
}

/// The memory's state, locked until the transaction ends (reviews of one memory apply one
/// after another); `None` when it is gone.
pub async fn lock_state(
    connection: &mut PgConnection,
    scope: &Scope,
    id: Uuid,
) -> Result<Option<ReviewedMemory>, StoreError> {
    let memory = sqlx::query_as(
        "SELECT id, kind, title, text, stability, difficulty, last_reviewed_at FROM memories \
         WHERE user_id = $1 AND space = $2 AND id = $3 FOR UPDATE",
    )
    .bind(scope.user_id.as_uuid())
    .bind(scope.space.as_str())
    .bind(id)
    .fetch_optional(connection)
    .await?;
    Ok(memory)
}

/// One review to record.
#[derive(Debug, Clone, PartialEq)]
pub struct ReviewRecord<'a> {
    pub segment_id: Uuid,
    pub memory_id: Uuid,
    pub conversation_id: Option<Uuid>,
    pub rating: &'a str,
    pub graded_by: &'a str,
    pub applied: bool,
    pub stability_before: Option<f64>,
    pub stability_after: Option<f64>,
    pub difficulty_before: Option<f64>,
    pub difficulty_after: Option<f64>,
    pub queries: &'a [String],
    pub reviewed_at: DateTime<Utc>,
}

/// Records a review; false when this segment's review of the memory was recorded before (a
/// redelivery: the caller applies nothing).
pub async fn record(
    connection: &mut PgConnection,
    scope: &Scope,
    review: &ReviewRecord<'_>,
) -> Result<bool, StoreError> {
    let inserted = sqlx::query(
        "INSERT INTO applied_reviews (segment_id, memory_id, user_id, space, conversation_id, rating, \
             graded_by, applied, stability_before, stability_after, difficulty_before, difficulty_after, \
             queries, reviewed_at) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14) \
         ON CONFLICT (segment_id, memory_id) DO NOTHING",
    )
    .bind(review.segment_id)
    .bind(review.memory_id)
    .bind(scope.user_id.as_uuid())
    .bind(scope.space.as_str())
    .bind(review.conversation_id)
    .bind(review.rating)
    .bind(review.graded_by)
    .bind(review.applied)
    .bind(review.stability_before)
    .bind(review.stability_after)
    .bind(review.difficulty_before)
    .bind(review.difficulty_after)
    .bind(review.queries)
    .bind(review.reviewed_at)
    .execute(connection)
    .await?;
    Ok(inserted.rows_affected() == 1)
}

/// Sets a memory's FSRS state after a review at `reviewed_at`.
pub async fn update_state(
    connection: &mut PgConnection,
    scope: &Scope,
    id: Uuid,
    stability: f64,
    difficulty: f64,
    reviewed_at: DateTime<Utc>,
) -> Result<(), StoreError> {
    sqlx::query(
        "UPDATE memories SET stability = $4, difficulty = $5, last_reviewed_at = $6, updated_at = now() \
         WHERE user_id = $1 AND space = $2 AND id = $3",
    )
    .bind(scope.user_id.as_uuid())
    .bind(scope.space.as_str())
    .bind(id)
    .bind(stability)
    .bind(difficulty)
    .bind(reviewed_at)
    .execute(connection)
    .await?;
    Ok(())
}

/// A space's reviews in a window.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ReviewStats {
    pub graded: i64,
    pub applied: i64,
    /// (rating, count), every rating that occurred.
    pub ratings: Vec<(String, i64)>,
    pub segments: i64,
    pub graded_by_llm: i64,
}

pub async fn stats(
    pool: &PgPool,
    scope: &Scope,
    since: Option<DateTime<Utc>>,
    until: Option<DateTime<Utc>>,
) -> Result<ReviewStats, StoreError> {
    let rows: Vec<(String, i64, i64, i64, i64)> = sqlx::query_as(
        "SELECT rating, count(*), count(*) FILTER (WHERE applied), \
                count(*) FILTER (WHERE graded_by = 'llm'), \
                (SELECT count(DISTINCT segment_id) FROM applied_reviews \
                 WHERE user_id = $1 AND space = $2 \
                   AND ($3::timestamptz IS NULL OR created_at >= $3) \
                   AND ($4::timestamptz IS NULL OR created_at < $4)) \
         FROM applied_reviews \
         WHERE user_id = $1 AND space = $2 \
           AND ($3::timestamptz IS NULL OR created_at >= $3) \
           AND ($4::timestamptz IS NULL OR created_at < $4) \
         GROUP BY rating ORDER BY rating",
    )
    .bind(scope.user_id.as_uuid())
    .bind(scope.space.as_str())
    .bind(since)
    .bind(until)
    .fetch_all(pool)
    .await?;
    let mut stats = ReviewStats::default();
    for (rating, graded, applied, by_llm, segments) in rows {
        stats.graded += graded;
        stats.applied += applied;
        stats.graded_by_llm += by_llm;
        stats.segments = segments;
        stats.ratings.push((rating, graded));
    }
    Ok(stats)
}
