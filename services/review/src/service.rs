//! The reviewer: the review service's operations, one method each, on checked inputs. The RPCs
//! of `grpc.rs` call the methods here; the bus consumer calls `review_segment` (segments.rs).

use std::sync::Arc;

use chrono::{DateTime, Utc};
use engram_core::episode::SegmentTurn;
use engram_core::memory_state::{days_since, retrievability};
use engram_core::review::ReviewTarget;
use engram_core::{MemoryId, Scope};
use engram_store::memories;
use engram_store::reviews::ReviewStats;
use sqlx::PgPool;
use uuid::Uuid;

use crate::apply::{Outcome, ReviewOrigin, apply};
use crate::error::ReviewError;
use crate::grading::{Grader, GraderChoice, MemoryForGrading};
use crate::metrics::ReviewMetrics;

/// Grades and applies reviews; cheap to clone.
#[derive(Debug, Clone)]
pub struct Reviewer {
    pub pool: PgPool,
    pub grader: Grader,
    pub desired_retention: f32,
    pub metrics: Arc<ReviewMetrics>,
}

/// An episodic memory's FSRS state, and its retrievability at `computed_at`.
#[derive(Debug, Clone, PartialEq)]
pub struct MemoryState {
    pub memory_id: Uuid,
    pub stability: f64,
    pub difficulty: f64,
    pub last_reviewed_at: DateTime<Utc>,
    pub retrievability: f64,
    pub days_since_review: f64,
    pub computed_at: DateTime<Utc>,
}

/// A checked GradeMemories request.
#[derive(Debug, Clone)]
pub struct GradingRequest {
    /// The conversation the memories are graded against.
    pub context: Vec<SegmentTurn>,
    /// Each memory once, with every query that retrieved it.
    pub targets: Vec<ReviewTarget>,
    pub grader: GraderChoice,
    /// Grade without moving any FSRS state.
    pub dry_run: bool,
}

impl Reviewer {
    /// GetMemoryState: an episode's FSRS state and its retrievability now.
    pub async fn memory_state(
        &self,
        scope: &Scope,
        memory_id: MemoryId,
    ) -> Result<MemoryState, ReviewError> {
        let mut connection = self
            .pool
            .acquire()
            .await
            .map_err(|e| ReviewError::Store(e.into()))?;
        let record = memories::get(&mut connection, scope, memory_id.as_uuid())
            .await?
            .ok_or_else(|| not_found(memory_id, scope))?;
        let (Some(stability), Some(difficulty), Some(last_reviewed_at)) =
            (record.stability, record.difficulty, record.last_reviewed_at)
        else {
            return Err(ReviewError::FailedPrecondition(format!(
                "memory {memory_id} is a {} memory; FSRS state belongs to episodic memories only",
                record.kind
            )));
        };
        let computed_at = Utc::now();
        let days = days_since(last_reviewed_at, computed_at);
        Ok(MemoryState {
            memory_id: record.id,
            stability,
            difficulty,
            last_reviewed_at,
            retrievability: retrievability(stability, difficulty, days),
            days_since_review: days,
            computed_at,
        })
    }

    /// GradeMemories: grades the memories against the context and, unless a dry run, applies
    /// the grades as a review of its own segment.
    pub async fn grade(
        &self,
        scope: &Scope,
        request: &GradingRequest,
    ) -> Result<Vec<Outcome>, ReviewError> {
        let targets = &request.targets;
        let ids: Vec<Uuid> = targets.iter().map(|t| t.memory_id).collect();
        let stored = engram_store::reviews::memories(&self.pool, scope, &ids).await?;
        if let Some(missing) = ids.iter().find(|id| !stored.iter().any(|m| m.id == **id)) {
            return Err(not_found(missing, scope));
        }
        let memories: Vec<MemoryForGrading> = targets
            .iter()
            .filter_map(|target| {
                let memory = stored.iter().find(|m| m.id == target.memory_id)?;
                Some(MemoryForGrading {
                    id: memory.id,
                    title: memory.title.clone(),
                    text: memory.text.clone(),
                    queries: target.queries.clone(),
                })
            })
            .collect();
        let graded = self
            .grader
            .grade(&request.context, &[], &memories, request.grader)
            .await?;
        let origin = ReviewOrigin {
            // A review asked for by an operator is its own segment.
            segment_id: Uuid::now_v7(),
            conversation_id: None,
            reviewed_at: Utc::now(),
        };
        let queries_of = |id: Uuid| {
            targets
                .iter()
                .find(|t| t.memory_id == id)
                .map(|t| t.queries.clone())
                .unwrap_or_default()
        };
        apply(
            &self.pool,
            scope,
            origin,
            &graded,
            queries_of,
            self.desired_retention,
            &self.metrics,
            request.dry_run,
        )
        .await
    }

    /// GetReviewStats: the grades of a space within [since, until).
    pub async fn stats(
        &self,
        scope: &Scope,
        since: Option<DateTime<Utc>>,
        until: Option<DateTime<Utc>>,
    ) -> Result<ReviewStats, ReviewError> {
        Ok(engram_store::reviews::stats(&self.pool, scope, since, until).await?)
    }
}

/// A memory this user's space does not hold (never did, or forgotten since).
fn not_found(memory_id: impl std::fmt::Display, scope: &Scope) -> ReviewError {
    ReviewError::NotFound(format!(
        "no memory {memory_id} in space {:?} of this user",
        scope.space.as_str()
    ))
}
