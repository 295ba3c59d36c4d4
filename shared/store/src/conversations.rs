//! Conversations: their incognito state, pending reviews, turns (immutable cold storage, in
//! order) and how far segmentation has got.

use chrono::{DateTime, Utc};
use engram_core::{ConversationId, Scope};
use sqlx::{PgConnection, PgPool};
use uuid::Uuid;

use crate::StoreError;

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

/// A conversation as the append path finds it, under its row lock.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct AppendState {
    pub next_turn_index: i32,
    pub last_turn_at: Option<DateTime<Utc>>,
    /// The conversation is incognito (explicitly, or by the space's default).
    pub incognito: bool,
    pub memory_enabled: bool,
}

/// Creates the conversation if needed and locks its row until the transaction ends, so that
/// appends to it run one after another (turn indexes are never lost, duplicated or reordered).
pub async fn lock_for_append(
    connection: &mut PgConnection,
    scope: &Scope,
    conversation: ConversationId,
) -> Result<AppendState, StoreError> {
    let state = sqlx::query_as::<_, AppendState>(
        "WITH locked AS ( \
             INSERT INTO conversations (user_id, space, conversation_id) VALUES ($1, $2, $3) \
             ON CONFLICT (user_id, space, conversation_id) DO UPDATE SET updated_at = now() \
             RETURNING next_turn_index, last_turn_at, incognito) \
         SELECT l.next_turn_index, l.last_turn_at, \
                COALESCE(l.incognito, s.incognito_default, false) AS incognito, \
                COALESCE(s.memory_enabled, true) AS memory_enabled \
         FROM locked l LEFT JOIN spaces s ON s.user_id = $1 AND s.space = $2",
    )
    .bind(scope.user_id.as_uuid())
    .bind(scope.space.as_str())
    .bind(conversation.as_uuid())
    .fetch_one(connection)
    .await?;
    Ok(state)
}

/// The conversation's incognito and memory state without creating or locking anything: what an
/// append that may store nothing looks at first.
pub async fn privacy_state(
    connection: &mut PgConnection,
    scope: &Scope,
    conversation: ConversationId,
) -> Result<(bool, bool), StoreError> {
    let state: (bool, bool) = sqlx::query_as(
        "SELECT COALESCE((SELECT incognito FROM conversations \
                          WHERE user_id = $1 AND space = $2 AND conversation_id = $3), \
                         s.incognito_default, false), \
                COALESCE(s.memory_enabled, true) \
         FROM (SELECT 1) AS one LEFT JOIN spaces s ON s.user_id = $1 AND s.space = $2",
    )
    .bind(scope.user_id.as_uuid())
    .bind(scope.space.as_str())
    .bind(conversation.as_uuid())
    .fetch_one(connection)
    .await?;
    Ok(state)
}

/// The turns already holding these client message ids: (client id, turn index).
pub async fn turns_by_client_id(
    connection: &mut PgConnection,
    scope: &Scope,
    conversation: ConversationId,
    client_ids: &[&str],
) -> Result<Vec<(String, i32)>, StoreError> {
    if client_ids.is_empty() {
        return Ok(Vec::new());
    }
    let rows = sqlx::query_as(
        "SELECT client_message_id, turn_index FROM conversation_turns \
         WHERE user_id = $1 AND space = $2 AND conversation_id = $3 \
           AND client_message_id = ANY($4::text[])",
    )
    .bind(scope.user_id.as_uuid())
    .bind(scope.space.as_str())
    .bind(conversation.as_uuid())
    .bind(client_ids)
    .fetch_all(connection)
    .await?;
    Ok(rows)
}

/// A turn to insert, with its index already allocated.
#[derive(Debug, Clone, PartialEq)]
pub struct NewTurn {
    pub turn_index: i32,
    pub role: &'static str,
    pub content: String,
    pub spoken_at: DateTime<Utc>,
    pub client_message_id: Option<String>,
    pub tokens: i32,
}

/// Inserts the turns and moves the conversation past them (next index, last time, and an
/// explicit close when asked for). The row must be locked ([`lock_for_append`]).
pub async fn insert_turns(
    connection: &mut PgConnection,
    scope: &Scope,
    conversation: ConversationId,
    turns: &[NewTurn],
    close_requested: bool,
) -> Result<(), StoreError> {
    let Some(last) = turns.last() else {
        return Ok(());
    };
    let mut indexes = Vec::with_capacity(turns.len());
    let mut roles = Vec::with_capacity(turns.len());
    let mut contents = Vec::with_capacity(turns.len());
    let mut times = Vec::with_capacity(turns.len());
    let mut client_ids = Vec::with_capacity(turns.len());
    let mut tokens = Vec::with_capacity(turns.len());
    for turn in turns {
        indexes.push(turn.turn_index);
        roles.push(turn.role);
        contents.push(turn.content.as_str());
        times.push(turn.spoken_at);
        client_ids.push(turn.client_message_id.as_deref());
        tokens.push(turn.tokens);
    }
    sqlx::query(
        "WITH inserted AS ( \
             INSERT INTO conversation_turns (user_id, space, conversation_id, turn_index, role, content, \
                 spoken_at, client_message_id, tokens) \
             SELECT $1, $2, $3, t.turn_index, t.role, t.content, t.spoken_at, t.client_message_id, t.tokens \
             FROM unnest($4::int4[], $5::text[], $6::text[], $7::timestamptz[], $8::text[], $9::int4[]) \
                 AS t(turn_index, role, content, spoken_at, client_message_id, tokens) \
             RETURNING 1) \
         UPDATE conversations SET next_turn_index = $10 + 1, last_turn_at = $11, last_appended_at = now(), \
             updated_at = now(), \
             close_requested_through = CASE WHEN $12 THEN $10 ELSE close_requested_through END \
         WHERE user_id = $1 AND space = $2 AND conversation_id = $3",
    )
    .bind(scope.user_id.as_uuid())
    .bind(scope.space.as_str())
    .bind(conversation.as_uuid())
    .bind(&indexes)
    .bind(&roles)
    .bind(&contents)
    .bind(&times)
    .bind(&client_ids)
    .bind(&tokens)
    .bind(last.turn_index)
    .bind(last.spoken_at)
    .bind(close_requested)
    .execute(connection)
    .await?;
    Ok(())
}

/// Marks the conversation as having a segmentation request pending; false when one already is
/// (and is younger than `renew_after`), so the caller need not publish another. Runs in the
/// append's transaction, which holds the conversation's row.
pub async fn claim_segmentation_request(
    connection: &mut PgConnection,
    scope: &Scope,
    conversation: ConversationId,
    renew_after: std::time::Duration,
) -> Result<bool, StoreError> {
    let claimed: Option<bool> = sqlx::query_scalar(
        "UPDATE conversations SET segmentation_requested_at = now() \
         WHERE user_id = $1 AND space = $2 AND conversation_id = $3 \
           AND (segmentation_requested_at IS NULL \
                OR segmentation_requested_at < now() - make_interval(secs => $4)) \
         RETURNING true",
    )
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
