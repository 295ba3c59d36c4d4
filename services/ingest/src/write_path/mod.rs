//! The write path of an explicit memory (seed: "Write Path Policy").
//!
//! A Remember is analysed where it arrives (fingerprint, metadata, importance: no I/O), then
//! handed to the group commit ([`crate::group_commit`]), which writes it in a transaction shared
//! with the other writes waiting at that moment ([`batch`]: the rounds, the statements, the
//! event each new entry stores in the outbox). What each write does to the store is decided here,
//! one write at a time, from what the store holds for its space.

use std::collections::HashMap;
use std::sync::Arc;

use chrono::{DateTime, Utc};
use engram_core::conflict::{self, SubjectValue};
use engram_core::normalize::normalize_for_fingerprint;
use engram_core::{
    Category, ConversationId, MemoryText, RetentionPolicy, Scope, SimHash, SpeakerRole, importance,
    metadata, when,
};
use engram_store::memories::{MemoryRecord, MergeUpdate, NewSemanticMemory};
use engram_store::write_path::WriteContext;
use sha2::{Digest, Sha256};
use sqlx::PgPool;
use uuid::Uuid;

use crate::config::MemorySettings;
use crate::error::IngestError;
use crate::group_commit::WriteQueue;

mod batch;

use crate::metrics::IngestMetrics;
pub use batch::embedding_requested;
use batch::{QueuedRemember, RememberBatches};

/// Most tags and source ids an entry keeps (merges included).
pub const MAX_TAGS_PER_ENTRY: usize = 32;
/// Characters of one tag: a client's (Remember, ImportMemories) or one derived from an LLM's
/// answer (an episode's entities).
pub const MAX_TAG_CHARS: usize = 64;
pub const MAX_SOURCE_IDS_PER_ENTRY: usize = 64;

/// Carries out writes and user controls; cheap to clone.
#[derive(Debug, Clone)]
pub struct MemoryWriter {
    pub(crate) pool: PgPool,
    /// The group commit's own connections, one per commit slot.
    commit_pool: PgPool,
    pub(crate) settings: Arc<MemorySettings>,
    pub(crate) metrics: Arc<IngestMetrics>,
    pub(crate) hooks: Arc<BackfillHooks>,
    /// Remembers wait here for their group commit.
    queue: WriteQueue<RememberBatches>,
    /// The retrieval pipeline, for "what do you remember about X".
    pub(crate) recall: Option<engram_recall::Recall>,
}

/// How writes reach the background workers (embedding backfill, outbox relay, segmentation).
#[derive(Debug, Clone, Default)]
pub struct BackfillHooks {
    /// Woken after a new entry is committed: the outbox relay (bus on) or the sweep (bus off).
    pub new_entry_wake: Option<Arc<tokio::sync::Notify>>,
    /// Wakes the sweep itself (re-embedding requests are found by it, not announced on the bus).
    pub sweep_wake: Option<Arc<tokio::sync::Notify>>,
    /// The model the backfill embeds with.
    pub embedding_model: Option<String>,
    /// Whether events go on the bus (through the outbox): segmentation requests and closed
    /// segments, and, when an embedder runs, EmbeddingRequested for every new entry.
    pub publish_events: bool,
    /// Woken after turns are appended when no bus carries segmentation requests.
    pub segmentation_wake: Option<Arc<tokio::sync::Notify>>,
}

impl BackfillHooks {
    /// New entries are announced for the embedding consumer (bus on, an embedder running).
    pub fn announce_embeddings(&self) -> bool {
        self.publish_events && self.embedding_model.is_some()
    }
}

/// A validated Remember.
#[derive(Debug, Clone)]
pub struct RememberCommand {
    pub scope: Scope,
    pub text: MemoryText,
    /// `None`: infer from the text.
    pub category: Option<Category>,
    pub role: SpeakerRole,
    pub tags: Vec<String>,
    pub source_ids: Vec<String>,
    pub manually_saved: bool,
    pub pin: bool,
    pub conversation: Option<ConversationId>,
    /// A fact consolidated from this episode (kept in `source_episode_ids`; a near-duplicate
    /// that already lists it is left as it is, so consolidating twice changes nothing).
    pub source_episode: Option<Uuid>,
    /// When the fact became true, if not now (a consolidated fact: when it was said).
    pub valid_at: Option<DateTime<Utc>>,
}

impl RememberCommand {
    /// A Remember of `text` with nothing else said about it.
    pub fn plain(scope: Scope, text: MemoryText) -> Self {
        Self {
            scope,
            text,
            category: None,
            role: SpeakerRole::User,
            tags: Vec::new(),
            source_ids: Vec::new(),
            manually_saved: false,
            pin: false,
            conversation: None,
            source_episode: None,
            valid_at: None,
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub enum RememberResult {
    Created {
        memory: MemoryRecord,
        trimmed: Vec<Uuid>,
    },
    Merged {
        memory: MemoryRecord,
    },
    SuppressedByTombstone {
        expires_at: DateTime<Utc>,
    },
    SkippedMemoryDisabled,
    SkippedIncognito,
    /// Stored, then removed by the soft cap in the same transaction: the space is full of entries
    /// that are protected or score higher. `trimmed` includes the new entry's id.
    TrimmedAtCapacity {
        trimmed: Vec<Uuid>,
    },
}

/// Everything about a text that can be decided without the database.
#[derive(Debug, Clone)]
pub(crate) struct Analysis {
    pub(crate) simhash: SimHash,
    pub(crate) digest: Vec<u8>,
    tags: Vec<String>,
    metadata_confidence: f64,
    importance: f64,
    manually_saved: bool,
    category: Category,
    /// The subject and value the fact states, when the conflict rules see one.
    pub(crate) states: Option<SubjectValue>,
}

pub(crate) fn analyse(command: &RememberCommand) -> Analysis {
    let text = command.text.as_str();
    let normalized = normalize_for_fingerprint(text);
    let extracted = metadata::extract(text);
    let signals = importance::classify(
        text,
        command.manually_saved || command.pin,
        extracted.confidence,
    );
    Analysis {
        simhash: SimHash::of_normalized(&normalized),
        digest: text_digest(&normalized),
        // The days relative words meant ("next Wednesday" said today, or in the conversation a
        // fact was drawn from), then what the text names.
        tags: merge_labels(
            &merge_labels(
                &command.tags,
                &when::date_tags(text, command.valid_at.unwrap_or_else(Utc::now)),
                MAX_TAGS_PER_ENTRY,
            ),
            &extracted.tags,
            MAX_TAGS_PER_ENTRY,
        ),
        metadata_confidence: extracted.confidence,
        importance: signals.score(),
        // Asking in words ("remember that ...") is as explicit as the flag.
        manually_saved: signals.explicit_save,
        category: command
            .category
            .unwrap_or_else(|| importance::infer_category(text)),
        states: conflict::subject_value(text),
    }
}

/// Digest of normalized text kept by tombstones (the text itself is not kept).
pub(crate) fn text_digest(normalized: &str) -> Vec<u8> {
    Sha256::digest(normalized.as_bytes()).to_vec()
}

/// `first` then the new items of `second`, case-insensitively unique, at most `limit`.
pub(crate) fn merge_labels(first: &[String], second: &[String], limit: usize) -> Vec<String> {
    let mut merged: Vec<String> = Vec::with_capacity(first.len() + second.len());
    for label in first.iter().chain(second) {
        if merged.len() == limit {
            break;
        }
        if !merged.iter().any(|kept| kept.eq_ignore_ascii_case(label)) {
            merged.push(label.clone());
        }
    }
    merged
}

impl MemoryWriter {
    /// Starts the group commit that carries out Remembers (so it needs a Tokio runtime).
    pub fn new(
        pool: PgPool,
        settings: MemorySettings,
        metrics: Arc<IngestMetrics>,
        hooks: BackfillHooks,
    ) -> Self {
        let settings = Arc::new(settings);
        let hooks = Arc::new(hooks);
        let group_commit = settings.group_commit();
        // A connection per commit slot, kept: batches always run on the same server processes
        // (their plan and catalog caches, and their mappings of the buffer cache, stay warm)
        // instead of going round the whole pool, and never wait behind the rest of the service.
        let commit_pool = engram_store::pool_beside(&pool, group_commit.concurrency as u32);
        let queue = WriteQueue::start(
            RememberBatches {
                pool: commit_pool.clone(),
                settings: settings.clone(),
                metrics: metrics.clone(),
                hooks: hooks.clone(),
            },
            group_commit,
            metrics.clone(),
        );
        Self {
            pool,
            commit_pool,
            settings,
            metrics,
            hooks,
            queue,
            recall: None,
        }
    }

    /// The connections of the group commit: closing them waits for the batches under way and
    /// refuses new ones (at shutdown, once no request can arrive).
    pub fn commit_pool(&self) -> &PgPool {
        &self.commit_pool
    }

    /// Lets ApplyCommand answer "what do you remember about X" with a retrieval.
    pub fn with_recall(mut self, recall: engram_recall::Recall) -> Self {
        self.recall = Some(recall);
        self
    }

    pub fn metrics(&self) -> &IngestMetrics {
        &self.metrics
    }

    /// Stores an explicit memory, or merges it into its near-duplicate.
    #[tracing::instrument(skip_all, fields(user_id = %command.scope.user_id, space = %command.scope.space), err(Display))]
    pub async fn remember(&self, command: RememberCommand) -> Result<RememberResult, IngestError> {
        let analysis = analyse(&command);
        // The entry is written later, by the group commit, outside this request's span: the event
        // announcing it carries this request's trace context.
        let trace_headers = if self.hooks.announce_embeddings() {
            engram_bus::current_trace_headers()
        } else {
            HashMap::new()
        };
        self.queue
            .write(QueuedRemember {
                command,
                analysis,
                trace_headers,
            })
            .await
    }
}

/// What one write does, decided from its space's state (read under the space's lock).
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Decision<'a> {
    /// Nothing is written: memory is off, the conversation is incognito, or a tombstone blocks
    /// the text.
    Skip(Skipped),
    /// Fold the write into this near-duplicate.
    Merge(&'a MemoryRecord),
    /// The near-duplicate already holds this write: a fact consolidated from an episode that
    /// the entry already lists as a source (consolidation ran again). Nothing changes.
    AlreadyHeld(&'a MemoryRecord),
    Create,
}

/// Why a write writes nothing.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Skipped {
    MemoryDisabled,
    Incognito,
    Tombstone { expires_at: DateTime<Utc> },
}

impl From<Skipped> for RememberResult {
    fn from(skipped: Skipped) -> Self {
        match skipped {
            Skipped::MemoryDisabled => RememberResult::SkippedMemoryDisabled,
            Skipped::Incognito => RememberResult::SkippedIncognito,
            Skipped::Tombstone { expires_at } => {
                RememberResult::SuppressedByTombstone { expires_at }
            }
        }
    }
}

/// Memory off, incognito and tombstones first; then merge into a near-duplicate or create.
pub(crate) fn decide<'a>(command: &RememberCommand, context: &'a WriteContext) -> Decision<'a> {
    if !context.memory_enabled {
        return Decision::Skip(Skipped::MemoryDisabled);
    }
    if command.conversation.is_some()
        && context
            .conversation_incognito
            .unwrap_or(context.incognito_default)
    {
        return Decision::Skip(Skipped::Incognito);
    }
    if let Some(expires_at) = context.tombstone_expires_at {
        return Decision::Skip(Skipped::Tombstone { expires_at });
    }
    match &context.near_duplicate {
        // "Nate: I love hiking." and "Joanna: I love hiking." are near in SimHash but about two
        // people: never merged.
        Some(existing) if !same_speaker(&existing.text, command.text.as_str()) => Decision::Create,
        Some(existing)
            if command
                .source_episode
                .is_some_and(|episode| existing.source_episode_ids.contains(&episode)) =>
        {
            Decision::AlreadyHeld(existing)
        }
        Some(existing) => Decision::Merge(existing),
        None => Decision::Create,
    }
}

/// Whether two facts are said by the same speaker: both by the same named one ("Nate: …"), or
/// neither names one.
fn same_speaker(one: &str, other: &str) -> bool {
    use engram_core::speaker::speaker_label;
    match (speaker_label(one), speaker_label(other)) {
        (Some(one), Some(other)) => one.eq_ignore_ascii_case(other),
        (one, other) => one.is_none() && other.is_none(),
    }
}

/// By how many entries the space goes over its soft cap once a new entry is in.
pub(crate) fn overage_after_insert(context: &WriteContext, default_soft_cap: u32) -> i64 {
    let soft_cap = context
        .soft_cap
        .map_or(i64::from(default_soft_cap), i64::from);
    context.memory_count + 1 - soft_cap
}

/// The entry a write creates.
pub(crate) fn new_memory(
    command: &RememberCommand,
    analysis: &Analysis,
    retention: &RetentionPolicy,
    now: DateTime<Utc>,
) -> NewSemanticMemory {
    NewSemanticMemory {
        id: Uuid::now_v7(),
        conversation_id: command.conversation.map(|c| c.as_uuid()),
        text: command.text.as_str().to_owned(),
        role: command.role.as_str(),
        category: analysis.category.as_str(),
        simhash: analysis.simhash,
        tags: analysis.tags.clone(),
        source_ids: command.source_ids.clone(),
        metadata_confidence: analysis.metadata_confidence,
        importance: analysis.importance,
        pinned: command.pin,
        manually_saved: analysis.manually_saved,
        last_scores: retention.scores_without_query(now, analysis.importance, now),
        source_episode_ids: command.source_episode.into_iter().collect(),
        fact_subject: analysis.states.as_ref().map(|s| s.subject.clone()),
        fact_value: analysis.states.as_ref().map(|s| s.value.clone()),
        valid_at: command.valid_at,
    }
}

/// Detail of a new entry's `create` audit event. A fact consolidated from an episode says it was
/// derived (and from which episode): "forget that" means what the user said, not what Engram
/// derived.
pub(crate) fn create_audit_detail(
    command: &RememberCommand,
    analysis: &Analysis,
) -> serde_json::Value {
    match command.source_episode {
        Some(episode) => serde_json::json!({
            "importance": analysis.importance,
            "category": analysis.category.as_str(),
            "derived": true,
            "source_episode": episode,
        }),
        None => serde_json::json!({
            "importance": analysis.importance,
            "category": analysis.category.as_str(),
        }),
    }
}

/// What a near-duplicate write changes on its canonical entry.
pub(crate) fn merge_update(
    command: &RememberCommand,
    analysis: &Analysis,
    existing: &MemoryRecord,
    retention: &RetentionPolicy,
    now: DateTime<Utc>,
) -> MergeUpdate {
    let repeat_count = existing.repeat_count.saturating_add(1);
    let merged_importance = importance::merged_importance(
        existing.importance,
        analysis.importance,
        u32::try_from(repeat_count).unwrap_or(u32::MAX),
    );
    MergeUpdate {
        repeat_count,
        importance: merged_importance,
        last_scores: retention.scores_without_query(existing.created_at, merged_importance, now),
        manually_saved: existing.manually_saved || analysis.manually_saved,
        // Pinning policy: an explicit pin request pins the canonical entry; nothing unpins it here.
        pinned: existing.pinned || command.pin,
        tags: merge_labels(&existing.tags, &analysis.tags, MAX_TAGS_PER_ENTRY),
        source_ids: merge_labels(
            &existing.source_ids,
            &command.source_ids,
            MAX_SOURCE_IDS_PER_ENTRY,
        ),
        metadata_confidence: existing
            .metadata_confidence
            .max(analysis.metadata_confidence),
        source_episode_ids: existing
            .source_episode_ids
            .iter()
            .copied()
            .chain(command.source_episode)
            .fold(Vec::new(), |mut ids, id| {
                if !ids.contains(&id) {
                    ids.push(id);
                }
                ids
            }),
    }
}

/// Detail of a suppressed write's audit event. Not the text: the user asked for it to be forgotten.
pub(crate) fn suppress_audit_detail(tombstone_expires_at: DateTime<Utc>) -> serde_json::Value {
    serde_json::json!({
        "reason": "forgotten recently",
        // As the forget event writes it (serde's RFC 3339, "Z"), so the two can be compared.
        "tombstone_expires_at": tombstone_expires_at,
    })
}

/// Detail of a merge's audit event (derived, as [`create_audit_detail`] says, for a fact
/// consolidated from an episode).
pub(crate) fn merge_audit_detail(
    command: &RememberCommand,
    update: &MergeUpdate,
) -> serde_json::Value {
    match command.source_episode {
        Some(episode) => serde_json::json!({
            "repeat_count": update.repeat_count,
            "importance": update.importance,
            "derived": true,
            "source_episode": episode,
        }),
        None => {
            serde_json::json!({ "repeat_count": update.repeat_count, "importance": update.importance })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn facts_of_two_named_speakers_are_never_the_same_speaker() {
        assert!(same_speaker("Nate: I love hiking.", "NATE: I love hiking!"));
        assert!(same_speaker("I love hiking.", "I really love hiking."));
        assert!(!same_speaker(
            "Nate: I love hiking.",
            "Joanna: I love hiking."
        ));
        assert!(!same_speaker("Nate: I love hiking.", "I love hiking."));
    }

    #[test]
    fn labels_merge_without_duplicates_up_to_the_limit() {
        let merged = merge_labels(
            &["Rust".into(), "work".into()],
            &["rust".into(), "tea".into()],
            3,
        );
        assert_eq!(merged, vec!["Rust", "work", "tea"]);
        let limited = merge_labels(&["a".into(), "b".into()], &["c".into()], 2);
        assert_eq!(limited, vec!["a", "b"]);
    }
}
