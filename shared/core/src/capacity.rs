//! The capacity policy: when a space holds more entries than its soft cap, the entries with the
//! lowest total score are trimmed. The total is relevance + recency + importance, with relevance 0
//! outside a retrieval and recency = exp(−Δt/τ). Cached scores (`last_scores`) are used while
//! fresh and recomputed first when missing or stale. Pinned and manually saved entries are never
//! trimmed; the plan reports when one of them would have been a victim, so operators are alerted.

use chrono::{DateTime, Duration, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// exp(−age/τ) in [0, 1] for any input: a negative age (a timestamp from the future) counts as
/// 0, and very old entries decay to exactly 0 instead of a subnormal number. The SQL of the soft
/// cap computes the same value and must not call `exp` below [`MIN_DECAY_EXPONENT`]: Postgres
/// raises "value out of range: underflow" there, which once made every write into a space with
/// a 14-year-old entry fail.
pub fn exponential_decay(age: f64, tau: f64) -> f64 {
    if age.is_nan() || age <= 0.0 {
        return 1.0;
    }
    if tau.is_nan() || tau <= 0.0 {
        return 0.0;
    }
    let exponent = -age / tau;
    if exponent.is_nan() || exponent < MIN_DECAY_EXPONENT {
        0.0
    } else {
        exponent.exp()
    }
}

/// Below this exponent exp() is under 1e-304 and counts as 0 (float8 `exp` underflows at about
/// −708 in Postgres; f64 goes subnormal there).
pub const MIN_DECAY_EXPONENT: f64 = -700.0;

/// Tunables of the retention policy.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RetentionPolicy {
    /// Recency time constant τ.
    pub recency_tau: Duration,
    /// Cached scores older than this are recomputed before they are used.
    pub score_staleness: Duration,
}

impl Default for RetentionPolicy {
    fn default() -> Self {
        Self {
            recency_tau: Duration::days(7),
            score_staleness: Duration::hours(24),
        }
    }
}

/// The score breakdown cached on an entry as `last_scores`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Scores {
    pub relevance: f64,
    pub recency: f64,
    pub importance: f64,
    pub total: f64,
    pub computed_at: DateTime<Utc>,
}

/// How old cached scores may get before a retrieval that returns the entry rewrites them. A
/// rewrite is cheap but not free; the capacity policy only needs scores fresher than a day, and a
/// higher total than the cached one is always written, so the best relevance an entry showed is
/// kept.
pub const SCORES_REFRESH: std::time::Duration = std::time::Duration::from_secs(3600);

impl RetentionPolicy {
    /// exp(−Δt/τ); an entry from the future (clock skew) counts as brand new.
    pub fn recency(&self, created_at: DateTime<Utc>, now: DateTime<Utc>) -> f64 {
        let age_seconds = (now - created_at).num_milliseconds() as f64 / 1000.0;
        let tau_seconds = self.recency_tau.num_milliseconds() as f64 / 1000.0;
        exponential_decay(age_seconds, tau_seconds)
    }

    /// Scores without a query: relevance 0, so total = recency + importance.
    pub fn scores_without_query(
        &self,
        created_at: DateTime<Utc>,
        importance: f64,
        now: DateTime<Utc>,
    ) -> Scores {
        let recency = self.recency(created_at, now);
        Scores {
            relevance: 0.0,
            recency,
            importance,
            total: recency + importance,
            computed_at: now,
        }
    }

    pub fn is_stale(&self, scores: &Scores, now: DateTime<Utc>) -> bool {
        now - scores.computed_at > self.score_staleness
    }
}

/// What the trim policy needs to know about one entry of the space.
#[derive(Debug, Clone, PartialEq)]
pub struct TrimCandidate {
    pub id: Uuid,
    pub created_at: DateTime<Utc>,
    pub importance: f64,
    pub pinned: bool,
    pub manually_saved: bool,
    pub last_scores: Option<Scores>,
}

impl TrimCandidate {
    fn is_protected(&self) -> bool {
        self.pinned || self.manually_saved
    }
}

/// The outcome of planning a trim.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct TrimPlan {
    /// Entries whose cached scores were missing or stale, with their recomputed scores.
    pub rescored: Vec<(Uuid, Scores)>,
    /// Entries to delete, lowest total first.
    pub victims: Vec<Uuid>,
    /// Protected (pinned or manually saved) entries that would have been victims had they not
    /// been protected: each one is an alert.
    pub protected_would_be_victims: Vec<Uuid>,
}

/// Plans which entries to trim so that the space sheds `overage` entries.
///
/// Ordering is by cached total ascending, then older first, then id, so a plan is deterministic.
/// If fewer unprotected entries exist than the overage, all of them go and the space stays over
/// its cap: protected entries are never removed.
pub fn plan_trim(
    entries: &[TrimCandidate],
    overage: usize,
    now: DateTime<Utc>,
    policy: &RetentionPolicy,
) -> TrimPlan {
    let mut plan = TrimPlan::default();
    if overage == 0 {
        return plan;
    }
    let mut ranked: Vec<(&TrimCandidate, f64)> = entries
        .iter()
        .map(|entry| {
            let scores = match entry.last_scores {
                Some(scores) if !policy.is_stale(&scores, now) => scores,
                _ => {
                    let fresh =
                        policy.scores_without_query(entry.created_at, entry.importance, now);
                    plan.rescored.push((entry.id, fresh));
                    fresh
                }
            };
            (entry, scores.total)
        })
        .collect();
    ranked.sort_by(|(a, a_total), (b, b_total)| {
        a_total
            .total_cmp(b_total)
            .then(a.created_at.cmp(&b.created_at))
            .then(a.id.cmp(&b.id))
    });

    plan.protected_would_be_victims = ranked
        .iter()
        .take(overage)
        .filter(|(entry, _)| entry.is_protected())
        .map(|(entry, _)| entry.id)
        .collect();
    plan.victims = ranked
        .iter()
        .filter(|(entry, _)| !entry.is_protected())
        .take(overage)
        .map(|(entry, _)| entry.id)
        .collect();
    plan
}

#[cfg(test)]
mod tests {
    use super::*;

    fn now() -> DateTime<Utc> {
        DateTime::parse_from_rfc3339("2026-01-10T12:00:00Z")
            .unwrap()
            .with_timezone(&Utc)
    }

    fn entry(n: u128, age_days: i64, importance: f64) -> TrimCandidate {
        TrimCandidate {
            id: Uuid::from_u128(n),
            created_at: now() - Duration::days(age_days),
            importance,
            pinned: false,
            manually_saved: false,
            last_scores: None,
        }
    }

    #[test]
    fn recency_decays_with_a_seven_day_time_constant() {
        let policy = RetentionPolicy::default();
        assert!((policy.recency(now(), now()) - 1.0).abs() < 1e-12);
        let week_old = policy.recency(now() - Duration::days(7), now());
        assert!((week_old - (-1.0f64).exp()).abs() < 1e-9);
        assert_eq!(policy.recency(now() + Duration::hours(1), now()), 1.0);
    }

    #[test]
    fn trims_the_lowest_totals() {
        let entries = vec![
            entry(1, 30, 0.2),
            entry(2, 0, 0.2),
            entry(3, 30, 0.9),
            entry(4, 60, 0.1),
        ];
        let plan = plan_trim(&entries, 2, now(), &RetentionPolicy::default());
        assert_eq!(plan.victims, vec![Uuid::from_u128(4), Uuid::from_u128(1)]);
        assert_eq!(plan.rescored.len(), 4, "no entry had cached scores");
        assert!(plan.protected_would_be_victims.is_empty());
    }

    #[test]
    fn pinned_and_saved_entries_are_never_trimmed_but_raise_an_alert() {
        let mut pinned = entry(1, 90, 0.0);
        pinned.pinned = true;
        let mut saved = entry(2, 90, 0.0);
        saved.manually_saved = true;
        let entries = vec![pinned, saved, entry(3, 10, 0.3), entry(4, 0, 0.3)];
        let plan = plan_trim(&entries, 1, now(), &RetentionPolicy::default());
        assert_eq!(plan.victims, vec![Uuid::from_u128(3)]);
        assert_eq!(plan.protected_would_be_victims, vec![Uuid::from_u128(1)]);
    }

    #[test]
    fn never_trims_protected_entries_even_when_short_of_victims() {
        let mut pinned = entry(1, 90, 0.0);
        pinned.pinned = true;
        let plan = plan_trim(
            &[pinned, entry(2, 0, 0.5)],
            2,
            now(),
            &RetentionPolicy::default(),
        );
        assert_eq!(plan.victims, vec![Uuid::from_u128(2)]);
    }

    #[test]
    fn fresh_cached_scores_are_used_and_stale_ones_recomputed() {
        let policy = RetentionPolicy::default();
        let mut cached_low = entry(1, 0, 0.9);
        cached_low.last_scores = Some(Scores {
            relevance: 0.0,
            recency: 0.0,
            importance: 0.0,
            total: 0.01,
            computed_at: now() - Duration::hours(1),
        });
        let mut stale = entry(2, 0, 0.9);
        stale.last_scores = Some(Scores {
            total: 0.0,
            computed_at: now() - Duration::hours(25),
            ..cached_low.last_scores.unwrap()
        });
        let plan = plan_trim(&[cached_low, stale, entry(3, 3, 0.5)], 1, now(), &policy);
        // The fresh cached total (0.01) wins over everything recomputed.
        assert_eq!(plan.victims, vec![Uuid::from_u128(1)]);
        let rescored: Vec<Uuid> = plan.rescored.iter().map(|(id, _)| *id).collect();
        assert_eq!(rescored, vec![Uuid::from_u128(2), Uuid::from_u128(3)]);
        let (_, stale_scores) = plan.rescored[0];
        assert!(
            (stale_scores.total - 1.9).abs() < 1e-9,
            "recency 1 + importance 0.9"
        );
        assert_eq!(stale_scores.relevance, 0.0);
    }

    #[test]
    fn no_overage_no_plan() {
        assert_eq!(
            plan_trim(&[entry(1, 0, 0.1)], 0, now(), &RetentionPolicy::default()),
            TrimPlan::default()
        );
    }
}
