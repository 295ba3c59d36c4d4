//! Retrieval's ListEntries and review's GetMemoryState.

use engram_e2e::Sandbox;
use engram_proto::v1;
use tonic::Code;
use uuid::Uuid;

use crate::helpers::{assert_status, new_scope, remember, remember_memory};

#[tokio::test]
async fn list_entries_filters_and_pages_newest_first() {
    let mut sandbox = Sandbox::start().await;
    let scope = new_scope("work");
    let mut ids = Vec::new();
    for index in 0..7 {
        let request = v1::RememberRequest {
            pin: index % 3 == 0,
            manually_saved: index == 1,
            ..remember(
                &scope,
                &format!(
                    "distinct fact number {index} about topic {}",
                    ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta"][index]
                ),
            )
        };
        ids.push(
            sandbox
                .ingest
                .remember(request)
                .await
                .unwrap()
                .into_inner()
                .memory
                .unwrap()
                .id,
        );
    }
    // Another user's entries never show up.
    sandbox
        .ingest
        .remember(remember(&new_scope("work"), "someone else's fact"))
        .await
        .unwrap();

    let mut listed = Vec::new();
    let mut token = String::new();
    loop {
        let page = sandbox
            .retrieval
            .list_entries(v1::ListEntriesRequest {
                scope: Some(scope.clone()),
                page_size: 3,
                page_token: token.clone(),
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        assert!(page.entries.len() <= 3);
        listed.extend(page.entries.into_iter().map(|m| m.id));
        if page.next_page_token.is_empty() {
            break;
        }
        token = page.next_page_token;
    }
    let newest_first: Vec<String> = ids.iter().rev().cloned().collect();
    assert_eq!(listed, newest_first);

    let pinned = sandbox
        .retrieval
        .list_entries(v1::ListEntriesRequest {
            scope: Some(scope.clone()),
            pinned: Some(true),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .entries;
    let pinned: Vec<&str> = pinned.iter().map(|m| m.id.as_str()).collect();
    assert_eq!(
        pinned,
        vec![ids[6].as_str(), ids[3].as_str(), ids[0].as_str()]
    );
    let saved = sandbox
        .retrieval
        .list_entries(v1::ListEntriesRequest {
            scope: Some(scope.clone()),
            manually_saved: Some(true),
            pinned: Some(false),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .entries;
    assert_eq!(
        saved.iter().map(|m| m.id.as_str()).collect::<Vec<_>>(),
        vec![ids[1].as_str()]
    );
    let episodic = sandbox
        .retrieval
        .list_entries(v1::ListEntriesRequest {
            scope: Some(scope.clone()),
            kind: v1::MemoryKind::Episodic.into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .entries;
    assert!(episodic.is_empty());
}

#[tokio::test]
async fn memory_state_of_an_episode() {
    let mut sandbox = Sandbox::start().await;
    let scope = new_scope("work");
    let episode = Uuid::new_v4();
    // Episodes are written by segmentation (a later issue); insert one as it would.
    sqlx::query(
        "INSERT INTO memories (id, user_id, space, kind, conversation_id, text, title, messages, surprise, \
             start_at, end_at, stability, difficulty, last_reviewed_at, simhash, importance) \
         VALUES ($1, $2::uuid, $3, 'episodic', gen_random_uuid(), 'User is switching to Rust', 'Career switch', '[]', 0.8, \
             now() - interval '7 days', now() - interval '7 days', 2.3065, 5.0, now() - interval '7 days', 1, 0.5)",
    )
    .bind(episode)
    .bind(&scope.user_id)
    .bind(&scope.space)
    .execute(&sandbox.pool)
    .await
    .unwrap();

    let state = sandbox
        .review
        .get_memory_state(v1::GetMemoryStateRequest {
            scope: Some(scope.clone()),
            memory_id: episode.to_string(),
        })
        .await
        .unwrap()
        .into_inner();
    assert!((state.days_since_review - 7.0).abs() < 0.01);
    // FSRS-6: S = 2.3065 after 7 days.
    assert!(
        (state.retrievability - 0.8083).abs() < 1e-3,
        "{}",
        state.retrievability
    );
    assert!((state.fsrs.unwrap().stability - 2.3065).abs() < 1e-9);

    let fact = remember_memory(&mut sandbox, &scope, "the build box is slow").await;
    let status = sandbox
        .review
        .get_memory_state(v1::GetMemoryStateRequest {
            scope: Some(scope.clone()),
            memory_id: fact.id,
        })
        .await
        .unwrap_err();
    assert_status(status, Code::FailedPrecondition, "episodic memories only");
    let status = sandbox
        .review
        .get_memory_state(v1::GetMemoryStateRequest {
            scope: Some(new_scope("work")),
            memory_id: episode.to_string(),
        })
        .await
        .unwrap_err();
    assert_status(status, Code::NotFound, "no memory");
}
