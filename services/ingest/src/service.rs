//! The ingest service's operations, one method each, on checked inputs: what every RPC of
//! `grpc.rs` calls. Each method says where its work is done: the write path (`write_path/`), the
//! user's controls (`controls.rs`), conversations (`conversations/`), commands (`commands.rs`),
//! imports (`import.rs`) and retention (`retention.rs`). The bus consumers and background jobs
//! use those modules directly; requests come in through here.

use engram_core::retention::DataRetention;
use engram_core::{ConversationId, MemoryId, Scope};
use engram_store::audit::AuditRecord;
use engram_store::conversations::{ConversationSummary, TurnRecord};
use engram_store::memories::MemoryRecord;
use engram_store::spaces::SettingsPatch;

use crate::commands::CommandOutcome;
use crate::controls::{EffectiveSettings, Forgotten};
use crate::conversations::forget::ConversationReceipt;
use crate::conversations::{AppendedMessage, NewMessage};
use crate::error::IngestError;
use crate::import::{ImportLimits, ImportedEntry, ParsedImport};
use crate::retention::{RetentionJob, RetentionPreview};
use crate::write_path::{MemoryWriter, RememberCommand, RememberResult};

/// Everything a client can ask of the ingest service; cheap to clone.
#[derive(Debug, Clone)]
pub struct Ingest {
    writer: MemoryWriter,
    retention: RetentionJob,
}

/// A space's settings as clients see them: what is stored, and the retention rules in force.
#[derive(Debug, Clone)]
pub struct SettingsInForce {
    pub settings: EffectiveSettings,
    pub retention: DataRetention,
}

/// A checked ImportMemories batch.
#[derive(Debug)]
pub struct ImportBatch {
    pub entries: Vec<ParsedImport>,
    /// Neighbouring turns each imported entry is searched with.
    pub context_turns: u32,
}

/// What an import did with each entry.
#[derive(Debug)]
pub struct Imported {
    pub entries: Vec<ImportedEntry>,
    pub context_turns: u32,
}

/// A page of a conversation: its state and the turns after the cursor.
#[derive(Debug)]
pub struct ConversationPage {
    pub summary: ConversationSummary,
    pub turns: Vec<TurnRecord>,
}

impl Ingest {
    pub fn new(writer: MemoryWriter, retention: RetentionJob) -> Self {
        Self { writer, retention }
    }

    /// The longest text a memory or a turn may hold, in characters.
    pub fn max_text_chars(&self) -> usize {
        self.writer.settings.max_text_chars
    }

    /// Remember: the write path with its group commit (`write_path/`).
    pub async fn remember(&self, command: RememberCommand) -> Result<RememberResult, IngestError> {
        self.writer.remember(command).await
    }

    /// Forget: deletes the memory and leaves a tombstone (`controls.rs`).
    pub async fn forget(&self, scope: &Scope, memory: MemoryId) -> Result<Forgotten, IngestError> {
        self.writer.forget(scope, memory, None).await
    }

    /// Pin and Unpin (`controls.rs`).
    pub async fn set_pinned(
        &self,
        scope: &Scope,
        memory: MemoryId,
        pinned: bool,
    ) -> Result<MemoryRecord, IngestError> {
        self.writer.set_pinned(scope, memory, pinned, None).await
    }

    /// GetSettings (`controls.rs`).
    pub async fn settings(&self, scope: &Scope) -> Result<SettingsInForce, IngestError> {
        let settings = self.writer.settings(scope).await?;
        Ok(self.in_force(settings))
    }

    /// UpdateSettings: applied and audited (`controls.rs`).
    pub async fn update_settings(
        &self,
        scope: &Scope,
        patch: SettingsPatch,
    ) -> Result<SettingsInForce, IngestError> {
        let settings = self.writer.update_settings(scope, patch, None).await?;
        Ok(self.in_force(settings))
    }

    fn in_force(&self, settings: EffectiveSettings) -> SettingsInForce {
        let retention = settings
            .space
            .retention_overrides()
            .resolve(&self.retention.defaults());
        SettingsInForce {
            settings,
            retention,
        }
    }

    /// StartIncognito and EndIncognito (`controls.rs`).
    pub async fn set_incognito(
        &self,
        scope: &Scope,
        conversation: ConversationId,
        incognito: bool,
    ) -> Result<(), IngestError> {
        self.writer
            .set_incognito(scope, conversation, incognito)
            .await
    }

    /// ApplyCommand: a natural-language memory command (`commands.rs`).
    pub async fn apply_command(
        &self,
        scope: &Scope,
        conversation: ConversationId,
        message: &str,
    ) -> Result<CommandOutcome, IngestError> {
        self.writer
            .apply_command(scope, conversation, message, None)
            .await
    }

    /// ListAudit: up to `limit` events before `before_id`, newest first (`controls.rs`).
    pub async fn audit_page(
        &self,
        scope: &Scope,
        before_id: Option<i64>,
        limit: u32,
    ) -> Result<Vec<AuditRecord>, IngestError> {
        self.writer.audit_page(scope, before_id, limit).await
    }

    /// What an ImportMemories batch is checked against (`import.rs`).
    pub async fn import_limits(&self) -> Result<ImportLimits, IngestError> {
        self.writer.import_limits().await
    }

    /// ImportMemories: one transaction for the batch (`import.rs`).
    pub async fn import(&self, scope: &Scope, batch: ImportBatch) -> Result<Imported, IngestError> {
        let entries = self
            .writer
            .import(scope, batch.entries, batch.context_turns)
            .await?;
        Ok(Imported {
            entries,
            context_turns: batch.context_turns,
        })
    }

    /// Reembed: queues a space's entries, or every space's (`None`), for a fresh embedding.
    /// Returns how many were queued and the model they will be embedded with (`controls.rs`).
    pub async fn reembed(
        &self,
        scope: Option<&Scope>,
        only_other_models: bool,
    ) -> Result<(u64, String), IngestError> {
        let queued = self
            .writer
            .request_reembedding(scope, only_other_models)
            .await?;
        let model = self.writer.embedding_model().unwrap_or_default().to_owned();
        Ok((queued, model))
    }

    /// AppendMessages: stores the turns, carries out commands, closes the segment when asked
    /// (`conversations/`).
    pub async fn append_messages(
        &self,
        scope: &Scope,
        conversation: ConversationId,
        messages: Vec<NewMessage>,
        close_segment: bool,
    ) -> Result<Vec<AppendedMessage>, IngestError> {
        self.writer
            .append_messages(scope, conversation, messages, close_segment)
            .await
    }

    /// CloseSegment: the open segment's first and last turn, or `None` when no turn waits
    /// (`conversations/`).
    pub async fn close_segment(
        &self,
        scope: &Scope,
        conversation: ConversationId,
    ) -> Result<Option<(i32, i32)>, IngestError> {
        self.writer.close_segment(scope, conversation).await
    }

    /// GetConversation: up to `limit` turns after `after` (`conversations/`).
    pub async fn conversation_page(
        &self,
        scope: &Scope,
        conversation: ConversationId,
        after: Option<i32>,
        limit: u32,
    ) -> Result<ConversationPage, IngestError> {
        let (summary, turns) = self
            .writer
            .conversation_page(scope, conversation, after, limit)
            .await?;
        Ok(ConversationPage { summary, turns })
    }

    /// ForgetConversation: its turns, episodes and the facts only it said (`conversations/`).
    pub async fn forget_conversation(
        &self,
        scope: &Scope,
        conversation: ConversationId,
    ) -> Result<ConversationReceipt, IngestError> {
        self.writer.forget_conversation(scope, conversation).await
    }

    /// PreviewRetention: what a retention run now would delete in the space, under its own
    /// rules (`retention.rs`). Reads only.
    pub async fn preview_retention(
        &self,
        scope: &Scope,
        page_size: u32,
    ) -> Result<RetentionPreview, IngestError> {
        let settings = self.writer.settings(scope).await?;
        self.retention
            .preview(scope, &settings.space.retention_overrides(), page_size)
            .await
    }
}
