//! Scoring a space's turns in the service (issue 41): `read_turns.sql` returns every turn of the
//! space in blocks (a row per 32 turns of a conversation) and this module ranks them as the
//! statement before it did in Postgres: Okapi BM25 over the turns' words (N, df and the average
//! length are the space's turns'), and, when a word matched, the turns nearest the query's turn
//! vector by cosine. Pure: no I/O.

use std::cmp::Ordering;

use chrono::{DateTime, Utc};
use half::slice::HalfFloatSliceExt as _;
use uuid::Uuid;

use super::TurnKey;
use crate::retrieval::Bm25;

/// Turns of one conversation as stored in a block (or its open segment in the same shape): the
/// arrays run in parallel, one element a turn, in turn order.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct TurnBlock {
    pub conversation_id: Uuid,
    pub turn_indexes: Vec<i32>,
    pub roles: Vec<String>,
    pub contents: Vec<String>,
    pub spoken_ats: Vec<DateTime<Utc>>,
    pub search_lengths: Vec<i32>,
    /// A line a turn: its words, each followed by how often it occurs ("knee 2 physio 1").
    pub words: String,
    /// The turns that have a turn vector, its model, and the vectors (`halfvec_send` of each
    /// unit vector, one after the other).
    pub vector_turns: Vec<i32>,
    pub vector_models: Vec<String>,
    pub vectors: Vec<u8>,
}

impl TurnBlock {
    fn first_turn(&self) -> i32 {
        self.turn_indexes.first().copied().unwrap_or(i32::MAX)
    }
}

/// A turn found, with the score of each leg that found it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct ScoredTurn {
    pub turn: TurnKey,
    pub word_score: Option<f64>,
    pub vector_score: Option<f64>,
}

/// What to rank the turns by.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Ranking<'a> {
    pub bm25: Bm25,
    /// The query's words (as `engram_search_words` makes them).
    pub terms: &'a [String],
    /// The query's turn vector and the model it belongs to: the vector leg (none without it).
    pub turn_vector: Option<(&'a str, &'a [f32])>,
    /// Turns the word leg keeps.
    pub limit: usize,
    /// Turns the vector leg keeps.
    pub nearest_limit: usize,
}

/// The space's turns, sorted by conversation and turn so a turn is found by binary search.
#[derive(Debug, Default)]
pub(crate) struct SpaceTurns {
    blocks: Vec<TurnBlock>,
}

/// Where a turn is: its block and its place in the block's arrays.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TurnPlace {
    pub block: usize,
    pub position: usize,
}

impl SpaceTurns {
    pub(crate) fn new(mut blocks: Vec<TurnBlock>) -> Self {
        blocks.retain(|block| !block.turn_indexes.is_empty());
        blocks.sort_by_key(|block| (block.conversation_id, block.first_turn()));
        Self { blocks }
    }

    pub(crate) fn block(&self, place: TurnPlace) -> &TurnBlock {
        &self.blocks[place.block]
    }

    /// Where `turn` is, if the space holds it.
    pub(crate) fn find(&self, turn: TurnKey) -> Option<TurnPlace> {
        // The last block of the conversation that starts at or before the turn.
        let after = self.blocks.partition_point(|block| {
            (block.conversation_id, block.first_turn()) <= (turn.conversation_id, turn.turn_index)
        });
        let block = after.checked_sub(1)?;
        let candidate = &self.blocks[block];
        if candidate.conversation_id != turn.conversation_id {
            return None;
        }
        let position = candidate
            .turn_indexes
            .binary_search(&turn.turn_index)
            .ok()?;
        Some(TurnPlace { block, position })
    }

    /// The turns either leg finds, in no particular order: the `limit` best by BM25, then, when
    /// any word matched, the `nearest_limit` nearest by cosine (a turn both found once, with
    /// both scores).
    pub(crate) fn rank(&self, ranking: &Ranking<'_>) -> Vec<ScoredTurn> {
        let word_hits = self.word_hits(ranking);
        let nearest = match ranking.turn_vector {
            Some((model, vector)) if !word_hits.is_empty() && ranking.nearest_limit > 0 => {
                self.nearest(model, vector, ranking.nearest_limit)
            }
            _ => Vec::new(),
        };
        let mut found: Vec<ScoredTurn> = word_hits
            .into_iter()
            .map(|(turn, score)| ScoredTurn {
                turn,
                word_score: Some(score),
                vector_score: None,
            })
            .collect();
        for (turn, score) in nearest {
            match found.iter_mut().find(|found| found.turn == turn) {
                Some(both) => both.vector_score = Some(score),
                None => found.push(ScoredTurn {
                    turn,
                    word_score: None,
                    vector_score: Some(score),
                }),
            }
        }
        found
    }

    /// Okapi BM25 of every turn holding a word of the query, the best `limit` (ties by
    /// conversation, then turn).
    fn word_hits(&self, ranking: &Ranking<'_>) -> Vec<(TurnKey, f64)> {
        if ranking.terms.is_empty() || ranking.limit == 0 {
            return Vec::new();
        }
        let mut documents = 0usize;
        let mut total_length = 0i64;
        // (turn, its length, which term, how often).
        let mut postings: Vec<(TurnKey, f64, usize, f64)> = Vec::new();
        for block in &self.blocks {
            documents += block.turn_indexes.len();
            total_length += block
                .search_lengths
                .iter()
                .map(|&l| i64::from(l))
                .sum::<i64>();
            for (position, line) in block.words.split('\n').enumerate() {
                let (Some(&turn_index), Some(&length)) = (
                    block.turn_indexes.get(position),
                    block.search_lengths.get(position),
                ) else {
                    break;
                };
                let mut tokens = line.split(' ');
                while let (Some(word), Some(count)) = (tokens.next(), tokens.next()) {
                    let Some(term) = ranking.terms.iter().position(|term| term == word) else {
                        continue;
                    };
                    let frequency: f64 = count.parse().unwrap_or(0.0);
                    let turn = TurnKey {
                        conversation_id: block.conversation_id,
                        turn_index,
                    };
                    postings.push((turn, f64::from(length), term, frequency));
                }
            }
        }
        if postings.is_empty() {
            return Vec::new();
        }
        let documents = documents as f64;
        let average_length = total_length as f64 / documents;
        let mut document_frequency = vec![0.0f64; ranking.terms.len()];
        for &(_, _, term, _) in &postings {
            document_frequency[term] += 1.0;
        }
        let Bm25 { k1, b } = ranking.bm25;
        // Postings come turn by turn, so a turn's are next to each other.
        let mut hits: Vec<(TurnKey, f64)> = Vec::new();
        for (turn, length, term, frequency) in postings {
            let df = document_frequency[term];
            let idf = (1.0 + (documents - df + 0.5) / (df + 0.5)).ln();
            let score = idf * frequency * (k1 + 1.0)
                / (frequency + k1 * (1.0 - b + b * length / average_length.max(1.0)));
            match hits.last_mut() {
                Some((last, sum)) if *last == turn => *sum += score,
                _ => hits.push((turn, score)),
            }
        }
        keep_best(hits, ranking.limit)
    }

    /// The `limit` turns whose vectors of `model` are nearest `query` by cosine (ties by
    /// conversation, then turn). None when the query's vector is zero.
    fn nearest(&self, model: &str, query: &[f32], limit: usize) -> Vec<(TurnKey, f64)> {
        let query_norm = query.iter().map(|x| x * x).sum::<f32>().sqrt();
        if query_norm == 0.0 || !query_norm.is_finite() {
            return Vec::new();
        }
        let unit: Vec<f32> = query.iter().map(|x| x / query_norm).collect();
        let mut halves: Vec<half::f16> = Vec::with_capacity(query.len());
        let mut vector: Vec<f32> = vec![0.0; query.len()];
        let mut scored: Vec<(TurnKey, f64)> = Vec::new();
        for block in &self.blocks {
            let mut rest = block.vectors.as_slice();
            for (turn_index, vector_model) in block.vector_turns.iter().zip(&block.vector_models) {
                let Some((dimensions, values)) = next_half_vector(&mut rest) else {
                    break;
                };
                if vector_model != model || dimensions != query.len() {
                    continue;
                }
                halves.clear();
                halves.extend(
                    values
                        .chunks_exact(2)
                        .map(|bits| half::f16::from_bits(u16::from_be_bytes([bits[0], bits[1]]))),
                );
                halves.convert_to_f32_slice(&mut vector);
                let (dot, norm) = vector
                    .iter()
                    .zip(&unit)
                    .fold((0.0f32, 0.0f32), |(dot, norm), (v, q)| {
                        (dot + v * q, norm + v * v)
                    });
                if norm == 0.0 {
                    continue;
                }
                let cosine = f64::from(dot) / f64::from(norm).sqrt();
                if cosine.is_finite() {
                    scored.push((
                        TurnKey {
                            conversation_id: block.conversation_id,
                            turn_index: *turn_index,
                        },
                        cosine,
                    ));
                }
            }
        }
        keep_best(scored, limit)
    }
}

/// The next vector of a `halfvec_send` sequence: its dimension count and its values' bytes.
fn next_half_vector<'a>(rest: &mut &'a [u8]) -> Option<(usize, &'a [u8])> {
    let header = rest.get(..4)?;
    let dimensions = usize::from(u16::from_be_bytes([header[0], header[1]]));
    let values = rest.get(4..4 + 2 * dimensions)?;
    *rest = &rest[4 + 2 * dimensions..];
    Some((dimensions, values))
}

/// The `limit` best of `scored` (highest score first, ties by conversation then turn).
fn keep_best(mut scored: Vec<(TurnKey, f64)>, limit: usize) -> Vec<(TurnKey, f64)> {
    let order = |a: &(TurnKey, f64), b: &(TurnKey, f64)| {
        b.1.partial_cmp(&a.1)
            .unwrap_or(Ordering::Equal)
            .then_with(|| a.0.cmp(&b.0))
    };
    if scored.len() > limit {
        scored.select_nth_unstable_by(limit, order);
        scored.truncate(limit);
    }
    scored.sort_by(order);
    scored
}

#[cfg(test)]
mod tests {
    use chrono::TimeZone as _;

    use super::*;

    const BM25: Bm25 = Bm25 { k1: 1.2, b: 0.75 };

    fn half_vector(values: &[f32]) -> Vec<u8> {
        let norm = values.iter().map(|x| x * x).sum::<f32>().sqrt();
        let mut bytes = Vec::new();
        bytes.extend_from_slice(&(values.len() as u16).to_be_bytes());
        bytes.extend_from_slice(&[0, 0]);
        for value in values {
            bytes.extend_from_slice(&half::f16::from_f32(value / norm).to_bits().to_be_bytes());
        }
        bytes
    }

    /// A block of `lines` (words and counts), turns numbered from `first`, each with length 4
    /// and the given vectors (by position).
    fn block(
        conversation: u128,
        first: i32,
        lines: &[&str],
        vectors: &[(usize, &[f32])],
    ) -> TurnBlock {
        let count = lines.len();
        TurnBlock {
            conversation_id: Uuid::from_u128(conversation),
            turn_indexes: (first..first + count as i32).collect(),
            roles: vec!["user".to_owned(); count],
            contents: lines.iter().map(|line| (*line).to_owned()).collect(),
            spoken_ats: vec![Utc.with_ymd_and_hms(2026, 12, 1, 9, 0, 0).unwrap(); count],
            search_lengths: vec![4; count],
            words: lines.join("\n"),
            vector_turns: vectors
                .iter()
                .map(|(position, _)| first + *position as i32)
                .collect(),
            vector_models: vec!["m".to_owned(); vectors.len()],
            vectors: vectors
                .iter()
                .flat_map(|(_, values)| half_vector(values))
                .collect(),
        }
    }

    fn key(conversation: u128, turn_index: i32) -> TurnKey {
        TurnKey {
            conversation_id: Uuid::from_u128(conversation),
            turn_index,
        }
    }

    fn terms(words: &[&str]) -> Vec<String> {
        words.iter().map(|word| (*word).to_owned()).collect()
    }

    #[test]
    fn bm25_matches_the_formula_over_the_whole_space() {
        let space = SpaceTurns::new(vec![
            block(1, 0, &["knee 2 physio 1", "weather 1"], &[]),
            block(2, 0, &["knee 1", ""], &[]),
        ]);
        let terms = terms(&["knee"]);
        let found = space.word_hits(&Ranking {
            bm25: BM25,
            terms: &terms,
            turn_vector: None,
            limit: 10,
            nearest_limit: 0,
        });
        // N = 4 turns, df = 2, every length 4 (the average too).
        let idf = (1.0f64 + (4.0 - 2.0 + 0.5) / (2.0 + 0.5)).ln();
        let score = |f: f64| idf * f * 2.2 / (f + 1.2);
        assert_eq!(found.len(), 2);
        assert_eq!(found[0].0, key(1, 0));
        assert!((found[0].1 - score(2.0)).abs() < 1e-12);
        assert_eq!(found[1].0, key(2, 0));
        assert!((found[1].1 - score(1.0)).abs() < 1e-12);
    }

    #[test]
    fn equal_scores_rank_by_conversation_then_turn_and_the_limit_keeps_the_first() {
        let space = SpaceTurns::new(vec![
            block(2, 0, &["knee 1"], &[]),
            block(1, 32, &["knee 1", "knee 1"], &[]),
        ]);
        let terms = terms(&["knee"]);
        let ranking = Ranking {
            bm25: BM25,
            terms: &terms,
            turn_vector: None,
            limit: 2,
            nearest_limit: 0,
        };
        let found: Vec<TurnKey> = space
            .word_hits(&ranking)
            .into_iter()
            .map(|(turn, _)| turn)
            .collect();
        assert_eq!(found, [key(1, 32), key(1, 33)]);
    }

    #[test]
    fn the_vector_leg_runs_only_when_a_word_matched_and_ranks_by_cosine() {
        let space = SpaceTurns::new(vec![block(
            1,
            0,
            &["knee 1", "race 1", "lunch 1"],
            &[
                (0, &[1.0, 0.0, 0.0]),
                (1, &[0.9, 0.1, 0.0]),
                (2, &[0.0, 0.0, 3.0]),
            ],
        )]);
        let query = [1.0f32, 0.0, 0.0];
        let knee = terms(&["knee"]);
        let ranking = |terms| Ranking {
            bm25: BM25,
            terms,
            turn_vector: Some(("m", &query[..])),
            limit: 5,
            nearest_limit: 2,
        };
        let found = space.rank(&ranking(&knee));
        assert_eq!(found.len(), 2);
        assert_eq!(found[0].turn, key(1, 0));
        assert!(found[0].word_score.is_some());
        assert!((found[0].vector_score.unwrap() - 1.0).abs() < 1e-3);
        assert_eq!(found[1].turn, key(1, 1));
        assert_eq!(found[1].word_score, None);
        let cosine = 0.9 / (0.81f64 + 0.01).sqrt();
        assert!((found[1].vector_score.unwrap() - cosine).abs() < 1e-3);
        assert!(space.rank(&ranking(&terms(&["absent"]))).is_empty());
    }

    #[test]
    fn another_models_vectors_and_a_zero_query_find_nothing() {
        let space = SpaceTurns::new(vec![block(1, 0, &["knee 1"], &[(0, &[1.0, 0.0])])]);
        assert!(space.nearest("other", &[1.0, 0.0], 5).is_empty());
        assert!(space.nearest("m", &[0.0, 0.0], 5).is_empty());
        assert_eq!(space.nearest("m", &[0.0, 2.0], 5).len(), 1);
    }

    #[test]
    fn a_turn_is_found_by_conversation_and_index_across_blocks() {
        let space = SpaceTurns::new(vec![
            block(1, 32, &["a 1", "b 1"], &[]),
            block(1, 0, &["c 1"], &[]),
            block(2, 0, &["d 1"], &[]),
        ]);
        let place = space.find(key(1, 33)).unwrap();
        assert_eq!(space.block(place).turn_indexes[place.position], 33);
        assert!(space.find(key(1, 1)).is_none());
        assert!(space.find(key(1, 34)).is_none());
        assert!(space.find(key(3, 0)).is_none());
        assert_eq!(space.find(key(2, 0)).map(|place| place.position), Some(0));
    }
}
