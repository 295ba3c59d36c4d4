//! What GetSummary reads about a space: counts, categories, the facts worth showing and the latest
//! episodes. Only entries still valid (invalid_at unset) are summarised.

use chrono::{DateTime, Utc};
use engram_core::Scope;
use sqlx::PgPool;

use crate::StoreError;
use crate::memories::MemoryRecord;

#[derive(Debug, Clone, Default, PartialEq, sqlx::FromRow)]
pub struct SpaceCounts {
    pub semantic_count: i64,
    pub episodic_count: i64,
    pub pinned_count: i64,
    pub oldest_at: Option<DateTime<Utc>>,
    pub newest_at: Option<DateTime<Utc>>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct SpaceContents {
    pub counts: SpaceCounts,
    /// (category, facts), largest first.
    pub categories: Vec<(String, i64)>,
    /// Every pinned fact, and the `per_category` most important others of each category.
    pub highlights: Vec<MemoryRecord>,
    /// The latest episodes, newest first.
    pub recent_episodes: Vec<MemoryRecord>,
}

/// Pinned facts shown per category in a summary (the counts still cover them all), so a space
/// with thousands of pins gets a readable answer of bounded size.
const MAX_PINNED_SHOWN: i64 = 50;

pub async fn space_contents(
    pool: &PgPool,
    scope: &Scope,
    per_category: i64,
    episodes: i64,
) -> Result<SpaceContents, StoreError> {
    let user_id = scope.user_id.as_uuid();
    let space = scope.space.as_str();
    let counts: SpaceCounts = sqlx::query_as(
        "SELECT count(*) FILTER (WHERE kind = 'semantic') AS semantic_count, \
                count(*) FILTER (WHERE kind = 'episodic') AS episodic_count, \
                count(*) FILTER (WHERE pinned) AS pinned_count, \
                min(created_at) AS oldest_at, max(created_at) AS newest_at \
         FROM memories WHERE user_id = $1 AND space = $2 AND invalid_at IS NULL",
    )
    .bind(user_id)
    .bind(space)
    .fetch_one(pool)
    .await?;
    let categories: Vec<(String, i64)> = sqlx::query_as(
        "SELECT COALESCE(category, 'fact'), count(*) FROM memories \
         WHERE user_id = $1 AND space = $2 AND kind = 'semantic' AND invalid_at IS NULL \
         GROUP BY 1 ORDER BY 2 DESC, 1",
    )
    .bind(user_id)
    .bind(space)
    .fetch_all(pool)
    .await?;
    // The ranked rows keep the name `memories`, which the cached scores' lookup refers to.
    let highlights: Vec<MemoryRecord> = sqlx::query_as(concat!(
        "SELECT ",
        memory_columns!(cached),
        " FROM (SELECT *, row_number() OVER (PARTITION BY COALESCE(category, 'fact'), pinned \
                 ORDER BY importance DESC, created_at DESC, id) AS position \
               FROM memories \
               WHERE user_id = $1 AND space = $2 AND kind = 'semantic' AND invalid_at IS NULL) memories \
         WHERE position <= CASE WHEN pinned THEN $4 ELSE $3 END \
         ORDER BY pinned DESC, importance DESC, created_at DESC, id"
    ))
    .bind(user_id)
    .bind(space)
    .bind(per_category)
    .bind(MAX_PINNED_SHOWN)
    .fetch_all(pool)
    .await?;
    let recent_episodes: Vec<MemoryRecord> = sqlx::query_as(concat!(
        "SELECT ",
        memory_columns!(cached),
        " FROM memories WHERE user_id = $1 AND space = $2 AND kind = 'episodic' \
           AND invalid_at IS NULL \
         ORDER BY COALESCE(end_at, created_at) DESC, id LIMIT $3"
    ))
    .bind(user_id)
    .bind(space)
    .bind(episodes)
    .fetch_all(pool)
    .await?;
    Ok(SpaceContents {
        counts,
        categories,
        highlights,
        recent_episodes,
    })
}
