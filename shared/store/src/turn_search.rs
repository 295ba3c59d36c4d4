//! The statements that search the stored turns of a space (issue 38): Okapi BM25 over each
//! turn's words, and the turns around the ones found, each with the episode that holds it.
//! Retrieval shows an assistant these lines verbatim, so the line that answers a question is
//! read, not only a summary of the segment around it.

use chrono::{DateTime, Utc};
use engram_core::Scope;
use sqlx::PgPool;
use uuid::Uuid;

use crate::StoreError;
use crate::retrieval::Bm25;

/// A turn of a conversation, by its place.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TurnKey {
    pub conversation_id: Uuid,
    pub turn_index: i32,
}

/// A turn the sparse leg found, with its BM25 score.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TurnHit {
    pub turn: TurnKey,
    pub score: f64,
}

#[derive(sqlx::FromRow)]
struct TurnHitRow {
    conversation_id: Uuid,
    turn_index: i32,
    score: f64,
}

/// A NaN score (cosine against a zero vector) ranks nothing: it is dropped.
fn turn_hits(rows: Vec<TurnHitRow>) -> Vec<TurnHit> {
    rows.into_iter()
        .filter(|row| row.score.is_finite())
        .map(|row| TurnHit {
            turn: TurnKey {
                conversation_id: row.conversation_id,
                turn_index: row.turn_index,
            },
            score: row.score,
        })
        .collect()
}

/// Okapi BM25 of the space's turns holding any word of the query, best first. N, df and the
/// average length are the space's turns'.
pub async fn search_turns(
    pool: &PgPool,
    scope: &Scope,
    query: &str,
    bm25: Bm25,
    limit: i64,
) -> Result<Vec<TurnHit>, StoreError> {
    let rows = sqlx::query_as::<_, TurnHitRow>(include_str!("turn_search/search_turns.sql"))
        .bind(scope.user_id.as_uuid())
        .bind(scope.space.as_str())
        .bind(query)
        .bind(bm25.k1)
        .bind(bm25.b)
        .bind(limit)
        .fetch_all(pool)
        .await?;
    Ok(turn_hits(rows))
}

/// A stored turn, and the episode whose time span holds it (none while its segment is open).
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct StoredTurn {
    pub conversation_id: Uuid,
    pub turn_index: i32,
    pub role: String,
    pub content: String,
    pub spoken_at: DateTime<Utc>,
    pub episode_id: Option<Uuid>,
}

impl StoredTurn {
    pub fn key(&self) -> TurnKey {
        TurnKey {
            conversation_id: self.conversation_id,
            turn_index: self.turn_index,
        }
    }
}

/// The given turns and up to `radius` turns either side of each, in conversation order, each
/// once: those of a segment still open, and those an episode holds (an inactive one only with
/// `include_inactive`). A closed segment's turn whose episode is gone (forgotten, suppressed,
/// trimmed) is left out, as is every turn of a conversation that is incognito now; turns
/// retention or ForgetConversation deleted are simply not there.
pub async fn turns_around(
    pool: &PgPool,
    scope: &Scope,
    turns: &[TurnKey],
    radius: i32,
    include_inactive: bool,
) -> Result<Vec<StoredTurn>, StoreError> {
    if turns.is_empty() {
        return Ok(Vec::new());
    }
    let conversations: Vec<Uuid> = turns.iter().map(|t| t.conversation_id).collect();
    let indexes: Vec<i32> = turns.iter().map(|t| t.turn_index).collect();
    let rows = sqlx::query_as::<_, StoredTurn>(include_str!("turn_search/turns_around.sql"))
        .bind(scope.user_id.as_uuid())
        .bind(scope.space.as_str())
        .bind(&conversations)
        .bind(&indexes)
        .bind(radius)
        .bind(include_inactive)
        .fetch_all(pool)
        .await?;
    Ok(rows)
}

/// The space's turns whose stored vectors (made by embedder `model`) are nearest `embedding`,
/// with their cosine, best first: an exact scan of the space's turn vectors.
pub async fn nearest_turns(
    pool: &PgPool,
    scope: &Scope,
    model: &str,
    embedding: &[f32],
    limit: i64,
) -> Result<Vec<TurnHit>, StoreError> {
    let rows = sqlx::query_as::<_, TurnHitRow>(
        "SELECT conversation_id, turn_index, (1 - (embedding <=> $4))::float8 AS score \
         FROM conversation_turn_embeddings \
         WHERE user_id = $1 AND space = $2 AND model = $3 \
         ORDER BY embedding <=> $4, conversation_id, turn_index LIMIT $5",
    )
    .bind(scope.user_id.as_uuid())
    .bind(scope.space.as_str())
    .bind(model)
    .bind(pgvector::Vector::from(embedding.to_vec()))
    .bind(limit)
    .fetch_all(pool)
    .await?;
    Ok(turn_hits(rows))
}
