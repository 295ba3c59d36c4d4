//! Concurrent writes of the same text leave one row.

use engram_e2e::Sandbox;
use engram_proto::v1;

use crate::helpers::{new_scope, outcome, remember};

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
