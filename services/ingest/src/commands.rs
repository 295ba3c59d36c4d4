//! ApplyCommand: natural-language memory commands, carried out with the same operations as the
//! explicit RPCs.

use chrono::{DateTime, Utc};
use engram_core::commands::{MemoryCommand, parse_command};
use engram_core::{ConversationId, MemoryId, MemoryText, Scope};
use engram_store::audit::{self, LastWritten};
use engram_store::conversations;
use engram_store::memories::MemoryRecord;
use engram_store::spaces::{self, SettingsPatch};

use crate::error::IngestError;
use crate::write_path::{MemoryWriter, RememberCommand, RememberResult};

/// The answer to "forget that" / "pin this" once the memory they refer to is gone: they never
/// reach back to an older one.
const ALREADY_GONE: &str =
    "The last thing saved from this conversation is already gone from memory.";

/// What ApplyCommand did.
#[derive(Debug, Clone)]
pub struct CommandOutcome {
    pub command: Option<MemoryCommand>,
    pub applied: bool,
    pub reply: String,
    pub memory: Option<MemoryRecord>,
    pub remember: Option<RememberResult>,
}

impl CommandOutcome {
    fn done(
        command: MemoryCommand,
        reply: impl Into<String>,
        memory: Option<MemoryRecord>,
    ) -> Self {
        Self {
            command: Some(command),
            applied: true,
            reply: reply.into(),
            memory,
            remember: None,
        }
    }

    fn not_applied(command: MemoryCommand, reply: impl Into<String>) -> Self {
        Self {
            command: Some(command),
            applied: false,
            reply: reply.into(),
            memory: None,
            remember: None,
        }
    }
}

impl MemoryWriter {
    /// "What do you remember about X": the Markdown of a retrieval for X, in this conversation
    /// (so incognito and memory off are honoured, and the retrieval is recorded for review).
    async fn recall_topic(
        &self,
        scope: &Scope,
        conversation: ConversationId,
        command: MemoryCommand,
        topic: &str,
    ) -> Result<CommandOutcome, IngestError> {
        let Some(recall) = &self.recall else {
            return Ok(CommandOutcome::not_applied(
                command,
                "Recall is not available in this service.",
            ));
        };
        let request = recall.default_request(scope.clone(), Some(conversation), topic.to_owned());
        let retrieval = recall.retrieve(&request).await?;
        // An empty answer because memory is not read here says why, not "No relevant memories".
        let reply = match retrieval.served_by.path.as_str() {
            "incognito" => {
                "This chat is incognito: I don't read or write memories in it, so I have nothing to recall here.".to_owned()
            }
            "memory_off" => {
                "Memory is off for this space, so I have nothing to recall. Say \"turn memory on\" to use it again.".to_owned()
            }
            _ => retrieval.markdown,
        };
        Ok(CommandOutcome::done(command, reply, None))
    }

    #[tracing::instrument(skip_all, fields(user_id = %scope.user_id, space = %scope.space, conversation = %conversation), err(Display))]
    /// `said_at`: when the user said it (a turn's `at` in AppendMessages; none: now). What a
    /// "remember" saves became true then, and its relative dates ("next Wednesday") mean days
    /// counted from then.
    pub async fn apply_command(
        &self,
        scope: &Scope,
        conversation: ConversationId,
        message: &str,
        said_at: Option<DateTime<Utc>>,
    ) -> Result<CommandOutcome, IngestError> {
        let Some(command) = parse_command(message) else {
            return Ok(CommandOutcome {
                command: None,
                applied: false,
                reply: "no command".into(),
                memory: None,
                remember: None,
            });
        };
        tracing::info!(command = ?command, "memory command recognised");
        match command.clone() {
            MemoryCommand::Recall(topic) => {
                self.recall_topic(scope, conversation, command, &topic)
                    .await
            }
            MemoryCommand::ForgetLast | MemoryCommand::PinLast => {
                self.act_on_last_written(scope, conversation, command).await
            }
            MemoryCommand::Remember(content) => {
                self.remember_said(scope, conversation, command, &content, said_at)
                    .await
            }
            MemoryCommand::MemoryOff | MemoryCommand::MemoryOn => {
                let enabled = command == MemoryCommand::MemoryOn;
                let patch = SettingsPatch {
                    memory_enabled: Some(enabled),
                    ..SettingsPatch::default()
                };
                self.update_settings(scope, patch, Some(conversation))
                    .await?;
                let reply = if enabled {
                    "Memory is on."
                } else {
                    "Memory is off: nothing will be saved or recalled."
                };
                Ok(CommandOutcome::done(command, reply, None))
            }
            MemoryCommand::IncognitoStart | MemoryCommand::IncognitoEnd => {
                let incognito = command == MemoryCommand::IncognitoStart;
                self.set_incognito(scope, conversation, incognito).await?;
                let reply = if incognito {
                    "This chat is incognito: nothing from it is saved, and nothing is recalled."
                } else {
                    "Incognito is off for this chat."
                };
                Ok(CommandOutcome::done(command, reply, None))
            }
        }
    }

    /// "Forget that" / "pin this": the last memory written from this conversation, if it is
    /// still the one the user means.
    async fn act_on_last_written(
        &self,
        scope: &Scope,
        conversation: ConversationId,
        command: MemoryCommand,
    ) -> Result<CommandOutcome, IngestError> {
        // Nothing said in an incognito chat or while memory is off was saved, so "that" cannot be
        // an older memory: acting on one would delete or pin what the user did not mean.
        if let Some(reply) = self.why_nothing_is_saved_now(scope, conversation).await? {
            return Ok(CommandOutcome::not_applied(command, reply));
        }
        let last = match self.last_written(scope, conversation).await? {
            LastWritten::Stored(id) => MemoryId::from_uuid(id),
            LastWritten::Gone => return Ok(CommandOutcome::not_applied(command, ALREADY_GONE)),
            LastWritten::BeforePrivacyChange => {
                return Ok(CommandOutcome::not_applied(
                    command,
                    "Nothing from this conversation has been saved since incognito or memory was switched, so I left older memories alone.",
                ));
            }
            LastWritten::AfterSuppressedWrite => {
                return Ok(CommandOutcome::not_applied(
                    command,
                    "What you last asked me to remember here was not saved (you had asked me to forget it), so I left older memories alone.",
                ));
            }
            LastWritten::Nothing => {
                return Ok(CommandOutcome::not_applied(
                    command,
                    "Nothing from this conversation is in memory.",
                ));
            }
        };
        // A concurrent "forget that" (a client's retry) may take the entry between the lookup
        // and here: that is the same answer as finding it gone.
        let acted = if command == MemoryCommand::ForgetLast {
            self.forget(scope, last, Some(conversation))
                .await
                .map(|forgotten| ("Forgotten.", forgotten.memory))
        } else {
            self.set_pinned(scope, last, true, Some(conversation))
                .await
                .map(|pinned| ("Pinned.", pinned))
        };
        match acted {
            Ok((reply, memory)) => Ok(CommandOutcome::done(command, reply, Some(memory))),
            Err(IngestError::NotFound(_)) => Ok(CommandOutcome::not_applied(command, ALREADY_GONE)),
            Err(error) => Err(error),
        }
    }

    /// "Remember that …": saved as the user's own, from when it was said.
    async fn remember_said(
        &self,
        scope: &Scope,
        conversation: ConversationId,
        command: MemoryCommand,
        content: &str,
        said_at: Option<DateTime<Utc>>,
    ) -> Result<CommandOutcome, IngestError> {
        let text = MemoryText::parse("message", content, self.settings.max_text_chars)?;
        let result = self
            .remember(RememberCommand {
                manually_saved: true,
                conversation: Some(conversation),
                valid_at: said_at,
                ..RememberCommand::plain(scope.clone(), text)
            })
            .await?;
        let (applied, reply, memory) = remember_reply(&result);
        Ok(CommandOutcome {
            command: Some(command),
            applied,
            reply: reply.into(),
            memory,
            remember: Some(result),
        })
    }

    /// Why nothing from this conversation is being saved right now (memory is off, or the chat
    /// is incognito), if so.
    async fn why_nothing_is_saved_now(
        &self,
        scope: &Scope,
        conversation: ConversationId,
    ) -> Result<Option<&'static str>, IngestError> {
        let mut connection = self.pool.acquire().await?;
        if !spaces::get(&mut connection, scope).await?.memory_enabled {
            return Ok(Some(
                "Memory is off for this space, so nothing from this chat was saved.",
            ));
        }
        let incognito =
            conversations::incognito_among(&mut connection, scope, &[conversation.as_uuid()])
                .await?;
        Ok((!incognito.is_empty())
            .then_some("This chat is incognito, so nothing from it was saved."))
    }

    async fn last_written(
        &self,
        scope: &Scope,
        conversation: ConversationId,
    ) -> Result<LastWritten, IngestError> {
        let mut connection = self.pool.acquire().await?;
        Ok(audit::last_written_in_conversation(&mut connection, scope, conversation).await?)
    }
}

/// What the assistant is told a spoken "remember" did: whether it was kept, the reply, the entry.
fn remember_reply(result: &RememberResult) -> (bool, &'static str, Option<MemoryRecord>) {
    match result {
        RememberResult::Created { memory, .. } => (true, "Saved to memory.", Some(memory.clone())),
        RememberResult::Merged { memory } => (
            true,
            "Already in memory; marked as important.",
            Some(memory.clone()),
        ),
        RememberResult::SuppressedByTombstone { .. } => (
            false,
            "You asked me to forget this less than a day ago, so it was not saved.",
            None,
        ),
        RememberResult::SkippedMemoryDisabled => (
            false,
            "Memory is off for this space, so nothing was saved.",
            None,
        ),
        RememberResult::SkippedIncognito => (
            false,
            "This conversation is incognito, so nothing was saved.",
            None,
        ),
        // Not reached today (a spoken "remember" is manually saved, so never trimmed); every
        // outcome still gets a true reply.
        RememberResult::TrimmedAtCapacity { .. } => (
            false,
            "Memory for this space is full of pinned or saved entries, so this was not kept.",
            None,
        ),
    }
}
