//! Applying ratings: each memory's FSRS state moves by its rating through FSRS-6, once per
//! segment, never backwards in time.
//!
//! In one transaction (a fixed handful of statements, however many memories), for each graded
//! memory: its row is locked; the review is recorded under
//! (segment, memory) — recorded before means this is a redelivery, and nothing more happens; a
//! review whose time is not after the memory's last review changes nothing (stale skip); a fact
//! is recorded but not reviewed (facts do not decay: FSRS belongs to episodes); otherwise
//! stability, difficulty and last_reviewed_at become FSRS's answer for the rating and the days
//! elapsed since the last review. Every applied rating is audited with the state before and
//! after. A dry run, or a space with memory off, computes the same outcomes and records nothing.

use chrono::{DateTime, Utc};
use engram_core::review::{FsrsState, Rating, next_state};
use engram_core::{MemoryKind, Scope};
use engram_store::audit::{self, AuditAction};
use engram_store::reviews::{self, NewState, ReviewRecord, ReviewState, SegmentReviews};
use engram_store::spaces;
use serde_json::json;
use sqlx::PgPool;
use uuid::Uuid;

use crate::error::ReviewError;
use crate::grading::Graded;
use crate::metrics::ReviewMetrics;

/// Where a review comes from.
#[derive(Debug, Clone, Copy)]
pub struct ReviewOrigin {
    /// The segment's id (from SegmentClosed), or a fresh id for a GradeMemories call.
    pub segment_id: Uuid,
    pub conversation_id: Option<Uuid>,
    /// The review's time: a memory last reviewed at or after it is left alone.
    pub reviewed_at: DateTime<Utc>,
}

/// What became of one rating.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    pub memory_id: Uuid,
    pub rating: Rating,
    pub graded_by: String,
    pub evidence: Option<f64>,
    pub applied: bool,
    pub skipped_reason: Option<&'static str>,
    pub before: Option<FsrsState>,
    pub after: Option<FsrsState>,
}

/// Why a rating changed nothing.
const REDELIVERED: &str = "this segment's review of the memory was applied before";
const STALE: &str = "the memory was reviewed at or after this review's time";
const NOT_AN_EPISODE: &str = "facts do not decay: FSRS state belongs to episodes";
const GONE: &str = "the memory is gone (forgotten or trimmed since it was retrieved)";
const DRY_RUN: &str = "dry run";
const MEMORY_OFF: &str = "memory is off for this space: graded, nothing recorded";

fn outcome(graded: &Graded, before: Option<FsrsState>) -> Outcome {
    Outcome {
        memory_id: graded.memory_id,
        rating: graded.rating,
        graded_by: graded.graded_by.clone(),
        evidence: graded.evidence,
        applied: false,
        skipped_reason: None,
        before,
        after: None,
    }
}

/// Whole days between the last review and this one (FSRS counts days).
fn days_between(last: DateTime<Utc>, now: DateTime<Utc>) -> u32 {
    // Truncates toward zero; `as` saturates at u32::MAX.
    engram_core::memory_state::days_since(last, now) as u32
}

/// Applies the ratings (see the module documentation); `queries` gives each memory's queries.
/// A dry run computes the same outcomes (the state each rating would lead to) and changes
/// nothing.
#[expect(
    clippy::too_many_arguments,
    reason = "the review's parts, each needed once"
)]
pub async fn apply(
    pool: &PgPool,
    scope: &Scope,
    origin: ReviewOrigin,
    graded: &[Graded],
    queries: impl Fn(Uuid) -> Vec<String>,
    desired_retention: f32,
    metrics: &ReviewMetrics,
    dry_run: bool,
) -> Result<Vec<Outcome>, ReviewError> {
    // The grader rates each memory once (its targets are aggregated by id).
    let ids: Vec<Uuid> = graded.iter().map(|g| g.memory_id).collect();
    debug_assert!(
        ids.iter().collect::<std::collections::HashSet<_>>().len() == ids.len(),
        "a memory graded twice"
    );
    // A handful of statements whatever the number of memories: lock every state, record every
    // review, update the states that changed, audit them.
    let mut transaction = engram_store::begin(pool).await?;
    let states = reviews::lock_states(&mut transaction, scope, &ids).await?;
    // With memory off nothing is learnt from what the user says, ratings included: the review is
    // computed like a dry run and nothing is recorded (not even the queries). The space's row is
    // held until commit, so memory switched off meanwhile waits for this review; it is taken
    // after the memories' rows, in the order writers take them (a write locks its entry, then
    // its trigger updates the space's count), so the two cannot wait on each other.
    let memory_off = !spaces::get_for_share(&mut transaction, scope)
        .await?
        .memory_enabled;
    let mut outcomes = rate(&states, graded, origin.reviewed_at, desired_retention)?;
    let recording_refused = if dry_run {
        Some(DRY_RUN)
    } else if memory_off {
        Some(MEMORY_OFF)
    } else {
        None
    };
    if let Some(reason) = recording_refused {
        transaction
            .rollback()
            .await
            .map_err(engram_store::StoreError::from)?;
        for result in &mut outcomes {
            result.applied = false;
            result.skipped_reason = result.skipped_reason.or(Some(reason));
        }
        return Ok(outcomes);
    }

    // Gone memories have nothing to record against.
    let present: Vec<usize> = (0..outcomes.len())
        .filter(|&index| outcomes[index].skipped_reason != Some(GONE))
        .collect();
    let memory_queries: Vec<Vec<String>> = present
        .iter()
        .map(|&index| queries(outcomes[index].memory_id))
        .collect();
    let reviews = SegmentReviews {
        segment_id: origin.segment_id,
        conversation_id: origin.conversation_id,
        reviewed_at: origin.reviewed_at,
        reviews: review_records(&outcomes, &present, &memory_queries),
    };
    let recorded = reviews::record(&mut transaction, scope, &reviews).await?;
    let (new_states, audited) = what_changed(&mut outcomes, &present, &recorded, origin, metrics);
    reviews::update_states(&mut transaction, scope, &new_states, origin.reviewed_at).await?;
    let conversation = origin
        .conversation_id
        .map(engram_core::ConversationId::from_uuid);
    audit::append_each(
        &mut transaction,
        scope,
        AuditAction::Review,
        conversation,
        &audited,
    )
    .await?;
    transaction
        .commit()
        .await
        .map_err(engram_store::StoreError::from)?;
    // Counted once committed: a failed transaction graded nothing that stays.
    for &index in &present {
        let result = &outcomes[index];
        if recorded.contains(&result.memory_id) {
            metrics.record_graded(result.rating.as_str(), result.applied);
        }
    }
    Ok(outcomes)
}

/// Each rating's outcome against the memory's locked state: gone, not an episode, stale, or the
/// FSRS state it leads to.
fn rate(
    states: &[ReviewState],
    graded: &[Graded],
    reviewed_at: DateTime<Utc>,
    desired_retention: f32,
) -> Result<Vec<Outcome>, ReviewError> {
    let mut outcomes = Vec::with_capacity(graded.len());
    for graded in graded {
        let Some(memory) = states.iter().find(|state| state.id == graded.memory_id) else {
            let mut gone = outcome(graded, None);
            gone.skipped_reason = Some(GONE);
            outcomes.push(gone);
            continue;
        };
        let before = match (memory.stability, memory.difficulty) {
            (Some(stability), Some(difficulty)) => Some(FsrsState {
                stability,
                difficulty,
            }),
            _ => None,
        };
        let mut result = outcome(graded, before);
        let episode = MemoryKind::from_stored(&memory.kind) == Some(MemoryKind::Episodic);
        let stale = memory
            .last_reviewed_at
            .is_some_and(|last| reviewed_at <= last);
        if !episode {
            result.skipped_reason = Some(NOT_AN_EPISODE);
        } else if stale {
            result.skipped_reason = Some(STALE);
        } else {
            let elapsed = memory
                .last_reviewed_at
                .map_or(0, |last| days_between(last, reviewed_at));
            let after = next_state(before, graded.rating, elapsed, desired_retention).map_err(
                |reason| {
                    ReviewError::FailedPrecondition(format!("FSRS refused the review: {reason}"))
                },
            )?;
            result.after = Some(after);
            result.applied = true;
        }
        outcomes.push(result);
    }
    Ok(outcomes)
}

/// The review rows of the memories still present (`present` indexes `outcomes`).
fn review_records<'a>(
    outcomes: &'a [Outcome],
    present: &[usize],
    memory_queries: &'a [Vec<String>],
) -> Vec<ReviewRecord<'a>> {
    present
        .iter()
        .zip(memory_queries)
        .map(|(&index, queries)| {
            let result = &outcomes[index];
            ReviewRecord {
                memory_id: result.memory_id,
                rating: result.rating.as_str(),
                graded_by: &result.graded_by,
                applied: result.applied,
                stability_before: result.before.map(|s| s.stability),
                stability_after: result.after.map(|s| s.stability),
                difficulty_before: result.before.map(|s| s.difficulty),
                difficulty_after: result.after.map(|s| s.difficulty),
                queries,
            }
        })
        .collect()
}

/// The states to write and the audit events, for the reviews recorded now; a review recorded
/// before (a redelivery) changes nothing and its outcome says so.
fn what_changed(
    outcomes: &mut [Outcome],
    present: &[usize],
    recorded: &[Uuid],
    origin: ReviewOrigin,
    metrics: &ReviewMetrics,
) -> (Vec<NewState>, Vec<(Uuid, serde_json::Value)>) {
    let mut new_states = Vec::new();
    let mut audited = Vec::new();
    for &index in present {
        let result = &mut outcomes[index];
        if !recorded.contains(&result.memory_id) {
            metrics.record_redelivered();
            result.applied = false;
            result.after = None;
            result.skipped_reason = Some(REDELIVERED);
            continue;
        }
        if let Some(after) = result.after {
            new_states.push(NewState {
                memory_id: result.memory_id,
                stability: after.stability,
                difficulty: after.difficulty,
            });
        }
        audited.push((result.memory_id, audit_detail(result, origin)));
    }
    (new_states, audited)
}

/// What the audit trail keeps of one review: the rating, who graded, and the state before and
/// after.
fn audit_detail(result: &Outcome, origin: ReviewOrigin) -> serde_json::Value {
    json!({
        "rating": result.rating.as_str(),
        "graded_by": result.graded_by,
        "evidence": result.evidence,
        "segment": origin.segment_id,
        "applied": result.applied,
        "skipped": result.skipped_reason,
        "stability_before": result.before.map(|s| s.stability),
        "stability_after": result.after.map(|s| s.stability),
        "difficulty_before": result.before.map(|s| s.difficulty),
        "difficulty_after": result.after.map(|s| s.difficulty),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn days_elapsed_are_whole_days_and_never_negative() {
        let now = Utc::now();
        assert_eq!(days_between(now - chrono::Duration::hours(47), now), 1);
        assert_eq!(days_between(now + chrono::Duration::hours(3), now), 0);
    }
}
