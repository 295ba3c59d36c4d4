//! Concurrent writes of the same text leave one row.

use engram_e2e::{Sandbox, SandboxOptions};
use engram_proto::v1;

use crate::helpers::{hold_space_lock, new_scope, outcome, remember};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn parallel_writes_of_the_same_text_leave_one_row() {
    const WRITERS: usize = 16;
    let sandbox = Sandbox::start().await;
    let scope = new_scope("work");
    let writes = (0..WRITERS).map(|_| {
        let mut client = sandbox.ingest.clone();
        let request = remember(&scope, "Team retro is every other Thursday at 4pm");
        tokio::spawn(async move { client.remember(request).await.map(|r| r.into_inner()) })
    });
    let responses: Vec<v1::RememberResponse> = futures::future::join_all(writes)
        .await
        .into_iter()
        .map(|joined| joined.unwrap().unwrap())
        .collect();

    let created = responses
        .iter()
        .filter(|r| outcome(r) == v1::RememberOutcome::Created)
        .count();
    assert_eq!(created, 1, "exactly one write creates the row");
    let rows: Vec<(String, i32)> = sqlx::query_as("SELECT id::text, repeat_count FROM memories")
        .fetch_all(&sandbox.pool)
        .await
        .unwrap();
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].1, (WRITERS - 1) as i32);
    assert!(
        responses
            .iter()
            .all(|r| r.memory.as_ref().unwrap().id == rows[0].0)
    );
}

/// A connection with more requests in flight than its limit is refused at once, not queued.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn requests_beyond_the_connection_limit_get_resource_exhausted() {
    let sandbox = Sandbox::start_with(SandboxOptions {
        max_concurrent_requests_per_connection: Some(8),
        ..Default::default()
    })
    .await;
    let scope = new_scope("work");
    // Hold the space's write lock so that writes to it wait (on a pool of our own, apart from
    // the service's).
    let own_pool = sqlx::PgPool::connect(sandbox.database.url()).await.unwrap();
    let blocker = hold_space_lock(&own_pool, engram_store::SpaceAccess::Exclusive, &scope).await;

    let waiting: Vec<_> = (0..8)
        .map(|index| {
            let mut client = sandbox.ingest.clone();
            let request = remember(
                &scope,
                &format!("waiting write number {index} about topic {index}"),
            );
            tokio::spawn(async move { client.remember(request).await })
        })
        .collect();
    // Wait until all eight are in flight: queued for their group commit, which waits for the
    // space's lock in Postgres.
    let started = std::time::Instant::now();
    loop {
        let blocked_in_postgres: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted \
             AND database = (SELECT oid FROM pg_database WHERE datname = current_database())",
        )
        .fetch_one(&own_pool)
        .await
        .unwrap();
        let in_flight = sandbox.ingest_metrics.writes_in_flight();
        if in_flight >= 8 && blocked_in_postgres >= 1 {
            break;
        }
        assert!(
            started.elapsed() < std::time::Duration::from_secs(20),
            "only {in_flight} writes in flight, {blocked_in_postgres} blocked in Postgres"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let mut client = sandbox.ingest.clone();
    let refused = client
        .remember(remember(&new_scope("other"), "one too many"))
        .await
        .unwrap_err();
    assert_eq!(
        refused.code(),
        tonic::Code::ResourceExhausted,
        "{refused:?}"
    );

    blocker.rollback().await.unwrap();
    for write in waiting {
        let response = write.await.unwrap().unwrap().into_inner();
        assert_eq!(outcome(&response), v1::RememberOutcome::Created);
    }
}
