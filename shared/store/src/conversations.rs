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

/// A conversation as the append path finds it, under its row lock.
#[derive(Debug, Clone, PartialEq)]
pub struct AppendState {
    pub next_turn_index: i32,
    pub last_turn_at: Option<DateTime<Utc>>,
    /// Turns already holding some of the append's client message ids: (client id, turn index).
    pub known_client_ids: Vec<(String, i32)>,
}

/// What an append finds when it opens a conversation.
#[derive(Debug, Clone, PartialEq)]
pub enum AppendOpening {
    /// Memory is off for the space, or the conversation is incognito (explicitly or by the
    /// space's default): nothing was created or locked.
    Refused { memory_enabled: bool },
    /// The conversation exists (created if it was new) and its row is locked until the
    /// transaction ends, so that appends to it run one after another.
    Open(AppendState),
}

#[derive(sqlx::FromRow)]
struct OpeningRow {
    memory_enabled: bool,
    next_turn_index: Option<i32>,
    last_turn_at: Option<DateTime<Utc>>,
    known_ids: Vec<String>,
    known_indexes: Vec<i32>,
}

/// Opens the conversation for an append, in one round trip: its privacy state (without creating
/// anything when memory is off or it is incognito); otherwise creates it if needed, locks its row
/// and finds which of `client_ids` its turns already hold. The caller holds the space's lock
/// ([`crate::begin_with_spaces_locked`]), which every appender and every incognito or memory
/// switch takes first, so the statement's snapshot sees the switches and turns as they are.
pub async fn open_for_append(
    connection: &mut PgConnection,
    scope: &Scope,
    conversation: ConversationId,
    client_ids: &[&str],
) -> Result<AppendOpening, StoreError> {
    let row = sqlx::query_as::<_, OpeningRow>(concat!(
        "WITH privacy AS (",
        privacy_row!(),
        "), \
         locked AS ( \
             INSERT INTO conversations (user_id, space, conversation_id) \
             SELECT $1, $2, $3 FROM privacy WHERE memory_enabled AND NOT incognito \
             ON CONFLICT (user_id, space, conversation_id) DO UPDATE SET updated_at = now() \
             RETURNING next_turn_index, last_turn_at), \
         known AS ( \
             SELECT COALESCE(array_agg(client_message_id), '{}') AS ids, \
                    COALESCE(array_agg(turn_index), '{}') AS indexes \
             FROM conversation_turns \
             WHERE user_id = $1 AND space = $2 AND conversation_id = $3 \
               AND client_message_id = ANY($4::text[])) \
         SELECT p.memory_enabled, l.next_turn_index, l.last_turn_at, \
                k.ids AS known_ids, k.indexes AS known_indexes \
         FROM privacy p LEFT JOIN locked l ON true CROSS JOIN known k"
    ))
    .bind(scope.user_id.as_uuid())
    .bind(scope.space.as_str())
    .bind(conversation.as_uuid())
    .bind(client_ids)
    .fetch_one(connection)
    .await?;
    let Some(next_turn_index) = row.next_turn_index else {
        return Ok(AppendOpening::Refused {
            memory_enabled: row.memory_enabled,
        });
    };
    Ok(AppendOpening::Open(AppendState {
        next_turn_index,
        last_turn_at: row.last_turn_at,
        known_client_ids: row.known_ids.into_iter().zip(row.known_indexes).collect(),
    }))
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

/// A segmentation request an append asks for with its turns.
#[derive(Debug, Clone, Copy)]
pub struct SegmentationRequest<'a> {
    /// Published through the outbox when this append claims the request.
    pub event: &'a NewOutboxEvent,
    /// A pending request older than this is claimed again (see [`claim_segmentation_request`]).
    pub renew_after: std::time::Duration,
}

/// Inserts the turns and moves the conversation past them (next index, last time, and an
/// explicit close when asked for); with a `segmentation_request`, also claims it as
/// [`claim_segmentation_request`] does and, when claimed, queues its event in the outbox. One
/// statement, so that an append costs few round trips while it holds the space's lock. The row
/// must be locked ([`open_for_append`]). Returns whether the event was queued.
pub async fn record_turns(
    connection: &mut PgConnection,
    scope: &Scope,
    conversation: ConversationId,
    turns: &[NewTurn],
    close_requested: bool,
    segmentation_request: Option<SegmentationRequest<'_>>,
) -> Result<bool, StoreError> {
    let Some(last) = turns.last() else {
        return Ok(false);
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
    let event = segmentation_request.map(|request| request.event);
    // The claim reads the row as this transaction left it (it holds the row's lock); data-modifying
    // CTEs all run, whether or not the final statement reads them.
    let queued = sqlx::query_scalar::<_, bool>(concat!(
        "WITH inserted AS ( \
             INSERT INTO conversation_turns (user_id, space, conversation_id, turn_index, role, content, \
                 spoken_at, client_message_id, tokens) \
             SELECT $1, $2, $3, t.turn_index, t.role, t.content, t.spoken_at, t.client_message_id, t.tokens \
             FROM unnest($4::int4[], $5::text[], $6::text[], $7::timestamptz[], $8::text[], $9::int4[]) \
                 AS t(turn_index, role, content, spoken_at, client_message_id, tokens) \
             RETURNING 1), \
         claim AS ( \
             SELECT $13::bool AND ",
        segmentation_claimable!("$14"),
        " AS claimed \
             FROM conversations WHERE user_id = $1 AND space = $2 AND conversation_id = $3), \
         moved AS ( \
             UPDATE conversations SET next_turn_index = $10 + 1, last_turn_at = $11, \
                 last_appended_at = now(), updated_at = now(), \
                 close_requested_through = CASE WHEN $12 THEN $10 ELSE close_requested_through END, \
                 segmentation_requested_at = CASE WHEN (SELECT claimed FROM claim) THEN now() \
                                                  ELSE segmentation_requested_at END \
             WHERE user_id = $1 AND space = $2 AND conversation_id = $3 \
             RETURNING 1), \
         queued AS ( \
             INSERT INTO outbox_events (message_id, routing_key, type_name, payload, trace_headers) \
             SELECT $15, $16, $17, $18, $19 FROM claim WHERE claimed \
             RETURNING 1) \
         SELECT EXISTS (SELECT 1 FROM queued)"
    ))
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
    .bind(segmentation_request.is_some())
    .bind(segmentation_request.map_or(0.0, |request| request.renew_after.as_secs_f64()))
    .bind(event.map(|event| event.message_id))
    .bind(event.map(|event| event.routing_key.as_str()))
    .bind(event.map(|event| event.type_name.as_str()))
    .bind(event.map(|event| event.payload.as_slice()))
    .bind(event.map(NewOutboxEvent::trace_headers_json))
    .fetch_one(connection)
    .await?;
    Ok(queued)
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
