//! The two ranking profiles, applied to fused candidates.
//!
//! - `fsrs` (the retrieve-memory API): an episode scores rrf × retrievability, the FSRS
//!   probability that it is still remembered; a semantic fact scores rrf (facts do not decay).
//! - `triscore` (the theoria policy): α·relevance + β·freshness + γ·importance, with freshness
//!   an episode's FSRS retrievability (as in `fsrs`: it fades with time and comes back with
//!   reviews) and, for what FSRS does not model, recency exp(−Δt/τ); the stored importance; and
//!   relevance a convex combination of both legs' own scores (`relevance`): w·BM25/best BM25 +
//!   (1 − w)·cosine/best cosine among the candidates, times `question_weight` for a fact that is
//!   itself a question and `other_speaker_weight` for a line of a transcript said by someone the
//!   query does not name when it names a speaker (`crate::speaker`).
//!
//! Relevance used to be the cosine alone: on multi-session dialogs that threw the BM25 evidence
//! away once candidates were found and ranked 11 points of recall@10 below plain BM25 (issue 23).
//! It was then the candidate's rrf over the best rrf; ranks forget by how much one entry beat the
//! next, and the scores themselves ranked the dialogs' turns 5 points of recall@10 higher still
//! (docs/eval/README.md). Questions are discounted because in a conversation the question is
//! rarely where the answer is, yet it shares the asker's words: "What are their names?" used to
//! outrank "meet Toby, our pup" for "What are the names of Andrew's dogs?".
//!
//! Every candidate gets the whole breakdown whatever the profile, so a response can say why an
//! entry ranked where it did, and the cached `last_scores` stay on the capacity policy's scale.

use chrono::{DateTime, NaiveDate, NaiveTime, Utc};

use crate::capacity::{Scores, exponential_decay};
use crate::memory_state::{days_since, retrievability};

mod settings;
pub use settings::{
    DEFAULT_CANDIDATES_PER_LEG, DEFAULT_PROFILE, MAX_CANDIDATES_PER_LEG, MIN_CANDIDATES_PER_LEG,
    RANKING_SETTINGS, RankingParams, RankingSetting,
};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RankingProfile {
    Fsrs,
    Triscore,
}

impl RankingProfile {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Fsrs => "fsrs",
            Self::Triscore => "triscore",
        }
    }

    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "fsrs" => Some(Self::Fsrs),
            "triscore" => Some(Self::Triscore),
            _ => None,
        }
    }
}

/// What the two legs say of one candidate: the sparse leg's score (BM25, or trigram similarity
/// or recency on its fallbacks), `None` when it did not find the candidate; and the cosine of the
/// candidate's embedding to the query's, `None` when either is missing.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct LegEvidence {
    pub sparse: Option<f64>,
    pub cosine: Option<f64>,
}

/// The best score each leg gave among the candidates ranked together: relevance's scale, so that
/// the best match of each leg counts 1 whatever the leg's units.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct LegScale {
    pub best_sparse: f64,
    pub best_cosine: f64,
}

impl LegScale {
    pub fn of<'a>(evidence: impl IntoIterator<Item = &'a LegEvidence>) -> Self {
        let best = |current: f64, value: Option<f64>| match value {
            Some(value) if value.is_finite() => current.max(value),
            _ => current,
        };
        evidence
            .into_iter()
            .fold(Self::default(), |scale, evidence| Self {
                best_sparse: best(scale.best_sparse, evidence.sparse),
                best_cosine: best(scale.best_cosine, evidence.cosine),
            })
    }
}

/// triscore's relevance on [0, 1] before the question weight: `sparse_weight` × the sparse score
/// over the best one, plus the rest × the cosine over the best cosine (a negative cosine counts
/// 0). A leg that scored no candidate above 0 (the embedder is down, no word matched) leaves its
/// weight to the other, so the best candidate of a one-legged search still has relevance 1.
pub fn relevance(evidence: &LegEvidence, scale: &LegScale, sparse_weight: f64) -> f64 {
    let part = |value: Option<f64>, best: f64| {
        (best > 0.0 && best.is_finite()).then(|| unit_interval(value.unwrap_or(0.0) / best))
    };
    let sparse_weight = unit_interval(sparse_weight);
    match (
        part(evidence.sparse, scale.best_sparse),
        part(evidence.cosine, scale.best_cosine),
    ) {
        (Some(sparse), Some(cosine)) => sparse_weight * sparse + (1.0 - sparse_weight) * cosine,
        (Some(only), None) | (None, Some(only)) => only,
        (None, None) => 0.0,
    }
}

/// Whether an entry's text is a question: it ends with a question mark (ASCII or full-width),
/// closing quotes and brackets aside.
pub fn is_question(text: &str) -> bool {
    text.trim_end_matches(|c: char| {
        c.is_whitespace() || matches!(c, '"' | '\'' | ')' | ']' | '”' | '’' | '」' | '』' | '）')
    })
    .ends_with(['?', '？'])
}

/// The days a query asks about (`when::query_window`), as instants: from the start of the first
/// day to the end of the last.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TimeWindow {
    pub from: DateTime<Utc>,
    /// Exclusive: the start of the day after the last.
    pub until: DateTime<Utc>,
}

impl TimeWindow {
    pub fn of_days(first: NaiveDate, last: NaiveDate) -> Self {
        let start = |day: NaiveDate| day.and_time(NaiveTime::MIN).and_utc();
        Self {
            from: start(first),
            until: last.succ_opt().map_or(DateTime::<Utc>::MAX_UTC, start),
        }
    }

    /// Whether something that took place from `start` to `end` (the same instant for a moment)
    /// falls in the window, wholly or in part.
    pub fn overlaps(&self, start: DateTime<Utc>, end: DateTime<Utc>) -> bool {
        start < self.until && end >= self.from
    }
}

/// What ranking needs to know about a candidate besides its fusion result.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CandidateFacts {
    pub created_at: DateTime<Utc>,
    /// When what the entry tells took place: an episode's first to last turn; for a fact or a
    /// turn, the moment it was said or became valid.
    pub took_place: (DateTime<Utc>, DateTime<Utc>),
    pub importance: f64,
    /// Stability, difficulty and last review of an episode.
    pub fsrs: Option<(f64, f64, DateTime<Utc>)>,
    /// The entry is a fact whose text is a question (`is_question`); episodes never are.
    pub is_question: bool,
    /// The entry is a fact, a line of a speaker other than those the query names
    /// (`NamedSpeakers::spoken_by_another`); episodes never are.
    pub spoken_by_another: bool,
    /// The entry was written from the conversation the request names.
    pub from_request_conversation: bool,
}

/// How much more an entry of the request's own conversation counts (its total times 1 + this).
/// The whole space is always searched, so an episode of another session that holds the answer
/// is found; among entries that answer about as well, the conversation's own come first (ahead
/// of entries of other sessions whose score is up to a quarter higher). Not chosen on the
/// development set, whose questions name no conversation.
pub const REQUEST_CONVERSATION_BOOST: f64 = 0.25;

/// Why a candidate scored what it did.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct ScoreParts {
    pub rrf: f64,
    /// FSRS retrievability (episodes); 1 for facts.
    pub retrievability: f64,
    pub relevance: f64,
    pub recency: f64,
    pub importance: f64,
    /// Whether the entry took place in the days the query names.
    pub time_match: bool,
    /// The ranking profile's score.
    pub total: f64,
}

impl ScoreParts {
    /// The scores cached on the entry: relevance + recency + importance, the scale on which the
    /// capacity policy compares entries, whichever profile ranked this request.
    pub fn cached(&self, computed_at: DateTime<Utc>) -> Scores {
        Scores {
            relevance: self.relevance,
            recency: self.recency,
            importance: self.importance,
            total: self.relevance + self.recency + self.importance,
            computed_at,
        }
    }
}

/// exp(−Δt/τ) with Δt in days; an entry from the future counts as new.
pub fn recency(created_at: DateTime<Utc>, now: DateTime<Utc>, tau_days: f64) -> f64 {
    exponential_decay(days_since(created_at, now), tau_days)
}

/// A score part on the unit interval; a value that is not a number (a relevance from an rrf that
/// is not finite, a stored importance or state out of range) counts as 0 rather than poisoning
/// the ordering and the cache.
fn unit_interval(value: f64) -> f64 {
    if value.is_finite() {
        value.clamp(0.0, 1.0)
    } else {
        0.0
    }
}

/// A finite product or sum of finite parts stays finite, but the weights and the rrf come from
/// requests and configuration; a total that is not finite ranks last.
fn finite_or_zero(value: f64) -> f64 {
    if value.is_finite() { value } else { 0.0 }
}

/// Scores one candidate by its fused score `rrf` (the `fsrs` profile) and its `relevance` from
/// both legs (the function of that name; `triscore`); `window` the days the query names, if it
/// names any.
pub fn score(
    rrf: f64,
    relevance: f64,
    facts: &CandidateFacts,
    params: &RankingParams,
    now: DateTime<Utc>,
    window: Option<&TimeWindow>,
) -> ScoreParts {
    let retrievability = match facts.fsrs {
        Some((stability, difficulty, last_reviewed_at)) => unit_interval(retrievability(
            stability,
            difficulty,
            days_since(last_reviewed_at, now),
        )),
        None => 1.0,
    };
    // Each discount applies only where its condition holds.
    let weight = |applies: bool, weight: f64| if applies { unit_interval(weight) } else { 1.0 };
    let relevance = unit_interval(relevance)
        * weight(facts.is_question, params.question_weight)
        * weight(facts.spoken_by_another, params.other_speaker_weight);
    let recency = recency(facts.created_at, now, params.recency_tau_days);
    // How fresh an entry is for triscore: an episode's FSRS retrievability, which fades with time
    // and comes back with the reviews that found it useful; recency for what FSRS does not model
    // (facts do not decay). Added, not multiplied into relevance: a product let a months-old
    // episode's relevance count for half a fact's, so facts crowded out the episodes that held
    // the answer (docs/eval/README.md).
    let freshness = if facts.fsrs.is_some() {
        retrievability
    } else {
        recency
    };
    let importance = unit_interval(facts.importance);
    let time_match =
        window.is_some_and(|window| window.overlaps(facts.took_place.0, facts.took_place.1));
    let time_factor = if time_match {
        1.0 + params.time_match_boost
    } else {
        1.0
    };
    let conversation_factor = if facts.from_request_conversation {
        1.0 + REQUEST_CONVERSATION_BOOST
    } else {
        1.0
    };
    let total = finite_or_zero(
        time_factor
            * conversation_factor
            * match params.profile {
                RankingProfile::Fsrs => rrf * retrievability,
                RankingProfile::Triscore => {
                    params.alpha * relevance + params.beta * freshness + params.gamma * importance
                }
            },
    );
    ScoreParts {
        rrf,
        retrievability,
        relevance,
        recency,
        importance,
        time_match,
        total,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::Duration;

    /// A plain fact said at `at`, of middling importance: what each test varies starts here.
    fn fact_said_at(at: DateTime<Utc>) -> CandidateFacts {
        CandidateFacts {
            created_at: at,
            took_place: (at, at),
            importance: 0.5,
            fsrs: None,
            is_question: false,
            spoken_by_another: false,
            from_request_conversation: false,
        }
    }

    #[test]
    fn the_request_conversations_own_entries_come_first_among_near_equals() {
        let now = Utc::now();
        let params = RankingParams {
            profile: RankingProfile::Triscore,
            alpha: 4.0,
            ..RankingParams::default()
        };
        let elsewhere = fact_said_at(now);
        let here = CandidateFacts {
            from_request_conversation: true,
            ..elsewhere
        };
        let own = score(0.02, 0.45, &here, &params, now, None);
        let other = score(0.02, 0.5, &elsewhere, &params, now, None);
        assert!(own.total > other.total, "{own:?} {other:?}");
        // A much better answer from another session still wins.
        let better = score(0.02, 1.0, &elsewhere, &params, now, None);
        assert!(better.total > own.total, "{better:?} {own:?}");
    }

    #[test]
    fn fsrs_profile_discounts_faded_episodes_but_not_facts() {
        let now = Utc::now();
        let params = RankingParams {
            profile: RankingProfile::Fsrs,
            ..RankingParams::default()
        };
        let fresh = CandidateFacts {
            fsrs: Some((2.0, 5.0, now)),
            ..fact_said_at(now)
        };
        let faded = CandidateFacts {
            fsrs: Some((2.0, 5.0, now - Duration::days(60))),
            ..fresh
        };
        let fact = CandidateFacts {
            fsrs: None,
            ..faded
        };
        let fresh = score(0.03, 1.0, &fresh, &params, now, None);
        let faded = score(0.03, 1.0, &faded, &params, now, None);
        let fact = score(0.03, 1.0, &fact, &params, now, None);
        assert!((fresh.total - 0.03).abs() < 1e-9);
        assert!(faded.total < 0.03 * 0.7, "{faded:?}");
        assert_eq!(fact.total, 0.03);
    }

    #[test]
    fn triscore_weighs_fused_relevance_recency_and_importance() {
        let now = Utc::now();
        let params = RankingParams {
            profile: RankingProfile::Triscore,
            alpha: 2.0,
            beta: 1.0,
            gamma: 0.5,
            recency_tau_days: 7.0,
            ..RankingParams::default()
        };
        let facts = CandidateFacts {
            importance: 0.6,
            ..fact_said_at(now - Duration::days(7))
        };
        let parts = score(0.02, 0.5, &facts, &params, now, None);
        assert!(
            (parts.relevance - 0.5).abs() < 1e-12,
            "relevance is the fused score over the best one"
        );
        assert!((parts.recency - (-1.0f64).exp()).abs() < 1e-9, "one τ old");
        let expected = 2.0 * 0.5 + (-1.0f64).exp() + 0.5 * 0.6;
        assert!((parts.total - expected).abs() < 1e-9);
        let cached = parts.cached(now);
        assert!((cached.total - (0.5 + (-1.0f64).exp() + 0.6)).abs() < 1e-9);
    }

    #[test]
    fn triscore_ranks_a_match_of_both_legs_above_a_closer_cosine_alone() {
        // "Toby, our pup" found by BM25 (its best match) and the vector leg (cosine 0.55) against
        // a question the vector leg liked best (0.71) and BM25 did not find: the fused evidence
        // wins.
        let now = Utc::now();
        let params = RankingParams {
            profile: RankingProfile::Triscore,
            sparse_weight: 0.3,
            ..RankingParams::default()
        };
        let facts = fact_said_at(now);
        let both = LegEvidence {
            sparse: Some(4.0),
            cosine: Some(0.55),
        };
        let cosine_only = LegEvidence {
            sparse: None,
            cosine: Some(0.71),
        };
        let scale = LegScale::of([&both, &cosine_only]);
        assert_eq!(
            scale,
            LegScale {
                best_sparse: 4.0,
                best_cosine: 0.71
            }
        );
        let relevance_of = |evidence| relevance(evidence, &scale, params.sparse_weight);
        let both = score(0.75, relevance_of(&both), &facts, &params, now, None);
        let cosine_only = score(0.5, relevance_of(&cosine_only), &facts, &params, now, None);
        assert!((both.relevance - (0.3 + 0.7 * 0.55 / 0.71)).abs() < 1e-12);
        assert!((cosine_only.relevance - 0.7).abs() < 1e-12);
        assert!(both.total > cosine_only.total, "{both:?} {cosine_only:?}");
    }

    #[test]
    fn a_leg_that_scored_nothing_leaves_its_weight_to_the_other() {
        // The embedder is down: no cosines; BM25 alone decides, and its best match counts 1.
        let bm25_only = [
            LegEvidence {
                sparse: Some(6.0),
                cosine: None,
            },
            LegEvidence {
                sparse: Some(3.0),
                cosine: None,
            },
        ];
        let scale = LegScale::of(&bm25_only);
        assert_eq!(relevance(&bm25_only[0], &scale, 0.3), 1.0);
        assert_eq!(relevance(&bm25_only[1], &scale, 0.3), 0.5);
        // No word matched: the cosines decide; a negative cosine counts 0.
        let vector_only = [
            LegEvidence {
                sparse: None,
                cosine: Some(0.4),
            },
            LegEvidence {
                sparse: None,
                cosine: Some(-0.2),
            },
        ];
        let scale = LegScale::of(&vector_only);
        assert_eq!(relevance(&vector_only[0], &scale, 0.3), 1.0);
        assert_eq!(relevance(&vector_only[1], &scale, 0.3), 0.0);
        assert_eq!(
            relevance(&LegEvidence::default(), &LegScale::default(), 0.3),
            0.0
        );
    }

    /// triscore with relevance alone: what a relevance weight does shows in the total.
    fn triscore_by_relevance() -> RankingParams {
        RankingParams {
            profile: RankingProfile::Triscore,
            alpha: 4.0,
            beta: 0.0,
            gamma: 0.0,
            ..RankingParams::default()
        }
    }

    #[test]
    fn a_question_is_discounted_by_the_question_weight() {
        let now = Utc::now();
        let params = RankingParams {
            question_weight: 0.8,
            ..triscore_by_relevance()
        };
        let answer = fact_said_at(now);
        let asked = CandidateFacts {
            is_question: true,
            ..answer
        };
        // The question shares more of the query's words, but asks rather than tells.
        let question = score(0.5, 1.0, &asked, &params, now, None);
        let answer = score(0.5, 0.9, &answer, &params, now, None);
        assert!((question.relevance - 0.8).abs() < 1e-12);
        assert!(answer.total > question.total, "{answer:?} {question:?}");
        // The fsrs profile ranks by rrf alone, as the retrieve-memory API defines it.
        let fsrs = RankingParams {
            profile: RankingProfile::Fsrs,
            ..params
        };
        assert_eq!(score(0.5, 1.0, &asked, &fsrs, now, None).total, 0.5);
    }

    #[test]
    fn a_line_of_a_speaker_the_query_does_not_name_is_discounted() {
        let now = Utc::now();
        let params = RankingParams {
            other_speaker_weight: 0.7,
            ..triscore_by_relevance()
        };
        let own = fact_said_at(now);
        let echo = CandidateFacts {
            spoken_by_another: true,
            ..own
        };
        // "Clara: Wow, Jonas! What breed?" echoes the name the query asks about; Jonas's own
        // line tells the breed with fewer of its words.
        let echoed = score(0.5, 1.0, &echo, &params, now, None);
        let told = score(0.5, 0.8, &own, &params, now, None);
        assert!((echoed.relevance - 0.7).abs() < 1e-12);
        assert!(told.total > echoed.total, "{told:?} {echoed:?}");
        // Both discounts apply to a question of the other speaker's.
        let asked = CandidateFacts {
            is_question: true,
            ..echo
        };
        let both = RankingParams {
            question_weight: 0.5,
            ..params
        };
        assert!((score(0.5, 1.0, &asked, &both, now, None).relevance - 0.35).abs() < 1e-12);
    }

    #[test]
    fn questions_are_told_by_their_closing_mark() {
        for text in [
            "Maria: What are their names?",
            "Did you get the dog? ",
            "He asked \"are you coming?\"",
            "你明天去上海吗？",
            "(is it Tuesday?)",
        ] {
            assert!(is_question(text), "{text}");
        }
        for text in [
            "Andrew: meet Toby, our pup!",
            "Why? Because the lease ended.",
            "",
            "?!",
        ] {
            assert!(!is_question(text), "{text}");
        }
    }

    #[test]
    fn triscore_counts_an_episodes_retrievability_as_its_freshness_not_against_its_relevance() {
        let now = Utc::now();
        let episode = CandidateFacts {
            took_place: (now - Duration::days(61), now - Duration::days(60)),
            fsrs: Some((2.0, 5.0, now - Duration::days(60))),
            ..fact_said_at(now - Duration::days(60))
        };
        // Relevance alone: a faded episode is as relevant as it is.
        let relevance_only = RankingParams {
            profile: RankingProfile::Triscore,
            alpha: 1.0,
            beta: 0.0,
            gamma: 0.0,
            ..RankingParams::default()
        };
        let parts = score(0.03, 0.8, &episode, &relevance_only, now, None);
        assert!(parts.retrievability < 0.7);
        assert!((parts.total - 0.8).abs() < 1e-9, "{parts:?}");
        // Freshness alone: the episode's retrievability, a fact's recency.
        let freshness_only = RankingParams {
            profile: RankingProfile::Triscore,
            alpha: 0.0,
            beta: 1.0,
            gamma: 0.0,
            ..RankingParams::default()
        };
        let parts = score(0.03, 0.8, &episode, &freshness_only, now, None);
        assert!(
            (parts.total - parts.retrievability).abs() < 1e-9,
            "{parts:?}"
        );
        let fact = fact_said_at(now - Duration::days(60));
        let parts = score(0.03, 0.8, &fact, &freshness_only, now, None);
        assert!((parts.total - parts.recency).abs() < 1e-9, "{parts:?}");
        assert!((parts.retrievability - 1.0).abs() < 1e-9);
    }

    #[test]
    fn an_entry_from_the_days_the_query_names_is_boosted() {
        let now = Utc::now();
        let params = RankingParams {
            profile: RankingProfile::Triscore,
            time_match_boost: 0.5,
            ..RankingParams::default()
        };
        let march = TimeWindow::of_days(
            NaiveDate::from_ymd_opt(2026, 3, 1).unwrap(),
            NaiveDate::from_ymd_opt(2026, 3, 31).unwrap(),
        );
        let at = |text: &str| {
            DateTime::parse_from_rfc3339(text)
                .unwrap()
                .with_timezone(&Utc)
        };
        let said = |start: &str, end: &str| CandidateFacts {
            took_place: (at(start), at(end)),
            ..fact_said_at(now)
        };
        let in_march = said("2026-03-31T23:59:59Z", "2026-03-31T23:59:59Z");
        let in_april = said("2026-04-01T00:00:00Z", "2026-04-01T00:00:00Z");
        // An episode from late February into March took place partly in March.
        let across = said("2026-02-27T10:00:00Z", "2026-03-02T10:00:00Z");
        let plain = score(0.02, 0.5, &in_march, &params, now, None);
        let matched = score(0.02, 0.5, &in_march, &params, now, Some(&march));
        assert!(matched.time_match && !plain.time_match);
        assert!((matched.total - 1.5 * plain.total).abs() < 1e-9);
        assert!(!score(0.02, 0.5, &in_april, &params, now, Some(&march)).time_match);
        assert!(score(0.02, 0.5, &across, &params, now, Some(&march)).time_match);
        // No boost configured: the match is noted, the score unchanged.
        let unboosted = RankingParams {
            time_match_boost: 0.0,
            ..params
        };
        let noted = score(0.02, 0.5, &in_march, &unboosted, now, Some(&march));
        assert!(noted.time_match);
        assert_eq!(noted.total, plain.total);
    }
}
