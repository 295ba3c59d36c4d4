//! The statements that cut a forgotten fact out of its copies (issue 39 part 6): the episodes it
//! was consolidated from or whose conversation said it (summary, excerpt, structured summary,
//! tags), and the stored turns that said it. Each runs in the Forget's transaction; what to cut
//! is decided by `engram_core::redact`, not here.
//!
//! Stored turns are immutable (a trigger refuses every UPDATE) except for this: a redaction sets
//! `engram.redacting` for its own statement and may then rewrite a turn's content, never its
//! place, speaker or time (migration 24).

use sqlx::PgConnection;
use uuid::Uuid;

use crate::StoreError;

/// An episode as a redaction reads and rewrites it.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct EpisodeCopy {
    pub id: Uuid,
    pub conversation_id: Option<Uuid>,
    pub title: Option<String>,
    pub text: String,
    pub messages: Option<serde_json::Value>,
    pub structured_summary: Option<serde_json::Value>,
    pub tags: Vec<String>,
}

/// A stored turn as a redaction reads it.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct TurnCopy {
    pub conversation_id: Uuid,
    pub turn_index: i32,
    pub content: String,
}

/// `%needle%` for ILIKE, with `%`, `_` and `\` taken as themselves.
pub(crate) fn contains_pattern(needle: &str) -> String {
    format!(
        "%{}%",
        needle
            .replace('\\', "\\\\")
            .replace('%', "\\%")
            .replace('_', "\\_")
    )
}

/// The episodes of the space that may hold a forgotten fact: those listed in `episodes` (it was
/// consolidated from them) and those of `conversation` (it was said there), locked for the
/// rewrite.
pub async fn episodes_holding(
    connection: &mut PgConnection,
    user_id: Uuid,
    space: &str,
    episodes: &[Uuid],
    conversation: Option<Uuid>,
) -> Result<Vec<EpisodeCopy>, StoreError> {
    let copies = sqlx::query_as(
        "SELECT id, conversation_id, title, text, messages, structured_summary, tags \
         FROM memories \
         WHERE user_id = $1 AND space = $2 AND kind = 'episodic' \
           AND (id = ANY($3::uuid[]) OR ($4::uuid IS NOT NULL AND conversation_id = $4)) \
         ORDER BY id FOR UPDATE",
    )
    .bind(user_id)
    .bind(space)
    .bind(episodes)
    .bind(conversation)
    .fetch_all(&mut *connection)
    .await?;
    Ok(copies)
}

/// Rewrites an episode without the forgotten sentences; it is embedded again (its vector was
/// computed from the old text).
pub async fn rewrite_episode(
    connection: &mut PgConnection,
    user_id: Uuid,
    space: &str,
    episode: &EpisodeCopy,
) -> Result<(), StoreError> {
    sqlx::query(
        "UPDATE memories SET title = $4, text = $5, messages = $6, structured_summary = $7, \
             tags = $8, needs_embedding = true, embedding_failures = 0, updated_at = now() \
         WHERE user_id = $1 AND space = $2 AND id = $3",
    )
    .bind(user_id)
    .bind(space)
    .bind(episode.id)
    .bind(&episode.title)
    .bind(&episode.text)
    .bind(&episode.messages)
    .bind(&episode.structured_summary)
    .bind(&episode.tags)
    .execute(&mut *connection)
    .await?;
    Ok(())
}

/// The stored turns of `conversations` whose content holds any of `needles` (any case).
pub async fn turns_naming(
    connection: &mut PgConnection,
    user_id: Uuid,
    space: &str,
    conversations: &[Uuid],
    needles: &[String],
) -> Result<Vec<TurnCopy>, StoreError> {
    if conversations.is_empty() || needles.is_empty() {
        return Ok(Vec::new());
    }
    let patterns: Vec<String> = needles.iter().map(|n| contains_pattern(n)).collect();
    let turns = sqlx::query_as(
        "SELECT conversation_id, turn_index, content FROM conversation_turns \
         WHERE user_id = $1 AND space = $2 AND conversation_id = ANY($3::uuid[]) \
           AND content ILIKE ANY($4::text[]) \
         ORDER BY conversation_id, turn_index",
    )
    .bind(user_id)
    .bind(space)
    .bind(conversations)
    .bind(&patterns)
    .fetch_all(&mut *connection)
    .await?;
    Ok(turns)
}

/// Rewrites turns' content (each given with its new content) and drops their vectors, which
/// were computed from the old words.
pub async fn redact_turns(
    connection: &mut PgConnection,
    user_id: Uuid,
    space: &str,
    turns: &[TurnCopy],
) -> Result<(), StoreError> {
    if turns.is_empty() {
        return Ok(());
    }
    let conversations: Vec<Uuid> = turns.iter().map(|t| t.conversation_id).collect();
    let indexes: Vec<i32> = turns.iter().map(|t| t.turn_index).collect();
    let contents: Vec<&str> = turns.iter().map(|t| t.content.as_str()).collect();
    sqlx::query("SELECT set_config('engram.redacting', 'on', true)")
        .execute(&mut *connection)
        .await?;
    sqlx::query(
        "UPDATE conversation_turns t SET content = r.content \
         FROM unnest($3::uuid[], $4::int[], $5::text[]) AS r(conversation_id, turn_index, content) \
         WHERE t.user_id = $1 AND t.space = $2 AND t.conversation_id = r.conversation_id \
           AND t.turn_index = r.turn_index",
    )
    .bind(user_id)
    .bind(space)
    .bind(&conversations)
    .bind(&indexes)
    .bind(&contents)
    .execute(&mut *connection)
    .await?;
    sqlx::query("SELECT set_config('engram.redacting', 'off', true)")
        .execute(&mut *connection)
        .await?;
    sqlx::query(
        "DELETE FROM conversation_turn_embeddings e \
         USING unnest($3::uuid[], $4::int[]) AS r(conversation_id, turn_index) \
         WHERE e.user_id = $1 AND e.space = $2 AND e.conversation_id = r.conversation_id \
           AND e.turn_index = r.turn_index",
    )
    .bind(user_id)
    .bind(space)
    .bind(&conversations)
    .bind(&indexes)
    .execute(&mut *connection)
    .await?;
    Ok(())
}
