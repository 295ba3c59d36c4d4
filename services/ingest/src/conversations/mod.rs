//! Conversations: an assistant hands Engram its turns, and Engram turns them into memory.
//!
//! - [`MemoryWriter::append_messages`] keeps every turn as it was said (immutable cold storage,
//!   in order, idempotent by client message id), carries out the memory commands of user turns,
//!   and asks for segmentation through the outbox in the same transaction.
//! - [`segmentation`] closes segments by the rules of `engram_core::segmentation` (or an LLM's
//!   judgement), writes each as an episodic memory, takes the conversation's pending reviews and
//!   announces `SegmentClosed` for the review service.
//! - [`describe`] titles and summarises a closed segment and extracts what it established: the
//!   LLM ([`llm`]) when configured, the extractive rules otherwise, behind one `Describer`
//!   ([`segment_text`] is the turn both read).
//! - [`consolidation`] (`Consolidator`) derives semantic facts from new episodes (through the
//!   normal write path, where a newer fact about the same subject supersedes an older one, and
//!   a fact saying a thing is over supersedes the speaker's facts naming it).
//! - [`forget`] deletes a conversation and what was derived only from it.
//!
//! Nothing is stored for an incognito conversation or a space with memory off: not a turn, not an
//! event, not a pending review.

pub mod consolidation;
pub(crate) mod describe;
pub mod events;
pub mod forget;
pub mod llm;
pub mod segment_text;
pub mod segmentation;

use chrono::{DateTime, Duration, Utc};
use engram_core::commands::parse_command;
use engram_core::retrieval::budget::count_tokens;
use engram_core::{ConversationId, MemoryText, Scope, SpeakerRole};
use engram_server::deadline::{mark_write_started, time_left};
use engram_store::conversations::{
    self, AppendOutcome, AppendTurns, SegmentationRequest, TurnToAppend,
};

use crate::commands::CommandOutcome;
use crate::error::IngestError;
use crate::write_path::MemoryWriter;

/// Most turns one AppendMessages carries.
pub const MAX_MESSAGES_PER_APPEND: usize = 100;
/// A clock this far ahead of ours is tolerated in a turn's time.
const FUTURE_TOLERANCE: Duration = Duration::minutes(5);
/// A pending segmentation request older than this is asked for again: the message may have been
/// lost or dead-lettered, and a conversation must not wait for the sweep's idle close.
const RENEW_SEGMENTATION_REQUEST_AFTER: std::time::Duration = std::time::Duration::from_secs(60);
/// How long before the request's deadline an append stops waiting for a lock: time to answer
/// DEADLINE_EXCEEDED (nothing stored) before the deadline layer would answer UNKNOWN.
const LOCK_WAIT_MARGIN: std::time::Duration = std::time::Duration::from_millis(100);

/// The answer to an operation on a conversation the space does not hold.
pub(crate) fn unknown_conversation(scope: &Scope, conversation: ConversationId) -> IngestError {
    IngestError::NotFound(format!(
        "no conversation {conversation} in space {:?} of this user",
        scope.space.as_str()
    ))
}

/// The tokens of each turn, counted off the async runtime when the turns are long (a hundred
/// turns of 8,192 characters take a core for a good while).
async fn token_counts(run: &[NewMessage]) -> Vec<i32> {
    fn counts(texts: &[MemoryText]) -> Vec<i32> {
        texts
            .iter()
            .map(|text| i32::try_from(count_tokens(text.as_str())).unwrap_or(i32::MAX))
            .collect()
    }
    let texts: Vec<MemoryText> = run.iter().map(|message| message.content.clone()).collect();
    let bytes = texts.iter().map(|text| text.as_str().len()).sum();
    engram_recall::cpu_bound_over(bytes, move || counts(&texts)).await
}

/// A validated turn to append.
#[derive(Debug, Clone)]
pub struct NewMessage {
    pub role: SpeakerRole,
    pub content: MemoryText,
    /// When it was said; `None` is now.
    pub at: Option<DateTime<Utc>>,
    pub client_message_id: Option<String>,
}

/// What became of one appended message.
#[derive(Debug, Clone, PartialEq)]
pub enum TurnResult {
    Stored { turn_index: i32 },
    Duplicate { turn_index: i32 },
    SkippedIncognito,
    SkippedMemoryDisabled,
}

#[derive(Debug, Clone)]
pub struct AppendedMessage {
    pub client_message_id: Option<String>,
    pub result: TurnResult,
    /// The memory command the turn carried, carried out.
    pub command: Option<CommandOutcome>,
}

impl MemoryWriter {
    /// Appends turns in order. A user turn that is a memory command is carried out right after
    /// it is stored, before the turns that follow it (so "start incognito for this chat" keeps
    /// what follows out of storage).
    #[tracing::instrument(skip_all, fields(user_id = %scope.user_id, space = %scope.space, conversation = %conversation, turns = messages.len()), err(Display))]
    pub async fn append_messages(
        &self,
        scope: &Scope,
        conversation: ConversationId,
        messages: Vec<NewMessage>,
        close_segment: bool,
    ) -> Result<Vec<AppendedMessage>, IngestError> {
        let total = messages.len();
        let mut appended = Vec::with_capacity(total);
        let mut run: Vec<NewMessage> = Vec::new();
        for (position, message) in messages.into_iter().enumerate() {
            let command = (message.role == SpeakerRole::User)
                .then(|| parse_command(message.content.as_str()))
                .flatten();
            let last = position + 1 == total;
            let text = message.content.as_str().to_owned();
            let said_at = message.at;
            run.push(message);
            if command.is_none() && !last {
                continue;
            }
            let close = close_segment && last;
            let first_position = position + 1 - run.len();
            appended.extend(
                self.append_run(
                    scope,
                    conversation,
                    std::mem::take(&mut run),
                    first_position,
                    close,
                )
                .await?,
            );
            if command.is_some() {
                let outcome = self
                    .apply_command(scope, conversation, &text, said_at)
                    .await?;
                if let Some(turn) = appended.last_mut() {
                    turn.command = Some(outcome);
                }
            }
        }
        Ok(appended)
    }

    /// Appends turns in one round trip and one transaction (see
    /// `engram_store::conversations::append_turns`): every round trip on the way is two
    /// wake-ups on a busy host, and appends are what a client waits for. `first_position` is
    /// the run's first message's position in the request, for error messages.
    async fn append_run(
        &self,
        scope: &Scope,
        conversation: ConversationId,
        run: Vec<NewMessage>,
        first_position: usize,
        close_segment: bool,
    ) -> Result<Vec<AppendedMessage>, IngestError> {
        let now = Utc::now();
        for (offset, message) in run.iter().enumerate() {
            if message.at.is_some_and(|at| at > now + FUTURE_TOLERANCE) {
                return Err(IngestError::Invalid(engram_core::ValidationError::new(
                    format!("messages[{}].at", first_position + offset),
                    "must not be in the future",
                )));
            }
        }
        let tokens = token_counts(&run).await;
        let turns: Vec<TurnToAppend<'_>> = run
            .iter()
            .zip(tokens)
            .map(|(message, tokens)| TurnToAppend {
                role: message.role.as_str(),
                content: message.content.as_str(),
                spoken_at: message.at,
                client_message_id: message.client_message_id.as_deref(),
                tokens,
            })
            .collect();
        let event = self.hooks.publish_events.then(|| {
            events::segmentation_requested(
                scope,
                conversation,
                close_segment,
                engram_bus::current_trace_headers(),
            )
        });
        let append = AppendTurns {
            turns: &turns,
            now,
            close: close_segment,
            segmentation_request: event.as_ref().map(|event| SegmentationRequest {
                event,
                renew_after: RENEW_SEGMENTATION_REQUEST_AFTER,
            }),
            // The statement commits as it ends, so the request's deadline cannot abandon it
            // before its commit: it gives up waiting for a lock while it can still answer.
            lock_timeout: time_left().map(|left| left.saturating_sub(LOCK_WAIT_MARGIN)),
        };
        mark_write_started();
        let outcome = conversations::append_turns(&self.pool, scope, conversation, &append).await?;
        let results = self.turn_results(outcome, run.len(), first_position, close_segment)?;
        Ok(run
            .into_iter()
            .zip(results)
            .map(|(message, result)| AppendedMessage {
                client_message_id: message.client_message_id,
                result,
                command: None,
            })
            .collect())
    }

    /// What became of each turn of an appended run, or why the run was refused.
    fn turn_results(
        &self,
        outcome: AppendOutcome,
        run_len: usize,
        first_position: usize,
        close_segment: bool,
    ) -> Result<Vec<TurnResult>, IngestError> {
        Ok(match outcome {
            AppendOutcome::Refused { memory_enabled } => {
                self.metrics.record_turns_skipped(run_len as u64);
                let result = if memory_enabled {
                    TurnResult::SkippedIncognito
                } else {
                    TurnResult::SkippedMemoryDisabled
                };
                vec![result; run_len]
            }
            AppendOutcome::LockTimedOut => {
                return Err(IngestError::DeadlineExceeded(
                    "the conversation or its space stayed locked (a privacy switch, ForgetConversation \
                     or retention) until the request's deadline; nothing was stored"
                        .to_owned(),
                ));
            }
            AppendOutcome::OutOfOrder {
                position,
                at,
                after,
            } => {
                return Err(IngestError::FailedPrecondition(format!(
                    "messages[{}].at: {at} is before the conversation's last turn ({after}); \
                     turns are appended in the order they were said",
                    first_position + position
                )));
            }
            AppendOutcome::Appended { turns, queued } => {
                let stored = turns.iter().filter(|turn| !turn.duplicate).count();
                self.metrics.record_turns_stored(stored as u64);
                if stored > 0 || close_segment {
                    self.segmentation_requested(queued);
                }
                turns
                    .into_iter()
                    .map(|turn| {
                        if turn.duplicate {
                            TurnResult::Duplicate {
                                turn_index: turn.turn_index,
                            }
                        } else {
                            TurnResult::Stored {
                                turn_index: turn.turn_index,
                            }
                        }
                    })
                    .collect()
            }
        })
    }

    /// A conversation's state and up to `limit` turns after `after`; NotFound when the space
    /// holds no such conversation.
    pub async fn conversation_page(
        &self,
        scope: &Scope,
        conversation: ConversationId,
        after: Option<i32>,
        limit: u32,
    ) -> Result<
        (
            conversations::ConversationSummary,
            Vec<conversations::TurnRecord>,
        ),
        IngestError,
    > {
        let summary = conversations::summary(&self.pool, scope, conversation)
            .await?
            .ok_or_else(|| unknown_conversation(scope, conversation))?;
        let turns =
            conversations::turns_page(&self.pool, scope, conversation, after, i64::from(limit))
                .await?;
        Ok((summary, turns))
    }

    /// CloseSegment: asks segmentation to close the open segment now. `None`: no turn waits in
    /// an open segment; NotFound when the space holds no such conversation (as GetConversation
    /// answers: an unknown id is not "nothing to close").
    pub async fn close_segment(
        &self,
        scope: &Scope,
        conversation: ConversationId,
    ) -> Result<Option<(i32, i32)>, IngestError> {
        let mut transaction = engram_store::begin(&self.pool).await?;
        let Some(open) =
            conversations::request_close(&mut transaction, scope, conversation).await?
        else {
            transaction.rollback().await?;
            return match conversations::summary(&self.pool, scope, conversation).await? {
                Some(_) => Ok(None),
                None => Err(unknown_conversation(scope, conversation)),
            };
        };
        let queued = self
            .request_segmentation(&mut transaction, scope, conversation, true)
            .await?;
        mark_write_started();
        transaction.commit().await?;
        self.segmentation_requested(queued);
        Ok(Some(open))
    }

    /// Tells segmentation to look at the conversation: with the bus on, an event in the outbox
    /// (in the caller's transaction), unless one is pending already (its pass will read this
    /// transaction's turns: see `clear_segmentation_requests`); without it, the local segmenter
    /// looks at every conversation with an open segment when woken
    /// ([`Self::segmentation_requested`]). Returns whether an event was queued.
    async fn request_segmentation(
        &self,
        transaction: &mut sqlx::PgConnection,
        scope: &Scope,
        conversation: ConversationId,
        close: bool,
    ) -> Result<bool, IngestError> {
        let queued = self.hooks.publish_events
            && conversations::claim_segmentation_request(
                transaction,
                scope,
                conversation,
                RENEW_SEGMENTATION_REQUEST_AFTER,
            )
            .await?;
        if queued {
            let event = events::segmentation_requested(
                scope,
                conversation,
                close,
                engram_bus::current_trace_headers(),
            );
            engram_store::outbox::insert(transaction, &event).await?;
        }
        Ok(queued)
    }

    /// After a commit that asked for segmentation: wakes the outbox relay when the commit queued
    /// an event (bus on; a pending request needs no second event), or the local segmenter (bus
    /// off).
    fn segmentation_requested(&self, event_queued: bool) {
        let wake = if !self.hooks.publish_events {
            &self.hooks.segmentation_wake
        } else if event_queued {
            &self.hooks.new_entry_wake
        } else {
            return;
        };
        if let Some(wake) = wake {
            wake.notify_one();
        }
    }
}
