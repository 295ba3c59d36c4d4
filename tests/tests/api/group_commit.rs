//! Group commit: writes that wait together are written in one transaction, with the same outcome
//! each would have had alone, and a write the database refuses fails alone.

use std::time::{Duration, Instant};

use engram_e2e::{Sandbox, SandboxOptions};
use engram_proto::v1;
use engram_store::SpaceAccess;
use sqlx::PgPool;

use crate::helpers::{
    Setting, hold_space_lock, new_scope, outcome, remember, remember_memory, update_setting,
};

/// One commit slot, so that writes queue behind a write blocked on its space's lock and then
/// leave together as one batch.
async fn single_slot_sandbox() -> Sandbox {
    Sandbox::start_with(SandboxOptions {
        write_batch_concurrency: Some(1),
        ..Default::default()
    })
    .await
}

/// Waits until a write is blocked on a space's lock in Postgres (so it holds its commit slot).
async fn wait_for_a_write_blocked_in_postgres(pool: &PgPool) {
    let started = Instant::now();
    loop {
        let waiting: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted \
             AND database = (SELECT oid FROM pg_database WHERE datname = current_database())",
        )
        .fetch_one(pool)
        .await
        .unwrap();
        if waiting > 0 {
            return;
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "no write is waiting for a space lock"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

async fn wait_for_writes_in_flight(sandbox: &Sandbox, expected: u64) {
    let started = Instant::now();
    while sandbox.ingest_metrics.writes_in_flight() < expected {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "only {} of {expected} writes in flight",
            sandbox.ingest_metrics.writes_in_flight()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn spawn_remember(
    sandbox: &Sandbox,
    request: v1::RememberRequest,
) -> tokio::task::JoinHandle<Result<v1::RememberResponse, tonic::Status>> {
    let mut client = sandbox.ingest.clone();
    tokio::spawn(async move { client.remember(request).await.map(|r| r.into_inner()) })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_batch_of_mixed_writes_has_the_outcomes_of_writes_made_one_by_one() {
    let mut sandbox = single_slot_sandbox().await;
    let own_pool = PgPool::connect(sandbox.database.url()).await.unwrap();

    // Spaces in every state a write can meet.
    let fresh: Vec<v1::Scope> = (0..6).map(|_| new_scope("work")).collect();
    let repeated = new_scope("work");
    let disabled = new_scope("work");
    update_setting(&mut sandbox, &disabled, Setting::MemoryEnabled(false)).await;
    let at_cap = new_scope("work");
    update_setting(&mut sandbox, &at_cap, Setting::SoftCap(2)).await;
    let oldest = remember_memory(&mut sandbox, &at_cap, "The wifi password is on the fridge").await;
    remember_memory(
        &mut sandbox,
        &at_cap,
        "Dentist appointment moved to Thursday",
    )
    .await;
    let tombstoned = new_scope("work");
    let forgotten = remember_memory(
        &mut sandbox,
        &tombstoned,
        "My old phone number ends in 4421",
    )
    .await;
    sandbox
        .ingest
        .forget(v1::ForgetRequest {
            scope: Some(tombstoned.clone()),
            memory_id: forgotten.id.clone(),
        })
        .await
        .unwrap();
    // A near-duplicate of an entry stored before: it merges in the batch's first round, in the
    // same statement as that round's new entries.
    let known = new_scope("work");
    let known_entry = remember_memory(&mut sandbox, &known, "I drink oat milk in my coffee").await;
    let (batches_before, writes_before) = sandbox.ingest_metrics.write_batches();

    // A write blocked on its space's lock holds the only slot; everything after it queues.
    let blocked_scope = new_scope("work");
    let blocker = hold_space_lock(&own_pool, SpaceAccess::Exclusive, &blocked_scope).await;
    let blocked = spawn_remember(
        &sandbox,
        remember(&blocked_scope, "I water the plants on Sundays"),
    );
    wait_for_a_write_blocked_in_postgres(&own_pool).await;

    let mut queued = Vec::new();
    let mut fresh_texts = Vec::new();
    for (index, scope) in fresh.iter().enumerate() {
        let text = format!(
            "Project {index} kickoff is scheduled for week {}",
            index + 10
        );
        queued.push(("fresh", spawn_remember(&sandbox, remember(scope, &text))));
        fresh_texts.push((scope.clone(), text));
    }
    // Three writes of one text into one space: the first to arrive creates, the others merge, in
    // rounds of the same batch.
    for _ in 0..3 {
        queued.push((
            "repeated",
            spawn_remember(
                &sandbox,
                remember(&repeated, "I prefer aisle seats on long flights"),
            ),
        ));
    }
    queued.push((
        "disabled",
        spawn_remember(&sandbox, remember(&disabled, "My locker code is 2210")),
    ));
    queued.push((
        "at_cap",
        spawn_remember(
            &sandbox,
            remember(&at_cap, "Quarterly taxes are due on the 15th"),
        ),
    ));
    queued.push((
        "known",
        spawn_remember(&sandbox, remember(&known, "i drink oat milk in my coffee!")),
    ));
    queued.push((
        "tombstoned",
        spawn_remember(
            &sandbox,
            remember(&tombstoned, "my old phone number ends in 4421!"),
        ),
    ));
    wait_for_writes_in_flight(&sandbox, 1 + queued.len() as u64).await;
    blocker.rollback().await.unwrap();

    let blocked = blocked.await.unwrap().unwrap();
    assert_eq!(outcome(&blocked), v1::RememberOutcome::Created);
    let mut repeated_outcomes = Vec::new();
    let mut repeated_ids = Vec::new();
    let mut fresh_answers = fresh_texts.into_iter();
    for (kind, write) in queued {
        let response = write.await.unwrap().unwrap();
        match kind {
            "fresh" => {
                assert_eq!(outcome(&response), v1::RememberOutcome::Created);
                // Each caller gets its own write's outcome, not a neighbour's in the batch.
                let (scope, text) = fresh_answers.next().unwrap();
                let memory = response.memory.unwrap();
                assert_eq!(memory.text, text);
                assert_eq!(memory.scope, Some(scope));
            }
            "repeated" => {
                repeated_outcomes.push(outcome(&response));
                repeated_ids.push(response.memory.unwrap().id);
            }
            "disabled" => {
                assert_eq!(
                    outcome(&response),
                    v1::RememberOutcome::SkippedMemoryDisabled
                )
            }
            "at_cap" => {
                assert_eq!(outcome(&response), v1::RememberOutcome::Created);
                assert_eq!(response.trimmed_ids, vec![oldest.id.clone()]);
            }
            "tombstoned" => {
                assert_eq!(
                    outcome(&response),
                    v1::RememberOutcome::SuppressedByTombstone
                )
            }
            "known" => {
                assert_eq!(outcome(&response), v1::RememberOutcome::Merged);
                let memory = response.memory.unwrap();
                assert_eq!(memory.id, known_entry.id);
                assert_eq!(memory.text, "I drink oat milk in my coffee");
                assert_eq!(memory.repeat_count, 1);
            }
            other => unreachable!("{other}"),
        }
    }
    // They reach the queue in whatever order the network delivers them: one of them creates.
    repeated_outcomes.sort_by_key(|outcome| *outcome as i32);
    assert_eq!(
        repeated_outcomes,
        vec![
            v1::RememberOutcome::Created,
            v1::RememberOutcome::Merged,
            v1::RememberOutcome::Merged
        ]
    );
    assert!(repeated_ids.iter().all(|id| *id == repeated_ids[0]));
    let repeat_count: i32 =
        sqlx::query_scalar("SELECT repeat_count FROM memories WHERE id = $1::uuid")
            .bind(&repeated_ids[0])
            .fetch_one(&sandbox.pool)
            .await
            .unwrap();
    assert_eq!(repeat_count, 2);

    // The queued writes left as one batch after the blocked one.
    let (batches, writes) = sandbox.ingest_metrics.write_batches();
    assert_eq!(
        batches - batches_before,
        2,
        "the blocked write, then one batch"
    );
    assert_eq!(writes - writes_before, 14);

    // The counters the capacity policy reads stayed exact, and every action was audited once.
    let miscounted: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM spaces s \
         WHERE s.memory_count <> (SELECT count(*) FROM memories m \
                                  WHERE m.user_id = s.user_id AND m.space = s.space)",
    )
    .fetch_one(&sandbox.pool)
    .await
    .unwrap();
    assert_eq!(miscounted, 0);
    crate::helpers::assert_retention_in_step(&sandbox.pool).await;
    let audited: Vec<(String, i64)> = sqlx::query_as(
        "SELECT action, count(*) FROM audit_events WHERE action IN ('create', 'merge', 'trim') \
         GROUP BY action ORDER BY action",
    )
    .fetch_all(&sandbox.pool)
    .await
    .unwrap();
    // Creates: 2 at the cap, 1 forgotten and 1 known before, then the blocked one, 6 fresh, 1
    // repeated, 1 at the cap; merges: 2 repeated, 1 known.
    assert_eq!(
        audited,
        vec![
            ("create".to_owned(), 13),
            ("merge".to_owned(), 3),
            ("trim".to_owned(), 1)
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_write_the_database_refuses_fails_alone() {
    let sandbox = single_slot_sandbox().await;
    let own_pool = PgPool::connect(sandbox.database.url()).await.unwrap();
    // Fault injection in this test's own database: the store refuses one particular text.
    sqlx::raw_sql(
        "CREATE FUNCTION refuse_poison() RETURNS trigger LANGUAGE plpgsql AS $$ \
         BEGIN RAISE EXCEPTION 'poisoned write refused by the test'; END $$; \
         CREATE TRIGGER refuse_poison BEFORE INSERT ON memories FOR EACH ROW \
             WHEN (NEW.text LIKE 'poison%') EXECUTE FUNCTION refuse_poison();",
    )
    .execute(&own_pool)
    .await
    .unwrap();

    let (batches_before, writes_before) = sandbox.ingest_metrics.write_batches();
    let blocked_scope = new_scope("work");
    let blocker = hold_space_lock(&own_pool, SpaceAccess::Exclusive, &blocked_scope).await;
    let blocked = spawn_remember(&sandbox, remember(&blocked_scope, "Standup moved to 9:30"));
    wait_for_a_write_blocked_in_postgres(&own_pool).await;
    let scopes: Vec<v1::Scope> = (0..5).map(|_| new_scope("work")).collect();
    let mut queued = Vec::new();
    for (index, scope) in scopes.iter().enumerate() {
        let text = if index == 2 {
            "poison pill that the store refuses".to_owned()
        } else {
            format!("Book club meets on the {index}th floor on Wednesdays")
        };
        queued.push(spawn_remember(&sandbox, remember(scope, &text)));
    }
    wait_for_writes_in_flight(&sandbox, 6).await;
    blocker.rollback().await.unwrap();
    assert_eq!(
        outcome(&blocked.await.unwrap().unwrap()),
        v1::RememberOutcome::Created
    );

    for (index, write) in queued.into_iter().enumerate() {
        let result = write.await.unwrap();
        if index == 2 {
            let status = result.unwrap_err();
            assert_eq!(status.code(), tonic::Code::Internal, "{status:?}");
            assert!(
                !status.message().contains("poison"),
                "internal causes stay out of the answer: {status:?}"
            );
        } else {
            assert_eq!(outcome(&result.unwrap()), v1::RememberOutcome::Created);
        }
    }
    let stored: i64 = sqlx::query_scalar("SELECT count(*) FROM memories")
        .fetch_one(&sandbox.pool)
        .await
        .unwrap();
    assert_eq!(stored, 5, "the blocked write and the four good ones");
    // The five queued writes were one batch (then retried one by one), after the blocked one.
    let (batches, writes) = sandbox.ingest_metrics.write_batches();
    assert_eq!((batches - batches_before, writes - writes_before), (2, 6));
}
