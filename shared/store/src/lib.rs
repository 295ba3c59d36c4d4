//! Engram's Postgres store, the source of truth: the migrations and every query the services run.
//!
//! Functions that are part of a larger transaction take `&mut PgConnection` (pass
//! `&mut *transaction`); read-only queries take the pool. Every query is scoped by
//! `(user_id, space)`: no function reads or writes a row of another tenant, whatever id it is
//! given.

#![forbid(unsafe_code)]

pub mod audit;
pub mod conversations;
pub mod embeddings;
pub mod error;
#[macro_use]
pub mod memories;
pub mod outbox;
#[macro_use]
pub mod retention;
pub mod retrieval;
pub mod reviews;
pub mod spaces;
pub mod summary;
#[macro_use]
pub mod tombstones;
pub mod segments;
pub mod transfer;
pub mod write_path;

use std::time::Duration;

use sqlx::PgPool;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

pub use error::StoreError;

/// The migrations in `migrations/`, embedded in every binary.
pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("../../migrations");

/// A pooled connection idle for longer than this is pinged before it is handed out.
const PING_AFTER_IDLE: Duration = Duration::from_secs(1);

/// Opens a connection pool.
pub async fn connect(
    url: &str,
    max_connections: u32,
    connect_timeout: Duration,
    synchronous_commit: &str,
) -> Result<PgPool, StoreError> {
    let options: PgConnectOptions = url.parse().map_err(StoreError::Database)?;
    let options = options
        .application_name("engram")
        .options([("synchronous_commit", synchronous_commit)]);
    pool_options(max_connections, connect_timeout)
        .connect_with(options)
        .await
        .map_err(StoreError::Database)
}

/// A pool of its own, of at most `max_connections`, to the database of `pool`; connections are
/// opened as they are first needed. For work that should always run on the same few server
/// processes, whose caches then stay warm, and never queue behind the rest of the service.
pub fn pool_beside(pool: &PgPool, max_connections: u32) -> PgPool {
    pool_options(max_connections, pool.options().get_acquire_timeout())
        .connect_lazy_with((*pool.connect_options()).clone())
}

fn pool_options(max_connections: u32, acquire_timeout: Duration) -> PgPoolOptions {
    PgPoolOptions::new()
        .max_connections(max_connections)
        .acquire_timeout(acquire_timeout)
        // sqlx pings every connection it hands out by default: a whole extra round trip on the
        // critical path of every transaction (every group commit of the write path paid it).
        // sqlx also pings each connection as it comes back, off that path, and drops it if the
        // ping fails; so a connection used moments ago is alive as far as a ping can tell. One
        // that sat idle is still checked, and replaced if the server went away. After a server
        // restart, a connection used within the last second fails its next transaction once.
        .test_before_acquire(false)
        .before_acquire(|connection, meta| {
            Box::pin(async move {
                if meta.idle_for > PING_AFTER_IDLE {
                    sqlx::Connection::ping(connection).await?;
                }
                Ok(true)
            })
        })
}

/// Applies pending migrations (the one migration owner calls this). Concurrent callers are safe:
/// sqlx takes an advisory lock.
pub async fn migrate(pool: &PgPool) -> Result<(), StoreError> {
    MIGRATOR.run(pool).await.map_err(StoreError::Migration)
}

/// Whether every embedded migration has been applied (services that do not own migrations wait
/// for this before they report ready).
pub async fn schema_is_current(pool: &PgPool) -> Result<bool, StoreError> {
    let table_exists: bool =
        sqlx::query_scalar("SELECT to_regclass('_sqlx_migrations') IS NOT NULL")
            .fetch_one(pool)
            .await?;
    if !table_exists {
        return Ok(false);
    }
    let applied: Vec<i64> =
        sqlx::query_scalar("SELECT version FROM _sqlx_migrations WHERE success")
            .fetch_all(pool)
            .await?;
    Ok(MIGRATOR
        .iter()
        .all(|migration| applied.contains(&migration.version)))
}

/// Begins a transaction that holds the write locks of some (user, space) pairs until it ends, in
/// one round trip. Near-duplicate detection and the capacity policy read a space and then write
/// it; without the lock, two concurrent writes of the same text could both miss each other and
/// create two rows.
///
/// Keys are taken in ascending order, so two transactions locking overlapping sets wait for each
/// other instead of deadlocking (a transaction holding one space's lock never asks for another).
/// The `BEGIN` goes out as one simple query with the lock statement (the keys are integers written
/// by us, so the statement text needs no parameters).
///
/// The same round trip also switches the transaction to generic plans. Every statement of a write
/// is keyed by its spaces, so a plan made for the parameters would be the same plan, yet Postgres
/// kept re-planning them on each execution (custom plans), which cost about a tenth of a write's
/// CPU in the ingest benchmark.
pub async fn begin_with_spaces_locked<'a>(
    pool: &PgPool,
    scopes: impl IntoIterator<Item = &'a engram_core::Scope>,
) -> Result<sqlx::Transaction<'static, sqlx::Postgres>, StoreError> {
    use std::fmt::Write as _;
    let keys = space_lock_keys(scopes);
    let mut statement = String::from(
        "BEGIN; SET LOCAL plan_cache_mode = force_generic_plan; \
         SELECT pg_advisory_xact_lock(key) FROM unnest('{",
    );
    for (at, key) in keys.iter().enumerate() {
        let separator = if at == 0 { "" } else { "," };
        let _ = write!(statement, "{separator}{key}");
    }
    statement.push_str("}'::int8[]) AS key");
    Ok(pool.begin_with(sqlx::AssertSqlSafe(statement)).await?)
}

/// The lock keys of some spaces, each once, in ascending order.
fn space_lock_keys<'a>(scopes: impl IntoIterator<Item = &'a engram_core::Scope>) -> Vec<i64> {
    let mut keys: Vec<i64> = scopes.into_iter().map(space_lock_key).collect();
    keys.sort_unstable();
    keys.dedup();
    keys
}

/// A stable 64-bit key for the advisory lock of one (user, space).
fn space_lock_key(scope: &engram_core::Scope) -> i64 {
    let mut key = scope.user_id.as_uuid().as_bytes().to_vec();
    key.extend_from_slice(scope.space.as_str().as_bytes());
    xxhash_rust::xxh3::xxh3_64(&key) as i64
}
