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
pub mod redaction;
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
pub mod turn_search;
pub mod write_path;

use std::time::Duration;

use sqlx::PgPool;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use tracing::Instrument as _;

pub use error::StoreError;

/// The migrations in `migrations/`, embedded in every binary.
pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("../../migrations");

/// A pooled connection idle for longer than this is pinged before it is handed out.
const PING_AFTER_IDLE: Duration = Duration::from_secs(1);

/// Opens a connection pool, with `min_connections` of its connections open before it returns
/// and kept open from then on (see `DatabaseSettings::min_connections`).
pub async fn connect(
    url: &str,
    min_connections: u32,
    max_connections: u32,
    connect_timeout: Duration,
    synchronous_commit: &str,
) -> Result<PgPool, StoreError> {
    let options: PgConnectOptions = url.parse().map_err(StoreError::Database)?;
    let options = options
        .application_name("engram")
        .options([("synchronous_commit", synchronous_commit)]);
    pool_options(max_connections, connect_timeout)
        .min_connections(min_connections.min(max_connections))
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

/// A pool of its own, as large as `pool` and with as many connections open from the start, to
/// the same database, whose sessions cannot write (`default_transaction_read_only`): for the
/// statements a read runs, such as a retrieval's searches.
///
/// Its connections come back without the round trip that checks every other pool's for a
/// transaction block left open ([`is_inside_transaction_block`]; four of them a retrieval, a
/// twentieth of the service's time at saturation). What that check guards against cannot happen
/// here: an open block's harm is the writes that run inside it and are then lost with it, and no
/// statement on these connections writes (an attempt fails). A block left open here would only
/// hold its read locks; the server ends a session idle in one after
/// [`READ_ONLY_IDLE_IN_TRANSACTION`].
pub async fn read_only_pool_beside(pool: &PgPool) -> Result<PgPool, StoreError> {
    let options = (*pool.connect_options()).clone().options([
        ("default_transaction_read_only", "on"),
        (
            "idle_in_transaction_session_timeout",
            READ_ONLY_IDLE_IN_TRANSACTION,
        ),
    ]);
    let sizes = pool.options();
    base_pool_options(sizes.get_max_connections(), sizes.get_acquire_timeout())
        .min_connections(sizes.get_min_connections())
        .connect_with(options)
        .await
        .map_err(StoreError::Database)
}

/// How long a read-only session may sit idle inside a transaction block before the server ends
/// it (see [`read_only_pool_beside`]); no read holds a block open for anywhere near as long.
const READ_ONLY_IDLE_IN_TRANSACTION: &str = "60s";

fn pool_options(max_connections: u32, acquire_timeout: Duration) -> PgPoolOptions {
    base_pool_options(max_connections, acquire_timeout).after_release(|connection, _meta| {
        Box::pin(async move { Ok(!is_inside_transaction_block(connection).await?) })
    })
}

fn base_pool_options(max_connections: u32, acquire_timeout: Duration) -> PgPoolOptions {
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

/// Whether a connection coming back to the pool is still inside a transaction block; such a
/// connection is closed (the server then rolls the block back), never handed to the next user.
///
/// sqlx cannot always tell by itself: a `BEGIN` whose caller was cancelled while it was in
/// flight (a request past its deadline) is counted nowhere, so nothing rolls it back, and the
/// next request's autocommit statements would run inside it, answered as stored but committed or
/// rolled back by whoever used the connection after (issue 37: acknowledged turns lost). Every
/// transaction goes through [`begin`] or [`begin_with_spaces_locked`], which cannot be cancelled
/// half-way; this check on release is the net under every other way a connection could be left
/// inside a block (a cancelled `COMMIT`, a block left aborted by a failed statement).
///
/// Inside a block, the transaction began with an earlier statement, so its timestamp is older
/// than this statement's (a whole round trip older: this statement is only sent once the
/// connection has answered everything before it). Outside one, the statement is its own
/// transaction and both timestamps are the time its message arrived: this holds for a simple
/// query (one message), not for a prepared one, whose Execute message arrives after the Bind that
/// started its transaction, hence `raw_sql`. A block in the aborted state fails the query, and
/// sqlx then closes the connection too.
async fn is_inside_transaction_block(
    connection: &mut sqlx::PgConnection,
) -> Result<bool, sqlx::Error> {
    use sqlx::Row as _;
    let inside: bool = sqlx::raw_sql(
        "SELECT pg_catalog.transaction_timestamp() < pg_catalog.statement_timestamp()",
    )
    .fetch_one(connection)
    .await?
    .try_get(0)?;
    if inside {
        tracing::warn!(
            "a connection came back to the pool inside a transaction block; closing it so that \
             the block is rolled back"
        );
    }
    Ok(inside)
}

/// Begins a transaction. Use it (or [`begin_with_spaces_locked`]) instead of `Pool::begin`,
/// which a cancelled caller can leave half-begun (see [`is_inside_transaction_block`]): the
/// `BEGIN` runs on a task of its own, so it ends either in a transaction handed to the caller or,
/// when the caller is gone, in one that is dropped, and so rolled back, on the spot (its locks
/// taken and let go: nothing is written), keeping its connection for the next request rather than
/// closing it.
pub async fn begin(
    pool: &PgPool,
) -> Result<sqlx::Transaction<'static, sqlx::Postgres>, StoreError> {
    begin_detached(pool, None).await
}

async fn begin_detached(
    pool: &PgPool,
    statement: Option<String>,
) -> Result<sqlx::Transaction<'static, sqlx::Postgres>, StoreError> {
    let pool = pool.clone();
    #[expect(
        clippy::disallowed_methods,
        reason = "the one place that begins transactions, on a task no caller can cancel"
    )]
    let begun = tokio::spawn(
        async move {
            match statement {
                Some(statement) => pool.begin_with(sqlx::AssertSqlSafe(statement)).await,
                None => pool.begin().await,
            }
        }
        .in_current_span(),
    );
    match begun.await {
        Ok(transaction) => Ok(transaction?),
        Err(error) if error.is_panic() => std::panic::resume_unwind(error.into_panic()),
        // The runtime is shutting down.
        Err(_) => Err(StoreError::Database(sqlx::Error::PoolClosed)),
    }
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

/// Commits a transaction that only writes what Engram derives from data already stored durably
/// (an entry's embedding, a conversation's episodes), without waiting for the WAL flush.
///
/// Safe because the derivation and the mark that it is done commit together: an embedding with
/// its entry's `needs_embedding` cleared, an episode with its conversation's `segmented_through`.
/// A Postgres crash within a few milliseconds of the commit undoes both, and the work is done
/// again (the backfill and segmentation sweeps find it), to the same result. What it buys: the
/// flushes are left to the requests whose answers promise durability (a Remember, an append),
/// which otherwise wait behind the background's (the conversations benchmark, where segmentation
/// and the embedding backfill commit about 70 times a second beside 200 appends).
pub async fn commit_derived(
    mut transaction: sqlx::Transaction<'static, sqlx::Postgres>,
) -> Result<(), StoreError> {
    sqlx::query("SET LOCAL synchronous_commit = off")
        .execute(&mut *transaction)
        .await?;
    transaction.commit().await?;
    Ok(())
}

/// What a transaction does to the spaces it locks, which decides the locks it takes.
///
/// Every (user, space) has two transaction-scoped advisory locks:
/// - the **privacy** lock guards what may be stored at all: memory on or off, incognito, and a
///   conversation being forgotten. Whatever stores something takes it shared, so it sees the
///   switches as they are; whatever changes them takes it exclusively.
/// - the **content** lock guards the entries: near-duplicate detection and the capacity policy
///   read a space and then write it, so without it two concurrent writes of the same text could
///   both miss each other and create two rows.
///
/// Appending turns needs only the first, shared, and takes it inside its one statement
/// (`conversations::append_turns`): a conversation's own row lock orders its turns, and turns are
/// never compared with entries. So an append does not wait for a segmentation or a Remember that
/// is writing entries of the same space (it used to: one exclusive lock per space put a user's
/// appends behind every episode written for them, the longest waits in the conversations
/// benchmark).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpaceAccess {
    /// Writing or deleting entries (Remember, import, pin, forget an entry, segmentation): the
    /// privacy lock shared and the content lock exclusive.
    WriteEntries,
    /// Changing what may be stored, or deleting turns (settings, incognito, forgetting a
    /// conversation, retention): both locks exclusive.
    Exclusive,
}

/// Begins a transaction that holds the locks `access` needs on some (user, space) pairs until it
/// ends, in one round trip (see [`SpaceAccess`]).
///
/// Locks are taken in one global order, every privacy lock (ascending keys) before every content
/// lock (ascending keys), so two transactions locking overlapping sets wait for each other
/// instead of deadlocking (a transaction holding a space's locks never asks for more).
/// The `BEGIN` goes out as one simple query with the lock statements (the keys are integers
/// written by us, so the statement text needs no parameters).
///
/// The same round trip also switches the transaction to generic plans. Every statement of a write
/// is keyed by its spaces, so a plan made for the parameters would be the same plan, yet Postgres
/// kept re-planning them on each execution (custom plans), which cost about a tenth of a write's
/// CPU in the ingest benchmark.
pub async fn begin_with_spaces_locked<'a>(
    pool: &PgPool,
    access: SpaceAccess,
    scopes: impl IntoIterator<Item = &'a engram_core::Scope>,
) -> Result<sqlx::Transaction<'static, sqlx::Postgres>, StoreError> {
    let statement = space_lock_statement(access, scopes);
    begin_detached(pool, Some(statement)).await
}

/// The `BEGIN` and lock statements of [`begin_with_spaces_locked`].
fn space_lock_statement<'a>(
    access: SpaceAccess,
    scopes: impl IntoIterator<Item = &'a engram_core::Scope>,
) -> String {
    use std::fmt::Write as _;
    let scopes: Vec<&engram_core::Scope> = scopes.into_iter().collect();
    // Every transaction that locks spaces here holds their content locks exclusively; what
    // differs is whether it changes what may be stored (the privacy lock, exclusively) or only
    // stores (shared).
    let privacy = match access {
        SpaceAccess::WriteEntries => "pg_advisory_xact_lock_shared",
        SpaceAccess::Exclusive => "pg_advisory_xact_lock",
    };
    let mut statement = String::from("BEGIN; SET LOCAL plan_cache_mode = force_generic_plan");
    let mut lock = |function: &str, keys: Vec<i64>| {
        let keys: Vec<String> = keys.iter().map(i64::to_string).collect();
        let _ = write!(
            statement,
            "; SELECT {function}(key) FROM unnest('{{{}}}'::int8[]) AS key",
            keys.join(",")
        );
    };
    lock(privacy, space_lock_keys(&scopes, LockKind::Privacy));
    lock(
        "pg_advisory_xact_lock",
        space_lock_keys(&scopes, LockKind::Content),
    );
    statement
}

/// Which of a space's two locks a key names.
#[derive(Debug, Clone, Copy)]
pub(crate) enum LockKind {
    Privacy,
    Content,
}

/// The keys of one kind of lock of some spaces, each once, in ascending order.
fn space_lock_keys(scopes: &[&engram_core::Scope], kind: LockKind) -> Vec<i64> {
    let mut keys: Vec<i64> = scopes
        .iter()
        .map(|scope| space_lock_key(scope, kind))
        .collect();
    keys.sort_unstable();
    keys.dedup();
    keys
}

/// A stable 64-bit key for one lock of one (user, space).
pub(crate) fn space_lock_key(scope: &engram_core::Scope, kind: LockKind) -> i64 {
    let mut key = scope.user_id.as_uuid().as_bytes().to_vec();
    key.extend_from_slice(scope.space.as_str().as_bytes());
    if let LockKind::Privacy = kind {
        // The content key keeps the hash it always had; the privacy key is the same space's
        // hash with a marker no space name can end with (names are printable text).
        key.push(0);
    }
    xxhash_rust::xxh3::xxh3_64(&key) as i64
}

#[cfg(test)]
mod tests {
    use super::*;
    use engram_core::Scope;

    fn scope(space: &str) -> Scope {
        Scope::parse("scope", "3f1c2a9e-6a55-4d0e-9d7a-0c2f1b7e5a10", space).unwrap()
    }

    /// The lock statements of a transaction, without the `BEGIN` and the plan setting.
    fn locks(access: SpaceAccess, scopes: &[Scope]) -> Vec<String> {
        space_lock_statement(access, scopes)
            .split("; ")
            .skip(2)
            .map(str::to_owned)
            .collect()
    }

    #[test]
    fn entry_writers_share_the_privacy_lock_and_hold_the_content_lock() {
        let spaces = [scope("work"), scope("home"), scope("work")];
        let statements = locks(SpaceAccess::WriteEntries, &spaces);
        assert_eq!(statements.len(), 2);
        assert!(statements[0].starts_with("SELECT pg_advisory_xact_lock_shared(key)"));
        assert!(statements[1].starts_with("SELECT pg_advisory_xact_lock(key)"));
        // Each space once, keys ascending, and a space's two locks are different locks.
        let refs: Vec<&Scope> = spaces.iter().collect();
        let privacy = space_lock_keys(&refs, LockKind::Privacy);
        let content = space_lock_keys(&refs, LockKind::Content);
        assert_eq!(privacy.len(), 2);
        assert!(privacy.is_sorted() && content.is_sorted());
        assert!(privacy.iter().all(|key| !content.contains(key)));
    }

    #[test]
    fn switches_hold_both_locks_privacy_first() {
        let statements = locks(SpaceAccess::Exclusive, &[scope("work")]);
        assert_eq!(statements.len(), 2);
        let work = scope("work");
        assert!(statements[0].contains(&space_lock_key(&work, LockKind::Privacy).to_string()));
        assert!(statements[1].contains(&space_lock_key(&work, LockKind::Content).to_string()));
        assert!(
            statements
                .iter()
                .all(|s| s.starts_with("SELECT pg_advisory_xact_lock(key)"))
        );
    }
}
