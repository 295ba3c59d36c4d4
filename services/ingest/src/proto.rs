//! The ingest service's proto conversions, in one place: requests in, checked with
//! InvalidArgument messages that name the field; results out as response messages.

use engram_core::commands::MemoryCommand;
use engram_core::retention::{self, DataRetention, RetentionOverrides};
use engram_core::validate::{check_label, parse_labels, parse_page_size};
use engram_core::{
    ConversationId, MemoryId, MemoryKind, MemoryText, Scope, SpeakerRole, ValidationError,
};
use engram_proto::v1;
use engram_server::AccessGrant;
use engram_server::convert::{
    category_from_proto, kind_to_proto, memory_to_proto, role_from_proto, role_to_proto,
    scope_from_proto,
};
use engram_server::paging::{
    RESPONSE_BYTE_BUDGET, fitting_count, parse_audit_token, parse_turn_token,
};
use engram_server::time::{from_proto_opt, to_proto};
use engram_store::audit::{AuditAction, AuditRecord};
use engram_store::conversations::TurnRecord;
use engram_store::spaces::SettingsPatch;
use tonic::Status;

use crate::commands::CommandOutcome;
use crate::controls::MAX_SOFT_CAP;
use crate::conversations::forget::ConversationReceipt;
use crate::conversations::{AppendedMessage, MAX_MESSAGES_PER_APPEND, NewMessage, TurnResult};
use crate::error::IngestError;
use crate::import::ImportLimits;
use crate::retention::RetentionPreview;
use crate::service::{ConversationPage, ImportBatch, Imported, SettingsInForce};
use crate::write_path::{MAX_TAG_CHARS, RememberCommand, RememberResult};

const MAX_TAGS: usize = 32;
const MAX_SOURCE_IDS: usize = 32;
const MAX_SOURCE_ID_CHARS: usize = 256;
const DEFAULT_PAGE_SIZE: u32 = 50;
const MAX_PAGE_SIZE: u32 = 500;
const DEFAULT_TURN_PAGE_SIZE: u32 = 100;
const DEFAULT_PREVIEW_PAGE_SIZE: u32 = 100;

pub fn memory_id(raw: &str) -> Result<MemoryId, IngestError> {
    Ok(MemoryId::parse("memory_id", raw)?)
}

pub fn conversation_id(raw: &str) -> Result<ConversationId, IngestError> {
    Ok(ConversationId::parse("conversation_id", raw)?)
}

pub fn remember_command(
    scope: Scope,
    message: &v1::RememberRequest,
    max_text_chars: usize,
) -> Result<RememberCommand, IngestError> {
    Ok(RememberCommand {
        text: MemoryText::parse("text", &message.text, max_text_chars)?,
        category: category_from_proto("category", message.category)?,
        role: role_from_proto("role", message.role)?,
        tags: parse_labels("tags", &message.tags, MAX_TAGS, MAX_TAG_CHARS)?,
        source_ids: parse_labels(
            "source_ids",
            &message.source_ids,
            MAX_SOURCE_IDS,
            MAX_SOURCE_ID_CHARS,
        )?,
        manually_saved: message.manually_saved,
        pin: message.pin,
        conversation: optional_conversation(&message.conversation_id)?,
        scope,
        source_episode: None,
        valid_at: None,
    })
}

pub fn forget_response(forgotten: &crate::controls::Forgotten) -> v1::ForgetResponse {
    v1::ForgetResponse {
        memory_id: forgotten.memory.id.to_string(),
        tombstone_expires_at: Some(to_proto(forgotten.tombstone_expires_at)),
    }
}

/// What an UpdateSettings changes: at least one thing, each within its range.
pub fn settings_patch(message: &v1::UpdateSettingsRequest) -> Result<SettingsPatch, IngestError> {
    let soft_cap = match message.soft_cap {
        None => None,
        Some(0) => Some(None),
        Some(cap) if cap <= MAX_SOFT_CAP => Some(Some(cap as i32)),
        Some(cap) => {
            return Err(ValidationError::new(
                "soft_cap",
                format!(
                    "is {cap}; it must be between 1 and {MAX_SOFT_CAP}, or 0 to use the global \
                     default"
                ),
            )
            .into());
        }
    };
    let retention = retention_from_proto(message.retention.as_ref())?;
    if message.memory_enabled.is_none()
        && message.incognito_default.is_none()
        && soft_cap.is_none()
        && retention.is_empty()
        && !message.reset_retention
    {
        return Err(ValidationError::new(
            "update",
            "sets nothing; give at least one of memory_enabled, incognito_default, soft_cap, \
             a retention rule or reset_retention",
        )
        .into());
    }
    Ok(SettingsPatch {
        memory_enabled: message.memory_enabled,
        incognito_default: message.incognito_default,
        soft_cap,
        retention,
        reset_retention: message.reset_retention,
    })
}

/// An ApplyCommand's conversation and message.
pub fn command_request(
    message: &v1::ApplyCommandRequest,
    max_text_chars: usize,
) -> Result<(ConversationId, MemoryText), IngestError> {
    let conversation = conversation_id(&message.conversation_id)?;
    let text = MemoryText::parse("message", &message.message, max_text_chars)?;
    Ok((conversation, text))
}

/// A ListAudit page: its size and the event it starts before.
pub fn audit_page_request(
    message: &v1::ListAuditRequest,
) -> Result<(u32, Option<i64>), IngestError> {
    let page_size = parse_page_size(
        "page_size",
        message.page_size,
        DEFAULT_PAGE_SIZE,
        MAX_PAGE_SIZE,
    )?;
    let before_id = parse_audit_token("page_token", &message.page_token)?;
    Ok((page_size, before_id))
}

/// `records` holds one more event than the page when another page follows.
pub fn audit_response(records: Vec<AuditRecord>, page_size: u32) -> v1::ListAuditResponse {
    let fetched = records.len();
    let mut events: Vec<v1::AuditEvent> = records
        .into_iter()
        .map(|record| v1::AuditEvent {
            id: record.id,
            action: audit_action_to_proto(&record.action).into(),
            memory_id: record
                .memory_id
                .map(|id| id.to_string())
                .unwrap_or_default(),
            conversation_id: record
                .conversation_id
                .map(|id| id.to_string())
                .unwrap_or_default(),
            detail_json: record.detail.to_string(),
            created_at: Some(to_proto(record.created_at)),
        })
        .collect();
    events.truncate(fitting_count(
        &events,
        page_size as usize,
        RESPONSE_BYTE_BUDGET,
    ));
    let next_page_token = if fetched > events.len() {
        events.last().map(|e| e.id.to_string()).unwrap_or_default()
    } else {
        String::new()
    };
    v1::ListAuditResponse {
        events,
        next_page_token,
    }
}

/// Checks an ImportMemories batch: up to 4 MiB of text to clean and check, on a blocking thread.
pub async fn import_batch(
    scope: &Scope,
    message: v1::ImportMemoriesRequest,
    limits: ImportLimits,
) -> Result<ImportBatch, IngestError> {
    let requested_context_turns = message.context_turns;
    let scope = scope.clone();
    let entries = engram_recall::cpu_bound(move || {
        crate::import::parse_batch(&scope, &message.memories, requested_context_turns, &limits)
    })
    .await?;
    let context_turns = crate::import::context_turns(requested_context_turns, &entries);
    Ok(ImportBatch {
        entries,
        context_turns,
    })
}

pub fn import_response(imported: Imported) -> v1::ImportMemoriesResponse {
    let entries = imported.entries;
    let created = entries.iter().filter(|entry| entry.created).count() as u32;
    let suppressed = entries
        .iter()
        .filter(|entry| entry.suppressed_by_tombstone)
        .count() as u32;
    let skipped_incognito = entries
        .iter()
        .filter(|entry| entry.skipped_incognito)
        .count() as u32;
    v1::ImportMemoriesResponse {
        existing: entries.len() as u32 - created - suppressed - skipped_incognito,
        created,
        suppressed,
        skipped_incognito,
        context_turns: imported.context_turns,
        entries: entries
            .into_iter()
            .map(|entry| v1::ImportedEntry {
                client_id: entry.client_id,
                id: entry.id.to_string(),
                created: entry.created,
                suppressed_by_tombstone: entry.suppressed_by_tombstone,
                skipped_incognito: entry.skipped_incognito,
            })
            .collect(),
    }
}

/// The space a Reembed covers, authorized; `None`: every space, which only an admin may ask
/// for, explicitly (minutes to hours of CPU), never by leaving the scope out.
pub fn reembed_scope(
    grant: &AccessGrant,
    message: &v1::ReembedRequest,
) -> Result<Option<Scope>, Status> {
    match (&message.scope, message.all_spaces) {
        (Some(_), true) => Err(IngestError::from(ValidationError::new(
            "all_spaces",
            "is set together with a scope; leave the scope out to re-embed every space",
        ))
        .into()),
        (Some(scope), false) => {
            let scope = scope_from_proto(Some(scope.clone())).map_err(IngestError::from)?;
            grant.authorize(&scope)?;
            Ok(Some(scope))
        }
        (None, true) => {
            grant.require_admin("re-embedding every space")?;
            tracing::warn!(
                only_other_models = message.only_other_models,
                "re-embedding every space of every user"
            );
            Ok(None)
        }
        (None, false) => Err(IngestError::from(ValidationError::new(
            "scope",
            "is required; to re-embed every space of every user set all_spaces (an admin \
             operation)",
        ))
        .into()),
    }
}

/// An AppendMessages' turns, checked on a blocking thread (up to 4 MiB of text).
pub async fn new_messages(
    message: v1::AppendMessagesRequest,
    max_text_chars: usize,
) -> Result<Vec<NewMessage>, IngestError> {
    let text_bytes = message.messages.iter().map(|m| m.content.len()).sum();
    Ok(engram_recall::cpu_bound_over(text_bytes, move || {
        parse_messages(&message.messages, max_text_chars)
    })
    .await?)
}

pub fn append_response(appended: Vec<AppendedMessage>) -> v1::AppendMessagesResponse {
    v1::AppendMessagesResponse {
        turns: appended.into_iter().map(appended_to_proto).collect(),
    }
}

pub fn close_segment_response(open: Option<(i32, i32)>) -> v1::CloseSegmentResponse {
    match open {
        Some((first, last)) => v1::CloseSegmentResponse {
            requested: true,
            first_turn_index: u32::try_from(first).unwrap_or_default(),
            last_turn_index: u32::try_from(last).unwrap_or_default(),
        },
        None => v1::CloseSegmentResponse::default(),
    }
}

/// A GetConversation page: the conversation, the page's size and the turn it starts after.
pub fn conversation_page_request(
    message: &v1::GetConversationRequest,
) -> Result<(ConversationId, u32, Option<i32>), IngestError> {
    let conversation = conversation_id(&message.conversation_id)?;
    let page_size = parse_page_size(
        "page_size",
        message.page_size,
        DEFAULT_TURN_PAGE_SIZE,
        MAX_PAGE_SIZE,
    )?;
    let after = parse_turn_token("page_token", &message.page_token)?;
    Ok((conversation, page_size, after))
}

/// `page.turns` holds one more turn than the page when another page follows.
pub fn conversation_response(
    conversation: ConversationId,
    page: &ConversationPage,
    page_size: u32,
) -> v1::GetConversationResponse {
    let ConversationPage { summary, turns } = page;
    let mut listed: Vec<v1::ConversationTurn> = turns.iter().map(turn_to_proto).collect();
    listed.truncate(fitting_count(
        &listed,
        page_size as usize,
        RESPONSE_BYTE_BUDGET,
    ));
    let next_page_token = match listed.last() {
        Some(last) if turns.len() > listed.len() => last.turn_index.to_string(),
        _ => String::new(),
    };
    v1::GetConversationResponse {
        conversation_id: conversation.to_string(),
        incognito: summary.incognito,
        turn_count: u32::try_from(summary.turn_count).unwrap_or_default(),
        segmented_through: summary.segmented_through,
        pending_reviews: u32::try_from(summary.pending_reviews).unwrap_or_default(),
        last_turn_at: summary.last_turn_at.map(to_proto),
        turns: listed,
        next_page_token,
        turns_deleted_through: summary.turns_deleted_through,
    }
}

pub fn forget_conversation_response(
    conversation: ConversationId,
    receipt: &ConversationReceipt,
) -> v1::ForgetConversationResponse {
    let count = |n: u64| u32::try_from(n).unwrap_or(u32::MAX);
    v1::ForgetConversationResponse {
        conversation_id: conversation.to_string(),
        turns_deleted: count(receipt.turns),
        episodes_deleted: count(receipt.episodes),
        facts_deleted: count(receipt.facts_deleted),
        facts_kept: count(receipt.facts_kept),
        pending_reviews_dropped: count(receipt.pending_reviews),
        tombstone_expires_at: Some(to_proto(receipt.tombstone_expires_at)),
    }
}

pub fn preview_page_size(message: &v1::PreviewRetentionRequest) -> Result<u32, IngestError> {
    Ok(parse_page_size(
        "page_size",
        message.page_size,
        DEFAULT_PREVIEW_PAGE_SIZE,
        MAX_PAGE_SIZE,
    )?)
}

pub fn preview_response(preview: &RetentionPreview) -> v1::PreviewRetentionResponse {
    let count = |n: i64| u64::try_from(n).unwrap_or_default();
    let entries: Vec<v1::RetentionCandidate> = preview
        .entries
        .iter()
        .map(|entry| v1::RetentionCandidate {
            memory_id: entry.id.to_string(),
            kind: MemoryKind::from_stored(&entry.kind)
                .map_or(v1::MemoryKind::Unspecified, kind_to_proto)
                .into(),
            reason: retention_reason_to_proto(&entry.reason).into(),
            title: entry.title.clone().unwrap_or_default(),
            text: entry.text.clone(),
            created_at: Some(to_proto(entry.created_at)),
            inactive_since: entry.inactive_since.map(to_proto),
        })
        .collect();
    v1::PreviewRetentionResponse {
        policy: Some(retention_to_proto(&preview.policy)),
        as_of: Some(to_proto(preview.as_of)),
        turns_to_delete: count(preview.counts.turns),
        conversations_with_turns_to_delete: u32::try_from(preview.counts.conversations_with_turns)
            .unwrap_or(u32::MAX),
        entries_past_max_age: count(preview.counts.past_max_age),
        inactive_entries_past_grace: count(preview.counts.inactive_past_grace),
        entries_becoming_inactive: count(preview.counts.becoming_inactive),
        entries,
    }
}

pub fn settings_to_proto(in_force: SettingsInForce) -> v1::SpaceSettings {
    let SettingsInForce {
        settings,
        retention,
    } = in_force;
    let overrides = settings.space.retention_overrides();
    v1::SpaceSettings {
        memory_enabled: settings.space.memory_enabled,
        incognito_default: settings.space.incognito_default,
        soft_cap_override: settings
            .space
            .soft_cap
            .and_then(|cap| u32::try_from(cap).ok())
            .unwrap_or(0),
        effective_soft_cap: settings.effective_soft_cap,
        memory_count: u64::try_from(settings.space.memory_count).unwrap_or(0),
        retention: Some(retention_to_proto(&retention)),
        retention_overrides: Some(v1::RetentionPolicy {
            turn_retention_days: overrides.turn_days,
            max_age_days: overrides.max_age_days,
            inactive_after_days: overrides.inactive_after_days,
            inactive_grace_days: overrides.inactive_grace_days,
        }),
    }
}

/// The rules in force, every field set (0: off).
fn retention_to_proto(policy: &DataRetention) -> v1::RetentionPolicy {
    let days = |rule: Option<u32>| Some(rule.unwrap_or(0));
    v1::RetentionPolicy {
        turn_retention_days: days(policy.turn_days),
        max_age_days: days(policy.max_age_days),
        inactive_after_days: days(policy.inactive_after_days),
        inactive_grace_days: days(policy.inactive_grace_days),
    }
}

/// The retention rules an UpdateSettings sets (each 0 to 36,500 days).
fn retention_from_proto(
    policy: Option<&v1::RetentionPolicy>,
) -> Result<RetentionOverrides, ValidationError> {
    let Some(policy) = policy else {
        return Ok(RetentionOverrides::default());
    };
    let check = |field: &str, days: Option<u32>| {
        days.map(|days| {
            retention::check_days(days).map_err(|reason| ValidationError::new(field, reason))
        })
        .transpose()
    };
    Ok(RetentionOverrides {
        turn_days: check("retention.turn_retention_days", policy.turn_retention_days)?,
        max_age_days: check("retention.max_age_days", policy.max_age_days)?,
        inactive_after_days: check("retention.inactive_after_days", policy.inactive_after_days)?,
        inactive_grace_days: check("retention.inactive_grace_days", policy.inactive_grace_days)?,
    })
}

fn retention_reason_to_proto(stored: &str) -> v1::RetentionReason {
    match stored {
        "AGE" => v1::RetentionReason::Age,
        "INACTIVE" => v1::RetentionReason::Inactive,
        "TURNS_SUMMARIZED" => v1::RetentionReason::TurnsSummarized,
        "BECOMES_INACTIVE" => v1::RetentionReason::BecomesInactive,
        _ => v1::RetentionReason::Unspecified,
    }
}

fn optional_conversation(raw: &str) -> Result<Option<ConversationId>, ValidationError> {
    if raw.is_empty() {
        Ok(None)
    } else {
        ConversationId::parse("conversation_id", raw).map(Some)
    }
}

pub fn remember_to_proto(result: RememberResult) -> v1::RememberResponse {
    use v1::RememberOutcome as Outcome;
    match result {
        RememberResult::Created { memory, trimmed } => v1::RememberResponse {
            outcome: Outcome::Created.into(),
            memory: Some(memory_to_proto(&memory)),
            trimmed_ids: trimmed.iter().map(ToString::to_string).collect(),
            tombstone_expires_at: None,
            message: if trimmed.is_empty() {
                "stored a new memory".into()
            } else {
                format!(
                    "stored a new memory; the soft cap trimmed {} entries",
                    trimmed.len()
                )
            },
        },
        RememberResult::Merged { memory } => v1::RememberResponse {
            outcome: Outcome::Merged.into(),
            message: format!(
                "merged into near-duplicate {} (repeat count {})",
                memory.id, memory.repeat_count
            ),
            memory: Some(memory_to_proto(&memory)),
            ..Default::default()
        },
        RememberResult::SuppressedByTombstone { expires_at } => v1::RememberResponse {
            outcome: Outcome::SuppressedByTombstone.into(),
            tombstone_expires_at: Some(to_proto(expires_at)),
            message: format!(
                "a near-duplicate was deleted recently (forgotten, or removed by retention); not stored before {expires_at}"
            ),
            ..Default::default()
        },
        RememberResult::SkippedMemoryDisabled => v1::RememberResponse {
            outcome: Outcome::SkippedMemoryDisabled.into(),
            message: "memory is turned off for this space; nothing was stored".into(),
            ..Default::default()
        },
        RememberResult::SkippedIncognito => v1::RememberResponse {
            outcome: Outcome::SkippedIncognito.into(),
            message: "the conversation is incognito; nothing was stored".into(),
            ..Default::default()
        },
        RememberResult::TrimmedAtCapacity { trimmed } => v1::RememberResponse {
            outcome: Outcome::TrimmedAtCapacity.into(),
            message: format!(
                "not kept: the space is at its soft cap and every other entry is pinned, saved or \
                 scores higher, so the new entry was trimmed ({} entries trimmed in all)",
                trimmed.len()
            ),
            trimmed_ids: trimmed.iter().map(ToString::to_string).collect(),
            ..Default::default()
        },
    }
}

fn command_action(command: Option<&MemoryCommand>) -> v1::CommandAction {
    match command {
        None => v1::CommandAction::NoCommand,
        Some(MemoryCommand::Recall(_)) => v1::CommandAction::Recall,
        Some(MemoryCommand::ForgetLast) => v1::CommandAction::Forget,
        Some(MemoryCommand::PinLast) => v1::CommandAction::Pin,
        Some(MemoryCommand::Remember(_)) => v1::CommandAction::Remember,
        Some(MemoryCommand::MemoryOff) => v1::CommandAction::MemoryOff,
        Some(MemoryCommand::MemoryOn) => v1::CommandAction::MemoryOn,
        Some(MemoryCommand::IncognitoStart) => v1::CommandAction::IncognitoStart,
        Some(MemoryCommand::IncognitoEnd) => v1::CommandAction::IncognitoEnd,
    }
}

pub fn command_to_proto(outcome: CommandOutcome) -> v1::ApplyCommandResponse {
    let remember_outcome = outcome
        .remember
        .map(|result| remember_to_proto(result).outcome)
        .unwrap_or(v1::RememberOutcome::Unspecified as i32);
    v1::ApplyCommandResponse {
        action: command_action(outcome.command.as_ref()).into(),
        applied: outcome.applied,
        reply: outcome.reply,
        memory: outcome.memory.as_ref().map(memory_to_proto),
        remember_outcome,
    }
}

fn turn_to_proto(turn: &TurnRecord) -> v1::ConversationTurn {
    v1::ConversationTurn {
        turn_index: u32::try_from(turn.turn_index).unwrap_or_default(),
        role: SpeakerRole::from_stored(&turn.role)
            .map_or(v1::SpeakerRole::Unspecified, role_to_proto)
            .into(),
        content: turn.content.clone(),
        at: Some(to_proto(turn.spoken_at)),
        client_message_id: turn.client_message_id.clone().unwrap_or_default(),
    }
}

fn appended_to_proto(appended: AppendedMessage) -> v1::AppendedTurn {
    let (outcome, turn_index) = match appended.result {
        TurnResult::Stored { turn_index } => (v1::TurnOutcome::Stored, turn_index),
        TurnResult::Duplicate { turn_index } => (v1::TurnOutcome::Duplicate, turn_index),
        TurnResult::SkippedIncognito => (v1::TurnOutcome::SkippedIncognito, 0),
        TurnResult::SkippedMemoryDisabled => (v1::TurnOutcome::SkippedMemoryDisabled, 0),
    };
    v1::AppendedTurn {
        outcome: outcome.into(),
        turn_index: u32::try_from(turn_index).unwrap_or_default(),
        client_message_id: appended.client_message_id.unwrap_or_default(),
        command: appended.command.map(command_to_proto),
    }
}

/// Validates the turns of an AppendMessages.
fn parse_messages(
    messages: &[v1::ConversationMessage],
    max_text_chars: usize,
) -> Result<Vec<NewMessage>, ValidationError> {
    if messages.is_empty() {
        return Err(ValidationError::new(
            "messages",
            "must hold at least one turn",
        ));
    }
    if messages.len() > MAX_MESSAGES_PER_APPEND {
        return Err(ValidationError::new(
            "messages",
            format!(
                "has {} turns; send at most {MAX_MESSAGES_PER_APPEND} per request",
                messages.len()
            ),
        ));
    }
    messages
        .iter()
        .enumerate()
        .map(|(index, message)| {
            let field = format!("messages[{index}]");
            let client_message_id = if message.client_message_id.is_empty() {
                None
            } else {
                check_label(
                    &format!("{field}.client_message_id"),
                    &message.client_message_id,
                    MAX_SOURCE_ID_CHARS,
                )?;
                Some(message.client_message_id.clone())
            };
            Ok(NewMessage {
                role: role_from_proto(&format!("{field}.role"), message.role)?,
                content: MemoryText::parse(
                    &format!("{field}.content"),
                    &message.content,
                    max_text_chars,
                )?,
                at: from_proto_opt(&format!("{field}.at"), message.at.as_ref())?,
                client_message_id,
            })
        })
        .collect()
}

fn audit_action_to_proto(stored: &str) -> v1::AuditAction {
    match AuditAction::from_stored(stored) {
        Some(AuditAction::Create) => v1::AuditAction::Create,
        Some(AuditAction::Merge) => v1::AuditAction::Merge,
        Some(AuditAction::Pin) => v1::AuditAction::Pin,
        Some(AuditAction::Unpin) => v1::AuditAction::Unpin,
        Some(AuditAction::Forget) => v1::AuditAction::Forget,
        Some(AuditAction::SettingsChange) => v1::AuditAction::SettingsChange,
        Some(AuditAction::IncognitoStart) => v1::AuditAction::IncognitoStart,
        Some(AuditAction::IncognitoEnd) => v1::AuditAction::IncognitoEnd,
        Some(AuditAction::Trim) => v1::AuditAction::Trim,
        Some(AuditAction::Import) => v1::AuditAction::Import,
        Some(AuditAction::Suppress) => v1::AuditAction::Suppress,
        Some(AuditAction::Supersede) => v1::AuditAction::Supersede,
        Some(AuditAction::ForgetConversation) => v1::AuditAction::ForgetConversation,
        Some(AuditAction::Segment) => v1::AuditAction::Segment,
        Some(AuditAction::Review) => v1::AuditAction::Review,
        Some(AuditAction::RetentionDelete) => v1::AuditAction::RetentionDelete,
        Some(AuditAction::RetentionRun) => v1::AuditAction::RetentionRun,
        None => v1::AuditAction::Unspecified,
    }
}
