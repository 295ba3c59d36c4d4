//! FSRS memory state of episodic memories: retrievability now, from stability and the days since
//! the last review (the fsrs crate's FSRS-6 forgetting curve).

use chrono::{DateTime, Utc};

/// Days between the last review and `now`, never negative.
pub fn days_since(last_reviewed_at: DateTime<Utc>, now: DateTime<Utc>) -> f64 {
    ((now - last_reviewed_at).num_milliseconds().max(0) as f64) / 86_400_000.0
}

/// The stability range FSRS-6 itself keeps to (days): stored values outside it (an import from
/// another system, say) are read as its nearest end, so the forgetting curve never divides by
/// zero or overflows `f32`.
pub const STABILITY_RANGE: std::ops::RangeInclusive<f64> = 0.001..=36_500.0;
pub const DIFFICULTY_RANGE: std::ops::RangeInclusive<f64> = 1.0..=10.0;

/// Probability of recall after `days_elapsed` for a memory of this stability and difficulty, in
/// [0, 1] whatever the inputs (a value that is not a number reads as the range's lower end).
pub fn retrievability(stability: f64, difficulty: f64, days_elapsed: f64) -> f64 {
    let within = |value: f64, range: &std::ops::RangeInclusive<f64>| {
        if value.is_nan() {
            *range.start()
        } else {
            value.clamp(*range.start(), *range.end())
        }
    };
    let days = if days_elapsed.is_finite() {
        days_elapsed.max(0.0)
    } else if days_elapsed == f64::INFINITY {
        f64::from(f32::MAX)
    } else {
        0.0
    };
    let state = fsrs::MemoryState {
        stability: within(stability, &STABILITY_RANGE) as f32,
        difficulty: within(difficulty, &DIFFICULTY_RANGE) as f32,
    };
    let recall = f64::from(fsrs::current_retrievability(
        state,
        days.min(f64::from(f32::MAX)) as f32,
        fsrs::FSRS6_DEFAULT_DECAY,
    ));
    if recall.is_finite() {
        recall.clamp(0.0, 1.0)
    } else {
        0.0
    }
}

/// Retention FSRS schedules for.
pub const DESIRED_RETENTION: f32 = 0.9;

/// Surprise of an episode when nothing can be compared with it (no embedder, no earlier episode).
pub const NEUTRAL_SURPRISE: f64 = 0.5;

/// Surprise of a new episode measured with embeddings: 1 − its highest cosine to the space's
/// earlier episodes (how unlike anything remembered it is), or neutral with nothing to compare.
pub fn surprise_from_similarity(highest_similarity: Option<f64>) -> f64 {
    match highest_similarity {
        Some(similarity) if similarity.is_finite() => (1.0 - similarity).clamp(0.0, 1.0),
        _ => NEUTRAL_SURPRISE,
    }
}

/// The state of a new episode: FSRS-6's first "Good" review (fresh, not yet reinforced), with the
/// stability boosted by surprise (`S * (1 + 0.5 * surprise)`) so surprising episodes fade slower.
/// Returns (stability, difficulty).
pub fn initial_state(surprise: f64) -> (f64, f64) {
    let good = fsrs::FSRS::new(&fsrs::DEFAULT_PARAMETERS)
        .and_then(|model| model.next_states(None, DESIRED_RETENTION, 0))
        .map(|states| states.good.memory);
    // The default parameters are valid, so this cannot fail; the published value stands in.
    let (stability, difficulty) = match good {
        Ok(state) => (f64::from(state.stability), f64::from(state.difficulty)),
        Err(_) => (2.3065, 2.1181),
    };
    (
        stability * (1.0 + 0.5 * surprise.clamp(0.0, 1.0)),
        difficulty,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn new_episodes_start_from_a_good_review_boosted_by_surprise() {
        let (plain, difficulty) = initial_state(0.0);
        assert!((plain - 2.3065).abs() < 1e-3, "{plain}");
        assert!((1.0..=10.0).contains(&difficulty), "{difficulty}");
        let (surprising, _) = initial_state(1.0);
        assert!((surprising - plain * 1.5).abs() < 1e-9);
    }

    #[test]
    fn surprise_is_how_unlike_the_nearest_earlier_episode() {
        assert!((surprise_from_similarity(Some(0.8)) - 0.2).abs() < 1e-12);
        // A negative cosine is as unlike as it gets; nothing to compare with is neutral.
        assert_eq!(surprise_from_similarity(Some(-0.3)), 1.0);
        assert_eq!(surprise_from_similarity(Some(1.0)), 0.0);
        assert_eq!(surprise_from_similarity(None), NEUTRAL_SURPRISE);
        assert_eq!(surprise_from_similarity(Some(f64::NAN)), NEUTRAL_SURPRISE);
    }

    /// Reference values of FSRS-6 for S = 2.3065 (a new memory rated Good at retention 0.9).
    #[test]
    fn matches_the_published_forgetting_curve() {
        for (days, expected) in [(1.0, 0.9468), (7.0, 0.8083), (30.0, 0.6675)] {
            let actual = retrievability(2.3065, 5.0, days);
            assert!(
                (actual - expected).abs() < 5e-4,
                "{days} days: {actual} vs {expected}"
            );
        }
        assert!((retrievability(2.3065, 5.0, 0.0) - 1.0).abs() < 1e-6);
    }

    #[test]
    fn days_since_is_fractional_and_never_negative() {
        let now = Utc::now();
        assert!((days_since(now - chrono::Duration::hours(36), now) - 1.5).abs() < 1e-9);
        assert_eq!(days_since(now + chrono::Duration::hours(1), now), 0.0);
    }
}
