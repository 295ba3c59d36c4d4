//! Test support: a fresh Postgres database per test, created from `template1` (which carries the
//! `vector` and `pg_trgm` extensions on the local Postgres that `make` brings up) and dropped when
//! the test ends.
//!
//! `ENGRAM_TEST_DATABASE_URL` names the server's admin database (default: the local Postgres of
//! `make up`, `postgres://postgres@127.0.0.1:55432/postgres`).
//!
//! Also a TCP proxy a test can cut ([`TcpProxy`]) and a fake OpenAI-compatible chat-completions
//! endpoint with scripted answers ([`FakeLlm`]), and the removal of a test's own bus topology
//! ([`drop_topology`]).

#![forbid(unsafe_code)]

mod bus;
mod fake_llm;
mod proxy;

use anyhow::Context as _;
pub use bus::drop_topology;
pub use fake_llm::{FAKE_COMPLETION_TOKENS, FAKE_PROMPT_TOKENS, FakeAnswer, FakeLlm};
pub use proxy::TcpProxy;
use sqlx::{Connection as _, Executor as _, PgConnection};

pub const TEST_DATABASE_URL_ENV: &str = "ENGRAM_TEST_DATABASE_URL";
const DEFAULT_ADMIN_URL: &str = "postgres://postgres@127.0.0.1:55432/postgres";
/// Prefix of every database a test creates, so leftovers are easy to find and drop.
pub const TEST_DATABASE_PREFIX: &str = "engram_test_";

pub fn admin_database_url() -> String {
    std::env::var(TEST_DATABASE_URL_ENV).unwrap_or_else(|_| DEFAULT_ADMIN_URL.to_owned())
}

/// A database that exists for one test.
#[derive(Debug)]
pub struct TestDatabase {
    name: String,
    url: String,
    admin_url: String,
}

impl TestDatabase {
    pub async fn create() -> anyhow::Result<Self> {
        let admin_url = admin_database_url();
        let name = format!("{TEST_DATABASE_PREFIX}{}", uuid::Uuid::new_v4().simple());
        let mut admin = PgConnection::connect(&admin_url).await.with_context(|| {
            format!("cannot reach the test postgres at {admin_url}; run `make up`")
        })?;
        admin
            .execute(sqlx::AssertSqlSafe(format!(
                "CREATE DATABASE {name} TEMPLATE template1"
            )))
            .await
            .with_context(|| format!("cannot create test database {name}"))?;
        admin.close().await.ok();
        let url = match admin_url.rsplit_once('/') {
            Some((server, _)) => format!("{server}/{name}"),
            None => anyhow::bail!("{TEST_DATABASE_URL_ENV} must end with /<database>"),
        };
        Ok(Self {
            name,
            url,
            admin_url,
        })
    }

    pub fn url(&self) -> &str {
        &self.url
    }

    pub fn name(&self) -> &str {
        &self.name
    }
}

impl Drop for TestDatabase {
    fn drop(&mut self) {
        // Drop runs outside any runtime guarantee: use a short-lived one on its own thread.
        let name = self.name.clone();
        let admin_url = self.admin_url.clone();
        let dropped = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .ok()?;
            runtime.block_on(async {
                let mut admin = PgConnection::connect(&admin_url).await.ok()?;
                admin
                    .execute(sqlx::AssertSqlSafe(format!(
                        "DROP DATABASE IF EXISTS {name} WITH (FORCE)"
                    )))
                    .await
                    .ok()?;
                admin.close().await.ok()
            })
        })
        .join();
        if !matches!(dropped, Ok(Some(()))) {
            eprintln!("engram-testkit: could not drop test database {}", self.name);
        }
    }
}
