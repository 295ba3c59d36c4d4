//! The scoring and capacity rules driven with the extremes that stored data and requests can
//! hold: timestamps from year 1 to year 9999 (imports from other systems, clocks far ahead),
//! stabilities from the smallest to the largest positive float, fused scores that are not numbers.
//! Every rule must answer, with every score part finite and within its range.

use chrono::{DateTime, Duration, Utc};
use engram_core::capacity::{RetentionPolicy, Scores, TrimCandidate, exponential_decay, plan_trim};
use engram_core::memory_state::retrievability;
use engram_core::retrieval::ranking::{
    CandidateFacts, LegEvidence, LegScale, RankingParams, RankingProfile, TimeWindow, recency,
    relevance, score,
};
use proptest::prelude::*;
use uuid::Uuid;

/// 0001-01-01T00:00:00Z and 9999-12-31T23:59:59Z: what a request's timestamp may hold.
const FIRST_SECOND: i64 = -62_135_596_800;
const LAST_SECOND: i64 = 253_402_300_799;

fn any_timestamp() -> impl Strategy<Value = DateTime<Utc>> {
    prop_oneof![
        Just(FIRST_SECOND),
        Just(LAST_SECOND),
        Just(0),
        FIRST_SECOND..=LAST_SECOND,
        // Around now, where most data is.
        1_700_000_000i64..1_900_000_000,
    ]
    .prop_map(|seconds| DateTime::from_timestamp(seconds, 0).expect("in chrono's range"))
}

/// Any f64, the awkward ones included.
fn any_float() -> impl Strategy<Value = f64> {
    prop_oneof![
        Just(f64::NAN),
        Just(f64::INFINITY),
        Just(f64::NEG_INFINITY),
        Just(0.0),
        Just(-0.0),
        Just(f64::MIN_POSITIVE),
        Just(f64::MAX),
        Just(1e-300),
        any::<f64>(),
        -2.0..2.0f64,
    ]
}

fn unit() -> impl Strategy<Value = f64> {
    prop_oneof![Just(0.0), Just(1.0), 0.0..=1.0f64]
}

fn trim_candidate(n: u128) -> impl Strategy<Value = TrimCandidate> {
    (
        any_timestamp(),
        unit(),
        any::<bool>(),
        any::<bool>(),
        proptest::option::of((any_timestamp(), -10.0..10.0f64)),
    )
        .prop_map(
            move |(created_at, importance, pinned, manually_saved, cached)| TrimCandidate {
                id: Uuid::from_u128(n),
                created_at,
                importance,
                pinned,
                manually_saved,
                last_scores: cached.map(|(computed_at, total)| Scores {
                    relevance: 0.0,
                    recency: 0.0,
                    importance,
                    total,
                    computed_at,
                }),
            },
        )
}

fn space() -> impl Strategy<Value = Vec<TrimCandidate>> {
    (0usize..12).prop_flat_map(|n| {
        (0..n)
            .map(|i| trim_candidate(i as u128 + 1))
            .collect::<Vec<_>>()
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2_000))]

    #[test]
    fn decay_is_a_number_between_0_and_1(age in any_float(), tau in any_float()) {
        let decay = exponential_decay(age, tau);
        prop_assert!((0.0..=1.0).contains(&decay), "exp(-{age}/{tau}) = {decay}");
    }

    #[test]
    fn the_capacity_policy_plans_any_space(
        entries in space(),
        overage in 0usize..14,
        now in any_timestamp(),
        tau_days in prop_oneof![Just(1e-6f64), Just(7.0), Just(36_500.0), 1e-3..1e5f64],
    ) {
        let policy = RetentionPolicy {
            recency_tau: Duration::milliseconds((tau_days * 86_400_000.0).max(1.0) as i64),
            score_staleness: Duration::hours(24),
        };
        let plan = plan_trim(&entries, overage, now, &policy);
        for (_, scores) in &plan.rescored {
            prop_assert!((0.0..=1.0).contains(&scores.recency), "{scores:?}");
            prop_assert!((0.0..=2.0).contains(&scores.total), "{scores:?}");
        }
        let trimmable = entries.iter().filter(|e| !e.pinned && !e.manually_saved).count();
        prop_assert_eq!(plan.victims.len(), overage.min(trimmable));
        for victim in &plan.victims {
            let entry = entries.iter().find(|e| e.id == *victim).expect("a victim is an entry");
            prop_assert!(!entry.pinned && !entry.manually_saved, "protected entry trimmed");
        }
    }

    #[test]
    fn recall_is_a_probability_for_any_stored_state(
        stability in any_float(),
        difficulty in any_float(),
        days in any_float(),
    ) {
        let recall = retrievability(stability, difficulty, days);
        prop_assert!((0.0..=1.0).contains(&recall), "R({stability}, {difficulty}, {days}) = {recall}");
    }

    #[test]
    fn ranking_scores_every_candidate_within_range(
        created_at in any_timestamp(),
        last_reviewed_at in any_timestamp(),
        now in any_timestamp(),
        importance in unit(),
        relevance in any_float(),
        is_question in any::<bool>(),
        spoken_by_another in any::<bool>(),
        relevance_weights in (unit(), unit(), unit()),
        stability in any_float(),
        difficulty in any_float(),
        episode in any::<bool>(),
        rrf in 0.0..=1.0f64,
        triscore in any::<bool>(),
        weights in (0.0..=100.0f64, 0.0..=100.0f64, 0.0..=100.0f64),
        tau_days in 0.01..=3_650.0f64,
        boost in 0.0..=10.0f64,
        window_start in any_timestamp(),
    ) {
        let facts = CandidateFacts {
            created_at,
            took_place: (created_at, created_at),
            importance,
            fsrs: episode.then_some((stability, difficulty, last_reviewed_at)),
            is_question,
            spoken_by_another,
            from_request_conversation: episode,
        };
        let params = RankingParams {
            profile: if triscore { RankingProfile::Triscore } else { RankingProfile::Fsrs },
            alpha: weights.0,
            beta: weights.1,
            gamma: weights.2,
            recency_tau_days: tau_days,
            time_match_boost: boost,
            sparse_weight: relevance_weights.0,
            question_weight: relevance_weights.1,
            other_speaker_weight: relevance_weights.2,
            ..RankingParams::default()
        };
        let day = window_start.date_naive();
        let window = TimeWindow::of_days(day, day);
        let parts = score(rrf, relevance, &facts, &params, now, Some(&window));
        for (name, part) in [
            ("retrievability", parts.retrievability),
            ("relevance", parts.relevance),
            ("recency", parts.recency),
            ("importance", parts.importance),
        ] {
            prop_assert!((0.0..=1.0).contains(&part), "{name} = {part} in {parts:?}");
        }
        prop_assert!(parts.total.is_finite() && parts.total >= 0.0, "{parts:?}");
        let cached = parts.cached(now);
        prop_assert!((0.0..=3.0).contains(&cached.total), "{cached:?}");
        prop_assert!((0.0..=1.0).contains(&recency(created_at, now, tau_days)));
    }
}

proptest! {
    #[test]
    fn relevance_stays_on_the_unit_interval(
        evidence in prop::collection::vec(
            (prop::option::of(any_float()), prop::option::of(any_float())),
            0..8,
        ),
        sparse_weight in any_float(),
    ) {
        let evidence: Vec<LegEvidence> = evidence
            .into_iter()
            .map(|(sparse, cosine)| LegEvidence { sparse, cosine })
            .collect();
        let scale = LegScale::of(&evidence);
        for candidate in &evidence {
            let value = relevance(candidate, &scale, sparse_weight);
            prop_assert!((0.0..=1.0).contains(&value), "{value} for {candidate:?} at {scale:?}");
        }
    }
}
