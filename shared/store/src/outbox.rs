//! The transactional outbox: events written with the work they describe, published by a relay.

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use sqlx::{PgConnection, PgPool};
use uuid::Uuid;

use crate::StoreError;

/// An event to write to the outbox.
#[derive(Debug, Clone, PartialEq)]
pub struct NewOutboxEvent {
    pub message_id: Uuid,
    pub routing_key: String,
    pub type_name: String,
    pub payload: Vec<u8>,
    pub trace_headers: HashMap<String, String>,
}

impl NewOutboxEvent {
    pub(crate) fn trace_headers_json(&self) -> serde_json::Value {
        serde_json::to_value(&self.trace_headers).unwrap_or_default()
    }
}

/// An event waiting to be published.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct PendingOutboxEvent {
    pub id: i64,
    pub message_id: Uuid,
    pub routing_key: String,
    pub type_name: String,
    pub payload: Vec<u8>,
    pub trace_headers: serde_json::Value,
    pub created_at: DateTime<Utc>,
}

impl PendingOutboxEvent {
    pub fn trace_headers(&self) -> HashMap<String, String> {
        serde_json::from_value(self.trace_headers.clone()).unwrap_or_default()
    }
}

/// Locks up to `limit` unpublished events, oldest first, for this transaction (other relays skip
/// them).
pub async fn lock_unpublished(
    connection: &mut PgConnection,
    limit: i64,
) -> Result<Vec<PendingOutboxEvent>, StoreError> {
    let events = sqlx::query_as::<_, PendingOutboxEvent>(
        "SELECT id, message_id, routing_key, type_name, payload, trace_headers, created_at FROM outbox_events \
         WHERE published_at IS NULL ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED",
    )
    .bind(limit)
    .fetch_all(connection)
    .await?;
    Ok(events)
}

pub async fn mark_published(connection: &mut PgConnection, ids: &[i64]) -> Result<(), StoreError> {
    sqlx::query("UPDATE outbox_events SET published_at = now(), publish_attempts = publish_attempts + 1 WHERE id = ANY($1)")
        .bind(ids)
        .execute(connection)
        .await?;
    Ok(())
}

pub async fn record_publish_failure(pool: &PgPool, id: i64, error: &str) -> Result<(), StoreError> {
    sqlx::query("UPDATE outbox_events SET publish_attempts = publish_attempts + 1, last_error = $2 WHERE id = $1")
        .bind(id)
        .bind(error)
        .execute(pool)
        .await?;
    Ok(())
}

/// Unpublished events and the age of the oldest, for metrics.
pub async fn backlog(pool: &PgPool) -> Result<(i64, Option<DateTime<Utc>>), StoreError> {
    let row: (i64, Option<DateTime<Utc>>) = sqlx::query_as(
        "SELECT count(*), min(created_at) FROM outbox_events WHERE published_at IS NULL",
    )
    .fetch_one(pool)
    .await?;
    Ok(row)
}

/// Deletes events published longer ago than `keep_secs`.
pub async fn purge_published(pool: &PgPool, keep_secs: f64) -> Result<u64, StoreError> {
    let result = sqlx::query(
        "DELETE FROM outbox_events WHERE published_at < now() - make_interval(secs => $1)",
    )
    .bind(keep_secs)
    .execute(pool)
    .await?;
    Ok(result.rows_affected())
}

/// Stores one event in the outbox, in the caller's transaction (the relay publishes it once the
/// transaction commits).
pub async fn insert(
    connection: &mut PgConnection,
    event: &NewOutboxEvent,
) -> Result<(), StoreError> {
    sqlx::query(
        "INSERT INTO outbox_events (message_id, routing_key, type_name, payload, trace_headers) \
         VALUES ($1, $2, $3, $4, $5)",
    )
    .bind(event.message_id)
    .bind(&event.routing_key)
    .bind(&event.type_name)
    .bind(&event.payload)
    .bind(event.trace_headers_json())
    .execute(connection)
    .await?;
    Ok(())
}
