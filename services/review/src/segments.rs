//! Reviewing closed segments: SegmentClosed from the bus, graded and applied.
//!
//! A message is acknowledged only after its review committed; a failure (the database away, the
//! LLM failing with `grading.on_llm_failure = retry`) sends it back for a delayed retry, and
//! after `amqp.max_attempts` deliveries to the dead-letter queue with the reason. A malformed
//! message is dead-lettered at once. The same segment delivered twice applies nothing twice: each
//! (segment, memory) review is recorded once.

use std::collections::HashMap;
use std::sync::Arc;

use engram_bus::consumer::consume_each;
use engram_bus::queues::{self, routes};
use engram_bus::{BusError, Delivery};
use engram_core::episode::SegmentTurn;
use engram_core::review::{ReviewTarget, aggregate};
use engram_core::{Scope, SpeakerRole};
use engram_proto::v1;
use engram_server::status::ServiceError as _;
use prost::Message as _;
use tokio::sync::watch;
use uuid::Uuid;

use crate::apply::{ReviewOrigin, apply};
use crate::config::ReviewBusSettings;
use crate::error::ReviewError;
use crate::grading::{GraderChoice, MemoryForGrading};
use crate::service::Reviewer;

/// A SegmentClosed message, read.
#[derive(Debug, Clone)]
pub struct ClosedSegment {
    pub scope: Scope,
    pub origin: ReviewOrigin,
    pub context: Vec<SegmentTurn>,
    /// The conversation's turn index of `context[0]` (the rest follow in order).
    pub first_turn_index: i32,
    pub targets: Vec<ReviewTarget>,
}

/// Reads a SegmentClosed message, or says why it is not one.
pub fn decode(delivery_type: Option<&str>, payload: &[u8]) -> Result<ClosedSegment, String> {
    if delivery_type != Some(routes::SEGMENT_CLOSED_TYPE) {
        return Err(format!("unexpected message type {delivery_type:?}"));
    }
    let event =
        v1::SegmentClosed::decode(payload).map_err(|e| format!("malformed payload: {e}"))?;
    let scope = engram_server::convert::scope_from_proto(event.scope)
        .map_err(|e| format!("bad scope: {e}"))?;
    let segment_id = Uuid::parse_str(&event.segment_id)
        .map_err(|_| format!("segment_id {:?} is not a UUID", event.segment_id))?;
    let conversation_id = Uuid::parse_str(&event.conversation_id).ok();
    let reviewed_at = event
        .reviewed_at
        .as_ref()
        .and_then(|at| engram_server::time::from_proto("reviewed_at", at).ok())
        .ok_or("reviewed_at is missing or invalid")?;
    let reviews: Vec<(String, Vec<Uuid>)> = event
        .pending_reviews
        .iter()
        .map(|review| {
            let ids = review
                .memory_ids
                .iter()
                .map(|id| {
                    Uuid::parse_str(id).map_err(|_| format!("memory id {id:?} is not a UUID"))
                })
                .collect::<Result<Vec<_>, _>>()?;
            Ok((review.query.clone(), ids))
        })
        .collect::<Result<_, String>>()?;
    let targets = aggregate(
        reviews
            .iter()
            .map(|(query, ids)| (query.as_str(), ids.as_slice())),
    );
    let context = event
        .context
        .iter()
        .map(|message| SegmentTurn {
            // A role this build does not know reads as the user's.
            role: engram_server::convert::role_from_proto("context", message.role)
                .unwrap_or(SpeakerRole::User),
            content: message.content.clone(),
        })
        .collect();
    Ok(ClosedSegment {
        scope,
        origin: ReviewOrigin {
            segment_id,
            conversation_id,
            reviewed_at,
        },
        context,
        first_turn_index: i32::try_from(event.first_turn_index).map_err(|_| {
            format!(
                "first_turn_index {} is out of range",
                event.first_turn_index
            )
        })?,
        targets,
    })
}

impl Reviewer {
    /// Grades and applies a closed segment's reviews; returns how many memories were graded.
    #[tracing::instrument(skip_all, fields(segment = %segment.origin.segment_id, memories = segment.targets.len()), err(Display))]
    pub async fn review_segment(&self, segment: &ClosedSegment) -> Result<usize, ReviewError> {
        let ids: Vec<Uuid> = segment.targets.iter().map(|t| t.memory_id).collect();
        // Memories forgotten or trimmed since they were retrieved are simply not there.
        let stored = engram_store::reviews::memories(&self.pool, &segment.scope, &ids);
        // The turns segmentation embedded with the grader's topic embedder: grading them costs
        // no inference. Read beside the memories: neither read needs the other.
        let topic_model = self.grader.embedder.as_ref().map(|e| e.model_id());
        let turn_vectors = async {
            match (
                segment.origin.conversation_id,
                segment.context.len(),
                topic_model,
            ) {
                (Some(conversation), turns, Some(topic_model)) if turns > 0 => {
                    let last = segment
                        .first_turn_index
                        .saturating_add(i32::try_from(turns).unwrap_or(i32::MAX).saturating_sub(1));
                    engram_store::reviews::turn_embeddings(
                        &self.pool,
                        &segment.scope,
                        conversation,
                        segment.first_turn_index,
                        last,
                        topic_model,
                    )
                    .await
                }
                _ => Ok(Vec::new()),
            }
        };
        let (stored, turn_vectors) = tokio::try_join!(stored, turn_vectors)?;
        let mut stored: HashMap<Uuid, _> = stored.into_iter().map(|m| (m.id, m)).collect();
        let memories: Vec<MemoryForGrading> = segment
            .targets
            .iter()
            .filter_map(|target| {
                let memory = stored.remove(&target.memory_id)?;
                Some(MemoryForGrading {
                    id: memory.id,
                    title: memory.title,
                    text: memory.text,
                    queries: target.queries.clone(),
                })
            })
            .collect();
        if memories.is_empty() {
            return Ok(0);
        }
        let graded = self
            .grader
            .grade(
                &segment.context,
                &turn_vectors,
                &memories,
                GraderChoice::Configured,
            )
            .await?;
        let queries_of = |id: Uuid| {
            segment
                .targets
                .iter()
                .find(|t| t.memory_id == id)
                .map(|t| t.queries.clone())
                .unwrap_or_default()
        };
        let outcomes = apply(
            &self.pool,
            &segment.scope,
            segment.origin,
            &graded,
            queries_of,
            self.desired_retention,
            &self.metrics,
            false,
        )
        .await?;
        Ok(outcomes.len())
    }
}

/// Consumes SegmentClosed until stopped, `amqp.review_concurrency` segments at a time.
pub struct SegmentConsumer {
    pub reviewer: Reviewer,
    pub settings: ReviewBusSettings,
    pub spaces_in_review: SpacesInReview,
}

/// One space's segments are reviewed one after another, in delivery order, while other spaces'
/// run beside them: a memory belongs to one space, so two reviews of it never race, and an
/// older review is not skipped as stale because a newer one overtook it. (The wait queue of a
/// tokio mutex is first come, first served.)
#[derive(Debug, Default)]
pub struct SpacesInReview(std::sync::Mutex<HashMap<Scope, Arc<tokio::sync::Mutex<()>>>>);

impl SpacesInReview {
    async fn enter(&self, scope: &Scope) -> InReview<'_> {
        let turn = self
            .0
            .lock()
            .expect("the map of spaces in review is never left poisoned")
            .entry(scope.clone())
            .or_default()
            .clone();
        InReview {
            spaces: self,
            scope: scope.clone(),
            guard: Some(turn.lock_owned().await),
        }
    }
}

/// A space's turn; leaving it lets the space's next segment in, and forgets the space when no
/// segment of it waits.
struct InReview<'a> {
    spaces: &'a SpacesInReview,
    scope: Scope,
    guard: Option<tokio::sync::OwnedMutexGuard<()>>,
}

impl Drop for InReview<'_> {
    fn drop(&mut self) {
        self.guard.take();
        let mut spaces = self
            .spaces
            .0
            .lock()
            .expect("the map of spaces in review is never left poisoned");
        if spaces
            .get(&self.scope)
            .is_some_and(|turn| Arc::strong_count(turn) == 1)
        {
            spaces.remove(&self.scope);
        }
    }
}

impl SegmentConsumer {
    pub async fn run(self, stop: watch::Receiver<bool>) {
        let retry_delay = self.settings.bus.retry_delay();
        let settings = self
            .settings
            .bus
            .consumer(usize::from(self.settings.review_concurrency));
        consume_each(
            settings,
            queues::segment_closed(retry_delay),
            stop,
            |delivery| self.handle(delivery),
        )
        .await;
    }

    async fn handle(&self, delivery: Delivery) -> Result<(), BusError> {
        use tracing::Instrument as _;
        use tracing_opentelemetry::OpenTelemetrySpanExt as _;
        let span = tracing::info_span!("review.segment", otel.kind = "consumer");
        let _ = span.set_parent(delivery.trace_context());
        async {
            let segment = match decode(delivery.type_name(), delivery.payload()) {
                Ok(segment) => segment,
                Err(reason) => return delivery.dead_letter(&reason).await,
            };
            let reviewed = {
                let _turn = self.spaces_in_review.enter(&segment.scope).await;
                self.reviewer.review_segment(&segment).await
            };
            match reviewed {
                Ok(_) => delivery.ack().await,
                Err(error) => delivery
                    .fail(
                        &error.to_string(),
                        error.is_retryable(),
                        self.settings.bus.max_attempts,
                    )
                    .await
                    .map(drop),
            }
        }
        .instrument(span)
        .await
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn scope(space: &str) -> Scope {
        Scope::parse("scope", "00000000-0000-4000-8000-000000000001", space).unwrap()
    }

    #[tokio::test]
    async fn a_space_reviews_one_segment_at_a_time_in_arrival_order_and_others_run_beside() {
        let spaces = Arc::new(SpacesInReview::default());
        let order = Arc::new(std::sync::Mutex::new(Vec::new()));
        let first = spaces.enter(&scope("a")).await;
        // Queued behind the first, in this order.
        let mut waiting = Vec::new();
        for n in 1..=3 {
            let (spaces, order) = (spaces.clone(), order.clone());
            waiting.push(tokio::spawn(async move {
                let _turn = spaces.enter(&scope("a")).await;
                order.lock().unwrap().push(n);
            }));
            tokio::task::yield_now().await;
        }
        // Another space does not wait.
        let other = tokio::time::timeout(Duration::from_secs(1), spaces.enter(&scope("b"))).await;
        assert!(other.is_ok(), "another space waited for space a");
        drop(other);
        assert!(
            order.lock().unwrap().is_empty(),
            "nobody overtook the first segment"
        );
        drop(first);
        for task in waiting {
            task.await.unwrap();
        }
        assert_eq!(*order.lock().unwrap(), vec![1, 2, 3]);
        assert!(
            spaces.0.lock().unwrap().is_empty(),
            "spaces nobody waits for are forgotten"
        );
    }
}
