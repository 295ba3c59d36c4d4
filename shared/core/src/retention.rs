//! Data retention: how long a space keeps what it holds, and when an entry has become inactive.
//! (Not the soft cap: `capacity::RetentionPolicy` ranks entries when a space is full; this
//! deletes by age and disuse whatever the space's size.)
//!
//! A space's policy has four rules, each in days and each off at 0:
//! - raw conversation turns are deleted `turn_days` after their segment closed (the episode,
//!   the summarized form, stays);
//! - entries neither pinned nor saved are deleted at `max_age_days`;
//! - entries unused for `inactive_after_days` become inactive (left out of retrieval unless a
//!   request asks for them), and are deleted once inactive for `inactive_grace_days`.
//!
//! "Unused" ([`InactivityRule`]): an episode's FSRS retrievability has stayed below a threshold,
//! and no retrieval returned it, for the whole period. Facts have no review signal, so for them
//! it is: no retrieval returned it and no write repeated it for the period, and its importance
//! is low (a fact the user said with weight, or said again, does not fade). Pinned and saved
//! entries are never inactive and never deleted by retention.

use chrono::{DateTime, Duration, Utc};

use crate::memory_state::retrievability;

/// The longest any rule may be: a hundred years.
pub const MAX_RETENTION_DAYS: u32 = 36_500;

/// A space's retention rules in force, in days; `None`: the rule is off.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DataRetention {
    pub turn_days: Option<u32>,
    pub max_age_days: Option<u32>,
    pub inactive_after_days: Option<u32>,
    /// With inactivity off, nothing becomes inactive, so this matters only beside it.
    pub inactive_grace_days: Option<u32>,
}

/// One rule as a space stores it: `None` follows the service default, `Some(0)` is off.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RetentionOverrides {
    pub turn_days: Option<u32>,
    pub max_age_days: Option<u32>,
    pub inactive_after_days: Option<u32>,
    pub inactive_grace_days: Option<u32>,
}

impl RetentionOverrides {
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }

    /// The rules in force: the space's value where it set one, the default elsewhere.
    pub fn resolve(&self, defaults: &RetentionOverrides) -> DataRetention {
        let rule =
            |own: Option<u32>, default: Option<u32>| own.or(default).filter(|days| *days > 0);
        DataRetention {
            turn_days: rule(self.turn_days, defaults.turn_days),
            max_age_days: rule(self.max_age_days, defaults.max_age_days),
            inactive_after_days: rule(self.inactive_after_days, defaults.inactive_after_days),
            inactive_grace_days: rule(self.inactive_grace_days, defaults.inactive_grace_days),
        }
    }
}

/// Why retention deleted something (the audit detail's `reason`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DeletionReason {
    /// An entry older than the space's maximum age.
    Age,
    /// An entry inactive for longer than the grace period.
    Inactive,
    /// Raw turns of a segment closed longer ago than the turn retention.
    TurnsSummarized,
}

impl DeletionReason {
    pub const ALL: [DeletionReason; 3] = [
        DeletionReason::Age,
        DeletionReason::Inactive,
        DeletionReason::TurnsSummarized,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            DeletionReason::Age => "AGE",
            DeletionReason::Inactive => "INACTIVE",
            DeletionReason::TurnsSummarized => "TURNS_SUMMARIZED",
        }
    }
}

/// The instants a run compares with, all from one `now` so a preview and a run at the same
/// instant select the same rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetentionCutoffs {
    /// Turns of segments closed before this are deleted.
    pub turns_closed_before: Option<DateTime<Utc>>,
    /// Entries created before this are deleted (unless pinned or saved).
    pub created_before: Option<DateTime<Utc>>,
    /// Entries unused since before this become inactive.
    pub unused_since: Option<DateTime<Utc>>,
    /// Entries inactive since before this are deleted.
    pub inactive_before: Option<DateTime<Utc>>,
}

impl DataRetention {
    pub fn cutoffs(&self, now: DateTime<Utc>) -> RetentionCutoffs {
        let before = |days: Option<u32>| days.map(|days| now - Duration::days(i64::from(days)));
        let inactivity = self.inactive_after_days.is_some();
        RetentionCutoffs {
            turns_closed_before: before(self.turn_days),
            created_before: before(self.max_age_days),
            unused_since: before(self.inactive_after_days),
            inactive_before: before(self.inactive_grace_days).filter(|_| inactivity),
        }
    }

    pub fn is_off(&self) -> bool {
        self.turn_days.is_none()
            && self.max_age_days.is_none()
            && self.inactive_after_days.is_none()
    }
}

/// When an entry counts as unused (see the module documentation).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct InactivityRule {
    /// An episode is unused while its retrievability is below this.
    pub retrievability_below: f64,
    /// A fact can be unused only when its importance is below this.
    pub fact_importance_below: f64,
}

impl InactivityRule {
    /// How long after its last review an episode's retrievability falls below the threshold, in
    /// days per day of stability. FSRS-6's forgetting curve depends on elapsed/stability alone,
    /// so the moment is `last_reviewed_at + stability * this` whatever the episode. Infinite
    /// when it never falls that low (a threshold of 0 or less); 0 when it already starts below
    /// (a threshold above 1).
    pub fn days_below_per_stability_day(&self) -> f64 {
        let threshold = self.retrievability_below;
        if threshold.is_nan() || threshold <= 0.0 {
            return f64::INFINITY;
        }
        if threshold > 1.0 {
            return 0.0;
        }
        let below = |days: f64| retrievability(1.0, 5.0, days) < threshold;
        // Grow an upper bound until the curve is below, then bisect.
        let mut high = 1.0;
        while !below(high) {
            high *= 2.0;
            if high > 1e30 {
                return f64::INFINITY;
            }
        }
        let mut low = 0.0;
        for _ in 0..200 {
            let middle = (low + high) / 2.0;
            if below(middle) {
                high = middle;
            } else {
                low = middle;
            }
        }
        high
    }
}

/// Checks one day count of a rule (0 switches the rule off); the error says what is allowed.
pub fn check_days(days: u32) -> Result<u32, String> {
    if days > MAX_RETENTION_DAYS {
        Err(format!(
            "must be 0 (off) to {MAX_RETENTION_DAYS} days, got {days}"
        ))
    } else {
        Ok(days)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(text: &str) -> DateTime<Utc> {
        text.parse().unwrap()
    }

    #[test]
    fn a_space_value_wins_over_the_default_and_zero_switches_a_rule_off() {
        let defaults = RetentionOverrides {
            turn_days: Some(180),
            max_age_days: Some(0),
            inactive_after_days: Some(90),
            inactive_grace_days: Some(90),
        };
        let own = RetentionOverrides {
            turn_days: Some(0),
            max_age_days: Some(365),
            ..Default::default()
        };
        assert_eq!(
            own.resolve(&defaults),
            DataRetention {
                turn_days: None,
                max_age_days: Some(365),
                inactive_after_days: Some(90),
                inactive_grace_days: Some(90),
            }
        );
        assert_eq!(
            RetentionOverrides::default()
                .resolve(&defaults)
                .max_age_days,
            None
        );
    }

    #[test]
    fn cutoffs_count_back_from_one_instant() {
        let retention = DataRetention {
            turn_days: Some(1),
            max_age_days: Some(10),
            inactive_after_days: Some(30),
            inactive_grace_days: Some(7),
        };
        let cutoffs = retention.cutoffs(at("2026-11-26T00:00:00Z"));
        assert_eq!(
            cutoffs.turns_closed_before,
            Some(at("2026-11-25T00:00:00Z"))
        );
        assert_eq!(cutoffs.created_before, Some(at("2026-11-16T00:00:00Z")));
        assert_eq!(cutoffs.unused_since, Some(at("2026-10-27T00:00:00Z")));
        assert_eq!(cutoffs.inactive_before, Some(at("2026-11-19T00:00:00Z")));
    }

    #[test]
    fn no_grace_deletion_without_the_inactivity_rule() {
        let retention = DataRetention {
            inactive_grace_days: Some(7),
            ..Default::default()
        };
        assert_eq!(retention.cutoffs(Utc::now()).inactive_before, None);
    }

    #[test]
    fn the_moment_retrievability_falls_below_scales_with_stability() {
        let rule = InactivityRule {
            retrievability_below: 0.5,
            fact_importance_below: 0.4,
        };
        let per_day = rule.days_below_per_stability_day();
        assert!(per_day.is_finite() && per_day > 1.0, "{per_day}");
        for (stability, difficulty) in [(0.5, 1.0), (2.3, 5.0), (40.0, 9.0), (900.0, 3.0)] {
            let moment = stability * per_day;
            assert!(retrievability(stability, difficulty, moment * 0.999) >= 0.5);
            assert!(retrievability(stability, difficulty, moment * 1.001) < 0.5);
        }
    }

    #[test]
    fn thresholds_outside_the_curve() {
        let rule = |threshold| InactivityRule {
            retrievability_below: threshold,
            fact_importance_below: 0.4,
        };
        assert_eq!(rule(0.0).days_below_per_stability_day(), f64::INFINITY);
        assert_eq!(rule(f64::NAN).days_below_per_stability_day(), f64::INFINITY);
        assert_eq!(rule(1.5).days_below_per_stability_day(), 0.0);
        // A tiny threshold is reached only after an astronomically long time, but it is reached.
        assert!(rule(0.001).days_below_per_stability_day() > 1e6);
    }

    #[test]
    fn days_are_checked() {
        assert_eq!(check_days(0), Ok(0));
        assert_eq!(check_days(36_500), Ok(36_500));
        let error = check_days(36_501).unwrap_err();
        assert!(
            error.contains("36500") && error.contains("36501"),
            "{error}"
        );
    }
}
