//! How each service's connections commit: ingest and review wait for the WAL flush of what users
//! gave Engram; retrieval, whose writes are only what a read leaves behind, does not. What a
//! pool does with a connection that comes back inside a transaction block, and the read-only
//! pool retrieval reads through.

use engram_ingest::config::IngestSettings;
use engram_retrieval::config::RetrievalSettings;
use engram_review::config::ReviewSettings;
use engram_server::DatabaseSettings;
use engram_server::settings::load_defaults_only;
use engram_testkit::TestDatabase;
use secrecy::SecretString;

/// `SHOW synchronous_commit` on a pool connected as a service with `defaults` connects.
async fn synchronous_commit_of(defaults: DatabaseSettings, database: &TestDatabase) -> String {
    let pool = engram_server::database::connect(&DatabaseSettings {
        url: SecretString::from(database.url().to_owned()),
        run_migrations: true,
        ..defaults
    })
    .await
    .expect("connects");
    let setting: String = sqlx::query_scalar("SHOW synchronous_commit")
        .fetch_one(&pool)
        .await
        .expect("reads the setting");
    pool.close().await;
    setting
}

#[tokio::test]
async fn only_retrieval_commits_without_waiting_for_the_wal_flush() {
    let database = TestDatabase::create().await.expect("test database");
    let ingest = load_defaults_only::<IngestSettings>()
        .expect("ingest defaults")
        .database;
    let review = load_defaults_only::<ReviewSettings>()
        .expect("review defaults")
        .database;
    let retrieval = load_defaults_only::<RetrievalSettings>()
        .expect("retrieval defaults")
        .database;
    assert_eq!(synchronous_commit_of(ingest, &database).await, "on");
    assert_eq!(synchronous_commit_of(review, &database).await, "on");
    assert_eq!(synchronous_commit_of(retrieval, &database).await, "off");
}

/// The server process behind the pool's one connection.
async fn backend_of(pool: &sqlx::PgPool) -> i32 {
    sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(pool)
        .await
        .expect("reads the backend")
}

/// A pool of one connection (as services open theirs) to `database`, which holds an empty table
/// `notes`.
async fn one_connection_with_notes(database: &TestDatabase) -> sqlx::PgPool {
    let pool = engram_store::connect(
        database.url(),
        1,
        1,
        std::time::Duration::from_secs(10),
        "on",
    )
    .await
    .expect("connects");
    sqlx::raw_sql("CREATE TABLE notes (text text NOT NULL)")
        .execute(&pool)
        .await
        .unwrap();
    pool
}

/// A connection coming back to the pool inside a transaction block is closed (its block rolled
/// back), never handed to the next request; every other connection is kept. (A block a cancelled
/// request left open once made the next request's autocommit writes part of it.)
#[tokio::test]
async fn a_connection_left_inside_a_transaction_is_closed_and_others_are_kept() {
    let database = TestDatabase::create().await.expect("test database");
    let pool = one_connection_with_notes(&database).await;
    let first = backend_of(&pool).await;
    // Ordinary use, autocommit and transactions, keeps the connection.
    sqlx::query("INSERT INTO notes VALUES ('kept')")
        .execute(&pool)
        .await
        .unwrap();
    let mut transaction = engram_store::begin(&pool).await.unwrap();
    sqlx::query("INSERT INTO notes VALUES ('committed')")
        .execute(&mut *transaction)
        .await
        .unwrap();
    transaction.commit().await.unwrap();
    assert_eq!(backend_of(&pool).await, first, "a clean connection is kept");

    // A block sqlx does not know of (as a cancelled BEGIN leaves), holding a write.
    let mut connection = pool.acquire().await.unwrap();
    sqlx::raw_sql("BEGIN; INSERT INTO notes VALUES ('never committed')")
        .execute(&mut *connection)
        .await
        .unwrap();
    drop(connection);
    let next = backend_of(&pool).await;
    assert_ne!(next, first, "the connection inside a block was closed");
    // The next request's write is its own, and the block's write is gone.
    sqlx::query("INSERT INTO notes VALUES ('after')")
        .execute(&pool)
        .await
        .unwrap();
    let notes: Vec<String> = sqlx::query_scalar("SELECT text FROM notes ORDER BY text")
        .fetch_all(&pool)
        .await
        .unwrap();
    assert_eq!(notes, ["after", "committed", "kept"]);
    assert_eq!(backend_of(&pool).await, next, "and the new one is kept");
    pool.close().await;
}

/// A read-only pool beside the main one (retrieval's reads go through one) opens as many
/// connections as it, cannot write, in autocommit or in a transaction, and its sessions end a
/// transaction block left idle.
#[tokio::test]
async fn a_read_only_pool_reads_and_cannot_write() {
    let database = TestDatabase::create().await.expect("test database");
    let pool = one_connection_with_notes(&database).await;
    sqlx::query("INSERT INTO notes VALUES ('kept')")
        .execute(&pool)
        .await
        .unwrap();
    let reads = engram_store::read_only_pool_beside(&pool)
        .await
        .expect("connects");
    assert_eq!(
        reads.size(),
        1,
        "as many connections open as the pool beside"
    );
    let notes: Vec<String> = sqlx::query_scalar("SELECT text FROM notes")
        .fetch_all(&reads)
        .await
        .unwrap();
    assert_eq!(notes, ["kept"]);

    let refused = |error: sqlx::Error| {
        error
            .as_database_error()
            .and_then(|error| error.code())
            .is_some_and(|code| code == "25006")
    };
    let insert = sqlx::query("INSERT INTO notes VALUES ('written')")
        .execute(&reads)
        .await
        .expect_err("a read-only session refuses a write");
    assert!(refused(insert), "read_only_sql_transaction");
    let mut transaction = engram_store::begin(&reads).await.unwrap();
    let insert = sqlx::query("INSERT INTO notes VALUES ('written')")
        .execute(&mut *transaction)
        .await
        .expect_err("and so does its transaction");
    assert!(refused(insert), "read_only_sql_transaction");
    drop(transaction);

    let timeout: String = sqlx::query_scalar("SHOW idle_in_transaction_session_timeout")
        .fetch_one(&reads)
        .await
        .unwrap();
    assert_eq!(timeout, "1min");
    let notes: Vec<String> = sqlx::query_scalar("SELECT text FROM notes")
        .fetch_all(&pool)
        .await
        .unwrap();
    assert_eq!(notes, ["kept"], "nothing was written");
    reads.close().await;
    pool.close().await;
}
