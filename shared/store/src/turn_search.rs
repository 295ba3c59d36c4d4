//! The search of the stored turns of a space (issue 38): Okapi BM25 over each turn's words and
//! the nearest turn vectors, and the turns around the ones found, each with the episode that
//! holds it. Postgres returns the space's turns (from their blocks, issue 41) and the service
//! ranks them ([`scoring`]).
//! Retrieval shows an assistant these lines verbatim, so the line that answers a question is
//! read, not only a summary of the segment around it.

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use engram_core::Scope;
use sqlx::PgPool;
use uuid::Uuid;

use crate::StoreError;
use crate::retrieval::Bm25;

mod scoring;

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
#[derive(Debug, Clone, PartialEq)]
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

/// A row of `find_turns_reference.sql`: a turn found or around one (`turn_index` set), or an episode of
/// one of their conversations (`episode_id` set).
#[cfg(feature = "reference")]
#[derive(sqlx::FromRow)]
struct FoundTurnRow {
    conversation_id: Uuid,
    turn_index: Option<i32>,
    role: Option<String>,
    content: Option<String>,
    spoken_at: Option<DateTime<Utc>>,
    segmented_through: Option<i32>,
    word_score: Option<f64>,
    vector_score: Option<f64>,
    episode_id: Option<Uuid>,
    start_at: Option<DateTime<Utc>>,
    end_at: Option<DateTime<Utc>>,
    created_at: Option<DateTime<Utc>>,
}

/// A turn the statement read, before it is known which episode holds it.
#[derive(Debug, Clone, PartialEq)]
struct ReadTurn {
    turn: StoredTurn,
    /// The last turn of the conversation's closed segments.
    segmented_through: i32,
    word_score: Option<f64>,
    vector_score: Option<f64>,
}

/// An episode of a conversation the statement read, by the time span of its turns.
#[derive(Debug, Clone, Copy, PartialEq)]
struct EpisodeSpan {
    id: Uuid,
    conversation_id: Uuid,
    start_at: DateTime<Utc>,
    end_at: DateTime<Utc>,
    created_at: DateTime<Utc>,
}

impl EpisodeSpan {
    /// Whether `turn`, of this episode's conversation, was said within its time span (both ends
    /// included).
    fn holds(&self, turn: &StoredTurn) -> bool {
        self.start_at <= turn.spoken_at && turn.spoken_at <= self.end_at
    }
}

/// Each turn with the episode whose time span holds it (the newest, if two segments share a
/// boundary instant), keeping only what the assistant may read: a turn an episode holds, or one
/// of a segment still open (past `segmented_through`). A closed segment's turn without an
/// episode is dropped: its episode was forgotten, suppressed, trimmed or is inactive. The turns
/// come back in conversation order.
fn hold_turns(turns: Vec<ReadTurn>, episodes: &[EpisodeSpan]) -> Vec<ReadTurn> {
    let mut by_conversation: HashMap<Uuid, Vec<&EpisodeSpan>> = HashMap::new();
    for episode in episodes {
        by_conversation
            .entry(episode.conversation_id)
            .or_default()
            .push(episode);
    }
    let mut kept: Vec<ReadTurn> = turns
        .into_iter()
        .filter_map(|mut read| {
            let holder = by_conversation
                .get(&read.turn.conversation_id)
                .into_iter()
                .flatten()
                .copied()
                .filter(|episode| episode.holds(&read.turn))
                // The newest, then the smaller id, so the choice never varies.
                .max_by_key(|episode| (episode.created_at, std::cmp::Reverse(episode.id)));
            read.turn.episode_id = holder.map(|episode| episode.id);
            let readable =
                read.turn.episode_id.is_some() || read.turn.turn_index > read.segmented_through;
            readable.then_some(read)
        })
        .collect();
    kept.sort_by_key(|read| read.turn.key());
    kept
}

#[cfg(feature = "reference")]
/// Splits the statement's rows into the turns it read and the episodes of their conversations.
fn split_rows(rows: Vec<FoundTurnRow>) -> (Vec<ReadTurn>, Vec<EpisodeSpan>) {
    let mut turns = Vec::with_capacity(rows.len());
    let mut episodes = Vec::new();
    for row in rows {
        match row {
            FoundTurnRow {
                conversation_id,
                turn_index: Some(turn_index),
                role: Some(role),
                content: Some(content),
                spoken_at: Some(spoken_at),
                segmented_through: Some(segmented_through),
                word_score,
                vector_score,
                ..
            } => turns.push(ReadTurn {
                turn: StoredTurn {
                    conversation_id,
                    turn_index,
                    role,
                    content,
                    spoken_at,
                    episode_id: None,
                },
                segmented_through,
                word_score,
                vector_score,
            }),
            // An episode without a time span holds no turn.
            FoundTurnRow {
                conversation_id,
                episode_id: Some(id),
                start_at: Some(start_at),
                end_at: Some(end_at),
                created_at: Some(created_at),
                ..
            } => episodes.push(EpisodeSpan {
                id,
                conversation_id,
                start_at,
                end_at,
                created_at,
            }),
            // Neither: no row of the statement is (its turns' columns are never NULL).
            _ => {}
        }
    }
    (turns, episodes)
}

/// A row of `read_turns.sql` (see its parts there).
#[derive(sqlx::FromRow)]
struct SpaceTurnsRow {
    part: i32,
    conversation_id: Option<Uuid>,
    segmented_through: Option<i32>,
    readable: Option<bool>,
    terms: Option<Vec<String>>,
    turn_indexes: Option<Vec<i32>>,
    roles: Option<Vec<String>>,
    contents: Option<Vec<String>>,
    spoken_ats: Option<Vec<DateTime<Utc>>>,
    search_lengths: Option<Vec<i32>>,
    words: Option<String>,
    vector_turns: Option<Vec<i32>>,
    vector_models: Option<Vec<String>>,
    vectors: Option<Vec<u8>>,
    episode_id: Option<Uuid>,
    start_at: Option<DateTime<Utc>>,
    end_at: Option<DateTime<Utc>>,
    created_at: Option<DateTime<Utc>>,
}

/// A conversation of the space: its closed range, and whether it may be read now.
#[derive(Debug, Clone, Copy)]
struct ConversationState {
    segmented_through: i32,
    readable: bool,
}

/// What `read_turns.sql` returned, sorted out.
#[derive(Default)]
struct SpaceRead {
    terms: Vec<String>,
    conversations: HashMap<Uuid, ConversationState>,
    blocks: Vec<scoring::TurnBlock>,
    episodes: Vec<EpisodeSpan>,
}

impl SpaceRead {
    fn from_rows(rows: Vec<SpaceTurnsRow>) -> Self {
        let mut read = SpaceRead::default();
        for row in rows {
            match (row.part, row.conversation_id) {
                (0, _) => read.terms = row.terms.unwrap_or_default(),
                (1, Some(conversation_id)) => {
                    read.conversations.insert(
                        conversation_id,
                        ConversationState {
                            segmented_through: row.segmented_through.unwrap_or(-1),
                            readable: row.readable.unwrap_or(false),
                        },
                    );
                }
                (2 | 3, Some(conversation_id)) => read.blocks.push(scoring::TurnBlock {
                    conversation_id,
                    turn_indexes: row.turn_indexes.unwrap_or_default(),
                    roles: row.roles.unwrap_or_default(),
                    contents: row.contents.unwrap_or_default(),
                    spoken_ats: row.spoken_ats.unwrap_or_default(),
                    search_lengths: row.search_lengths.unwrap_or_default(),
                    words: row.words.unwrap_or_default(),
                    vector_turns: row.vector_turns.unwrap_or_default(),
                    vector_models: row.vector_models.unwrap_or_default(),
                    vectors: row.vectors.unwrap_or_default(),
                }),
                // An episode without a time span holds no turn.
                (4, Some(conversation_id)) => {
                    if let (Some(id), Some(start_at), Some(end_at), Some(created_at)) =
                        (row.episode_id, row.start_at, row.end_at, row.created_at)
                    {
                        read.episodes.push(EpisodeSpan {
                            id,
                            conversation_id,
                            start_at,
                            end_at,
                            created_at,
                        });
                    }
                }
                _ => {}
            }
        }
        read
    }
}

/// The turns `found` and `radius` turns either side of each, once each, as read turns of the
/// conversations that may be read (a neighbour no leg found has no scores).
fn around_found(
    space: &scoring::SpaceTurns,
    conversations: &HashMap<Uuid, ConversationState>,
    found: &[scoring::ScoredTurn],
    radius: i32,
) -> Vec<ReadTurn> {
    let mut wanted: HashMap<TurnKey, (Option<f64>, Option<f64>)> = HashMap::new();
    for hit in found {
        for step in -radius..=radius {
            let turn = TurnKey {
                conversation_id: hit.turn.conversation_id,
                turn_index: hit.turn.turn_index.saturating_add(step),
            };
            let scores = wanted.entry(turn).or_default();
            if step == 0 {
                *scores = (hit.word_score, hit.vector_score);
            }
        }
    }
    wanted
        .into_iter()
        .filter_map(|(turn, (word_score, vector_score))| {
            let state = conversations.get(&turn.conversation_id)?;
            if !state.readable {
                return None;
            }
            let place = space.find(turn)?;
            let block = space.block(place);
            Some(ReadTurn {
                turn: StoredTurn {
                    conversation_id: turn.conversation_id,
                    turn_index: turn.turn_index,
                    role: block.roles.get(place.position)?.clone(),
                    content: block.contents.get(place.position)?.clone(),
                    spoken_at: *block.spoken_ats.get(place.position)?,
                    episode_id: None,
                },
                segmented_through: state.segmented_through,
                word_score,
                vector_score,
            })
        })
        .collect()
}

/// The space's turns that answer `query`: one statement (`read_turns.sql`) reads the space's
/// turns (the closed ones from their blocks, a row per 32 turns of a conversation; the open
/// segments' from the turns) with its conversations and episodes, and the service ranks them
/// ([`scoring`]): Okapi BM25 over each turn's words (N, df and the average length are the
/// space's turns'); where a word matched, the turns nearest the query's turn vector (cosine, the
/// stored vectors at half precision); and every turn found with `radius` turns either side,
/// each with the episode that holds it. Only what the assistant may read comes back: turns of a
/// segment still open, and turns an episode holds (an inactive one only with
/// `include_inactive`). A closed segment's turn whose episode is gone (forgotten, suppressed,
/// trimmed) is left out, as is every turn of a conversation that is incognito now; turns
/// retention or ForgetConversation deleted, or a redaction rewrote, are as the turns are now
/// (the blocks are rebuilt in the transaction that changes them).
pub async fn find_turns(
    pool: &PgPool,
    scope: &Scope,
    query: &str,
    search: TurnSearch<'_>,
) -> Result<FoundTurns, StoreError> {
    let rows = sqlx::query_as::<_, SpaceTurnsRow>(include_str!("turn_search/read_turns.sql"))
        .bind(scope.user_id.as_uuid())
        .bind(scope.space.as_str())
        .bind(query)
        .bind(search.turn_vector.is_some() && search.nearest_limit > 0)
        .bind(search.include_inactive)
        .fetch_all(pool)
        .await?;
    let read = SpaceRead::from_rows(rows);
    let space = scoring::SpaceTurns::new(read.blocks);
    let found = space.rank(&scoring::Ranking {
        bm25: search.bm25,
        terms: &read.terms,
        turn_vector: search.turn_vector,
        limit: usize::try_from(search.limit).unwrap_or(0),
        nearest_limit: usize::try_from(search.nearest_limit).unwrap_or(0),
    });
    let around = around_found(&space, &read.conversations, &found, search.radius.max(0));
    Ok(into_found(hold_turns(around, &read.episodes)))
}

/// The turns kept, as what the legs found: each turn's hits (a NaN score ranks nothing), and
/// the turns in conversation order.
fn into_found(kept: Vec<ReadTurn>) -> FoundTurns {
    let mut found = FoundTurns::default();
    for read in kept {
        let key = read.turn.key();
        let hit = |score: Option<f64>| {
            score
                .filter(|score| score.is_finite())
                .map(|score| TurnHit { turn: key, score })
        };
        found.hits.extend(hit(read.word_score));
        found.nearest.extend(hit(read.vector_score));
        found.stored.push(read.turn);
    }
    found
}

#[cfg(feature = "reference")]
/// The reference the block search is checked against (the `reference` feature: tests only):
/// the statement `find_turns` was before issue 41 moved the scoring into the service, which
/// reads every turn row of the space and ranks in Postgres. The space's turns that answer
/// `query`, in one statement (`find_turns_reference.sql`): Okapi BM25 over
/// each turn's words (N, df and the average length are the space's turns'); where a word
/// matched, the turns nearest the query's turn vector by an exact scan; and every turn found
/// with `radius` turns either side, each with the episode that holds it. Only what the
/// assistant may read comes back: turns of a segment still open, and turns an episode holds
/// (an inactive one only with `include_inactive`). A closed segment's turn whose episode is gone
/// (forgotten, suppressed, trimmed) is left out, as is every turn of a conversation that is
/// incognito now; turns retention or ForgetConversation deleted are simply not there. A NaN
/// score (a cosine against a zero vector) ranks nothing: it is dropped.
pub async fn find_turns_reference(
    pool: &PgPool,
    scope: &Scope,
    query: &str,
    search: TurnSearch<'_>,
) -> Result<FoundTurns, StoreError> {
    let (model, vector) = match search.turn_vector {
        Some((model, vector)) => (model, Some(pgvector::Vector::from(vector.to_vec()))),
        None => ("", None),
    };
    let rows =
        sqlx::query_as::<_, FoundTurnRow>(include_str!("turn_search/find_turns_reference.sql"))
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
    let (turns, episodes) = split_rows(rows);
    Ok(into_found(hold_turns(turns, &episodes)))
}

#[cfg(test)]
mod tests {
    use chrono::TimeZone as _;

    use super::*;

    fn at(minute: u32) -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2026, 11, 20, 9, minute, 0).unwrap()
    }

    fn conversation(n: u128) -> Uuid {
        Uuid::from_u128(n)
    }

    fn turn(
        conversation_id: Uuid,
        turn_index: i32,
        minute: u32,
        segmented_through: i32,
    ) -> ReadTurn {
        ReadTurn {
            turn: StoredTurn {
                conversation_id,
                turn_index,
                role: "user".to_owned(),
                content: format!("turn {turn_index}"),
                spoken_at: at(minute),
                episode_id: None,
            },
            segmented_through,
            word_score: None,
            vector_score: None,
        }
    }

    fn episode(id: u128, conversation_id: Uuid, span: (u32, u32), created: u32) -> EpisodeSpan {
        EpisodeSpan {
            id: Uuid::from_u128(id),
            conversation_id,
            start_at: at(span.0),
            end_at: at(span.1),
            created_at: at(created),
        }
    }

    fn held(kept: &[ReadTurn]) -> Vec<(i32, Option<Uuid>)> {
        kept.iter()
            .map(|read| (read.turn.turn_index, read.turn.episode_id))
            .collect()
    }

    #[test]
    fn a_turn_is_held_by_the_episode_whose_span_holds_it_ends_included() {
        let chat = conversation(1);
        let episodes = [episode(10, chat, (0, 2), 30), episode(11, chat, (3, 5), 31)];
        let kept = hold_turns(
            vec![
                turn(chat, 0, 0, 5),
                turn(chat, 2, 2, 5),
                turn(chat, 4, 4, 5),
            ],
            &episodes,
        );
        assert_eq!(
            held(&kept),
            [
                (0, Some(Uuid::from_u128(10))),
                (2, Some(Uuid::from_u128(10))),
                (4, Some(Uuid::from_u128(11)))
            ]
        );
    }

    #[test]
    fn on_a_shared_boundary_the_newest_episode_holds_the_turn_then_the_smaller_id() {
        let chat = conversation(1);
        let newer = [episode(20, chat, (0, 3), 30), episode(21, chat, (3, 6), 40)];
        assert_eq!(
            held(&hold_turns(vec![turn(chat, 3, 3, 6)], &newer)),
            [(3, Some(Uuid::from_u128(21)))]
        );
        let same_time = [episode(31, chat, (0, 3), 30), episode(30, chat, (3, 6), 30)];
        assert_eq!(
            held(&hold_turns(vec![turn(chat, 3, 3, 6)], &same_time)),
            [(3, Some(Uuid::from_u128(30)))]
        );
    }

    #[test]
    fn an_episode_of_another_conversation_never_holds_a_turn() {
        let (chat, other) = (conversation(1), conversation(2));
        let kept = hold_turns(
            vec![turn(chat, 0, 1, -1)],
            &[episode(10, other, (0, 5), 30)],
        );
        assert_eq!(held(&kept), [(0, None)]);
    }

    #[test]
    fn a_closed_turn_without_an_episode_is_dropped_an_open_one_is_kept() {
        let chat = conversation(1);
        // Turns 0..=3 are segmented; the episode of 0..=1 is there, that of 2..=3 is gone.
        let episodes = [episode(10, chat, (0, 1), 30)];
        let kept = hold_turns(
            vec![
                turn(chat, 1, 1, 3),
                turn(chat, 2, 2, 3),
                turn(chat, 3, 3, 3),
                turn(chat, 4, 4, 3),
            ],
            &episodes,
        );
        assert_eq!(held(&kept), [(1, Some(Uuid::from_u128(10))), (4, None)]);
    }

    #[test]
    fn the_turns_come_back_in_conversation_order() {
        let (first, second) = (conversation(1), conversation(2));
        let kept = hold_turns(
            vec![
                turn(second, 0, 0, -1),
                turn(first, 5, 0, -1),
                turn(first, 2, 0, -1),
            ],
            &[],
        );
        let order: Vec<(Uuid, i32)> = kept
            .iter()
            .map(|read| (read.turn.conversation_id, read.turn.turn_index))
            .collect();
        assert_eq!(order, [(first, 2), (first, 5), (second, 0)]);
    }
}
