//! Review: how useful a retrieved memory really was, and what that does to its FSRS state.
//!
//! When a conversation segment closes, every memory retrieval handed the assistant during it is
//! graded Again / Hard / Good / Easy (by an LLM, or by [`grade`]), and the grade moves the
//! memory's stability and difficulty through FSRS-6 ([`next_state`]). Retrieval never changes
//! FSRS state; only review does, so memories that help become easier to retrieve and noise fades.
//!
//! The local grader judges from what the assistant said: the highest cosine similarity of the
//! memory (title and summary) to the assistant's turns, and the share of the memory's salient
//! terms found in them. Their weighted sum, the evidence of use, makes a memory Easy or Good above
//! two thresholds; below them, a memory that was at least on the conversation's topic (close to
//! some turn, the user's included) or shows some use is Hard, and anything else Again. The
//! thresholds were calibrated on a labelled set (tests/eval/review, docs/eval/review.md).

use std::collections::HashSet;

use uuid::Uuid;

use crate::episode::content_terms;

/// How useful a memory was in the conversation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Rating {
    /// Noise: not used at all.
    Again,
    /// Tangential: related, but needed real inference to connect, or not used.
    Hard,
    /// Directly relevant: the assistant visibly used it.
    Good,
    /// A core pillar of the conversation.
    Easy,
}

impl Rating {
    pub const ALL: [Rating; 4] = [Rating::Again, Rating::Hard, Rating::Good, Rating::Easy];

    pub fn as_str(self) -> &'static str {
        match self {
            Rating::Again => "again",
            Rating::Hard => "hard",
            Rating::Good => "good",
            Rating::Easy => "easy",
        }
    }

    /// Reads a rating as a grader writes it (any case, surrounding space ignored).
    pub fn parse(raw: &str) -> Option<Self> {
        let raw = raw.trim();
        Self::ALL
            .into_iter()
            .find(|rating| rating.as_str().eq_ignore_ascii_case(raw))
    }
}

/// A memory to grade, with every query that retrieved it during the segment (how often it came
/// back is a signal for the grader, not a rule).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReviewTarget {
    pub memory_id: Uuid,
    pub queries: Vec<String>,
}

/// Deduplicates the memories of a segment's pending reviews, keeping for each the distinct
/// queries that retrieved it, in the order they were first seen.
pub fn aggregate<'a>(
    reviews: impl IntoIterator<Item = (&'a str, &'a [Uuid])>,
) -> Vec<ReviewTarget> {
    let mut targets: Vec<ReviewTarget> = Vec::new();
    for (query, ids) in reviews {
        for id in ids {
            match targets.iter_mut().find(|target| target.memory_id == *id) {
                Some(target) => {
                    if !target.queries.iter().any(|known| known == query) {
                        target.queries.push(query.to_owned());
                    }
                }
                None => targets.push(ReviewTarget {
                    memory_id: *id,
                    queries: vec![query.to_owned()],
                }),
            }
        }
    }
    targets
}

/// Stability and difficulty of a memory.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FsrsState {
    pub stability: f64,
    pub difficulty: f64,
}

/// The FSRS-6 state after a review rated `rating`, `days_elapsed` days after the last one
/// (`current` is `None` for a memory never reviewed), scheduling for `desired_retention`.
pub fn next_state(
    current: Option<FsrsState>,
    rating: Rating,
    days_elapsed: u32,
    desired_retention: f32,
) -> Result<FsrsState, String> {
    let model = fsrs::FSRS::new(&fsrs::DEFAULT_PARAMETERS).map_err(|e| e.to_string())?;
    let current = current.map(|state| fsrs::MemoryState {
        stability: state.stability.clamp(
            *crate::memory_state::STABILITY_RANGE.start(),
            *crate::memory_state::STABILITY_RANGE.end(),
        ) as f32,
        difficulty: state.difficulty.clamp(
            *crate::memory_state::DIFFICULTY_RANGE.start(),
            *crate::memory_state::DIFFICULTY_RANGE.end(),
        ) as f32,
    });
    let states = model
        .next_states(current, desired_retention, days_elapsed)
        .map_err(|e| e.to_string())?;
    let next = match rating {
        Rating::Again => states.again.memory,
        Rating::Hard => states.hard.memory,
        Rating::Good => states.good.memory,
        Rating::Easy => states.easy.memory,
    };
    Ok(FsrsState {
        stability: f64::from(next.stability),
        difficulty: f64::from(next.difficulty),
    })
}

/// What the local grader measures of one memory in one segment.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct GradeSignals {
    /// Highest cosine similarity of the memory to one of the assistant's turns (0 without
    /// embeddings).
    pub similarity: f64,
    /// Share of the memory's salient terms that the assistant's turns contain.
    pub overlap: f64,
    /// Highest cosine similarity of the memory to any turn of the conversation, the user's
    /// included: whether it was on the topic at all.
    pub topic: f64,
}

/// The local grader's bands: evidence of use from `easy` is Easy, from `good` Good; below, from
/// `hard` (some use) or with the topic from `topic` (on the subject, unused) Hard; else Again.
/// `overlap_weight` is the overlap's share of the evidence.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GraderThresholds {
    pub hard: f64,
    pub good: f64,
    pub easy: f64,
    pub overlap_weight: f64,
    pub topic: f64,
}

impl GradeSignals {
    pub fn evidence(&self, thresholds: &GraderThresholds) -> f64 {
        let weight = thresholds.overlap_weight.clamp(0.0, 1.0);
        (1.0 - weight) * self.similarity.clamp(0.0, 1.0) + weight * self.overlap.clamp(0.0, 1.0)
    }
}

/// The local grade of a memory from its signals.
pub fn grade(signals: &GradeSignals, thresholds: &GraderThresholds) -> Rating {
    let evidence = signals.evidence(thresholds);
    if evidence >= thresholds.easy {
        Rating::Easy
    } else if evidence >= thresholds.good {
        Rating::Good
    } else if evidence >= thresholds.hard || signals.topic >= thresholds.topic {
        Rating::Hard
    } else {
        Rating::Again
    }
}

/// Words a memory's summary uses for the user, whom the assistant calls "you".
const ABOUT_THE_USER: &[&str] = &["user", "users", "user's", "用户"];

/// Salient terms reduced to their stems (English Snowball; CJK bigrams as they are), so that
/// "running" meets "run" and "injuries" meets "injury".
fn stems(text: &str) -> HashSet<String> {
    static STEMMER: std::sync::LazyLock<rust_stemmers::Stemmer> = std::sync::LazyLock::new(|| {
        rust_stemmers::Stemmer::create(rust_stemmers::Algorithm::English)
    });
    content_terms(text)
        .into_iter()
        .filter(|term| !ABOUT_THE_USER.contains(&term.as_str()))
        .map(|term| STEMMER.stem(&term).into_owned())
        .collect()
}

/// The stemmed salient terms of what was said, computed once for every memory graded against it.
#[derive(Debug, Clone, Default)]
pub struct SaidTerms(HashSet<String>);

impl SaidTerms {
    pub fn of(said: &str) -> Self {
        Self(stems(said))
    }

    /// Share of the memory's salient terms (title and summary) found among these, compared by
    /// stem; 0 when the memory has none.
    pub fn overlap(&self, memory: &str) -> f64 {
        let memory_terms = stems(memory);
        if memory_terms.is_empty() {
            return 0.0;
        }
        let found = memory_terms
            .iter()
            .filter(|term| self.0.contains(*term))
            .count();
        found as f64 / memory_terms.len() as f64
    }
}

/// Share of the memory's salient terms (title and summary) that `said` contains, compared by
/// stem; 0 when the memory has none. Grading many memories against one text: [`SaidTerms`].
pub fn term_overlap(memory: &str, said: &str) -> f64 {
    SaidTerms::of(said).overlap(memory)
}

#[cfg(test)]
mod tests {
    use super::*;

    const THRESHOLDS: GraderThresholds = GraderThresholds {
        hard: 0.2,
        good: 0.4,
        easy: 0.6,
        overlap_weight: 0.5,
        topic: 0.5,
    };

    #[test]
    fn ratings_read_as_graders_write_them() {
        assert_eq!(Rating::parse(" Easy "), Some(Rating::Easy));
        assert_eq!(Rating::parse("AGAIN"), Some(Rating::Again));
        assert_eq!(Rating::parse("great"), None);
    }

    #[test]
    fn memories_are_deduplicated_with_every_query_that_found_them() {
        let a = Uuid::from_u128(1);
        let b = Uuid::from_u128(2);
        let targets = aggregate([
            ("rust progress", &[a, b][..]),
            ("programming preferences", &[b][..]),
            ("rust progress", &[b][..]),
        ]);
        assert_eq!(
            targets,
            [
                ReviewTarget {
                    memory_id: a,
                    queries: vec!["rust progress".into()]
                },
                ReviewTarget {
                    memory_id: b,
                    queries: vec!["rust progress".into(), "programming preferences".into()]
                },
            ]
        );
    }

    #[test]
    fn easy_strengthens_more_than_good_more_than_hard_more_than_again() {
        let current = Some(FsrsState {
            stability: 2.3065,
            difficulty: 5.0,
        });
        let after: Vec<f64> = Rating::ALL
            .iter()
            .map(|rating| next_state(current, *rating, 1, 0.9).unwrap().stability)
            .collect();
        // Published FSRS-6 values from S = 2.3065, D = 5 after one day.
        for (actual, expected) in after.iter().zip([0.5420, 4.3414, 5.6901, 8.6436]) {
            assert!((actual - expected).abs() < 1e-3, "{after:?}");
        }
        let fresh = next_state(None, Rating::Good, 0, 0.9).unwrap();
        assert!((fresh.stability - 2.3065).abs() < 1e-3);
    }

    #[test]
    fn the_grade_follows_the_evidence_bands() {
        let grade_of = |similarity, overlap, topic| {
            grade(
                &GradeSignals {
                    similarity,
                    overlap,
                    topic,
                },
                &THRESHOLDS,
            )
        };
        assert_eq!(grade_of(0.1, 0.0, 0.1), Rating::Again);
        assert_eq!(
            grade_of(0.1, 0.0, 0.6),
            Rating::Hard,
            "on the topic, unused"
        );
        assert_eq!(grade_of(0.3, 0.2, 0.3), Rating::Hard);
        assert_eq!(grade_of(0.5, 0.4, 0.5), Rating::Good);
        assert_eq!(grade_of(0.7, 0.7, 0.7), Rating::Easy);
    }

    #[test]
    fn overlap_counts_the_memorys_salient_terms_in_what_was_said() {
        let memory = "Knee injury: the user tore a meniscus while running";
        assert!(term_overlap(memory, "How is the knee? Still no running?") >= 0.4);
        assert_eq!(term_overlap(memory, "Let us plan the holiday"), 0.0);
        assert_eq!(term_overlap("", "anything"), 0.0);
        assert!(term_overlap("用户在学习日语", "你的日语学习怎么样了？") > 0.3);
    }
}
