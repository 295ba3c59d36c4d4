//! The write path of an explicit memory (seed: "Write Path Policy").

use std::sync::Arc;

use chrono::{DateTime, Utc};
use engram_core::normalize::normalize_for_fingerprint;
use engram_core::{
    Category, ConversationId, MemoryText, RetentionPolicy, Scope, SimHash, SpeakerRole, importance,
    metadata,
};
use engram_store::audit::{self, AuditAction};
use engram_store::memories::{self, MemoryRecord, MergeUpdate, NewSemanticMemory};
use engram_store::write_path;
use serde_json::json;
use sha2::{Digest, Sha256};
use sqlx::{PgConnection, PgPool};
use uuid::Uuid;

use crate::config::MemorySettings;
use crate::error::IngestError;
use crate::metrics::IngestMetrics;

/// Most tags and source ids an entry keeps (merges included).
pub const MAX_TAGS_PER_ENTRY: usize = 32;
pub const MAX_SOURCE_IDS_PER_ENTRY: usize = 64;

/// Carries out writes and user controls; cheap to clone.
#[derive(Debug, Clone)]
pub struct MemoryWriter {
    pub(crate) pool: PgPool,
    pub(crate) settings: Arc<MemorySettings>,
    pub(crate) metrics: Arc<IngestMetrics>,
    /// Woken after a new entry is committed: the outbox relay (bus on) or the sweep (bus off).
    pub(crate) new_entry_wake: Option<Arc<tokio::sync::Notify>>,
    /// Wakes the sweep itself (re-embedding requests are found by it, not announced on the bus).
    pub(crate) sweep_wake: Option<Arc<tokio::sync::Notify>>,
    /// The model the backfill embeds with; `None` when it is disabled.
    pub(crate) embedding_model: Option<String>,
    /// Whether new entries are announced on the bus (an EmbeddingRequested event in the outbox).
    publish_events: bool,
    /// The retrieval pipeline, for "what do you remember about X".
    pub(crate) recall: Option<engram_recall::Recall>,
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
}

#[derive(Debug, Clone)]
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
}

/// Everything about a text that can be decided without the database.
struct Analysis {
    simhash: SimHash,
    digest: Vec<u8>,
    tags: Vec<String>,
    metadata_confidence: f64,
    importance: f64,
    manually_saved: bool,
    category: Category,
}

fn analyse(command: &RememberCommand) -> Analysis {
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
        tags: merge_labels(&command.tags, &extracted.tags, MAX_TAGS_PER_ENTRY),
        metadata_confidence: extracted.confidence,
        importance: signals.score(),
        // Asking in words ("remember that ...") is as explicit as the flag.
        manually_saved: signals.explicit_save,
        category: command
            .category
            .unwrap_or_else(|| importance::infer_category(text)),
    }
}

/// Digest of normalized text kept by tombstones (the text itself is not kept).
pub(crate) fn text_digest(normalized: &str) -> Vec<u8> {
    Sha256::digest(normalized.as_bytes()).to_vec()
}

/// `first` then the new items of `second`, case-insensitively unique, at most `limit`.
fn merge_labels(first: &[String], second: &[String], limit: usize) -> Vec<String> {
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
    pub fn new(pool: PgPool, settings: MemorySettings, metrics: Arc<IngestMetrics>) -> Self {
        Self {
            pool,
            settings: Arc::new(settings),
            metrics,
            new_entry_wake: None,
            sweep_wake: None,
            embedding_model: None,
            publish_events: false,
            recall: None,
        }
    }

    /// Lets ApplyCommand answer "what do you remember about X" with a retrieval.
    pub fn with_recall(mut self, recall: engram_recall::Recall) -> Self {
        self.recall = Some(recall);
        self
    }

    /// New entries get an EmbeddingRequested event in the outbox, in the writing transaction.
    pub fn publishing_events(mut self) -> Self {
        self.publish_events = true;
        self
    }

    /// Connects the writer to a running backfill: `new_entry_wake` is woken after each new entry,
    /// `sweep_wake` after a re-embedding request.
    pub fn with_backfill(
        mut self,
        new_entry_wake: Arc<tokio::sync::Notify>,
        sweep_wake: Arc<tokio::sync::Notify>,
        model: String,
    ) -> Self {
        self.new_entry_wake = Some(new_entry_wake);
        self.sweep_wake = Some(sweep_wake);
        self.embedding_model = Some(model);
        self
    }

    pub fn metrics(&self) -> &IngestMetrics {
        &self.metrics
    }

    /// Stores an explicit memory, or merges it into its near-duplicate.
    #[tracing::instrument(skip_all, fields(user_id = %command.scope.user_id, space = %command.scope.space), err(Display))]
    pub async fn remember(&self, command: RememberCommand) -> Result<RememberResult, IngestError> {
        let analysis = analyse(&command);
        let scope = &command.scope;

        let mut transaction = self.pool.begin().await?;
        engram_store::lock_space(&mut transaction, scope).await?;

        let context = write_path::write_context(
            &mut transaction,
            scope,
            command.conversation,
            analysis.simhash,
            &analysis.digest,
        )
        .await?;
        if !context.memory_enabled {
            return Ok(RememberResult::SkippedMemoryDisabled);
        }
        if command.conversation.is_some()
            && context
                .conversation_incognito
                .unwrap_or(context.incognito_default)
        {
            return Ok(RememberResult::SkippedIncognito);
        }
        if let Some(expires_at) = context.tombstone_expires_at {
            return Ok(RememberResult::SuppressedByTombstone { expires_at });
        }

        let near_duplicate = match context.near_duplicate_id {
            Some(id) => memories::get(&mut transaction, scope, id).await?,
            None => None,
        };
        if let Some(existing) = near_duplicate {
            let retention = self.settings.retention();
            let memory =
                merge(&mut transaction, &command, &analysis, &existing, &retention).await?;
            transaction.commit().await?;
            self.metrics.record_merged();
            return Ok(RememberResult::Merged { memory });
        }

        let now = Utc::now();
        let new_memory = NewSemanticMemory {
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
            last_scores: self.settings.retention().scores_without_query(
                now,
                analysis.importance,
                now,
            ),
        };
        let event = self
            .publish_events
            .then(|| crate::bus::embedding_requested(new_memory.id, scope));
        let memory = write_path::insert_semantic_audited(
            &mut transaction,
            scope,
            &new_memory,
            json!({ "importance": analysis.importance, "category": analysis.category.as_str() }),
            event.as_ref(),
        )
        .await?;

        let soft_cap = context
            .soft_cap
            .map_or(i64::from(self.settings.soft_cap), i64::from);
        let overage = context.memory_count + 1 - soft_cap;
        let trimmed = if overage > 0 {
            self.enforce_capacity(&mut transaction, scope, overage)
                .await?
        } else {
            Vec::new()
        };
        transaction.commit().await?;

        self.metrics.record_created();
        if let Some(wake) = &self.new_entry_wake {
            wake.notify_one();
        }
        if !trimmed.is_empty() {
            self.metrics.record_trimmed(trimmed.len() as u64);
        }
        Ok(RememberResult::Created { memory, trimmed })
    }

    /// Trims `overage` entries of lowest total score, never pinned or saved ones, and alerts
    /// when a protected entry would have been a victim.
    async fn enforce_capacity(
        &self,
        connection: &mut PgConnection,
        scope: &Scope,
        overage: i64,
    ) -> Result<Vec<Uuid>, IngestError> {
        let outcome =
            write_path::enforce_soft_cap(connection, scope, overage, &self.settings.retention())
                .await?;
        if !outcome.protected_would_be_victims.is_empty() {
            tracing::warn!(
                user_id = %scope.user_id,
                space = %scope.space,
                protected = ?outcome.protected_would_be_victims,
                "capacity alert: pinned or saved entries have the lowest scores and would have been trimmed"
            );
            self.metrics
                .record_pinned_trim_alerts(outcome.protected_would_be_victims.len() as u64);
        }
        let shortfall = overage - outcome.trimmed.len() as i64;
        if shortfall > 0 {
            tracing::info!(
                user_id = %scope.user_id,
                space = %scope.space,
                over_by = shortfall,
                "space stays over its soft cap: the remaining entries are pinned or saved"
            );
        }
        Ok(outcome.trimmed)
    }
}

async fn merge(
    connection: &mut PgConnection,
    command: &RememberCommand,
    analysis: &Analysis,
    existing: &MemoryRecord,
    retention: &RetentionPolicy,
) -> Result<MemoryRecord, IngestError> {
    let repeat_count = existing.repeat_count.saturating_add(1);
    let merged_importance = importance::merged_importance(
        existing.importance,
        analysis.importance,
        u32::try_from(repeat_count).unwrap_or(u32::MAX),
    );
    let update = MergeUpdate {
        repeat_count,
        importance: merged_importance,
        last_scores: retention.scores_without_query(
            existing.created_at,
            merged_importance,
            Utc::now(),
        ),
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
    };
    let memory = memories::apply_merge(connection, &command.scope, existing.id, &update).await?;
    audit::append(
        connection,
        &command.scope,
        AuditAction::Merge,
        Some(memory.id),
        command.conversation,
        json!({ "repeat_count": repeat_count, "importance": update.importance }),
    )
    .await?;
    Ok(memory)
}

#[cfg(test)]
mod tests {
    use super::*;

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
