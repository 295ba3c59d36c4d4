//! The statement that searches the stored turns of a space (issue 38): Okapi BM25 over each
//! turn's words and the nearest turn vectors, and the turns around the ones found, each with the
//! episode that holds it.
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

/// Where the turn legs look, and how far around what they find.
#[derive(Debug, Clone, Copy)]
pub struct TurnSearch<'a> {
    pub bm25: Bm25,
    /// The query's vector among the stored turn vectors, and the model that made them: the
    /// nearest turns join the word matches (none without it).
    pub turn_vector: Option<(&'a str, &'a [f32])>,
    /// Turns the word leg brings.
    pub limit: i64,
    /// Turns the vector leg brings (0: none).
    pub nearest_limit: i64,
    /// Turns either side of each found turn that come with it.
    pub radius: i32,
    /// Whether turns of inactive episodes count.
    pub include_inactive: bool,
}

/// What the turn legs found: the turns that share words with the query (BM25 scores), those
/// nearest it by their vectors (cosines), and those turns with their neighbours, in
/// conversation order.
#[derive(Debug, Clone, Default)]
pub struct FoundTurns {
    pub hits: Vec<TurnHit>,
    pub nearest: Vec<TurnHit>,
    pub stored: Vec<StoredTurn>,
}

impl FoundTurns {
    /// The episodes holding the turns found, each once.
    pub fn holding_episodes(&self) -> Vec<Uuid> {
        let mut episodes: Vec<Uuid> = self.stored.iter().filter_map(|t| t.episode_id).collect();
        episodes.sort_unstable();
        episodes.dedup();
        episodes
    }
}

#[derive(sqlx::FromRow)]
struct FoundTurnRow {
    #[sqlx(flatten)]
    turn: StoredTurn,
    word_score: Option<f64>,
    vector_score: Option<f64>,
}

/// The space's turns that answer `query`, in one statement (`find_turns.sql`): Okapi BM25 over
/// each turn's words (N, df and the average length are the space's turns'); where a word
/// matched, the turns nearest the query's turn vector by an exact scan; and every turn found
/// with `radius` turns either side, each with the episode that holds it. Only what the
/// assistant may read comes back: turns of a segment still open, and turns an episode holds
/// (an inactive one only with `include_inactive`). A closed segment's turn whose episode is gone
/// (forgotten, suppressed, trimmed) is left out, as is every turn of a conversation that is
/// incognito now; turns retention or ForgetConversation deleted are simply not there. A NaN
/// score (a cosine against a zero vector) ranks nothing: it is dropped.
pub async fn find_turns(
    pool: &PgPool,
    scope: &Scope,
    query: &str,
    search: TurnSearch<'_>,
) -> Result<FoundTurns, StoreError> {
    let (model, vector) = match search.turn_vector {
        Some((model, vector)) => (model, Some(pgvector::Vector::from(vector.to_vec()))),
        None => ("", None),
    };
    let rows = sqlx::query_as::<_, FoundTurnRow>(include_str!("turn_search/find_turns.sql"))
        .bind(scope.user_id.as_uuid())
        .bind(scope.space.as_str())
        .bind(query)
        .bind(search.bm25.k1)
        .bind(search.bm25.b)
        .bind(search.limit)
        .bind(model)
        .bind(vector)
        .bind(search.radius)
        .bind(search.include_inactive)
        .bind(search.nearest_limit)
        .fetch_all(pool)
        .await?;
    let mut found = FoundTurns::default();
    for row in rows {
        let key = row.turn.key();
        let hit = |score: Option<f64>| {
            score
                .filter(|score| score.is_finite())
                .map(|score| TurnHit { turn: key, score })
        };
        found.hits.extend(hit(row.word_score));
        found.nearest.extend(hit(row.vector_score));
        found.stored.push(row.turn);
    }
    Ok(found)
}
