//! The `conversations` table: per-conversation incognito state (and, later, pending reviews).

use engram_core::{ConversationId, Scope};
use sqlx::PgConnection;
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
