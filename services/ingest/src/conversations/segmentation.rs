//! Segmentation: closes a conversation's segments and writes each as an episodic memory.
//!
//! For each conversation of a batch ([`Segmenter::segment_many`]; the local model works several
//! times faster on one batch than on single texts, so model calls span the whole batch):
//! 1. read the open segment (the turns after the last closed one) and embed the turns that have
//!    no embedding yet (for the topic rules; one call for every conversation of the batch);
//! 2. decide which segments close (`engram_core::segmentation`);
//! 3. describe each closed segment — by the LLM when one is configured, by the extractive rules
//!    of `engram_core::episode` otherwise or when the LLM fails — outside any transaction, since
//!    an LLM may take seconds (what the LLM wrote is cleaned and bounded like user text first:
//!    [`super::llm`]);
//! 4. in one transaction holding the space's content lock (as every entry write does): check
//!    that nobody segmented it meanwhile, write the episodes (tombstones, near-duplicates, soft
//!    cap, audit, embedding event — as every entry), then, with the conversation's row locked
//!    only from here to the commit, take the pending reviews each closed segment answers,
//!    announce `SegmentClosed` for the review service, and record the progress;
//! 5. consolidate the new episodes into facts ([`super::consolidation`]).
//!
//! A write that Postgres refuses for what it holds (a value it cannot store: SQLSTATE class 22,
//! a check, a size limit) while an LLM described a segment is written once more with every
//! segment described by the rules: an answer that cannot be stored must not hold the
//! conversation back, nor have the LLM asked again on every pass.
//!
//! An episode without the LLM's judgement of its surprise is written neutral and marked
//! `surprise_pending`; the embedding backfill measures it (1 − its highest cosine to the space's
//! earlier episodes) with the embedding it computes for search anyway, and sets the initial FSRS
//! state from it (`engram_store::segments::settle_pending_surprise`). Segmentation itself never
//! waits for the model's episode embeddings: the episode is searchable by its words as soon as
//! its transaction commits, and the model — the scarce resource on a small host — works through
//! the episodes and facts behind it, at a lower CPU priority than the requests and in the gaps
//! between them (`engram_embed::YieldToRequests`).
//!
//! It runs on a bus message (`SegmentationRequested`), and on a sweep that closes idle segments,
//! catches what a lost message missed, and (without the bus) takes every conversation that got
//! turns. The same segment written twice finds its episode already there (the episode's id is
//! derived from the conversation and the segment's first turn), and the progress check turns a
//! concurrent second pass into a no-op.

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use engram_core::episode::StructuredSummary;
use engram_core::memory_state::{NEUTRAL_SURPRISE, initial_state};
use engram_core::normalize::normalize_for_fingerprint;
use engram_core::segmentation::{ClosedSegment, TurnView, close_segments};
use engram_core::{
    ConversationId, RetentionPolicy, Scope, SimHash, SpeakerRole, importance, metadata,
};
use engram_embed::Embedder;
use engram_llm::ChatClient;
use engram_proto::v1;
use engram_store::StoreError;
use engram_store::audit;
use engram_store::conversations::TurnRecord;
use engram_store::segments::{self, EpisodeWrite, NewEpisode, OpenTail};
use engram_store::write_path::{CapacityTarget, enforce_soft_caps};
use futures::StreamExt as _;
use serde_json::json;
use sqlx::PgPool;
use tokio::sync::{Notify, watch};
use uuid::Uuid;

use super::consolidation::Consolidator;
use super::describe::{Describer, Describers, SegmentText};
use super::events::{ClosedSegmentEvent, segment_closed};
use crate::config::SegmentationSettings;
use crate::error::IngestError;
use crate::metrics::IngestMetrics;
use crate::write_path::{MAX_TAG_CHARS, MemoryWriter, embedding_requested, text_digest};

/// Episode ids: UUIDv5 of `user/space/conversation/first turn` in this namespace.
const EPISODE_NAMESPACE: Uuid = Uuid::from_u128(0x6a0e_51c4_92d7_4b3f_8e1a_c55d_0f7b_2e90);
/// Characters of an episode's excerpt in all (as an import allows): later turns are cut.
const MAX_EXCERPT_CHARS: usize = 65_536;
/// Conversations one sweep looks at, at most.
const SWEEP_BATCH: i64 = 200;
/// Conversations of one batch written (and consolidated) concurrently, each in its own
/// transaction; outcomes keep the batch's order.
const CONVERSATIONS_WRITTEN_AT_ONCE: usize = 4;
/// How far before a sweep's start the next sweep looks for changed conversations.
const CHANGE_MARGIN: chrono::Duration = chrono::Duration::seconds(5);

/// Closes segments and writes episodes; cheap to clone.
#[derive(Clone)]
pub struct Segmenter {
    pub(crate) pool: PgPool,
    pub(crate) writer: MemoryWriter,
    /// Embeds turns for the topic rules (see `engram_embed::Embedders::topic`).
    pub(crate) topic_embedder: Option<Arc<dyn Embedder>>,
    pub(crate) settings: Arc<SegmentationSettings>,
    pub(crate) metrics: Arc<IngestMetrics>,
    /// Titles, summarises and extracts what a closed segment established.
    pub(crate) describer: Describer,
    /// Writes the facts of the episodes written.
    pub(crate) consolidator: Consolidator,
}

impl std::fmt::Debug for Segmenter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Segmenter")
            .field(
                "topic_embedder",
                &self.topic_embedder.as_ref().map(|e| e.model_id()),
            )
            .field("llm", &self.describer.llm.as_ref().map(ChatClient::model))
            .finish()
    }
}

/// What one look at a conversation did.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SegmentationOutcome {
    pub closed: Vec<ClosedEpisode>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct ClosedEpisode {
    pub segment: ClosedSegment,
    /// The episode written (or repeated); `None` when a tombstone suppressed it.
    pub episode: Option<Uuid>,
    pub created: bool,
    pub pending_reviews: usize,
}

/// What a look at one conversation found to close: the closed segments, described, after the
/// progress they were found at.
struct Plan {
    segmented_through: i32,
    prepared: Vec<Prepared>,
    /// The open tail the segments were found in, to describe them again by the rules when the
    /// LLM's description cannot be written.
    tail: OpenTail,
}

/// A closed segment ready to write.
struct Prepared {
    segment: ClosedSegment,
    /// Nothing but greetings and thanks: the segment closes without an episode.
    trivial: bool,
    episode: NewEpisode,
    context: Vec<v1::Message>,
    described_by: &'static str,
    /// When Engram received the segment's last turn: the reviews recorded before it are this
    /// segment's.
    last_received_at: DateTime<Utc>,
}

fn view(turn: &TurnRecord, embedding: Option<&Vec<f32>>) -> TurnView {
    TurnView {
        index: turn.turn_index,
        role: SpeakerRole::from_stored(&turn.role).unwrap_or_default(),
        spoken_at: turn.spoken_at,
        received_at: turn.created_at,
        tokens: u32::try_from(turn.tokens).unwrap_or(0),
        embedding: embedding.cloned(),
    }
}

/// The excerpt an episode keeps: every turn, within [`MAX_EXCERPT_CHARS`] in all.
fn excerpt(turns: &[&TurnRecord]) -> (serde_json::Value, Vec<v1::Message>) {
    let mut left = MAX_EXCERPT_CHARS;
    let mut stored = Vec::with_capacity(turns.len());
    let mut context = Vec::with_capacity(turns.len());
    for turn in turns {
        if left == 0 {
            break;
        }
        let content: String = turn.content.chars().take(left).collect();
        left -= content.chars().count();
        stored.push(json!({"role": turn.role, "content": content}));
        context.push(v1::Message {
            role: engram_server::convert::role_to_proto(
                SpeakerRole::from_stored(&turn.role).unwrap_or_default(),
            )
            .into(),
            content,
        });
    }
    (serde_json::Value::Array(stored), context)
}

/// Pending reviews as stored (`[{query, memory_ids, retrieved_at}]`), oldest first.
fn pending_reviews(stored: &serde_json::Value) -> Vec<(DateTime<Utc>, v1::PendingReview)> {
    let Some(items) = stored.as_array() else {
        return Vec::new();
    };
    items
        .iter()
        .filter_map(|item| {
            let retrieved_at: DateTime<Utc> = item
                .get("retrieved_at")
                .and_then(|at| at.as_str())
                .and_then(|at| DateTime::parse_from_rfc3339(at).ok())
                .map(|at| at.with_timezone(&Utc))
                .unwrap_or(DateTime::<Utc>::MIN_UTC);
            let review = v1::PendingReview {
                query: item.get("query")?.as_str()?.to_owned(),
                memory_ids: item
                    .get("memory_ids")?
                    .as_array()?
                    .iter()
                    .filter_map(|id| id.as_str().map(str::to_owned))
                    .collect(),
                retrieved_at: (retrieved_at > DateTime::<Utc>::MIN_UTC)
                    .then(|| engram_server::time::to_proto(retrieved_at)),
            };
            Some((retrieved_at, review))
        })
        .collect()
}

/// Whether a write failed on what it was to store rather than on the database's state: a value
/// Postgres cannot take (SQLSTATE class 22, data exception: a NUL, an invalid byte sequence, a
/// value out of range), a check (23514), a size limit (54000), or one sqlx could not encode.
/// Writing the same again fails again.
fn failed_on_content(error: &IngestError) -> bool {
    match error {
        IngestError::Store(StoreError::Database(sqlx::Error::Database(error))) => error
            .code()
            .is_some_and(|code| code.starts_with("22") || code == "23514" || code == "54000"),
        IngestError::Store(StoreError::Database(sqlx::Error::Encode(_))) => true,
        IngestError::Shared(error) => failed_on_content(error),
        _ => false,
    }
}

impl Segmenter {
    /// Looks at several conversations together, with one outcome each, in order: the turns of
    /// all the conversations that still need vectors for the topic rules are embedded in one
    /// call. Each conversation is then written in its own transaction, so one failure fails only
    /// its own conversation.
    #[tracing::instrument(skip_all, fields(conversations = conversations.len()))]
    pub async fn segment_many(
        &self,
        conversations: &[(Scope, ConversationId)],
    ) -> Vec<Result<SegmentationOutcome, IngestError>> {
        let mut tails: Vec<Result<Option<OpenTail>, IngestError>> =
            Vec::with_capacity(conversations.len());
        for (scope, conversation) in conversations {
            let tail = segments::open_tail(
                &self.pool,
                scope,
                *conversation,
                self.topic_embedder.as_ref().map(|e| e.model_id()),
            )
            .await;
            tails.push(tail.map_err(IngestError::from));
        }
        self.embed_missing(conversations, &mut tails).await;

        // Decide and describe (no transaction held: an LLM may take seconds).
        let mut plans: Vec<Result<Option<Plan>, IngestError>> =
            Vec::with_capacity(conversations.len());
        for ((scope, conversation), tail) in conversations.iter().zip(tails) {
            let plan = match tail {
                Ok(Some(tail)) if !tail.turns.is_empty() => {
                    self.plan(scope, *conversation, tail).await
                }
                Ok(_) => Ok(None),
                Err(error) => Err(error),
            };
            plans.push(plan);
        }

        // A few conversations at a time: each transaction spends most of its time waiting for
        // Postgres (round trips, its commit's WAL flush), and the facts of several
        // consolidations share the write path's group commits.
        let writes: Vec<_> = conversations
            .iter()
            .zip(plans)
            .map(|((scope, conversation), plan)| self.write_planned(scope, *conversation, plan))
            .collect();
        futures::stream::iter(writes)
            .buffered(CONVERSATIONS_WRITTEN_AT_ONCE)
            .collect()
            .await
    }

    /// Writes one conversation's plan and consolidates the episodes it created.
    async fn write_planned(
        &self,
        scope: &Scope,
        conversation: ConversationId,
        plan: Result<Option<Plan>, IngestError>,
    ) -> Result<SegmentationOutcome, IngestError> {
        let outcome = match plan {
            Ok(Some(plan)) => {
                let written = self.write_or_fall_back(scope, conversation, plan).await;
                if let Ok(outcome) = &written {
                    self.consolidate_created(scope, outcome).await;
                }
                written
            }
            Ok(None) => Ok(SegmentationOutcome::default()),
            Err(error) => Err(error),
        };
        if let Err(error) = &outcome {
            tracing::warn!(%error, %conversation, "cannot segment the conversation");
        }
        outcome
    }

    /// Writes a plan; when the write fails on what an LLM wrote, writes the same segments once
    /// more, described by the rules (see the module documentation).
    async fn write_or_fall_back(
        &self,
        scope: &Scope,
        conversation: ConversationId,
        plan: Plan,
    ) -> Result<SegmentationOutcome, IngestError> {
        let Plan {
            segmented_through,
            prepared,
            tail,
        } = plan;
        let described_by_llm = prepared.iter().any(|p| p.described_by == "llm");
        let segments: Vec<ClosedSegment> = prepared.iter().map(|p| p.segment).collect();
        let error = match self
            .write(scope, conversation, segmented_through, prepared)
            .await
        {
            Err(error) if described_by_llm && failed_on_content(&error) => error,
            written => return written,
        };
        self.metrics.record_llm_fallback("segment_episode");
        tracing::warn!(
            %error,
            %conversation,
            "the LLM's description of a segment cannot be stored; writing the rules' description"
        );
        let mut prepared = Vec::with_capacity(segments.len());
        for segment in segments {
            prepared.push(
                self.prepare(scope, conversation, segment, &tail, Describers::RulesOnly)
                    .await?,
            );
        }
        self.write(scope, conversation, segmented_through, prepared)
            .await
    }

    /// The segments the rules close in a conversation's open tail, described and built.
    async fn plan(
        &self,
        scope: &Scope,
        conversation: ConversationId,
        tail: OpenTail,
    ) -> Result<Option<Plan>, IngestError> {
        let views: Vec<TurnView> = tail
            .turns
            .iter()
            .map(|turn| view(turn, tail.embeddings.get(&turn.turn_index)))
            .collect();
        let closed = close_segments(
            &views,
            &self.settings.rules(),
            tail.close_requested_through,
            Utc::now(),
        );
        if closed.is_empty() {
            return Ok(None);
        }
        let mut prepared = Vec::with_capacity(closed.len());
        for segment in closed {
            prepared.push(
                self.prepare(
                    scope,
                    conversation,
                    segment,
                    &tail,
                    Describers::LlmThenRules,
                )
                .await?,
            );
        }
        Ok(Some(Plan {
            segmented_through: tail.segmented_through,
            prepared,
            tail,
        }))
    }

    /// Consolidates the episodes a write created into facts.
    async fn consolidate_created(&self, scope: &Scope, outcome: &SegmentationOutcome) {
        if !self.settings.consolidate {
            return;
        }
        for closed in outcome.closed.iter().filter(|c| c.created) {
            if let Some(episode) = closed.episode
                && let Err(error) = self.consolidator.consolidate_episode(scope, episode).await
            {
                // The sweep consolidates what is left unconsolidated.
                tracing::warn!(%error, %episode, "consolidation failed; the sweep will retry");
            }
        }
    }

    /// Embeds, in one call, the open segments' turns that have no embedding yet, for the topic
    /// rules. Without an embedder, or when it fails, the topic rules simply see no embedding.
    async fn embed_missing(
        &self,
        conversations: &[(Scope, ConversationId)],
        tails: &mut [Result<Option<OpenTail>, IngestError>],
    ) {
        let Some(embedder) = &self.topic_embedder else {
            return;
        };
        // (which tail, turn index) of every turn to embed, and its text.
        let mut missing: Vec<(usize, i32)> = Vec::new();
        let mut texts: Vec<String> = Vec::new();
        for (position, tail) in tails.iter().enumerate() {
            let Ok(Some(tail)) = tail else { continue };
            for turn in &tail.turns {
                if !tail.embeddings.contains_key(&turn.turn_index) {
                    missing.push((position, turn.turn_index));
                    texts.push(turn.content.clone());
                }
            }
        }
        if texts.is_empty() {
            return;
        }
        let vectors = match embedder.embed(&texts).await {
            Ok(vectors) => vectors,
            Err(error) => {
                tracing::warn!(%error, "cannot embed turns; topic rules skipped this time");
                return;
            }
        };
        let mut embedded: Vec<Vec<(i32, Vec<f32>)>> = vec![Vec::new(); tails.len()];
        for ((position, turn_index), vector) in missing.into_iter().zip(vectors) {
            embedded[position].push((turn_index, vector));
        }
        for (position, embedded) in embedded.into_iter().enumerate() {
            let Ok(Some(tail)) = &mut tails[position] else {
                continue;
            };
            if embedded.is_empty() {
                continue;
            }
            let (scope, conversation) = &conversations[position];
            if let Err(error) = segments::store_turn_embeddings(
                &self.pool,
                scope,
                *conversation,
                embedder.model_id(),
                &embedded,
            )
            .await
            {
                tracing::warn!(%error, "cannot keep turn embeddings");
            }
            tail.embeddings.extend(embedded);
        }
    }

    /// Describes a closed segment and builds its episode (no transaction held).
    async fn prepare(
        &self,
        scope: &Scope,
        conversation: ConversationId,
        segment: ClosedSegment,
        tail: &OpenTail,
        describers: Describers,
    ) -> Result<Prepared, IngestError> {
        let turns: Vec<&TurnRecord> = tail
            .turns
            .iter()
            .filter(|turn| (segment.first..=segment.last).contains(&turn.turn_index))
            .collect();
        let texts: Vec<SegmentText> = turns
            .iter()
            .map(|turn| SegmentText {
                role: SpeakerRole::from_stored(&turn.role).unwrap_or_default(),
                content: turn.content.clone(),
                spoken_at: turn.spoken_at,
            })
            .collect();
        let trivial = texts
            .iter()
            .all(|turn| importance::is_chit_chat(&turn.content));
        let (title, summary, structured, llm_surprise, described_by) = if trivial {
            (
                String::new(),
                String::new(),
                StructuredSummary::default(),
                Some(0.0),
                "nothing",
            )
        } else {
            let description = self.describer.describe(&texts, describers).await;
            (
                description.title,
                description.summary,
                description.structured,
                description.surprise,
                description.described_by,
            )
        };
        // Without the LLM's judgement an episode is neutral until the backfill measures it with
        // its embedding; without an embedder it stays neutral.
        let surprise = llm_surprise.unwrap_or(NEUTRAL_SURPRISE);
        let surprise_pending =
            llm_surprise.is_none() && self.writer.hooks.embedding_model.is_some();
        let (stability, difficulty) = initial_state(surprise);
        let fingerprinted = normalize_for_fingerprint(&format!("{title}\n{summary}"));
        let extracted = metadata::extract(&summary);
        let tags = episode_tags(&structured.entities, extracted.tags);
        let importance = importance::classify(&summary, false, extracted.confidence).score();
        let retention: RetentionPolicy = self.writer.settings.retention();
        let now = Utc::now();
        let (messages, context) = excerpt(&turns);
        let first = turns.first().map_or(now, |turn| turn.spoken_at);
        let last = turns.last().map_or(now, |turn| turn.spoken_at);
        let id = episode_id(scope, conversation, segment.first);
        Ok(Prepared {
            segment,
            trivial,
            episode: NewEpisode {
                id,
                conversation_id: conversation.as_uuid(),
                title,
                summary,
                messages,
                surprise,
                surprise_pending,
                start_at: first,
                end_at: last,
                stability,
                difficulty,
                simhash: SimHash::of_normalized(&fingerprinted),
                text_digest: text_digest(&fingerprinted),
                tags,
                metadata_confidence: extracted.confidence,
                importance,
                structured_summary: serde_json::to_value(&structured).unwrap_or_default(),
                last_scores: retention.scores_without_query(now, importance, now),
            },
            context,
            described_by,
            last_received_at: turns.last().map_or(now, |turn| turn.created_at),
        })
    }

    /// Writes the prepared segments in one transaction (see the module documentation).
    ///
    /// The conversation's row is touched only at the end (taking its pending reviews, recording
    /// the progress), so it is locked for the last few statements and the commit, not for the
    /// episodes' writes: the row is also what every append to the conversation locks, and its
    /// next turns usually come while its last segment is being written.
    async fn write(
        &self,
        scope: &Scope,
        conversation: ConversationId,
        segmented_through: i32,
        prepared: Vec<Prepared>,
    ) -> Result<SegmentationOutcome, IngestError> {
        let mut transaction = engram_store::begin_with_spaces_locked(
            &self.pool,
            engram_store::SpaceAccess::WriteEntries,
            [scope],
        )
        .await?;
        if segments::progress(&mut transaction, scope, conversation).await?
            != Some(segmented_through)
        {
            // Segmented meanwhile (another pass, another replica), or forgotten: nothing to do.
            transaction.rollback().await?;
            return Ok(SegmentationOutcome::default());
        }
        let (incognito, memory_enabled) =
            engram_store::conversations::privacy_state(&mut transaction, scope, conversation)
                .await?;
        if incognito || !memory_enabled {
            // Turned off after the turns were stored: the segment waits, nothing is derived.
            transaction.rollback().await?;
            return Ok(SegmentationOutcome::default());
        }
        let written_segments = self
            .write_segments(&mut transaction, scope, conversation, prepared)
            .await?;

        let taken = segments::take_pending_reviews(&mut transaction, scope, conversation).await?;
        let mut reviews = taken.as_ref().map(pending_reviews).unwrap_or_default();
        reviews.sort_by_key(|(at, _)| *at);
        let mut reviews = reviews.into_iter().peekable();
        let publish = self.writer.hooks.publish_events;
        let mut outcome = SegmentationOutcome::default();
        let mut last_closed = segmented_through;
        for (prepared, episode_id, created) in written_segments {
            // The reviews recorded before this segment's last turn arrived are this segment's.
            let mut answered = Vec::new();
            while let Some((_, review)) =
                reviews.next_if(|(at, _)| *at <= prepared.last_received_at)
            {
                answered.push(review);
            }
            let pending = answered.len();
            if !answered.is_empty() && publish {
                // The review service grades them: what each retrieval returned, against the
                // segment's turns.
                let closed = ClosedSegmentEvent {
                    scope,
                    conversation,
                    segment_id: prepared.episode.id,
                    episode_id,
                    first_turn_index: prepared.segment.first,
                    last_turn_index: prepared.segment.last,
                    reason: prepared.segment.reason.as_str(),
                    context: prepared.context,
                    pending_reviews: answered,
                    closed_at: Utc::now(),
                };
                engram_store::outbox::insert(&mut transaction, &segment_closed(closed)).await?;
            }
            self.metrics
                .record_segment_closed(prepared.segment.reason.as_str(), created);
            last_closed = prepared.segment.last;
            outcome.closed.push(ClosedEpisode {
                segment: prepared.segment,
                episode: episode_id,
                created,
                pending_reviews: pending,
            });
        }
        // Reviews recorded while the still-open segment went on wait for it.
        let later: Vec<(DateTime<Utc>, v1::PendingReview)> = reviews.collect();
        if !later.is_empty() {
            segments::put_back_pending_reviews(
                &mut transaction,
                scope,
                conversation,
                &pending_reviews_json(&later),
            )
            .await?;
        }
        segments::mark_segmented(&mut transaction, scope, conversation, last_closed).await?;
        // A crash that undoes the commit undoes the progress with the episodes: the turns are
        // segmented again, into the same episodes (their ids come from the segments).
        engram_store::commit_derived(transaction).await?;
        if publish && let Some(wake) = &self.writer.hooks.new_entry_wake {
            wake.notify_one();
        }
        tracing::info!(
            closed = outcome.closed.len(),
            through = last_closed,
            "segments closed"
        );
        Ok(outcome)
    }

    /// Writes each segment's episode; returns each with its episode's id and whether it is new.
    async fn write_segments(
        &self,
        transaction: &mut sqlx::PgConnection,
        scope: &Scope,
        conversation: ConversationId,
        prepared: Vec<Prepared>,
    ) -> Result<Vec<(Prepared, Option<Uuid>, bool)>, IngestError> {
        let retention = self.writer.settings.retention();
        let mut written = Vec::with_capacity(prepared.len());
        for prepared in prepared {
            let (episode_id, created) = self
                .write_segment(transaction, scope, conversation, &prepared, &retention)
                .await?;
            written.push((prepared, episode_id, created));
        }
        Ok(written)
    }

    /// Writes one closed segment's episode (unless it is greetings only) and audits the
    /// segment; returns the episode's id and whether it is new.
    async fn write_segment(
        &self,
        transaction: &mut sqlx::PgConnection,
        scope: &Scope,
        conversation: ConversationId,
        prepared: &Prepared,
        retention: &RetentionPolicy,
    ) -> Result<(Option<Uuid>, bool), IngestError> {
        let episode = &prepared.episode;
        let event = self
            .writer
            .hooks
            .announce_embeddings()
            .then(|| embedding_requested(episode.id, scope, Default::default()));
        // Derived: "forget that" in the conversation means what the user said, not this.
        let detail = json!({
            "segment": [prepared.segment.first, prepared.segment.last],
            "reason": prepared.segment.reason.as_str(),
            "described_by": prepared.described_by,
            "derived": true,
        });
        let written = if prepared.trivial {
            None
        } else {
            Some(
                segments::write_episode(transaction, scope, episode, detail, event.as_ref())
                    .await?,
            )
        };
        let (episode_id, created) = match &written {
            Some(EpisodeWrite::Created(record)) => (Some(record.id), true),
            Some(EpisodeWrite::Merged(record)) => (Some(record.id), false),
            Some(EpisodeWrite::AlreadyWritten(id)) => (Some(id.to_owned()), false),
            Some(EpisodeWrite::Suppressed) | None => (None, false),
        };
        if created {
            self.enforce_soft_cap(transaction, scope, retention).await?;
        }
        audit::append(
            transaction,
            scope,
            audit::AuditAction::Segment,
            episode_id,
            Some(conversation),
            json!({
                "segment": [prepared.segment.first, prepared.segment.last],
                "reason": prepared.segment.reason.as_str(),
                "episode": match &written {
                    Some(EpisodeWrite::Created(_)) => "created",
                    Some(EpisodeWrite::Merged(_)) => "repeated",
                    Some(EpisodeWrite::AlreadyWritten(_)) => "already written",
                    Some(EpisodeWrite::Suppressed) => "suppressed by a tombstone",
                    None => "none: greetings and thanks only",
                },
            }),
        )
        .await?;
        Ok((episode_id, created))
    }

    /// The soft cap after a new episode, as after any new entry.
    async fn enforce_soft_cap(
        &self,
        connection: &mut sqlx::PgConnection,
        scope: &Scope,
        retention: &RetentionPolicy,
    ) -> Result<(), IngestError> {
        let (count, cap) = segments::space_size(connection, scope).await?;
        let cap = cap.map_or(i64::from(self.writer.settings.soft_cap), i64::from);
        let overage = count - cap;
        if overage > 0 {
            let outcome =
                enforce_soft_caps(connection, &[CapacityTarget { scope, overage }], retention)
                    .await?;
            let trimmed: usize = outcome.iter().map(|o| o.trimmed.len()).sum();
            self.metrics.record_trimmed(trimmed as u64);
        }
        Ok(())
    }

    /// Runs until `stop`: on every wake-up (appends without the bus) and every sweep interval,
    /// looks at the conversations whose open segment may be due, and consolidates episodes left
    /// unconsolidated.
    pub async fn run(self, wake: Arc<Notify>, mut stop: watch::Receiver<bool>) {
        let interval = Duration::from_millis(self.settings.sweep_interval_ms.max(10));
        let mut changed_since: Option<DateTime<Utc>> = None;
        loop {
            let started = Utc::now();
            if let Err(error) = self.sweep(changed_since, &stop).await {
                tracing::warn!(%error, "segmentation sweep failed; retrying");
            }
            // Without the bus every append wakes this loop: the next pass takes what changed
            // since this one started. A conversation's `updated_at` is its transaction's start,
            // so an append that began before this pass and committed during it is older than
            // `started`: the margin takes it too (looking again at a conversation is a no-op).
            if !self.writer.hooks.publish_events {
                changed_since = Some(started - CHANGE_MARGIN);
            }
            tokio::select! {
                () = wake.notified() => {}
                () = tokio::time::sleep(interval) => {}
                _ = stop.changed() => break,
            }
            if *stop.borrow() {
                break;
            }
        }
        tracing::info!("segmentation stopped");
    }

    /// One pass over the conversations that may be due. It stops between conversations once
    /// `stop` is set: a pass over hundreds of conversations with the local model takes minutes,
    /// and a service told to stop must not run it to the end (what is left is found next time).
    async fn sweep(
        &self,
        changed_since: Option<DateTime<Utc>>,
        stop: &watch::Receiver<bool>,
    ) -> Result<(), IngestError> {
        let idle_before = Utc::now() - self.settings.rules().idle_close;
        // Without the bus, the first pass looks at everything open.
        let since = if self.writer.hooks.publish_events {
            None
        } else {
            // Not chrono's MIN_UTC: Postgres refuses it ("timestamp out of range"), and the
            // first sweep of every start failed on it.
            Some(changed_since.unwrap_or_else(engram_server::time::earliest_supported))
        };
        let due = segments::due_conversations(&self.pool, idle_before, since, SWEEP_BATCH).await?;
        let due: Vec<(Scope, ConversationId)> = due
            .into_iter()
            .filter_map(|conversation| {
                let space = engram_core::SpaceName::parse("space", &conversation.space).ok()?;
                let scope = Scope {
                    user_id: engram_core::UserId::from_uuid(conversation.user_id),
                    space,
                };
                Some((
                    scope,
                    ConversationId::from_uuid(conversation.conversation_id),
                ))
            })
            .collect();
        for batch in due.chunks(self.settings.batch) {
            if *stop.borrow() {
                return Ok(());
            }
            // Failures are logged per conversation; the next pass takes them again.
            self.segment_many(batch).await;
        }
        if self.settings.consolidate && !*stop.borrow() {
            self.consolidator.consolidate_leftovers().await?;
        }
        Ok(())
    }
}
/// An episode's tags: the entities its description names, then what its summary names; each
/// once, within a client's tag length (lowercasing may lengthen a name), at most
/// `MAX_DERIVED_TAGS`.
fn episode_tags(entities: &[String], extracted: Vec<String>) -> Vec<String> {
    let mut tags: Vec<String> = Vec::new();
    for tag in entities
        .iter()
        .map(|entity| entity.to_lowercase())
        .chain(extracted)
    {
        if !tags.contains(&tag)
            && tags.len() < engram_core::metadata::MAX_DERIVED_TAGS
            && tag.chars().count() <= MAX_TAG_CHARS
        {
            tags.push(tag);
        }
    }
    tags
}

/// A segment's episode id, the same each time the segment is written (a segmentation that runs
/// again after a crash writes the same episodes).
fn episode_id(scope: &Scope, conversation: ConversationId, first_turn: i32) -> Uuid {
    Uuid::new_v5(
        &EPISODE_NAMESPACE,
        format!(
            "{}/{}/{}/{}",
            scope.user_id, scope.space, conversation, first_turn
        )
        .as_bytes(),
    )
}

/// Pending reviews as the conversation's row keeps them.
fn pending_reviews_json(reviews: &[(DateTime<Utc>, v1::PendingReview)]) -> serde_json::Value {
    serde_json::Value::Array(
        reviews
            .iter()
            .map(|(at, review)| {
                json!({
                    "query": review.query,
                    "memory_ids": review.memory_ids,
                    "retrieved_at": at,
                })
            })
            .collect(),
    )
}
