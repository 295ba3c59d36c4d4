//! The review service's proto conversions, in one place: requests in, checked with
//! InvalidArgument messages that name the field; results out as response messages.

use chrono::{DateTime, Utc};
use engram_core::episode::SegmentTurn;
use engram_core::retrieval::query::MAX_QUERY_CHARS;
use engram_core::review::{FsrsState, Rating, ReviewTarget, aggregate};
use engram_core::{MemoryId, MemoryText, ValidationError};
use engram_proto::v1;
use engram_server::convert::role_from_proto;
use engram_server::time::{from_proto_opt, to_proto};
use engram_store::reviews::ReviewStats;

use crate::apply::Outcome;
use crate::error::ReviewError;
use crate::grading::GraderChoice;
use crate::service::{GradingRequest, MemoryState};

const MAX_CONTEXT_TURNS: usize = 200;
const MAX_MEMORIES_PER_GRADING: usize = 100;
/// Characters of a context turn the grader reads, as a conversation turn may hold.
const MAX_TURN_CHARS: usize = 8_192;
/// Distinct queries one memory to grade may come with (each stored with its review): far more
/// than one segment's retrievals ever find one memory by.
const MAX_QUERIES_PER_MEMORY: usize = 32;

fn rating_to_proto(rating: Rating) -> v1::ReviewRating {
    match rating {
        Rating::Again => v1::ReviewRating::Again,
        Rating::Hard => v1::ReviewRating::Hard,
        Rating::Good => v1::ReviewRating::Good,
        Rating::Easy => v1::ReviewRating::Easy,
    }
}

fn state_to_proto(state: Option<FsrsState>) -> Option<v1::FsrsState> {
    state.map(|state| v1::FsrsState {
        stability: state.stability,
        difficulty: state.difficulty,
        last_reviewed_at: None,
    })
}

/// Validates a GradeMemories request: the context, the memories (deduplicated), the grader.
pub fn grading_request(message: &v1::GradeMemoriesRequest) -> Result<GradingRequest, ReviewError> {
    let (context, targets, grader) = parse_grading(message)?;
    Ok(GradingRequest {
        context,
        targets,
        grader,
        dry_run: message.dry_run,
    })
}

fn parse_grading(
    message: &v1::GradeMemoriesRequest,
) -> Result<(Vec<SegmentTurn>, Vec<ReviewTarget>, GraderChoice), ValidationError> {
    if message.context.is_empty() || message.context.len() > MAX_CONTEXT_TURNS {
        return Err(ValidationError::new(
            "context",
            format!(
                "must hold 1 to {MAX_CONTEXT_TURNS} turns, has {}",
                message.context.len()
            ),
        ));
    }
    let context = message
        .context
        .iter()
        .enumerate()
        .map(|(index, turn)| {
            let field = format!("context[{index}]");
            Ok(SegmentTurn {
                role: role_from_proto(&format!("{field}.role"), turn.role)?,
                content: MemoryText::parse(
                    &format!("{field}.content"),
                    &turn.content,
                    MAX_TURN_CHARS,
                )?
                .into_string(),
            })
        })
        .collect::<Result<Vec<_>, ValidationError>>()?;
    if message.memories.is_empty() || message.memories.len() > MAX_MEMORIES_PER_GRADING {
        return Err(ValidationError::new(
            "memories",
            format!(
                "must hold 1 to {MAX_MEMORIES_PER_GRADING} memories, has {}",
                message.memories.len()
            ),
        ));
    }
    let mut reviews: Vec<(String, Vec<uuid::Uuid>)> = Vec::new();
    for (index, memory) in message.memories.iter().enumerate() {
        let id = MemoryId::parse(&format!("memories[{index}].memory_id"), &memory.memory_id)?;
        if memory.queries.len() > MAX_QUERIES_PER_MEMORY {
            return Err(ValidationError::new(
                format!("memories[{index}].queries"),
                format!(
                    "has {} queries; the limit is {MAX_QUERIES_PER_MEMORY}",
                    memory.queries.len()
                ),
            ));
        }
        if memory.queries.is_empty() {
            reviews.push((String::new(), vec![id.as_uuid()]));
        }
        // Each is a query that retrieved the memory: what RetrieveMemory takes as a query.
        for (query_index, query) in memory.queries.iter().enumerate() {
            let query = MemoryText::parse(
                &format!("memories[{index}].queries[{query_index}]"),
                query,
                MAX_QUERY_CHARS,
            )?;
            reviews.push((query.into_string(), vec![id.as_uuid()]));
        }
    }
    let mut targets = aggregate(reviews.iter().map(|(q, ids)| (q.as_str(), ids.as_slice())));
    for target in &mut targets {
        target.queries.retain(|query| !query.is_empty());
        // A memory listed more than once gathers the queries of every listing.
        if target.queries.len() > MAX_QUERIES_PER_MEMORY {
            return Err(ValidationError::new(
                "memories",
                format!(
                    "have {} distinct queries for memory {} in all; the limit is \
                     {MAX_QUERIES_PER_MEMORY}",
                    target.queries.len(),
                    target.memory_id
                ),
            ));
        }
    }
    let grader = match v1::Grader::try_from(message.grader) {
        Ok(v1::Grader::Unspecified) => GraderChoice::Configured,
        Ok(v1::Grader::Local) => GraderChoice::Local,
        Ok(v1::Grader::Llm) => GraderChoice::Llm,
        Err(_) => {
            return Err(ValidationError::new(
                "grader",
                format!("{} is not a known grader", message.grader),
            ));
        }
    };
    Ok((context, targets, grader))
}

pub fn memory_id(message: &v1::GetMemoryStateRequest) -> Result<MemoryId, ReviewError> {
    Ok(MemoryId::parse("memory_id", &message.memory_id)?)
}

pub fn memory_state_response(state: MemoryState) -> v1::GetMemoryStateResponse {
    v1::GetMemoryStateResponse {
        memory_id: state.memory_id.to_string(),
        fsrs: Some(v1::FsrsState {
            stability: state.stability,
            difficulty: state.difficulty,
            last_reviewed_at: Some(to_proto(state.last_reviewed_at)),
        }),
        retrievability: state.retrievability,
        days_since_review: state.days_since_review,
        computed_at: Some(to_proto(state.computed_at)),
    }
}

pub fn grading_response(outcomes: Vec<Outcome>) -> v1::GradeMemoriesResponse {
    v1::GradeMemoriesResponse {
        graded: outcomes
            .into_iter()
            .map(|outcome| v1::GradedMemory {
                memory_id: outcome.memory_id.to_string(),
                rating: rating_to_proto(outcome.rating).into(),
                graded_by: outcome.graded_by,
                evidence: outcome.evidence.unwrap_or_default(),
                applied: outcome.applied,
                skipped_reason: outcome.skipped_reason.unwrap_or_default().to_owned(),
                before: state_to_proto(outcome.before),
                after: state_to_proto(outcome.after),
            })
            .collect(),
    }
}

/// The period of a GetReviewStats: [since, until), either end open.
pub type Period = (Option<DateTime<Utc>>, Option<DateTime<Utc>>);

pub fn stats_period(message: &v1::GetReviewStatsRequest) -> Result<Period, ReviewError> {
    let since = from_proto_opt("since", message.since.as_ref())?;
    let until = from_proto_opt("until", message.until.as_ref())?;
    if let (Some(since), Some(until)) = (since, until)
        && since > until
    {
        return Err(ValidationError::new("since", "must not be after until").into());
    }
    Ok((since, until))
}

pub fn stats_response(stats: &ReviewStats) -> v1::GetReviewStatsResponse {
    let count = |n: i64| u32::try_from(n).unwrap_or(u32::MAX);
    let again = stats
        .ratings
        .iter()
        .find(|(rating, _)| rating == "again")
        .map_or(0, |(_, n)| *n);
    v1::GetReviewStatsResponse {
        graded: count(stats.graded),
        applied: count(stats.applied),
        ratings: stats
            .ratings
            .iter()
            .filter_map(|(rating, n)| {
                Some(v1::RatingCount {
                    rating: rating_to_proto(Rating::parse(rating)?).into(),
                    count: count(*n),
                })
            })
            .collect(),
        again_share: if stats.graded > 0 {
            again as f64 / stats.graded as f64
        } else {
            0.0
        },
        segments: count(stats.segments),
        graded_by_llm: count(stats.graded_by_llm),
        graded_locally: count(stats.graded - stats.graded_by_llm),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(queries: Vec<String>) -> v1::GradeMemoriesRequest {
        v1::GradeMemoriesRequest {
            scope: None,
            context: vec![v1::Message {
                role: v1::SpeakerRole::Assistant.into(),
                content: "Per your notes, the trip is in May.".into(),
            }],
            memories: vec![v1::MemoryToGrade {
                memory_id: "6f1c1f4e-2f0b-4a4e-9a34-9d4f3f1e2a10".into(),
                queries,
            }],
            dry_run: true,
            grader: v1::Grader::Local.into(),
        }
    }

    fn error_of(request: &v1::GradeMemoriesRequest) -> String {
        parse_grading(request).unwrap_err().to_string()
    }

    #[test]
    fn queries_are_validated_like_a_retrieval_query() {
        let (_, targets, _) = parse_grading(&request(vec![
            "trip \u{1b}[31mdates".into(),
            "trip dates".into(),
        ]))
        .unwrap();
        assert_eq!(
            targets[0].queries,
            ["trip dates"],
            "cleaned, then deduplicated"
        );
        let (_, targets, _) = parse_grading(&request(vec![])).unwrap();
        assert!(targets[0].queries.is_empty());

        assert_eq!(
            error_of(&request(vec!["ok".into(), "nul\0here".into()])),
            "memories[0].queries[1]: must not contain NUL characters"
        );
        assert_eq!(
            error_of(&request(vec!["x".repeat(MAX_QUERY_CHARS + 1)])),
            "memories[0].queries[0]: is 2049 characters long; the limit is 2048"
        );
        assert!(error_of(&request(vec![" ".into()])).starts_with("memories[0].queries[0]: "));
        let too_many: Vec<String> = (0..=MAX_QUERIES_PER_MEMORY)
            .map(|n| format!("query {n}"))
            .collect();
        assert_eq!(
            error_of(&request(too_many)),
            "memories[0].queries: has 33 queries; the limit is 32"
        );
    }

    #[test]
    fn a_memory_listed_twice_gathers_no_more_queries_than_once() {
        let mut twice = request((0..20).map(|n| format!("query {n}")).collect());
        let mut again = twice.memories[0].clone();
        again.queries = (20..40).map(|n| format!("query {n}")).collect();
        twice.memories.push(again);
        assert!(
            error_of(&twice).starts_with("memories: have 40 distinct queries for memory"),
            "{}",
            error_of(&twice)
        );
    }
}
