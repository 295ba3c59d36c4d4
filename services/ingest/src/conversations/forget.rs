//! ForgetConversation: a conversation and what was derived only from it leave memory.

use chrono::{DateTime, SubsecRound, Utc};
use engram_core::normalize::normalize_for_fingerprint;
use engram_core::{ConversationId, Scope, SimHash};
use engram_server::deadline::mark_write_started;
use engram_store::audit::{self, AuditAction};
use engram_store::memories::MemoryRecord;
use engram_store::tombstones::NewTombstone;
use engram_store::{segments, tombstones};
use serde_json::json;

use crate::error::IngestError;
use crate::write_path::{MemoryWriter, text_digest};

/// What ForgetConversation deleted (the receipt).
#[derive(Debug, Clone, PartialEq)]
pub struct ConversationReceipt {
    pub turns: u64,
    pub episodes: u64,
    pub facts_deleted: u64,
    pub facts_kept: u64,
    pub pending_reviews: u64,
    pub tombstone_expires_at: DateTime<Utc>,
}

/// The tombstone of a deleted entry: its SimHash and the digest of the text it was fingerprinted
/// by (an episode as segmentation fingerprinted it, title and summary; a fact its text).
pub(crate) fn tombstone_for(memory: &MemoryRecord) -> NewTombstone {
    let fingerprinted = match &memory.title {
        Some(title) if !title.is_empty() => {
            normalize_for_fingerprint(&format!("{title}\n{}", memory.text))
        }
        _ => normalize_for_fingerprint(&memory.text),
    };
    (
        memory.id,
        SimHash::from_i64(memory.simhash),
        text_digest(&fingerprinted),
    )
}

impl MemoryWriter {
    /// Deletes the conversation's turns, episodes and the facts derived only from them, each
    /// episode and fact leaving a tombstone as Forget does, and audits it with the counts.
    #[tracing::instrument(skip_all, fields(user_id = %scope.user_id, space = %scope.space, conversation = %conversation), err(Display))]
    pub async fn forget_conversation(
        &self,
        scope: &Scope,
        conversation: ConversationId,
    ) -> Result<ConversationReceipt, IngestError> {
        let mut transaction = engram_store::begin_with_spaces_locked(
            &self.pool,
            engram_store::SpaceAccess::Exclusive,
            [scope],
        )
        .await?;
        let forgotten = segments::forget_conversation(&mut transaction, scope, conversation)
            .await?
            .ok_or_else(|| super::unknown_conversation(scope, conversation))?;
        let expires_at = (Utc::now() + self.settings.tombstone_ttl()).trunc_subsecs(6);
        let tombstones: Vec<(&Scope, NewTombstone)> = forgotten
            .episodes
            .iter()
            .chain(&forgotten.facts)
            .map(|memory| (scope, tombstone_for(memory)))
            .collect();
        tombstones::insert_many(&mut transaction, &tombstones, expires_at).await?;
        let receipt = ConversationReceipt {
            turns: forgotten.turns,
            episodes: forgotten.episodes.len() as u64,
            facts_deleted: forgotten.facts.len() as u64,
            facts_kept: forgotten.facts_kept,
            pending_reviews: forgotten.pending_reviews,
            tombstone_expires_at: expires_at,
        };
        audit::append(
            &mut transaction,
            scope,
            AuditAction::ForgetConversation,
            None,
            Some(conversation),
            json!({
                "turns": receipt.turns,
                "episodes": receipt.episodes,
                "facts_deleted": receipt.facts_deleted,
                "facts_kept": receipt.facts_kept,
                "pending_reviews": receipt.pending_reviews,
                "tombstone_expires_at": expires_at,
            }),
        )
        .await?;
        mark_write_started();
        transaction.commit().await?;
        Ok(receipt)
    }
}
