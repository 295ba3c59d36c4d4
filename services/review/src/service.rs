//! The reviewer: what the consumer and the RPCs share.

use std::sync::Arc;

use sqlx::PgPool;

use crate::grading::Grader;
use crate::metrics::ReviewMetrics;

/// Grades and applies reviews; cheap to clone.
#[derive(Debug, Clone)]
pub struct Reviewer {
    pub pool: PgPool,
    pub grader: Grader,
    pub desired_retention: f32,
    pub metrics: Arc<ReviewMetrics>,
}
