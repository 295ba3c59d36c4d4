//! The audit trail: every user action (and every trim) on a space, append-only.

use chrono::{DateTime, Utc};
use engram_core::{ConversationId, Scope};
use sqlx::{PgConnection, PgPool};
use uuid::Uuid;

use crate::StoreError;

/// An audited action, with its stored name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuditAction {
    Create,
    Merge,
    Pin,
    Unpin,
    Forget,
    SettingsChange,
    IncognitoStart,
    IncognitoEnd,
    Trim,
    Import,
    /// A Remember that a tombstone suppressed: nothing was written.
    Suppress,
    /// A fact superseded by a newer one about the same subject.
    Supersede,
    ForgetConversation,
    /// Segmentation closed a segment (and wrote its episode).
    Segment,
    /// The review service graded a memory (and updated its FSRS state).
    Review,
    /// Retention deleted a memory, or a conversation's summarized turns.
    RetentionDelete,
    /// A retention run's counts for a space.
    RetentionRun,
}

impl AuditAction {
    pub fn as_str(self) -> &'static str {
        match self {
            AuditAction::Create => "create",
            AuditAction::Merge => "merge",
            AuditAction::Pin => "pin",
            AuditAction::Unpin => "unpin",
            AuditAction::Forget => "forget",
            AuditAction::SettingsChange => "settings_change",
            AuditAction::IncognitoStart => "incognito_start",
            AuditAction::IncognitoEnd => "incognito_end",
            AuditAction::Trim => "trim",
            AuditAction::Import => "import",
            AuditAction::Suppress => "suppress",
            AuditAction::Supersede => "supersede",
            AuditAction::ForgetConversation => "forget_conversation",
            AuditAction::Segment => "segment",
            AuditAction::Review => "review",
            AuditAction::RetentionDelete => "retention_delete",
            AuditAction::RetentionRun => "retention_run",
        }
    }

    pub fn from_stored(stored: &str) -> Option<Self> {
        use AuditAction::*;
        [
            Create,
            Merge,
            Pin,
            Unpin,
            Forget,
            SettingsChange,
            IncognitoStart,
            IncognitoEnd,
            Trim,
            Import,
            Suppress,
            Supersede,
            ForgetConversation,
            Segment,
            Review,
            RetentionDelete,
            RetentionRun,
        ]
        .into_iter()
        .find(|action| action.as_str() == stored)
    }
}

#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct AuditRecord {
    pub id: i64,
    pub action: String,
    pub memory_id: Option<Uuid>,
    pub conversation_id: Option<Uuid>,
    pub detail: serde_json::Value,
    pub created_at: DateTime<Utc>,
}

pub async fn append(
    connection: &mut PgConnection,
    scope: &Scope,
    action: AuditAction,
    memory_id: Option<Uuid>,
    conversation: Option<ConversationId>,
    detail: serde_json::Value,
) -> Result<(), StoreError> {
    sqlx::query(
        "INSERT INTO audit_events (user_id, space, action, memory_id, conversation_id, detail) \
         VALUES ($1, $2, $3, $4, $5, $6)",
    )
    .bind(scope.user_id.as_uuid())
    .bind(scope.space.as_str())
    .bind(action.as_str())
    .bind(memory_id)
    .bind(conversation.map(|c| c.as_uuid()))
    .bind(detail)
    .execute(connection)
    .await?;
    Ok(())
}

/// Appends one event of `action` per (memory, detail), in one statement.
pub async fn append_each(
    connection: &mut PgConnection,
    scope: &Scope,
    action: AuditAction,
    conversation: Option<ConversationId>,
    events: &[(Uuid, serde_json::Value)],
) -> Result<(), StoreError> {
    let events: Vec<(&Scope, Option<Uuid>, serde_json::Value)> = events
        .iter()
        .map(|(id, detail)| (scope, Some(*id), detail.clone()))
        .collect();
    append_across(connection, action, conversation, &events).await
}

/// Appends one event of `action` per (space, memory, detail), for several spaces at once, in
/// one statement, in the order given.
pub async fn append_across(
    connection: &mut PgConnection,
    action: AuditAction,
    conversation: Option<ConversationId>,
    events: &[(&Scope, Option<Uuid>, serde_json::Value)],
) -> Result<(), StoreError> {
    if events.is_empty() {
        return Ok(());
    }
    sqlx::query(
        "INSERT INTO audit_events (user_id, space, action, memory_id, conversation_id, detail) \
         SELECT e.user_id, e.space, $1, e.memory_id, $2, e.detail \
         FROM unnest($3::uuid[], $4::text[], $5::uuid[], $6::jsonb[]) WITH ORDINALITY \
              AS e(user_id, space, memory_id, detail, position) \
         ORDER BY e.position",
    )
    .bind(action.as_str())
    .bind(conversation.map(|c| c.as_uuid()))
    .bind(
        events
            .iter()
            .map(|(scope, _, _)| scope.user_id.as_uuid())
            .collect::<Vec<_>>(),
    )
    .bind(
        events
            .iter()
            .map(|(scope, _, _)| scope.space.as_str())
            .collect::<Vec<_>>(),
    )
    .bind(events.iter().map(|(_, id, _)| *id).collect::<Vec<_>>())
    .bind(
        events
            .iter()
            .map(|(_, _, detail)| detail.clone())
            .collect::<Vec<_>>(),
    )
    .execute(connection)
    .await?;
    Ok(())
}

/// Events of the space, newest first, with ids below `before_id` when given.
pub async fn list(
    pool: &PgPool,
    scope: &Scope,
    before_id: Option<i64>,
    limit: i64,
) -> Result<Vec<AuditRecord>, StoreError> {
    let records = sqlx::query_as::<_, AuditRecord>(
        "SELECT id, action, memory_id, conversation_id, detail, created_at FROM audit_events \
         WHERE user_id = $1 AND space = $2 AND ($3::bigint IS NULL OR id < $3) \
         ORDER BY id DESC LIMIT $4",
    )
    .bind(scope.user_id.as_uuid())
    .bind(scope.space.as_str())
    .bind(before_id)
    .bind(limit)
    .fetch_all(pool)
    .await?;
    Ok(records)
}

/// The memory most recently created or merged from a conversation by the user (not derived by
/// segmentation or consolidation, whose audit detail says `"derived": true`): what "forget that"
/// and "pin this" refer to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LastWritten {
    /// Nothing from the conversation was ever written.
    Nothing,
    /// The last write's memory has since been forgotten or trimmed. Commands do not reach back to
    /// older writes: a repeated "forget that" must not delete what the user did not mean.
    Gone,
    /// The conversation went incognito, left it, or changed the space's memory setting after its
    /// last write, or the space's memory or default-incognito setting was switched from anywhere
    /// (UpdateSettings) since: what was said since may not have been saved, so the last write is
    /// not what the user means by "that".
    BeforePrivacyChange,
    /// A Remember in the conversation after its last write was suppressed by a tombstone: the
    /// user's "that" is what was not saved, not the last write.
    AfterSuppressedWrite,
    Stored(Uuid),
}

pub async fn last_written_in_conversation(
    connection: &mut PgConnection,
    scope: &Scope,
    conversation: ConversationId,
) -> Result<LastWritten, StoreError> {
    let row: Option<(Uuid, bool, bool, bool)> =
        sqlx::query_as(include_str!("audit/last_written_in_conversation.sql"))
            .bind(scope.user_id.as_uuid())
            .bind(scope.space.as_str())
            .bind(conversation.as_uuid())
            .fetch_optional(connection)
            .await?;
    Ok(match row {
        None => LastWritten::Nothing,
        Some((_, _, true, _)) => LastWritten::BeforePrivacyChange,
        Some((_, _, false, true)) => LastWritten::AfterSuppressedWrite,
        Some((id, true, false, false)) => LastWritten::Stored(id),
        Some((_, false, false, false)) => LastWritten::Gone,
    })
}
