//! How each service's connections commit: ingest and review wait for the WAL flush of what users
//! gave Engram; retrieval, whose writes are only what a read leaves behind, does not.

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
    let ingest = load_defaults_only::<IngestSettings>(IngestSettings::defaults())
        .expect("ingest defaults")
        .database;
    let review = load_defaults_only::<ReviewSettings>(ReviewSettings::defaults())
        .expect("review defaults")
        .database;
    let retrieval = load_defaults_only::<RetrievalSettings>(RetrievalSettings::defaults())
        .expect("retrieval defaults")
        .database;
    assert_eq!(synchronous_commit_of(ingest, &database).await, "on");
    assert_eq!(synchronous_commit_of(review, &database).await, "on");
    assert_eq!(synchronous_commit_of(retrieval, &database).await, "off");
}
