//! The statements of segmentation: a conversation's open segment, the episodes written from it,
//! the pending reviews a closed segment takes, and the conversations due for a look.

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use engram_core::memory_state::{initial_state, surprise_from_similarity};
use engram_core::{ConversationId, Scope, Scores, SimHash};
use pgvector::Vector;
use sqlx::{PgConnection, PgPool};
use uuid::Uuid;

use crate::StoreError;
use crate::conversations::TurnRecord;
use crate::embeddings::{EntryKey, key_arrays};
use crate::memories::MemoryRecord;
use crate::outbox::NewOutboxEvent;

/// A conversation's open segment: the turns after the last closed one, with their embeddings.
#[derive(Debug, Clone, PartialEq)]
pub struct OpenTail {
    pub segmented_through: i32,
    pub close_requested_through: Option<i32>,
    pub turns: Vec<TurnRecord>,
    pub embeddings: HashMap<i32, Vec<f32>>,
}

/// Most turns one look at an open segment reads (a segment closes at twice `max_turns` anyway).
pub const MAX_OPEN_TURNS: i64 = 400;

/// The turn vectors read are those of embedder `topic_model` (none without one).
pub async fn open_tail(
    pool: &PgPool,
    scope: &Scope,
    conversation: ConversationId,
    topic_model: Option<&str>,
) -> Result<Option<OpenTail>, StoreError> {
    let progress: Option<(i32, Option<i32>)> = sqlx::query_as(
        "SELECT segmented_through, close_requested_through FROM conversations \
         WHERE user_id = $1 AND space = $2 AND conversation_id = $3",
    )
    .bind(scope.user_id.as_uuid())
    .bind(scope.space.as_str())
    .bind(conversation.as_uuid())
    .fetch_optional(pool)
    .await?;
    let Some((segmented_through, close_requested_through)) = progress else {
        return Ok(None);
    };
    let turns: Vec<TurnRecord> = sqlx::query_as(
        "SELECT turn_index, role, content, spoken_at, client_message_id, tokens, created_at FROM conversation_turns \
         WHERE user_id = $1 AND space = $2 AND conversation_id = $3 AND turn_index > $4 \
         ORDER BY turn_index LIMIT $5",
    )
    .bind(scope.user_id.as_uuid())
    .bind(scope.space.as_str())
    .bind(conversation.as_uuid())
    .bind(segmented_through)
    .bind(MAX_OPEN_TURNS)
    .fetch_all(pool)
    .await?;
    let embeddings: Vec<(i32, Vector)> = match topic_model {
        None => Vec::new(),
        Some(topic_model) => sqlx::query_as(
        "SELECT turn_index, embedding FROM conversation_turn_embeddings \
         WHERE user_id = $1 AND space = $2 AND conversation_id = $3 AND turn_index > $4 AND model = $5",
    )
    .bind(scope.user_id.as_uuid())
    .bind(scope.space.as_str())
    .bind(conversation.as_uuid())
    .bind(segmented_through)
    .bind(topic_model)
    .fetch_all(pool)
    .await?,
    };
    Ok(Some(OpenTail {
        segmented_through,
        close_requested_through,
        turns,
        embeddings: embeddings
            .into_iter()
            .map(|(index, vector)| (index, vector.to_vec()))
            .collect(),
    }))
}

/// Keeps turn vectors for the topic rules, made by embedder `model` (a turn embedded twice by
/// one embedder keeps the first; a vector of another embedder is replaced).
pub async fn store_turn_embeddings(
    pool: &PgPool,
    scope: &Scope,
    conversation: ConversationId,
    model: &str,
    embeddings: &[(i32, Vec<f32>)],
) -> Result<(), StoreError> {
    if embeddings.is_empty() {
        return Ok(());
    }
    let indexes: Vec<i32> = embeddings.iter().map(|(index, _)| *index).collect();
    let vectors: Vec<Vector> = embeddings
        .iter()
        .map(|(_, vector)| Vector::from(vector.clone()))
        .collect();
    // A turn deleted meanwhile (ForgetConversation) has no row to refer to: it is skipped.
    sqlx::query(
        "INSERT INTO conversation_turn_embeddings (user_id, space, conversation_id, turn_index, embedding, model) \
         SELECT $1, $2, $3, e.turn_index, e.embedding, $6 FROM unnest($4::int4[], $5::vector[]) AS e(turn_index, embedding) \
         WHERE EXISTS (SELECT 1 FROM conversation_turns t WHERE t.user_id = $1 AND t.space = $2 \
                       AND t.conversation_id = $3 AND t.turn_index = e.turn_index) \
         ON CONFLICT (user_id, space, conversation_id, turn_index) DO UPDATE \
             SET embedding = EXCLUDED.embedding, model = EXCLUDED.model \
             WHERE conversation_turn_embeddings.model <> EXCLUDED.model",
    )
    .bind(scope.user_id.as_uuid())
    .bind(scope.space.as_str())
    .bind(conversation.as_uuid())
    .bind(&indexes)
    .bind(&vectors)
    .bind(model)
    .execute(pool)
    .await?;
    Ok(())
}

/// The conversation's segmentation progress (`segmented_through`), or `None` when the
/// conversation is gone. Read without locking the row: only transactions holding the space's
/// content lock change it (segmentation, forgetting the conversation), so it stays as read for
/// a caller that holds that lock ([`crate::SpaceAccess::WriteEntries`]).
pub async fn progress(
    connection: &mut PgConnection,
    scope: &Scope,
    conversation: ConversationId,
) -> Result<Option<i32>, StoreError> {
    let progress = sqlx::query_scalar(
        "SELECT segmented_through FROM conversations \
         WHERE user_id = $1 AND space = $2 AND conversation_id = $3",
    )
    .bind(scope.user_id.as_uuid())
    .bind(scope.space.as_str())
    .bind(conversation.as_uuid())
    .fetch_optional(connection)
    .await?;
    Ok(progress)
}

/// Records that every turn up to `through` is in a closed segment (an explicit close it covered
/// is done), and starts the retention clock of those turns (`summarized_segments`; the space
/// gets its settings row, which the retention job goes through, if it had none).
pub async fn mark_segmented(
    connection: &mut PgConnection,
    scope: &Scope,
    conversation: ConversationId,
    through: i32,
) -> Result<(), StoreError> {
    sqlx::query(
        "WITH progress AS ( \
             UPDATE conversations SET segmented_through = $4, updated_at = now(), \
                 close_requested_through = CASE WHEN close_requested_through <= $4 THEN NULL \
                                                ELSE close_requested_through END \
             WHERE user_id = $1 AND space = $2 AND conversation_id = $3 \
             RETURNING user_id), \
         space_row AS ( \
             INSERT INTO spaces (user_id, space) SELECT $1, $2 FROM progress \
             ON CONFLICT DO NOTHING) \
         INSERT INTO summarized_segments (user_id, space, conversation_id, last_turn_index) \
         SELECT $1, $2, $3, $4 FROM progress \
         ON CONFLICT DO NOTHING",
    )
    .bind(scope.user_id.as_uuid())
    .bind(scope.space.as_str())
    .bind(conversation.as_uuid())
    .bind(through)
    .execute(connection)
    .await?;
    Ok(())
}

/// Takes the conversation's pending reviews: reads and clears them in one statement, so a review
/// recorded meanwhile is either taken now or left for the next segment, never lost or taken
/// twice. `None` when there were none.
pub async fn take_pending_reviews(
    connection: &mut PgConnection,
    scope: &Scope,
    conversation: ConversationId,
) -> Result<Option<serde_json::Value>, StoreError> {
    let taken: Option<Option<serde_json::Value>> = sqlx::query_scalar(
        "UPDATE conversations c SET pending_reviews = NULL, updated_at = now() \
         FROM (SELECT pending_reviews FROM conversations \
               WHERE user_id = $1 AND space = $2 AND conversation_id = $3 FOR UPDATE) AS before \
         WHERE c.user_id = $1 AND c.space = $2 AND c.conversation_id = $3 \
           AND before.pending_reviews IS NOT NULL \
         RETURNING before.pending_reviews",
    )
    .bind(scope.user_id.as_uuid())
    .bind(scope.space.as_str())
    .bind(conversation.as_uuid())
    .fetch_optional(connection)
    .await?;
    Ok(taken.flatten())
}

/// Returns reviews taken with a segment that belong to the still-open segment (recorded after
/// the closed segments' last turns), ahead of any recorded since.
pub async fn put_back_pending_reviews(
    connection: &mut PgConnection,
    scope: &Scope,
    conversation: ConversationId,
    reviews: &serde_json::Value,
) -> Result<(), StoreError> {
    sqlx::query(
        "UPDATE conversations SET pending_reviews = $4::jsonb || COALESCE(pending_reviews, '[]'::jsonb) \
         WHERE user_id = $1 AND space = $2 AND conversation_id = $3",
    )
    .bind(scope.user_id.as_uuid())
    .bind(scope.space.as_str())
    .bind(conversation.as_uuid())
    .bind(reviews)
    .execute(connection)
    .await?;
    Ok(())
}

/// A new episodic memory.
#[derive(Debug, Clone)]
pub struct NewEpisode {
    /// Derived from the conversation and the segment's first turn: writing the same segment
    /// twice finds the first.
    pub id: Uuid,
    pub conversation_id: Uuid,
    pub title: String,
    pub summary: String,
    /// `[{"role", "content"}]`.
    pub messages: serde_json::Value,
    pub surprise: f64,
    /// `surprise` is neutral until the embedding backfill measures it
    /// ([`settle_pending_surprise`]).
    pub surprise_pending: bool,
    pub start_at: DateTime<Utc>,
    pub end_at: DateTime<Utc>,
    pub stability: f64,
    pub difficulty: f64,
    pub simhash: SimHash,
    pub text_digest: Vec<u8>,
    pub tags: Vec<String>,
    pub metadata_confidence: f64,
    pub importance: f64,
    pub structured_summary: serde_json::Value,
    pub last_scores: Scores,
}

/// What writing an episode did.
#[derive(Debug, Clone, PartialEq)]
pub enum EpisodeWrite {
    Created(MemoryRecord),
    /// This segment's episode exists already (the segment was written before).
    AlreadyWritten(Uuid),
    /// A near-duplicate episode existed: it was repeated (repeat_count + 1) instead.
    Merged(MemoryRecord),
    /// The user forgot a near-duplicate recently: nothing was written.
    Suppressed,
}

/// Writes a segment's episode the way the write path writes every entry: a live tombstone
/// suppresses it, a near-duplicate episode (SimHash within distance 3) is repeated instead,
/// otherwise it is inserted — audited, and announced in the outbox when `event` is given.
pub async fn write_episode(
    connection: &mut PgConnection,
    scope: &Scope,
    episode: &NewEpisode,
    audit_detail: serde_json::Value,
    event: Option<&NewOutboxEvent>,
) -> Result<EpisodeWrite, StoreError> {
    let user = scope.user_id.as_uuid();
    let space = scope.space.as_str();
    let existing: Option<Uuid> =
        sqlx::query_scalar("SELECT id FROM memories WHERE user_id = $1 AND space = $2 AND id = $3")
            .bind(user)
            .bind(space)
            .bind(episode.id)
            .fetch_optional(&mut *connection)
            .await?;
    if let Some(id) = existing {
        return Ok(EpisodeWrite::AlreadyWritten(id));
    }
    if episode_is_forgotten(connection, scope, episode).await? {
        return Ok(EpisodeWrite::Suppressed);
    }
    let distance = i64::from(engram_core::simhash::NEAR_DUPLICATE_DISTANCE);
    let duplicate: Option<(Uuid, i32, f64)> = sqlx::query_as(concat!(
        "SELECT id, repeat_count, importance FROM (",
        episodic_near_duplicate_lookup!(),
        ") AS d"
    ))
    .bind(user)
    .bind(space)
    .bind(episode.simhash.as_i64())
    .bind(distance)
    .fetch_optional(&mut *connection)
    .await?;
    if let Some((id, repeat_count, importance)) = duplicate {
        let repeats = u32::try_from(repeat_count + 1).unwrap_or(u32::MAX);
        let merged =
            engram_core::importance::merged_importance(importance, episode.importance, repeats);
        let record = repeat_episode(connection, scope, id, merged, episode, &audit_detail).await?;
        return Ok(EpisodeWrite::Merged(record));
    }
    let record = insert_episode(connection, scope, episode, &audit_detail, event).await?;
    Ok(EpisodeWrite::Created(record))
}

/// Whether a live tombstone blocks the episode's text.
async fn episode_is_forgotten(
    connection: &mut PgConnection,
    scope: &Scope,
    episode: &NewEpisode,
) -> Result<bool, StoreError> {
    Ok(sqlx::query_scalar(concat!(
        "SELECT EXISTS (SELECT 1 FROM tombstones t WHERE t.user_id = $1 AND t.space = $2 AND ",
        live_tombstone_matches!("$3::int8", "$4::bytea", "$5"),
        ")"
    ))
    .bind(scope.user_id.as_uuid())
    .bind(scope.space.as_str())
    .bind(episode.simhash.as_i64())
    .bind(&episode.text_digest)
    .bind(i64::from(engram_core::simhash::NEAR_DUPLICATE_DISTANCE))
    .fetch_one(connection)
    .await?)
}

/// Repeats near-duplicate episode `id` instead of writing a new one, audited as a merge.
async fn repeat_episode(
    connection: &mut PgConnection,
    scope: &Scope,
    id: Uuid,
    importance: f64,
    episode: &NewEpisode,
    audit_detail: &serde_json::Value,
) -> Result<MemoryRecord, StoreError> {
    Ok(sqlx::query_as::<_, MemoryRecord>(concat!(
        "WITH updated AS ( \
             UPDATE memories SET repeat_count = repeat_count + 1, importance = $4, updated_at = now(), \
                 inactive_since = NULL \
             WHERE user_id = $1 AND space = $2 AND id = $3 RETURNING *), \
         audited AS ( \
             INSERT INTO audit_events (user_id, space, action, memory_id, conversation_id, detail) \
             SELECT user_id, space, 'merge', id, $5, $6 FROM updated) \
         SELECT ",
        memory_columns!(),
        " FROM updated"
    ))
    .bind(scope.user_id.as_uuid())
    .bind(scope.space.as_str())
    .bind(id)
    .bind(importance)
    .bind(episode.conversation_id)
    .bind(audit_detail)
    .fetch_one(connection)
    .await?)
}

/// Inserts the episode, audited as a create and announced in the outbox when `event` is given.
async fn insert_episode(
    connection: &mut PgConnection,
    scope: &Scope,
    episode: &NewEpisode,
    audit_detail: &serde_json::Value,
    event: Option<&NewOutboxEvent>,
) -> Result<MemoryRecord, StoreError> {
    Ok(sqlx::query_as::<_, MemoryRecord>(concat!(
        "WITH inserted AS ( \
             INSERT INTO memories (id, user_id, space, kind, conversation_id, text, role, title, messages, \
                 surprise, start_at, end_at, stability, difficulty, last_reviewed_at, created_at, \
                 updated_at, simhash, tags, metadata_confidence, importance, needs_embedding, \
                 last_scores, structured_summary, surprise_pending) \
             VALUES ($3, $1, $2, 'episodic', $4, $5, 'user', $6, $7, $8, $9, $10, $11, $12, $10, now(), \
                 now(), $13, $14, $15, $16, true, $17, $18, $25) \
             RETURNING *), \
         audited AS ( \
             INSERT INTO audit_events (user_id, space, action, memory_id, conversation_id, detail) \
             SELECT user_id, space, 'create', id, conversation_id, $19 FROM inserted), \
         outboxed AS ( \
             INSERT INTO outbox_events (message_id, routing_key, type_name, payload, trace_headers) \
             SELECT $20, $21, $22, $23, $24 FROM inserted WHERE $20::uuid IS NOT NULL) \
         SELECT ",
        memory_columns!(),
        " FROM inserted"
    ))
    .bind(scope.user_id.as_uuid())
    .bind(scope.space.as_str())
    .bind(episode.id)
    .bind(episode.conversation_id)
    .bind(&episode.summary)
    .bind(&episode.title)
    .bind(&episode.messages)
    .bind(episode.surprise)
    .bind(episode.start_at)
    .bind(episode.end_at)
    .bind(episode.stability)
    .bind(episode.difficulty)
    .bind(episode.simhash.as_i64())
    .bind(&episode.tags)
    .bind(episode.metadata_confidence)
    .bind(episode.importance)
    .bind(
        serde_json::to_value(episode.last_scores)
            .map_err(|error| StoreError::Corrupt(format!("cannot encode scores: {error}")))?,
    )
    .bind(&episode.structured_summary)
    .bind(audit_detail)
    .bind(event.map(|e| e.message_id))
    .bind(event.map(|e| e.routing_key.as_str()))
    .bind(event.map(|e| e.type_name.as_str()))
    .bind(event.map(|e| e.payload.as_slice()))
    .bind(event.map(NewOutboxEvent::trace_headers_json))
    .bind(episode.surprise_pending)
    .fetch_one(connection)
    .await?)
}

/// The space's entry count and soft cap override (for the overage after a new episode).
pub async fn space_size(
    connection: &mut PgConnection,
    scope: &Scope,
) -> Result<(i64, Option<i32>), StoreError> {
    let size: Option<(i64, Option<i32>)> = sqlx::query_as(
        "SELECT memory_count, soft_cap FROM spaces WHERE user_id = $1 AND space = $2",
    )
    .bind(scope.user_id.as_uuid())
    .bind(scope.space.as_str())
    .fetch_optional(connection)
    .await?;
    Ok(size.unwrap_or((0, None)))
}

/// Measures the surprise of the episodes among `keys` that wait for it (`surprise_pending`), now
/// that their embeddings are stored in this transaction: 1 − the highest cosine to the space's
/// episodes written before it, and the initial stability from it (the initial difficulty does not
/// depend on surprise). Every earlier episode is compared exactly (an aggregate, not the
/// approximate index, whose filtered scan can miss the nearest). A review that graded the episode
/// meanwhile has cleared the mark: its state stands.
pub async fn settle_pending_surprise(
    connection: &mut PgConnection,
    keys: &[EntryKey],
) -> Result<(), StoreError> {
    let (users, ids) = key_arrays(keys.iter().copied());
    let measured: Vec<(Uuid, Uuid, Option<f64>)> = sqlx::query_as(
        "SELECT m.user_id, m.id, \
             (SELECT max(1 - (earlier.embedding <=> own.embedding))::float8 \
              FROM memory_embeddings earlier \
              JOIN memories e ON e.user_id = earlier.user_id AND e.id = earlier.memory_id \
              WHERE earlier.user_id = m.user_id AND earlier.space = m.space \
                AND earlier.kind = 'episodic' AND e.created_at < m.created_at) \
         FROM unnest($1::uuid[], $2::uuid[]) AS k(user_id, id) \
         JOIN memories m ON m.user_id = k.user_id AND m.id = k.id \
         JOIN memory_embeddings own ON own.user_id = m.user_id AND own.memory_id = m.id \
         WHERE m.surprise_pending \
         FOR UPDATE OF m",
    )
    .bind(&users)
    .bind(&ids)
    .fetch_all(&mut *connection)
    .await?;
    if measured.is_empty() {
        return Ok(());
    }
    let (keys, surprises): (Vec<(Uuid, Uuid)>, Vec<f64>) = measured
        .into_iter()
        .map(|(user, id, nearest)| ((user, id), surprise_from_similarity(nearest)))
        .unzip();
    let (users, ids): (Vec<Uuid>, Vec<Uuid>) = keys.into_iter().unzip();
    let stabilities: Vec<f64> = surprises
        .iter()
        .map(|&surprise| initial_state(surprise).0)
        .collect();
    sqlx::query(
        "UPDATE memories m SET surprise = v.surprise, stability = v.stability, \
             surprise_pending = false \
         FROM unnest($1::uuid[], $2::uuid[], $3::float8[], $4::float8[]) \
             AS v(user_id, id, surprise, stability) \
         WHERE m.user_id = v.user_id AND m.id = v.id AND m.surprise_pending",
    )
    .bind(&users)
    .bind(&ids)
    .bind(&surprises)
    .bind(&stabilities)
    .execute(&mut *connection)
    .await?;
    Ok(())
}

/// A conversation whose open segment may be due to close.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct DueConversation {
    pub user_id: Uuid,
    pub space: String,
    pub conversation_id: Uuid,
}

/// Conversations with an open segment that asked to be closed, or whose last turn arrived before
/// `idle_before`, or (with `changed_since`) that changed since then, in spaces with memory on and
/// not incognito (a segment waits while they are): what the sweep looks at.
pub async fn due_conversations(
    pool: &PgPool,
    idle_before: DateTime<Utc>,
    changed_since: Option<DateTime<Utc>>,
    limit: i64,
) -> Result<Vec<DueConversation>, StoreError> {
    let due = sqlx::query_as(
        "SELECT c.user_id, c.space, c.conversation_id FROM conversations c \
         LEFT JOIN spaces s ON s.user_id = c.user_id AND s.space = c.space \
         WHERE c.next_turn_index - 1 > c.segmented_through \
           AND (c.last_appended_at < $1 OR c.close_requested_through > c.segmented_through \
                OR ($2::timestamptz IS NOT NULL AND c.updated_at >= $2)) \
           AND COALESCE(s.memory_enabled, true) \
           AND NOT COALESCE(c.incognito, s.incognito_default, false) \
         ORDER BY c.last_appended_at LIMIT $3",
    )
    .bind(idle_before)
    .bind(changed_since)
    .bind(limit)
    .fetch_all(pool)
    .await?;
    Ok(due)
}

/// Episodes not consolidated yet, created before `before` (the consolidation sweep's catch-up).
pub async fn unconsolidated_episodes(
    pool: &PgPool,
    before: DateTime<Utc>,
    limit: i64,
) -> Result<Vec<MemoryRecord>, StoreError> {
    let episodes = sqlx::query_as(concat!(
        "SELECT ",
        memory_columns!(),
        " FROM memories WHERE kind = 'episodic' AND consolidated_at IS NULL AND created_at < $1 \
         ORDER BY created_at LIMIT $2"
    ))
    .bind(before)
    .bind(limit)
    .fetch_all(pool)
    .await?;
    Ok(episodes)
}

/// Marks an episode consolidated; whether this call did it (false: it was already).
pub async fn mark_consolidated(
    pool: &PgPool,
    scope: &Scope,
    episode: Uuid,
) -> Result<bool, StoreError> {
    let marked = sqlx::query(
        "UPDATE memories SET consolidated_at = now() \
         WHERE user_id = $1 AND space = $2 AND id = $3 AND consolidated_at IS NULL",
    )
    .bind(scope.user_id.as_uuid())
    .bind(scope.space.as_str())
    .bind(episode)
    .execute(pool)
    .await?;
    Ok(marked.rows_affected() > 0)
}

/// What [`forget_conversation`] deleted.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ForgottenConversation {
    pub turns: u64,
    /// Episodes and facts deleted, with what their tombstones keep (SimHash and text).
    pub episodes: Vec<MemoryRecord>,
    pub facts: Vec<MemoryRecord>,
    pub facts_kept: u64,
    pub pending_reviews: u64,
}

/// Deletes a conversation's turns, its episodes, the facts derived only from those episodes
/// (unless the user pinned or saved them), its pending reviews and its retrieval metrics (they
/// hold its queries); the conversation keeps only its incognito state and turn counter. Facts other sources also support, or the user kept, lose this
/// conversation's episodes and stay. `None` when the space holds no such conversation. The
/// caller writes the tombstones and the audit event in the same transaction.
pub async fn forget_conversation(
    connection: &mut PgConnection,
    scope: &Scope,
    conversation: ConversationId,
) -> Result<Option<ForgottenConversation>, StoreError> {
    let user = scope.user_id.as_uuid();
    let space = scope.space.as_str();
    let id = conversation.as_uuid();
    // The row stays, with its incognito state (forgetting an incognito conversation must not
    // make it an ordinary one) and its turn counter (indexes are never reused); nothing is open
    // or pending any more, and a later turn may be said at any time.
    let pending: Option<i32> = sqlx::query_scalar(
        "UPDATE conversations c SET segmented_through = c.next_turn_index - 1, pending_reviews = NULL, \
             turns_deleted_through = c.next_turn_index - 1, \
             close_requested_through = NULL, last_turn_at = NULL, last_appended_at = NULL, \
             updated_at = now() \
         FROM (SELECT COALESCE(jsonb_array_length(pending_reviews), 0) AS pending FROM conversations \
               WHERE user_id = $1 AND space = $2 AND conversation_id = $3 FOR UPDATE) AS before \
         WHERE c.user_id = $1 AND c.space = $2 AND c.conversation_id = $3 \
         RETURNING before.pending",
    )
    .bind(user)
    .bind(space)
    .bind(id)
    .fetch_optional(&mut *connection)
    .await?;
    let Some(pending) = pending else {
        return Ok(None);
    };
    let (turns, episodes) = delete_turns_and_episodes(connection, scope, conversation).await?;
    let (facts, facts_kept) =
        forget_derived_facts(connection, scope, conversation, &episodes).await?;
    sqlx::query(
        "DELETE FROM retrieval_metrics WHERE user_id = $1 AND space = $2 AND conversation_id = $3",
    )
    .bind(user)
    .bind(space)
    .bind(id)
    .execute(&mut *connection)
    .await?;
    Ok(Some(ForgottenConversation {
        turns,
        episodes,
        facts,
        facts_kept,
        pending_reviews: u64::try_from(pending).unwrap_or(0),
    }))
}

/// The conversation's turns, its episodes and its summarized segments, deleted: how many turns,
/// and the episodes (their tombstones keep SimHash and text).
async fn delete_turns_and_episodes(
    connection: &mut PgConnection,
    scope: &Scope,
    conversation: ConversationId,
) -> Result<(u64, Vec<MemoryRecord>), StoreError> {
    let user = scope.user_id.as_uuid();
    let space = scope.space.as_str();
    let id = conversation.as_uuid();
    let turns = sqlx::query(
        "DELETE FROM conversation_turns WHERE user_id = $1 AND space = $2 AND conversation_id = $3",
    )
    .bind(user)
    .bind(space)
    .bind(id)
    .execute(&mut *connection)
    .await?
    .rows_affected();
    let episodes: Vec<MemoryRecord> = sqlx::query_as(concat!(
        "DELETE FROM memories WHERE user_id = $1 AND space = $2 AND kind = 'episodic' \
           AND conversation_id = $3 RETURNING ",
        memory_columns!()
    ))
    .bind(user)
    .bind(space)
    .bind(id)
    .fetch_all(&mut *connection)
    .await?;
    sqlx::query(
        "DELETE FROM summarized_segments WHERE user_id = $1 AND space = $2 AND conversation_id = $3",
    )
    .bind(user)
    .bind(space)
    .bind(id)
    .execute(&mut *connection)
    .await?;
    Ok((turns, episodes))
}

/// The facts derived only from the conversation's episodes, deleted unless the user pinned or
/// saved them; the others lose those episodes as sources (and the conversation) and stay.
/// Returns the deleted facts and how many were kept.
async fn forget_derived_facts(
    connection: &mut PgConnection,
    scope: &Scope,
    conversation: ConversationId,
    episodes: &[MemoryRecord],
) -> Result<(Vec<MemoryRecord>, u64), StoreError> {
    let user = scope.user_id.as_uuid();
    let space = scope.space.as_str();
    let id = conversation.as_uuid();
    // Every episode the conversation ever had, also those retention has deleted since (their
    // creation is audited with the conversation): a fact derived only from them came from this
    // conversation and goes with it.
    let episode_ids: Vec<Uuid> = sqlx::query_scalar(
        "SELECT DISTINCT memory_id FROM audit_events \
         WHERE user_id = $1 AND space = $2 AND conversation_id = $3 \
           AND action = 'create' AND memory_id IS NOT NULL \
         UNION SELECT unnest($4::uuid[])",
    )
    .bind(user)
    .bind(space)
    .bind(id)
    .bind(
        episodes
            .iter()
            .map(|episode| episode.id)
            .collect::<Vec<_>>(),
    )
    .fetch_all(&mut *connection)
    .await?;
    let facts: Vec<MemoryRecord> = sqlx::query_as(concat!(
        "DELETE FROM memories WHERE user_id = $1 AND space = $2 AND kind = 'semantic' \
           AND source_episode_ids <> '{}' AND source_episode_ids <@ $3::uuid[] \
           AND NOT pinned AND NOT manually_saved RETURNING ",
        memory_columns!()
    ))
    .bind(user)
    .bind(space)
    .bind(&episode_ids)
    .fetch_all(&mut *connection)
    .await?;
    let facts_kept = sqlx::query(
        "UPDATE memories SET source_episode_ids = ARRAY(SELECT e FROM unnest(source_episode_ids) AS e \
                                                      WHERE e <> ALL($3::uuid[])), \
             conversation_id = CASE WHEN conversation_id = $4 THEN NULL ELSE conversation_id END, \
             updated_at = now() \
         WHERE user_id = $1 AND space = $2 AND kind = 'semantic' AND source_episode_ids && $3::uuid[]",
    )
    .bind(user)
    .bind(space)
    .bind(&episode_ids)
    .bind(id)
    .execute(&mut *connection)
    .await?
    .rows_affected();
    Ok((facts, facts_kept))
}

/// The texts of these valid facts of the space: `(id, text)`.
/// The scope's valid facts whose text holds `needle` (any case; `%` and `_` are plain
/// characters), oldest first, at most `limit`: the candidates a fact saying `needle` is over
/// may supersede (the trigram index finds them in a large space).
pub async fn valid_facts_naming(
    pool: &PgPool,
    scope: &Scope,
    needle: &str,
    limit: i64,
) -> Result<Vec<(Uuid, String)>, StoreError> {
    let pattern = crate::redaction::contains_pattern(needle);
    let texts = sqlx::query_as(
        "SELECT id, text FROM memories WHERE user_id = $1 AND space = $2 AND kind = 'semantic' \
           AND invalid_at IS NULL AND search_text ILIKE $3 ORDER BY created_at, id LIMIT $4",
    )
    .bind(scope.user_id.as_uuid())
    .bind(scope.space.as_str())
    .bind(pattern)
    .bind(limit)
    .fetch_all(pool)
    .await?;
    Ok(texts)
}

/// The valid facts of a space said after `after` (by their `valid_at`), first said first, at
/// most `limit`: the newer facts that may end a fact written after them.
pub async fn valid_facts_said_after(
    pool: &PgPool,
    scope: &Scope,
    after: DateTime<Utc>,
    limit: i64,
) -> Result<Vec<(Uuid, String)>, StoreError> {
    let texts = sqlx::query_as(
        "SELECT id, text FROM memories WHERE user_id = $1 AND space = $2 AND kind = 'semantic' \
           AND invalid_at IS NULL AND valid_at > $3 ORDER BY valid_at, id LIMIT $4",
    )
    .bind(scope.user_id.as_uuid())
    .bind(scope.space.as_str())
    .bind(after)
    .bind(limit)
    .fetch_all(pool)
    .await?;
    Ok(texts)
}

pub async fn valid_fact_texts(
    pool: &PgPool,
    scope: &Scope,
    ids: &[Uuid],
) -> Result<Vec<(Uuid, String)>, StoreError> {
    let texts = sqlx::query_as(
        "SELECT id, text FROM memories WHERE user_id = $1 AND space = $2 AND id = ANY($3::uuid[]) \
           AND kind = 'semantic' AND invalid_at IS NULL ORDER BY created_at, id",
    )
    .bind(scope.user_id.as_uuid())
    .bind(scope.space.as_str())
    .bind(ids)
    .fetch_all(pool)
    .await?;
    Ok(texts)
}
