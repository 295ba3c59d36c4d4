//! Connecting to Postgres at start-up. One process owns migrations (ingest, or `ingest migrate`);
//! the others wait until the schema is current, so services can start in any order.

use std::time::Duration;

use anyhow::Context as _;
use secrecy::ExposeSecret as _;
use sqlx::PgPool;

use crate::settings::DatabaseSettings;

/// How often a non-owner checks whether migrations have been applied.
const SCHEMA_POLL_INTERVAL: Duration = Duration::from_secs(1);

/// Connects, then applies migrations (owner) or waits up to `schema_wait_secs` for them.
pub async fn connect(settings: &DatabaseSettings) -> anyhow::Result<PgPool> {
    let pool = engram_store::connect(
        settings.url.expose_secret(),
        settings.min_connections,
        settings.max_connections,
        Duration::from_secs(settings.connect_timeout_secs),
        settings.synchronous_commit.as_str(),
    )
    .await
    .context("cannot connect to postgres (ENGRAM_DATABASE__URL)")?;

    if settings.run_migrations {
        engram_store::migrate(&pool)
            .await
            .context("cannot apply database migrations")?;
        tracing::info!("database schema is current");
        return Ok(pool);
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(settings.schema_wait_secs);
    loop {
        if engram_store::schema_is_current(&pool).await? {
            return Ok(pool);
        }
        if tokio::time::Instant::now() >= deadline {
            anyhow::bail!(
                "the database schema is behind this binary after waiting {}s; run `ingest migrate`",
                settings.schema_wait_secs
            );
        }
        tracing::info!("waiting for the ingest service to apply database migrations");
        tokio::time::sleep(SCHEMA_POLL_INTERVAL).await;
    }
}
