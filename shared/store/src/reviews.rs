//! The statements of review: the memories a segment's reviews name, the rating applied to each
//! (recorded once per segment and memory, so a redelivered segment applies nothing twice), the
//! FSRS update, and the statistics of a space's reviews.

use chrono::{DateTime, Utc};
use engram_core::Scope;
use pgvector::Vector;
use sqlx::{PgConnection, PgPool};
use uuid::Uuid;

use crate::StoreError;

/// What grading needs of a memory: its content (the grader compares it with the turns in its
/// own topic vectors, not the stored search embedding).
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct MemoryToGrade {
    pub id: Uuid,
    pub title: Option<String>,
    pub text: String,
}

/// The memories of the space among `ids` (those forgotten or trimmed since are simply absent).
pub async fn memories(
    pool: &PgPool,
    scope: &Scope,
    ids: &[Uuid],
) -> Result<Vec<MemoryToGrade>, StoreError> {
    Ok(sqlx::query_as(
        "SELECT id, title, text FROM memories \
         WHERE user_id = $1 AND space = $2 AND id = ANY($3::uuid[])",
    )
    .bind(scope.user_id.as_uuid())
    .bind(scope.space.as_str())
    .bind(ids)
    .fetch_all(pool)
    .await?)
}

/// The stored vectors of a conversation's turns `first..=last` made by embedder `model`, in
/// turn order; `None` for a turn segmentation did not embed with it.
pub async fn turn_embeddings(
    pool: &PgPool,
    scope: &Scope,
    conversation_id: Uuid,
    first: i32,
    last: i32,
    model: &str,
) -> Result<Vec<Option<Vec<f32>>>, StoreError> {
    if last < first {
        return Ok(Vec::new());
    }
    let rows: Vec<(i32, Vector)> = sqlx::query_as(
        "SELECT turn_index, embedding FROM conversation_turn_embeddings \
         WHERE user_id = $1 AND space = $2 AND conversation_id = $3 AND turn_index BETWEEN $4 AND $5 \
           AND model = $6",
    )
    .bind(scope.user_id.as_uuid())
    .bind(scope.space.as_str())
    .bind(conversation_id)
    .bind(first)
    .bind(last)
    .bind(model)
    .fetch_all(pool)
    .await?;
    let mut vectors = vec![None; usize::try_from(last - first).unwrap_or(0) + 1];
    for (index, vector) in rows {
        if let Some(slot) = usize::try_from(index - first)
            .ok()
            .and_then(|offset| vectors.get_mut(offset))
        {
            *slot = Some(vector.to_vec());
        }
    }
    Ok(vectors)
}

/// A memory's FSRS state, as a review reads it.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct ReviewState {
    pub id: Uuid,
    pub kind: String,
    pub stability: Option<f64>,
    pub difficulty: Option<f64>,
    pub last_reviewed_at: Option<DateTime<Utc>>,
}

/// The states of the space's memories among `ids`, locked until the transaction ends (reviews
/// of one memory apply one after another; locked in id order, so two reviews of overlapping
/// memories cannot deadlock). Memories gone since are absent.
pub async fn lock_states(
    connection: &mut PgConnection,
    scope: &Scope,
    ids: &[Uuid],
) -> Result<Vec<ReviewState>, StoreError> {
    let states = sqlx::query_as(
        "SELECT id, kind, stability, difficulty, last_reviewed_at FROM memories \
         WHERE user_id = $1 AND space = $2 AND id = ANY($3::uuid[]) ORDER BY id FOR UPDATE",
    )
    .bind(scope.user_id.as_uuid())
    .bind(scope.space.as_str())
    .bind(ids)
    .fetch_all(connection)
    .await?;
    Ok(states)
}

/// The reviews of one segment, to record together.
#[derive(Debug, Clone, PartialEq)]
pub struct SegmentReviews<'a> {
    pub segment_id: Uuid,
    pub conversation_id: Option<Uuid>,
    pub reviewed_at: DateTime<Utc>,
    pub reviews: Vec<ReviewRecord<'a>>,
}

/// One memory's review.
#[derive(Debug, Clone, PartialEq)]
pub struct ReviewRecord<'a> {
    pub memory_id: Uuid,
    pub rating: &'a str,
    pub graded_by: &'a str,
    pub applied: bool,
    pub stability_before: Option<f64>,
    pub stability_after: Option<f64>,
    pub difficulty_before: Option<f64>,
    pub difficulty_after: Option<f64>,
    pub queries: &'a [String],
}

/// Records a segment's reviews in one statement; returns the memories whose review is new. A
/// memory missing from the answer had this segment's review recorded before (a redelivery: the
/// caller applies nothing to it).
pub async fn record(
    connection: &mut PgConnection,
    scope: &Scope,
    segment: &SegmentReviews<'_>,
) -> Result<Vec<Uuid>, StoreError> {
    let reviews = &segment.reviews;
    let column = |f: fn(&ReviewRecord<'_>) -> Option<f64>| -> Vec<Option<f64>> {
        reviews.iter().map(f).collect()
    };
    let inserted: Vec<Uuid> = sqlx::query_scalar(
        "INSERT INTO applied_reviews (segment_id, memory_id, user_id, space, conversation_id, rating, \
             graded_by, applied, stability_before, stability_after, difficulty_before, difficulty_after, \
             queries, reviewed_at) \
         SELECT $1, r.memory_id, $2, $3, $4, r.rating, r.graded_by, r.applied, r.stability_before, \
             r.stability_after, r.difficulty_before, r.difficulty_after, \
             ARRAY(SELECT jsonb_array_elements_text(r.queries)), $5 \
         FROM unnest($6::uuid[], $7::text[], $8::text[], $9::bool[], $10::float8[], $11::float8[], \
             $12::float8[], $13::float8[], $14::jsonb[]) \
             AS r(memory_id, rating, graded_by, applied, stability_before, stability_after, \
                  difficulty_before, difficulty_after, queries) \
         ON CONFLICT (user_id, segment_id, memory_id) DO NOTHING \
         RETURNING memory_id",
    )
    .bind(segment.segment_id)
    .bind(scope.user_id.as_uuid())
    .bind(scope.space.as_str())
    .bind(segment.conversation_id)
    .bind(segment.reviewed_at)
    .bind(reviews.iter().map(|r| r.memory_id).collect::<Vec<_>>())
    .bind(reviews.iter().map(|r| r.rating).collect::<Vec<_>>())
    .bind(reviews.iter().map(|r| r.graded_by).collect::<Vec<_>>())
    .bind(reviews.iter().map(|r| r.applied).collect::<Vec<_>>())
    .bind(column(|r| r.stability_before))
    .bind(column(|r| r.stability_after))
    .bind(column(|r| r.difficulty_before))
    .bind(column(|r| r.difficulty_after))
    .bind(
        reviews
            .iter()
            .map(|r| serde_json::json!(r.queries))
            .collect::<Vec<_>>(),
    )
    .fetch_all(connection)
    .await?;
    Ok(inserted)
}

/// A memory's FSRS state after a review.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct NewState {
    pub memory_id: Uuid,
    pub stability: f64,
    pub difficulty: f64,
}

/// Sets the memories' FSRS states after a review at `reviewed_at`, in one statement.
pub async fn update_states(
    connection: &mut PgConnection,
    scope: &Scope,
    states: &[NewState],
    reviewed_at: DateTime<Utc>,
) -> Result<(), StoreError> {
    if states.is_empty() {
        return Ok(());
    }
    // A graded episode's state is the review's: a surprise not yet measured no longer sets it.
    sqlx::query(
        "UPDATE memories m SET stability = s.stability, difficulty = s.difficulty, \
             last_reviewed_at = $6, updated_at = now(), inactive_since = NULL, \
             surprise_pending = false \
         FROM unnest($3::uuid[], $4::float8[], $5::float8[]) AS s(id, stability, difficulty) \
         WHERE m.user_id = $1 AND m.space = $2 AND m.id = s.id",
    )
    .bind(scope.user_id.as_uuid())
    .bind(scope.space.as_str())
    .bind(states.iter().map(|s| s.memory_id).collect::<Vec<_>>())
    .bind(states.iter().map(|s| s.stability).collect::<Vec<_>>())
    .bind(states.iter().map(|s| s.difficulty).collect::<Vec<_>>())
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
