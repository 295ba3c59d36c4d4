//! Requests past their deadline: DEADLINE_EXCEEDED when nothing was written, UNKNOWN when a
//! write may have landed, at the caller's `grpc-timeout` or the server's own limit, whichever
//! comes first. (tonic's own timeout answered CANCELLED "Timeout expired", even for writes that
//! had committed.)

use std::time::{Duration, Instant};

use engram_e2e::{Sandbox, SandboxOptions};
use engram_proto::v1;
use tonic::Code;

use crate::helpers::{assert_status, entries, new_scope, remember, remember_memory};

/// A transaction of the test's own holding a table lock, so that the services' statements on it
/// wait until the test lets go.
async fn hold_lock(
    sandbox: &Sandbox,
    statement: &str,
) -> sqlx::Transaction<'static, sqlx::Postgres> {
    let mut transaction = engram_store::begin(&sandbox.pool).await.unwrap();
    sqlx::query(sqlx::AssertSqlSafe(statement.to_owned()))
        .execute(&mut *transaction)
        .await
        .unwrap();
    transaction
}

#[tokio::test]
async fn a_write_past_the_servers_deadline_that_may_have_landed_is_unknown() {
    let mut sandbox = Sandbox::start_with(SandboxOptions {
        request_timeout_secs: Some(1),
        ..Default::default()
    })
    .await;
    let scope = new_scope("work");
    remember_memory(&mut sandbox, &scope, "The office opens at eight").await;
    // Inserts wait; the group commit has already taken the write into its transaction.
    let lock = hold_lock(&sandbox, "LOCK TABLE memories IN EXCLUSIVE MODE").await;
    let started = Instant::now();
    let status = sandbox
        .ingest
        .remember(remember(&scope, "The lift is out of order on Fridays"))
        .await
        .unwrap_err();
    assert_status(status, Code::Unknown, "may or may not have been applied");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "answered at the server's 1 s limit"
    );
    lock.commit().await.unwrap();
    // It did land: the caller was right to read it back rather than assume either way.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let texts: Vec<String> = entries(&mut sandbox, &scope)
            .await
            .into_iter()
            .map(|m| m.text)
            .collect();
        if texts.iter().any(|t| t.contains("lift")) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the write never landed: {texts:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn the_callers_deadline_is_honoured_and_an_unwritten_write_is_deadline_exceeded() {
    let mut sandbox = Sandbox::start().await;
    let scope = new_scope("work");
    let memory = remember_memory(&mut sandbox, &scope, "My locker is number 42").await;
    let lock = hold_lock(&sandbox, "LOCK TABLE memories IN EXCLUSIVE MODE").await;
    let mut forget = tonic::Request::new(v1::ForgetRequest {
        scope: Some(scope.clone()),
        memory_id: memory.id.clone(),
    });
    forget.set_timeout(Duration::from_millis(300));
    let started = Instant::now();
    let status = sandbox.ingest.forget(forget).await.unwrap_err();
    assert_status(
        status,
        Code::DeadlineExceeded,
        "nothing it asked to write was written",
    );
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "the server's 30 s did not apply"
    );
    lock.commit().await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let kept = entries(&mut sandbox, &scope).await;
    assert_eq!(kept.len(), 1, "the forget was abandoned, not applied");
    assert_eq!(kept[0].id, memory.id);
}

#[tokio::test]
async fn a_read_past_the_callers_deadline_is_deadline_exceeded() {
    let mut sandbox = Sandbox::start().await;
    let scope = new_scope("work");
    remember_memory(&mut sandbox, &scope, "The printer is on the second floor").await;
    let lock = hold_lock(&sandbox, "LOCK TABLE spaces IN ACCESS EXCLUSIVE MODE").await;
    let mut retrieve = tonic::Request::new(v1::RetrieveMemoryRequest {
        scope: Some(scope.clone()),
        query: "printer".to_owned(),
        ..Default::default()
    });
    retrieve.set_timeout(Duration::from_millis(300));
    let status = sandbox
        .retrieval
        .retrieve_memory(retrieve)
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::DeadlineExceeded, "{status:?}");
    lock.rollback().await.unwrap();
}
