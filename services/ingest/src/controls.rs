//! The user's controls: forget (with a tombstone), pin and unpin, per-space settings, incognito
//! conversations, and the audit trail that records each of them.

use chrono::{DateTime, SubsecRound, Utc};
use engram_core::episode::StructuredSummary;
use engram_core::normalize::normalize_for_fingerprint;
use engram_core::{ConversationId, MemoryId, MemoryKind, Scope, SimHash, redact};
use engram_store::audit::{self, AuditAction, AuditRecord};
use engram_store::memories::{self, MemoryRecord};
use engram_store::spaces::{self, SettingsPatch, SpaceRecord};
use engram_store::{conversations, redaction, tombstones};
use serde_json::json;
use uuid::Uuid;

use engram_server::deadline::mark_write_started;

use crate::error::IngestError;
use crate::write_path::{MemoryWriter, text_digest};

/// Largest per-space soft cap UpdateSettings accepts.
pub const MAX_SOFT_CAP: u32 = 1_000_000;

/// The result of a Forget.
#[derive(Debug, Clone)]
pub struct Forgotten {
    pub memory: MemoryRecord,
    pub tombstone_expires_at: DateTime<Utc>,
}

/// Settings as reported to clients: the stored ones and the cap in force.
#[derive(Debug, Clone)]
pub struct EffectiveSettings {
    pub space: SpaceRecord,
    pub effective_soft_cap: u32,
}

fn not_found(memory: MemoryId, scope: &Scope) -> IngestError {
    IngestError::NotFound(format!(
        "no memory {memory} in space {:?} of this user",
        scope.space.as_str()
    ))
}

/// How many copies of a forgotten fact a Forget cut it out of.
#[derive(Debug, Clone, Copy, Default)]
struct Redacted {
    episodes: usize,
    turns: usize,
}

/// Cuts a forgotten fact out of its copies (issue 39 part 6): the episodes it was consolidated
/// from or whose conversation said it (summary, title, excerpt, structured summary, tags; each
/// is embedded again) and the stored turns of those conversations that said it (their vectors
/// go). What says the fact is `engram_core::redact`'s to decide. An episode forgotten is gone
/// whole, and leaves nothing to cut.
async fn redact_copies(
    connection: &mut sqlx::PgConnection,
    scope: &Scope,
    deleted: &MemoryRecord,
) -> Result<Redacted, IngestError> {
    if deleted.memory_kind() != MemoryKind::Semantic {
        return Ok(Redacted::default());
    }
    let forgotten = redact::Forgotten::new(&deleted.text);
    let (user, space) = (scope.user_id.as_uuid(), scope.space.as_str());
    let episodes = redaction::episodes_holding(
        connection,
        user,
        space,
        &deleted.source_episode_ids,
        deleted.conversation_id,
    )
    .await?;
    let mut conversations: Vec<Uuid> = deleted.conversation_id.into_iter().collect();
    let mut redacted = Redacted::default();
    for mut episode in episodes {
        if let Some(conversation) = episode.conversation_id
            && !conversations.contains(&conversation)
        {
            conversations.push(conversation);
        }
        let mut changed = false;
        if let Some(summary) = forgotten.redact_or_mark(&episode.text) {
            episode.text = summary;
            changed = true;
        }
        if let Some(title) = episode.title.as_deref().and_then(|t| forgotten.redact(t)) {
            episode.title = Some(if title.is_empty() {
                engram_core::episode::UNTITLED.to_owned()
            } else {
                title
            });
            changed = true;
        }
        // The excerpt as stored: `[{"role", "content"}]`.
        if let Some(lines) = episode.messages.as_mut().and_then(|m| m.as_array_mut()) {
            let mut contents: Vec<String> = lines
                .iter()
                .map(|line| line["content"].as_str().unwrap_or_default().to_owned())
                .collect();
            if forgotten.redact_lines(&mut contents) {
                for (line, content) in lines.iter_mut().zip(contents) {
                    if let Some(line) = line.as_object_mut() {
                        line.insert("content".to_owned(), serde_json::Value::String(content));
                    }
                }
                changed = true;
            }
        }
        if let Some(stored) = episode.structured_summary.as_mut()
            && let Ok(mut structured) = serde_json::from_value::<StructuredSummary>(stored.clone())
            && forgotten.redact_structured(&mut structured)
            && let Ok(redacted) = serde_json::to_value(&structured)
        {
            *stored = redacted;
            changed = true;
        }
        changed |= forgotten.drop_labels(&mut episode.tags);
        if changed {
            redaction::rewrite_episode(connection, user, space, &episode).await?;
            redacted.episodes += 1;
        }
    }
    let mut turns = redaction::turns_naming(
        connection,
        user,
        space,
        &conversations,
        &forgotten.needles(),
    )
    .await?;
    turns.retain_mut(|turn| match forgotten.redact_or_mark(&turn.content) {
        Some(rest) => {
            turn.content = rest;
            true
        }
        None => false,
    });
    redaction::redact_turns(connection, user, space, &turns).await?;
    redacted.turns = turns.len();
    Ok(redacted)
}

impl MemoryWriter {
    /// Deletes a memory and leaves a tombstone so its text is not re-created within the TTL, and
    /// cuts a forgotten fact out of the episodes and stored turns that still say it.
    #[tracing::instrument(skip_all, fields(user_id = %scope.user_id, space = %scope.space, memory = %memory), err(Display))]
    pub async fn forget(
        &self,
        scope: &Scope,
        memory: MemoryId,
        conversation: Option<ConversationId>,
    ) -> Result<Forgotten, IngestError> {
        let mut transaction = engram_store::begin_with_spaces_locked(
            &self.pool,
            engram_store::SpaceAccess::WriteEntries,
            [scope],
        )
        .await?;
        let mut deleted = memories::delete(&mut transaction, scope, &[memory.as_uuid()]).await?;
        let deleted = deleted.pop().ok_or_else(|| not_found(memory, scope))?;
        let redacted = redact_copies(&mut transaction, scope, &deleted).await?;

        let normalized = normalize_for_fingerprint(&deleted.text);
        // At the microsecond Postgres keeps, so that this answer and a later Remember's
        // SUPPRESSED_BY_TOMBSTONE (read back from the tombstone) name the same instant.
        let expires_at = (Utc::now() + self.settings.tombstone_ttl()).trunc_subsecs(6);
        tombstones::insert(
            &mut transaction,
            scope,
            deleted.id,
            SimHash::from_i64(deleted.simhash),
            &text_digest(&normalized),
            expires_at,
        )
        .await?;
        audit::append(
            &mut transaction,
            scope,
            AuditAction::Forget,
            Some(deleted.id),
            conversation,
            json!({
                "tombstone_expires_at": expires_at,
                "episodes_redacted": redacted.episodes,
                "turns_redacted": redacted.turns,
            }),
        )
        .await?;
        // From here the write may land even if the caller stops waiting.
        mark_write_started();
        transaction.commit().await?;
        Ok(Forgotten {
            memory: deleted,
            tombstone_expires_at: expires_at,
        })
    }

    /// Pins or unpins a memory.
    #[tracing::instrument(skip_all, fields(user_id = %scope.user_id, space = %scope.space, memory = %memory, pinned), err(Display))]
    pub async fn set_pinned(
        &self,
        scope: &Scope,
        memory: MemoryId,
        pinned: bool,
        conversation: Option<ConversationId>,
    ) -> Result<MemoryRecord, IngestError> {
        // Under the space's lock, like every write of the space: a Remember that merges into the
        // entry reads its pinned flag under the same lock, so a pin or unpin in between is
        // neither undone by the merge nor audited twice.
        let mut transaction = engram_store::begin_with_spaces_locked(
            &self.pool,
            engram_store::SpaceAccess::WriteEntries,
            [scope],
        )
        .await?;
        let change = memories::set_pinned(&mut transaction, scope, memory.as_uuid(), pinned)
            .await?
            .ok_or_else(|| not_found(memory, scope))?;
        // Pinning a pinned entry (a retry, say) is answered the same but is no new action.
        if change.changed {
            let action = if pinned {
                AuditAction::Pin
            } else {
                AuditAction::Unpin
            };
            audit::append(
                &mut transaction,
                scope,
                action,
                Some(change.record.id),
                conversation,
                json!({}),
            )
            .await?;
        }
        // From here the write may land even if the caller stops waiting.
        mark_write_started();
        transaction.commit().await?;
        Ok(change.record)
    }

    pub async fn settings(&self, scope: &Scope) -> Result<EffectiveSettings, IngestError> {
        let mut connection = self.pool.acquire().await?;
        let space = spaces::get(&mut connection, scope).await?;
        Ok(self.effective(space))
    }

    fn effective(&self, space: SpaceRecord) -> EffectiveSettings {
        let effective_soft_cap = space
            .soft_cap
            .and_then(|cap| u32::try_from(cap).ok())
            .unwrap_or(self.settings.soft_cap);
        EffectiveSettings {
            space,
            effective_soft_cap,
        }
    }

    /// Applies a settings change and audits it with the values before and after.
    #[tracing::instrument(skip_all, fields(user_id = %scope.user_id, space = %scope.space), err(Display))]
    pub async fn update_settings(
        &self,
        scope: &Scope,
        patch: SettingsPatch,
        conversation: Option<ConversationId>,
    ) -> Result<EffectiveSettings, IngestError> {
        let mut transaction = engram_store::begin_with_spaces_locked(
            &self.pool,
            engram_store::SpaceAccess::Exclusive,
            [scope],
        )
        .await?;
        let before = spaces::get(&mut transaction, scope).await?;
        let after = spaces::update(&mut transaction, scope, &patch).await?;
        let settings = |space: &SpaceRecord| {
            json!({
                "memory_enabled": space.memory_enabled,
                "incognito_default": space.incognito_default,
                "soft_cap": space.soft_cap,
                "turn_retention_days": space.turn_retention_days,
                "max_age_days": space.max_age_days,
                "inactive_after_days": space.inactive_after_days,
                "inactive_grace_days": space.inactive_grace_days,
            })
        };
        let (before, after_settings) = (settings(&before), settings(&after));
        // Setting what is already set (a retry, "turn memory off" said twice) is no new action.
        if before != after_settings {
            audit::append(
                &mut transaction,
                scope,
                AuditAction::SettingsChange,
                None,
                conversation,
                json!({ "before": before, "after": after_settings }),
            )
            .await?;
        }
        // From here the write may land even if the caller stops waiting.
        mark_write_started();
        transaction.commit().await?;
        Ok(self.effective(after))
    }

    /// Starts or ends incognito for one conversation.
    #[tracing::instrument(skip_all, fields(user_id = %scope.user_id, space = %scope.space, conversation = %conversation, incognito), err(Display))]
    pub async fn set_incognito(
        &self,
        scope: &Scope,
        conversation: ConversationId,
        incognito: bool,
    ) -> Result<(), IngestError> {
        // Exclusively under the space's privacy lock, which every append takes shared: an append
        // either commits before the switch or sees it.
        let mut transaction = engram_store::begin_with_spaces_locked(
            &self.pool,
            engram_store::SpaceAccess::Exclusive,
            [scope],
        )
        .await?;
        let was_incognito =
            !conversations::incognito_among(&mut transaction, scope, &[conversation.as_uuid()])
                .await?
                .is_empty();
        // The conversation's own state is written even when it matches the space's default, so
        // that a later change of the default leaves it as the user set it; it is audited only when
        // the conversation's effective state changes (and only by the caller whose write did it).
        let written =
            conversations::set_incognito(&mut transaction, scope, conversation, incognito).await?;
        if written && was_incognito != incognito {
            let action = if incognito {
                AuditAction::IncognitoStart
            } else {
                AuditAction::IncognitoEnd
            };
            audit::append(
                &mut transaction,
                scope,
                action,
                None,
                Some(conversation),
                json!({}),
            )
            .await?;
        }
        // From here the write may land even if the caller stops waiting.
        mark_write_started();
        transaction.commit().await?;
        Ok(())
    }

    /// Audit events of the space, newest first.
    pub async fn audit_page(
        &self,
        scope: &Scope,
        before_id: Option<i64>,
        limit: u32,
    ) -> Result<Vec<AuditRecord>, IngestError> {
        Ok(audit::list(&self.pool, scope, before_id, i64::from(limit)).await?)
    }
}

impl MemoryWriter {
    /// Queues entries of one space (or of all, with `None`) for a fresh embedding and wakes the
    /// backfill. Returns how many entries were queued.
    #[tracing::instrument(skip_all, fields(space = ?scope.map(|s| s.space.as_str())), err(Display))]
    pub async fn request_reembedding(
        &self,
        scope: Option<&Scope>,
        only_other_models: bool,
    ) -> Result<u64, IngestError> {
        let only_other_than = if only_other_models {
            self.hooks.embedding_model.as_deref()
        } else {
            None
        };
        mark_write_started();
        let queued =
            engram_store::embeddings::request_reembedding(&self.pool, scope, only_other_than)
                .await?;
        tracing::info!(queued, only_other_models, "re-embedding requested");
        if let Some(wake) = &self.hooks.sweep_wake {
            wake.notify_one();
        }
        Ok(queued)
    }

    pub fn embedding_model(&self) -> Option<&str> {
        self.hooks.embedding_model.as_deref()
    }
}
