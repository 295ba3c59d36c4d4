//! Conversations: their incognito state, pending reviews, turns (immutable cold storage, in
//! order) and how far segmentation has got.

use chrono::{DateTime, Utc};
use engram_core::{ConversationId, Scope};
use sqlx::{PgConnection, PgPool};
use uuid::Uuid;

use crate::StoreError;
use crate::outbox::NewOutboxEvent;

/// The conversation's incognito state (its own, else the space's default) and the space's memory
/// switch, as one row `(incognito, memory_enabled)` for the conversation `$1, $2, $3`.
macro_rules! privacy_row {
    () => {
        "SELECT COALESCE((SELECT incognito FROM conversations \
                          WHERE user_id = $1 AND space = $2 AND conversation_id = $3), \
                         s.incognito_default, false) AS incognito, \
                COALESCE(s.memory_enabled, true) AS memory_enabled \
         FROM (SELECT 1) AS one LEFT JOIN spaces s ON s.user_id = $1 AND s.space = $2"
    };
}

/// Whether the conversation's segmentation request may be claimed: none pending, or the pending
/// one older than `$renew` seconds.
macro_rules! segmentation_claimable {
    ($renew:literal) => {
        concat!(
            "(segmentation_requested_at IS NULL \
              OR segmentation_requested_at < now() - make_interval(secs => ",
            $renew,
            "))"
        )
    };
}

/// Which of these conversations of the space are incognito, explicitly or by the space's default.
pub async fn incognito_among(
    connection: &mut PgConnection,
    scope: &Scope,
    conversations: &[Uuid],
) -> Result<Vec<Uuid>, StoreError> {
    if conversations.is_empty() {
        return Ok(Vec::new());
    }
    let incognito = sqlx::query_scalar(
        "SELECT given.id FROM unnest($3::uuid[]) AS given(id) \
         LEFT JOIN conversations c \
             ON c.user_id = $1 AND c.space = $2 AND c.conversation_id = given.id \
         LEFT JOIN spaces s ON s.user_id = $1 AND s.space = $2 \
         WHERE COALESCE(c.incognito, s.incognito_default, false)",
    )
    .bind(scope.user_id.as_uuid())
    .bind(scope.space.as_str())
    .bind(conversations)
    .fetch_all(connection)
    .await?;
    Ok(incognito)
}

/// Sets the conversation's own incognito state; whether that changed it (a conversation with no
/// state of its own yet counts as changed: it now overrides the space's default).
pub async fn set_incognito(
    connection: &mut PgConnection,
    scope: &Scope,
    conversation: ConversationId,
    incognito: bool,
) -> Result<bool, StoreError> {
    // The conflict branch updates only a different state, and RETURNING yields a row only for
    // an insert or a real update: one atomic statement, however many callers race.
    let written = sqlx::query(
        "INSERT INTO conversations (user_id, space, conversation_id, incognito) VALUES ($1, $2, $3, $4) \
         ON CONFLICT (user_id, space, conversation_id) DO UPDATE SET incognito = $4, updated_at = now() \
         WHERE conversations.incognito IS DISTINCT FROM $4 \
         RETURNING 1",
    )
    .bind(scope.user_id.as_uuid())
    .bind(scope.space.as_str())
    .bind(conversation.as_uuid())
    .bind(incognito)
    .fetch_optional(connection)
    .await?;
    Ok(written.is_some())
}

/// The conversation's incognito and memory state without creating or locking anything.
pub async fn privacy_state(
    connection: &mut PgConnection,
    scope: &Scope,
    conversation: ConversationId,
) -> Result<(bool, bool), StoreError> {
    let state: (bool, bool) = sqlx::query_as(privacy_row!())
        .bind(scope.user_id.as_uuid())
        .bind(scope.space.as_str())
        .bind(conversation.as_uuid())
        .fetch_one(connection)
        .await?;
    Ok(state)
}

/// A turn to append, as the client sent it.
#[derive(Debug, Clone, PartialEq)]
pub struct TurnToAppend<'a> {
    pub role: &'static str,
    pub content: &'a str,
    /// When it was said; `None` is now (or the last turn's time, when that is ahead of now).
    pub spoken_at: Option<DateTime<Utc>>,
    pub client_message_id: Option<&'a str>,
    pub tokens: i32,
}

/// A segmentation request an append asks for with its turns.
#[derive(Debug, Clone, Copy)]
pub struct SegmentationRequest<'a> {
    /// Published through the outbox when this append claims the request.
    pub event: &'a NewOutboxEvent,
    /// A pending request older than this is claimed again (as [`claim_segmentation_request`]
    /// does for CloseSegment).
    pub renew_after: std::time::Duration,
}

/// One AppendMessages run: turns in the order they were said.
#[derive(Debug, Clone)]
pub struct AppendTurns<'a> {
    pub turns: &'a [TurnToAppend<'a>],
    /// The time a turn without one is given (unless the last turn's is later).
    pub now: DateTime<Utc>,
    /// Close the open segment after these turns (AppendMessages' `close_segment`).
    pub close: bool,
    /// With the bus on: the request to put in the outbox.
    pub segmentation_request: Option<SegmentationRequest<'a>>,
    /// The longest wait for each lock (the space's, the conversation's row); past it the append
    /// fails with nothing written ([`AppendOutcome::LockTimedOut`]).
    pub lock_timeout: Option<std::time::Duration>,
}

/// What became of one turn of an append.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AppendedTurn {
    pub turn_index: i32,
    /// The conversation already held a turn with this client message id (a resend).
    pub duplicate: bool,
}

/// What an append did.
#[derive(Debug, Clone, PartialEq)]
pub enum AppendOutcome {
    /// Memory is off for the space, or the conversation is incognito (explicitly or by the
    /// space's default): nothing was written.
    Refused { memory_enabled: bool },
    /// A turn was said before the turn before it (the conversation's last, or the previous one
    /// of the run): nothing was written.
    OutOfOrder {
        /// Its position in the run.
        position: usize,
        at: DateTime<Utc>,
        after: DateTime<Utc>,
    },
    /// A lock was not had within `lock_timeout`: nothing was written.
    LockTimedOut,
    Appended {
        /// One per turn of the run, in order.
        turns: Vec<AppendedTurn>,
        /// Whether the segmentation request went into the outbox (a pending one needs none).
        queued: bool,
    },
}

/// Postgres's SQLSTATE for a lock not had within `lock_timeout`.
const LOCK_NOT_AVAILABLE: &str = "55P03";

#[derive(sqlx::FromRow)]
struct AppendRow {
    memory_enabled: bool,
    refused: bool,
    turn_indexes: Option<Vec<i32>>,
    duplicates: Option<Vec<bool>>,
    out_of_order_position: Option<i32>,
    out_of_order_at: Option<DateTime<Utc>>,
    out_of_order_after: Option<DateTime<Utc>>,
    queued: bool,
}

/// Appends turns to a conversation in one round trip and one transaction (the
/// `engram_append_turns` function of the migrations): under the space's privacy lock (shared, so
/// memory and incognito switches are seen as they are) and the conversation's row lock (so
/// concurrent appends to it run one after another, never losing, duplicating or reordering
/// turns), creating the conversation if it is new. Turns whose client message id the
/// conversation already holds are reported, not stored again. With new turns, or a close asked
/// for, the conversation's progress moves and the segmentation request is claimed and queued.
pub async fn append_turns(
    pool: &PgPool,
    scope: &Scope,
    conversation: ConversationId,
    append: &AppendTurns<'_>,
) -> Result<AppendOutcome, StoreError> {
    let count = append.turns.len();
    let mut roles = Vec::with_capacity(count);
    let mut contents = Vec::with_capacity(count);
    let mut times = Vec::with_capacity(count);
    let mut client_ids = Vec::with_capacity(count);
    let mut tokens = Vec::with_capacity(count);
    for turn in append.turns {
        roles.push(turn.role);
        contents.push(turn.content);
        times.push(turn.spoken_at);
        client_ids.push(turn.client_message_id);
        tokens.push(turn.tokens);
    }
    let request = append.segmentation_request;
    let event = request.map(|request| request.event);
    let row: Result<AppendRow, sqlx::Error> = sqlx::query_as(
        "SELECT * FROM engram_append_turns($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, \
                                           $13, $14, $15, $16, $17, $18)",
    )
    .bind(crate::space_lock_key(scope, crate::LockKind::Privacy))
    .bind(scope.user_id.as_uuid())
    .bind(scope.space.as_str())
    .bind(conversation.as_uuid())
    .bind(&roles)
    .bind(&contents)
    .bind(&times)
    .bind(&client_ids)
    .bind(&tokens)
    .bind(append.now)
    .bind(append.close)
    .bind(request.map(|request| request.renew_after.as_secs_f64()))
    .bind(event.map(|event| event.message_id))
    .bind(event.map(|event| event.routing_key.as_str()))
    .bind(event.map(|event| event.type_name.as_str()))
    .bind(event.map(|event| event.payload.as_slice()))
    .bind(event.map(NewOutboxEvent::trace_headers_json))
    .bind(
        append
            .lock_timeout
            .map(|timeout| i64::try_from(timeout.as_millis()).unwrap_or(i64::MAX)),
    )
    .fetch_one(pool)
    .await;
    let row = match row {
        Err(sqlx::Error::Database(error))
            if error.code().as_deref() == Some(LOCK_NOT_AVAILABLE) =>
        {
            return Ok(AppendOutcome::LockTimedOut);
        }
        row => row?,
    };
    if row.refused {
        return Ok(AppendOutcome::Refused {
            memory_enabled: row.memory_enabled,
        });
    }
    if let (Some(position), Some(at), Some(after)) = (
        row.out_of_order_position,
        row.out_of_order_at,
        row.out_of_order_after,
    ) {
        return Ok(AppendOutcome::OutOfOrder {
            position: usize::try_from(position).unwrap_or_default(),
            at,
            after,
        });
    }
    let turns = row
        .turn_indexes
        .unwrap_or_default()
        .into_iter()
        .zip(row.duplicates.unwrap_or_default())
        .map(|(turn_index, duplicate)| AppendedTurn {
            turn_index,
            duplicate,
        })
        .collect();
    Ok(AppendOutcome::Appended {
        turns,
        queued: row.queued,
    })
}

/// Marks the conversation as having a segmentation request pending; false when one already is
/// (and is younger than `renew_after`), so the caller need not publish another. CloseSegment
/// calls it in the transaction that marked the close; an append claims the same way inside
/// `engram_append_turns`.
pub async fn claim_segmentation_request(
    connection: &mut PgConnection,
    scope: &Scope,
    conversation: ConversationId,
    renew_after: std::time::Duration,
) -> Result<bool, StoreError> {
    let claimed: Option<bool> = sqlx::query_scalar(concat!(
        "UPDATE conversations SET segmentation_requested_at = now() \
         WHERE user_id = $1 AND space = $2 AND conversation_id = $3 AND ",
        segmentation_claimable!("$4"),
        " RETURNING true"
    ))
    .bind(scope.user_id.as_uuid())
    .bind(scope.space.as_str())
    .bind(conversation.as_uuid())
    .bind(renew_after.as_secs_f64())
    .fetch_optional(connection)
    .await?;
    Ok(claimed.is_some())
}

/// Clears the pending-request marks of `conversations` before segmentation reads their tails: a
/// turn committed after this asks for segmentation again. Each waits for an append holding the
/// conversation's row, whose turns the read that follows then sees; one statement per
/// conversation, so that it never holds one row while waiting for another's (appends and
/// segmentation writes hold a space lock too: a multi-row update could close a cycle).
pub async fn clear_segmentation_requests(
    pool: &PgPool,
    conversations: &[(Scope, ConversationId)],
) -> Result<(), StoreError> {
    for (scope, conversation) in conversations {
        sqlx::query(
            "UPDATE conversations SET segmentation_requested_at = NULL \
             WHERE user_id = $1 AND space = $2 AND conversation_id = $3 \
               AND segmentation_requested_at IS NOT NULL",
        )
        .bind(scope.user_id.as_uuid())
        .bind(scope.space.as_str())
        .bind(conversation.as_uuid())
        .execute(pool)
        .await?;
    }
    Ok(())
}

/// Asks for the open segment to close (CloseSegment): its turns, `(first, last)`, or `None` when
/// no turn waits in an open segment.
pub async fn request_close(
    connection: &mut PgConnection,
    scope: &Scope,
    conversation: ConversationId,
) -> Result<Option<(i32, i32)>, StoreError> {
    let open = sqlx::query_as(
        "UPDATE conversations SET close_requested_through = next_turn_index - 1, updated_at = now() \
         WHERE user_id = $1 AND space = $2 AND conversation_id = $3 \
           AND next_turn_index - 1 > segmented_through \
         RETURNING segmented_through + 1, next_turn_index - 1",
    )
    .bind(scope.user_id.as_uuid())
    .bind(scope.space.as_str())
    .bind(conversation.as_uuid())
    .fetch_optional(connection)
    .await?;
    Ok(open)
}

/// A conversation as GetConversation reports it.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct ConversationSummary {
    pub incognito: bool,
    pub turn_count: i32,
    pub segmented_through: i32,
    pub pending_reviews: i32,
    pub last_turn_at: Option<DateTime<Utc>>,
    /// Turns up to this index were deleted (retention, ForgetConversation); -1: none.
    pub turns_deleted_through: i32,
}

pub async fn summary(
    pool: &PgPool,
    scope: &Scope,
    conversation: ConversationId,
) -> Result<Option<ConversationSummary>, StoreError> {
    let summary = sqlx::query_as(
        "SELECT COALESCE(c.incognito, s.incognito_default, false) AS incognito, \
                c.next_turn_index AS turn_count, c.segmented_through, \
                COALESCE(jsonb_array_length(c.pending_reviews), 0) AS pending_reviews, c.last_turn_at, \
                c.turns_deleted_through \
         FROM conversations c LEFT JOIN spaces s ON s.user_id = c.user_id AND s.space = c.space \
         WHERE c.user_id = $1 AND c.space = $2 AND c.conversation_id = $3",
    )
    .bind(scope.user_id.as_uuid())
    .bind(scope.space.as_str())
    .bind(conversation.as_uuid())
    .fetch_optional(pool)
    .await?;
    Ok(summary)
}

/// One stored turn.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct TurnRecord {
    pub turn_index: i32,
    pub role: String,
    pub content: String,
    pub spoken_at: DateTime<Utc>,
    pub client_message_id: Option<String>,
    pub tokens: i32,
    /// When Engram received it (our clock, whatever the client said of `spoken_at`).
    pub created_at: DateTime<Utc>,
}

/// Up to `limit` turns after `after` (a turn index), oldest first.
pub async fn turns_page(
    pool: &PgPool,
    scope: &Scope,
    conversation: ConversationId,
    after: Option<i32>,
    limit: i64,
) -> Result<Vec<TurnRecord>, StoreError> {
    let turns = sqlx::query_as(
        "SELECT turn_index, role, content, spoken_at, client_message_id, tokens, created_at FROM conversation_turns \
         WHERE user_id = $1 AND space = $2 AND conversation_id = $3 AND turn_index > $4 \
         ORDER BY turn_index LIMIT $5",
    )
    .bind(scope.user_id.as_uuid())
    .bind(scope.space.as_str())
    .bind(conversation.as_uuid())
    .bind(after.unwrap_or(-1))
    .bind(limit)
    .fetch_all(pool)
    .await?;
    Ok(turns)
}
