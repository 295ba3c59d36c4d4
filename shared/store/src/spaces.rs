//! The `spaces` table: per-space settings and the entry count maintained by triggers.

use chrono::{DateTime, Utc};
use engram_core::Scope;
use sqlx::PgConnection;

use crate::StoreError;

/// A space's settings; a space never written to has the defaults.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct SpaceRecord {
    pub memory_enabled: bool,
    pub incognito_default: bool,
    pub soft_cap: Option<i32>,
    pub memory_count: i64,
    pub updated_at: Option<DateTime<Utc>>,
}

impl Default for SpaceRecord {
    fn default() -> Self {
        Self {
            memory_enabled: true,
            incognito_default: false,
            soft_cap: None,
            memory_count: 0,
            updated_at: None,
        }
    }
}

/// A space's settings row (one statement, read with or without a row lock).
macro_rules! select_space {
    () => {
        "SELECT memory_enabled, incognito_default, soft_cap, memory_count, updated_at \
         FROM spaces WHERE user_id = $1 AND space = $2"
    };
}

pub async fn get(connection: &mut PgConnection, scope: &Scope) -> Result<SpaceRecord, StoreError> {
    read(connection, scope, select_space!()).await
}

/// [`get`], holding the space's row (when it has one) until the transaction ends, so that a
/// settings change waits for what was decided on the settings read.
pub async fn get_for_share(
    connection: &mut PgConnection,
    scope: &Scope,
) -> Result<SpaceRecord, StoreError> {
    read(connection, scope, concat!(select_space!(), " FOR SHARE")).await
}

async fn read(
    connection: &mut PgConnection,
    scope: &Scope,
    sql: &'static str,
) -> Result<SpaceRecord, StoreError> {
    let record = sqlx::query_as::<_, SpaceRecord>(sql)
        .bind(scope.user_id.as_uuid())
        .bind(scope.space.as_str())
        .fetch_optional(connection)
        .await?;
    Ok(record.unwrap_or_default())
}

/// A settings change; `None` keeps the stored value. `soft_cap: Some(None)` clears the override.
#[derive(Debug, Clone, Default)]
pub struct SettingsPatch {
    pub memory_enabled: Option<bool>,
    pub incognito_default: Option<bool>,
    pub soft_cap: Option<Option<i32>>,
}

pub async fn update(
    connection: &mut PgConnection,
    scope: &Scope,
    patch: &SettingsPatch,
) -> Result<SpaceRecord, StoreError> {
    let (set_soft_cap, soft_cap) = match patch.soft_cap {
        Some(value) => (true, value),
        None => (false, None),
    };
    let record = sqlx::query_as::<_, SpaceRecord>(
        "INSERT INTO spaces (user_id, space, memory_enabled, incognito_default, soft_cap) \
         VALUES ($1, $2, COALESCE($3, true), COALESCE($4, false), CASE WHEN $5 THEN $6 ELSE NULL END) \
         ON CONFLICT (user_id, space) DO UPDATE SET \
             memory_enabled = COALESCE($3, spaces.memory_enabled), \
             incognito_default = COALESCE($4, spaces.incognito_default), \
             soft_cap = CASE WHEN $5 THEN $6 ELSE spaces.soft_cap END, \
             updated_at = now() \
         RETURNING memory_enabled, incognito_default, soft_cap, memory_count, updated_at",
    )
    .bind(scope.user_id.as_uuid())
    .bind(scope.space.as_str())
    .bind(patch.memory_enabled)
    .bind(patch.incognito_default)
    .bind(set_soft_cap)
    .bind(soft_cap)
    .fetch_one(connection)
    .await?;
    Ok(record)
}
