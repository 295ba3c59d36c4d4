//! The `conversations` table: per-conversation incognito state (and, later, pending reviews).

use engram_core::{ConversationId, Scope};
use sqlx::PgConnection;

use crate::StoreError;

pub async fn set_incognito(
    connection: &mut PgConnection,
    scope: &Scope,
    conversation: ConversationId,
    incognito: bool,
) -> Result<(), StoreError> {
    sqlx::query(
        "INSERT INTO conversations (user_id, space, conversation_id, incognito) VALUES ($1, $2, $3, $4) \
         ON CONFLICT (user_id, space, conversation_id) DO UPDATE SET incognito = $4, updated_at = now()",
    )
    .bind(scope.user_id.as_uuid())
    .bind(scope.space.as_str())
    .bind(conversation.as_uuid())
    .bind(incognito)
    .execute(connection)
    .await?;
    Ok(())
}
