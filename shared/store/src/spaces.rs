//! The `spaces` table: per-space settings and the entry count maintained by triggers.

use chrono::{DateTime, Utc};
use engram_core::Scope;
use engram_core::retention::RetentionOverrides;
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
    /// Retention rules in days (0: off); `None` follows the service default.
    pub turn_retention_days: Option<i32>,
    pub max_age_days: Option<i32>,
    pub inactive_after_days: Option<i32>,
    pub inactive_grace_days: Option<i32>,
}

impl SpaceRecord {
    /// The space's own retention values (the rest follow the service defaults).
    pub fn retention_overrides(&self) -> RetentionOverrides {
        stored_retention([
            self.turn_retention_days,
            self.max_age_days,
            self.inactive_after_days,
            self.inactive_grace_days,
        ])
    }
}

/// A space's retention columns (turns, max age, inactive after, grace; NULL: the default) as
/// its own rules.
pub(crate) fn stored_retention(columns: [Option<i32>; 4]) -> RetentionOverrides {
    let [turn, max_age, inactive_after, grace] =
        columns.map(|value| value.and_then(|days| u32::try_from(days).ok()));
    RetentionOverrides {
        turn_days: turn,
        max_age_days: max_age,
        inactive_after_days: inactive_after,
        inactive_grace_days: grace,
    }
}

impl Default for SpaceRecord {
    fn default() -> Self {
        Self {
            memory_enabled: true,
            incognito_default: false,
            soft_cap: None,
            memory_count: 0,
            updated_at: None,
            turn_retention_days: None,
            max_age_days: None,
            inactive_after_days: None,
            inactive_grace_days: None,
        }
    }
}

/// The columns of [`SpaceRecord`].
macro_rules! space_columns {
    () => {
        "memory_enabled, incognito_default, soft_cap, memory_count, updated_at, \
         turn_retention_days, max_age_days, inactive_after_days, inactive_grace_days"
    };
}

/// A space's settings row (one statement, read with or without a row lock).
macro_rules! select_space {
    () => {
        concat!(
            "SELECT ",
            space_columns!(),
            " FROM spaces WHERE user_id = $1 AND space = $2"
        )
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
    /// Retention values to set (days, 0: off).
    pub retention: RetentionOverrides,
    /// Clears the space's retention values first, so the service defaults apply again (except
    /// where `retention` sets one).
    pub reset_retention: bool,
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
    let days = |value: Option<u32>| value.map(|days| days.min(i32::MAX as u32) as i32);
    let retention = &patch.retention;
    let record = sqlx::query_as::<_, SpaceRecord>(concat!(
        "INSERT INTO spaces (user_id, space, memory_enabled, incognito_default, soft_cap, \
             turn_retention_days, max_age_days, inactive_after_days, inactive_grace_days) \
         VALUES ($1, $2, COALESCE($3, true), COALESCE($4, false), CASE WHEN $5 THEN $6 ELSE NULL END, \
             $8, $9, $10, $11) \
         ON CONFLICT (user_id, space) DO UPDATE SET \
             memory_enabled = COALESCE($3, spaces.memory_enabled), \
             incognito_default = COALESCE($4, spaces.incognito_default), \
             soft_cap = CASE WHEN $5 THEN $6 ELSE spaces.soft_cap END, \
             turn_retention_days = COALESCE($8, CASE WHEN $7 THEN NULL ELSE spaces.turn_retention_days END), \
             max_age_days = COALESCE($9, CASE WHEN $7 THEN NULL ELSE spaces.max_age_days END), \
             inactive_after_days = COALESCE($10, CASE WHEN $7 THEN NULL ELSE spaces.inactive_after_days END), \
             inactive_grace_days = COALESCE($11, CASE WHEN $7 THEN NULL ELSE spaces.inactive_grace_days END), \
             updated_at = now() \
         RETURNING ",
        space_columns!()
    ))
    .bind(scope.user_id.as_uuid())
    .bind(scope.space.as_str())
    .bind(patch.memory_enabled)
    .bind(patch.incognito_default)
    .bind(set_soft_cap)
    .bind(soft_cap)
    .bind(patch.reset_retention)
    .bind(days(retention.turn_days))
    .bind(days(retention.max_age_days))
    .bind(days(retention.inactive_after_days))
    .bind(days(retention.inactive_grace_days))
    .fetch_one(connection)
    .await?;
    Ok(record)
}
