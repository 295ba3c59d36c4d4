//! ImportMemories, ExportSpace and GetSummary: idempotent imports by client id, precise
//! validation errors, memory off refusing, export round trips (with embeddings when asked), and
//! the readable summary of a space.

use engram_e2e::Sandbox;
use engram_proto::v1;
use futures::StreamExt;
use tonic::Code;
use uuid::Uuid;

use crate::helpers::import;
use crate::helpers::{Setting, assert_status, new_scope, start_incognito, update_setting};
use crate::retrieval::{episode, fact};

async fn export(
    sandbox: &mut Sandbox,
    scope: &v1::Scope,
    include_embeddings: bool,
    page_size: u32,
) -> Vec<Vec<v1::ExportedMemory>> {
    let mut stream = sandbox
        .retrieval
        .export_space(v1::ExportSpaceRequest {
            scope: Some(scope.clone()),
            include_embeddings,
            page_size,
        })
        .await
        .unwrap()
        .into_inner();
    let mut pages = Vec::new();
    while let Some(page) = stream.next().await {
        pages.push(page.unwrap().memories);
    }
    pages
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn importing_the_same_batch_twice_creates_nothing_new() {
    let mut sandbox = Sandbox::start().await;
    let scope = new_scope("work");
    let conversation = Uuid::new_v4();
    let batch = vec![
        fact("a", "I prefer window seats on long flights", 3.0),
        fact("b", "My sister's birthday is on 14 March", 30.0),
        episode(
            "c",
            conversation,
            "Trip planning",
            "Booked the flight to Osaka",
            2.0,
            0.4,
            &[("user", "Book me a window seat")],
        ),
    ];
    let first = import(&mut sandbox, &scope, batch.clone()).await;
    assert_eq!((first.created, first.existing), (3, 0));
    let second = import(&mut sandbox, &scope, batch).await;
    assert_eq!((second.created, second.existing), (0, 3));
    let ids =
        |r: &v1::ImportMemoriesResponse| r.entries.iter().map(|e| e.id.clone()).collect::<Vec<_>>();
    assert_eq!(ids(&first), ids(&second));

    // The same client ids in another space are other entries.
    let other = v1::Scope {
        user_id: scope.user_id.clone(),
        space: "home".into(),
    };
    let elsewhere = import(
        &mut sandbox,
        &other,
        vec![fact("a", "I prefer aisle seats", 1.0)],
    )
    .await;
    assert_eq!(elsewhere.created, 1);
    assert_ne!(elsewhere.entries[0].id, first.entries[0].id);

    let audited: i64 =
        sqlx::query_scalar("SELECT count(*) FROM audit_events WHERE action = 'import'")
            .fetch_one(&sandbox.pool)
            .await
            .unwrap();
    assert_eq!(audited, 3, "every import request is audited");
    // Imported entries wait for the embedding backfill like any other.
    let waiting: i64 = sqlx::query_scalar("SELECT count(*) FROM memories WHERE needs_embedding")
        .fetch_one(&sandbox.pool)
        .await
        .unwrap();
    assert_eq!(waiting, 4);
    crate::helpers::assert_retention_in_step(&sandbox.pool).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_imports_are_rejected_whole_with_the_entry_and_field_named() {
    let mut sandbox = Sandbox::start().await;
    let scope = new_scope("work");
    let good = fact("ok", "A fine fact", 1.0);
    let mut future = fact("future", "From the future", 1.0);
    future.created_at = Some(engram_server::time::to_proto(
        chrono::Utc::now() + chrono::Duration::days(2),
    ));
    let mut no_kind = fact("nokind", "text", 1.0);
    no_kind.kind = v1::MemoryKind::Unspecified.into();
    let mut bad_fsrs = episode("ep", Uuid::new_v4(), "T", "S", 1.0, 0.1, &[]);
    bad_fsrs.fsrs = Some(v1::FsrsState {
        stability: 3.0,
        difficulty: 11.0,
        last_reviewed_at: None,
    });
    let mut year_10000 = fact("y", "Far away", 1.0);
    year_10000.invalid_at = Some(prost_types::Timestamp {
        seconds: 253_402_300_800,
        nanos: 0,
    });
    let mut zero_vector = fact("z", "No direction", 1.0);
    zero_vector.embedding = vec![0.0; 384];
    zero_vector.embedding_model = "imported-model".into();
    let mut nul_title = episode("nul", Uuid::new_v4(), "T\0", "S", 1.0, 0.1, &[]);
    nul_title.title = "bad\0title".into();
    let escape_title = episode("esc", Uuid::new_v4(), "Tit\u{1b}[31mle", "S", 1.0, 0.1, &[]);
    let in_2099 = Some(prost_types::Timestamp {
        seconds: 4_070_908_800,
        nanos: 0,
    });
    let mut future_episode = episode("fe", Uuid::new_v4(), "T", "S", 1.0, 0.1, &[]);
    future_episode.end_at = in_2099;
    let mut future_review = episode("fr", Uuid::new_v4(), "T", "S", 1.0, 0.1, &[]);
    future_review.fsrs = Some(v1::FsrsState {
        stability: 1.0,
        difficulty: 5.0,
        last_reviewed_at: in_2099,
    });
    let cases = vec![
        (vec![good.clone(), future], "memories[1].created_at"),
        (
            vec![year_10000],
            "memories[0].invalid_at: must lie between the years 1 and 9999",
        ),
        (
            vec![zero_vector],
            "memories[0].embedding: must not be the zero vector",
        ),
        (
            vec![nul_title],
            "memories[0].title: must not contain control characters",
        ),
        (
            vec![escape_title],
            "memories[0].title: must not contain control characters",
        ),
        (
            vec![future_episode],
            "memories[0].end_at: must not be in the future",
        ),
        (
            vec![future_review],
            "memories[0].fsrs.last_reviewed_at: must not be in the future",
        ),
        (
            vec![fact("a\u{7}x", "text", 1.0)],
            "memories[0].client_id: must not contain control characters",
        ),
        (
            vec![fact("\u{200b}", "text", 1.0)],
            "memories[0].client_id: must not be empty",
        ),
        (vec![no_kind], "memories[0].kind"),
        (vec![good.clone(), bad_fsrs], "memories[1].fsrs.difficulty"),
        (vec![good.clone(), good.clone()], "appears twice"),
        (vec![], "memories"),
        (vec![fact("", "text", 1.0)], "memories[0].client_id"),
        (vec![fact("x", "", 1.0)], "memories[0].text"),
    ];
    for (memories, needle) in cases {
        let status = sandbox
            .ingest
            .import_memories(v1::ImportMemoriesRequest {
                scope: Some(scope.clone()),
                memories,
                context_turns: None,
            })
            .await
            .unwrap_err();
        assert_status(status, Code::InvalidArgument, needle);
    }
    let too_many = (0..501).map(|i| fact(&i.to_string(), "t", 1.0)).collect();
    let status = sandbox
        .ingest
        .import_memories(v1::ImportMemoriesRequest {
            scope: Some(scope.clone()),
            memories: too_many,
            context_turns: None,
        })
        .await
        .unwrap_err();
    assert_status(status, Code::InvalidArgument, "at most 500");
    let stored: i64 = sqlx::query_scalar("SELECT count(*) FROM memories")
        .fetch_one(&sandbox.pool)
        .await
        .unwrap();
    assert_eq!(stored, 0, "nothing of a rejected batch is stored");

    update_setting(&mut sandbox, &scope, Setting::MemoryEnabled(false)).await;
    let status = sandbox
        .ingest
        .import_memories(v1::ImportMemoriesRequest {
            scope: Some(scope.clone()),
            memories: vec![good],
            context_turns: None,
        })
        .await
        .unwrap_err();
    assert_status(status, Code::FailedPrecondition, "memory is turned off");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_import_does_not_bring_back_what_the_user_forgot() {
    let mut sandbox = Sandbox::start().await;
    let scope = new_scope("work");
    let batch = vec![
        fact("keep", "My dentist is Dr. Alvarez on Main Street", 3.0),
        fact("gone", "My old bank PIN hint is the dog's birthday", 3.0),
    ];
    let first = import(&mut sandbox, &scope, batch.clone()).await;
    sandbox
        .ingest
        .forget(v1::ForgetRequest {
            scope: Some(scope.clone()),
            memory_id: first.entries[1].id.clone(),
        })
        .await
        .unwrap();

    // A client re-sending the same batch (a retry, a re-sync) must not undo the forget.
    let again = import(&mut sandbox, &scope, batch).await;
    assert_eq!((again.created, again.existing, again.suppressed), (0, 1, 1));
    assert!(again.entries[1].suppressed_by_tombstone);
    assert!(!again.entries[1].created);
    // Nor does the same text under another client id.
    let renamed = import(
        &mut sandbox,
        &scope,
        vec![fact(
            "other-id",
            "my old bank PIN hint is the dog's birthday!",
            1.0,
        )],
    )
    .await;
    assert_eq!(renamed.suppressed, 1);
    let stored: Vec<String> = sqlx::query_scalar("SELECT text FROM memories")
        .fetch_all(&sandbox.pool)
        .await
        .unwrap();
    assert_eq!(
        stored,
        vec!["My dentist is Dr. Alvarez on Main Street".to_owned()]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_from_an_incognito_conversation_is_imported() {
    let mut sandbox = Sandbox::start().await;
    let scope = new_scope("work");
    let secret = Uuid::new_v4();
    start_incognito(&mut sandbox, &scope, &secret.to_string()).await;
    let mut from_secret = fact("s", "My secret bank pin is 1234", 1.0);
    from_secret.conversation_id = secret.to_string();
    let secret_episode = episode("e", secret, "Bank", "Talked about the pin", 1.0, 0.1, &[]);
    let mut from_elsewhere = fact("o", "I prefer window seats", 1.0);
    from_elsewhere.conversation_id = Uuid::new_v4().to_string();
    let imported = import(
        &mut sandbox,
        &scope,
        vec![from_secret, secret_episode, from_elsewhere],
    )
    .await;
    assert_eq!(
        (
            imported.created,
            imported.existing,
            imported.suppressed,
            imported.skipped_incognito
        ),
        (1, 0, 0, 2)
    );
    assert!(imported.entries[0].skipped_incognito && !imported.entries[0].created);
    assert!(imported.entries[1].skipped_incognito);
    assert!(imported.entries[2].created && !imported.entries[2].skipped_incognito);
    let stored: Vec<String> = sqlx::query_scalar("SELECT text FROM memories")
        .fetch_all(&sandbox.pool)
        .await
        .unwrap();
    assert_eq!(stored, vec!["I prefer window seats".to_owned()]);

    // A space incognito by default keeps out every conversation not explicitly opened.
    let private = new_scope("private");
    update_setting(&mut sandbox, &private, Setting::IncognitoDefault(true)).await;
    let mut in_private = fact("p", "I prefer aisle seats", 1.0);
    in_private.conversation_id = Uuid::new_v4().to_string();
    let imported = import(&mut sandbox, &private, vec![in_private]).await;
    assert_eq!((imported.created, imported.skipped_incognito), (0, 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn export_streams_the_whole_space_with_embeddings_only_when_asked() {
    let mut sandbox = Sandbox::start().await;
    let scope = new_scope("work");
    let mut memories: Vec<v1::ImportedMemory> = (0..7)
        .map(|i| {
            fact(
                &format!("f{i}"),
                &format!("Fact number {i} about gardening"),
                f64::from(10 - i),
            )
        })
        .collect();
    let mut vector = vec![0.0f32; 384];
    vector[3] = 1.0;
    memories[0].embedding = vector.clone();
    memories[0].embedding_model = "imported-model".into();
    memories.push(episode(
        "ep",
        Uuid::new_v4(),
        "Garden day",
        "Planted tomatoes",
        0.5,
        0.9,
        &[
            ("user", "The tomatoes are in"),
            ("assistant", "Water them daily"),
        ],
    ));
    import(&mut sandbox, &scope, memories).await;
    // Someone else's entries never appear.
    import(
        &mut sandbox,
        &new_scope("work"),
        vec![fact("f0", "Not yours", 1.0)],
    )
    .await;

    let pages = export(&mut sandbox, &scope, false, 3).await;
    assert_eq!(
        pages.iter().map(Vec::len).collect::<Vec<_>>(),
        vec![3, 3, 2]
    );
    let all: Vec<&v1::ExportedMemory> = pages.iter().flatten().collect();
    assert!(all.iter().all(|m| m.embedding.is_empty()));
    let texts: Vec<&str> = all
        .iter()
        .map(|m| m.memory.as_ref().unwrap().text.as_str())
        .collect();
    assert_eq!(texts[0], "Fact number 0 about gardening", "oldest first");
    let episode = all
        .iter()
        .map(|m| m.memory.as_ref().unwrap())
        .find(|m| m.kind == v1::MemoryKind::Episodic as i32)
        .unwrap();
    assert_eq!(episode.messages.len(), 2);
    assert!(episode.fsrs.is_some() && episode.surprise == 0.9);

    let with_vectors = export(&mut sandbox, &scope, true, 0).await;
    let first = &with_vectors[0][0];
    assert_eq!(first.embedding, vector);
    assert_eq!(
        first.memory.as_ref().unwrap().embedding_model,
        "imported-model"
    );

    let status = sandbox
        .retrieval
        .export_space(v1::ExportSpaceRequest {
            scope: Some(scope.clone()),
            include_embeddings: false,
            page_size: 5_000,
        })
        .await
        .unwrap_err();
    assert_status(status, Code::InvalidArgument, "page_size");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_summary_tells_what_is_remembered() {
    let mut sandbox = Sandbox::start().await;
    let scope = new_scope("work");
    let summary = |sandbox: &mut Sandbox, scope: &v1::Scope| {
        let mut client = sandbox.retrieval.clone();
        let scope = scope.clone();
        async move {
            client
                .get_summary(v1::GetSummaryRequest { scope: Some(scope) })
                .await
                .unwrap()
                .into_inner()
        }
    };
    let empty = summary(&mut sandbox, &scope).await;
    assert!(
        empty.summary.contains("Nothing is remembered yet."),
        "{}",
        empty.summary
    );

    let mut pinned = fact("pin", "Always answer in British English", 5.0);
    pinned.pinned = true;
    pinned.category = v1::Category::Guideline.into();
    let mut tea = fact("tea", "I like green tea in the morning", 2.0);
    tea.category = v1::Category::Preference.into();
    import(
        &mut sandbox,
        &scope,
        vec![
            pinned,
            tea,
            episode(
                "ep",
                Uuid::new_v4(),
                "Quarterly planning",
                "Set the Q3 goals",
                1.0,
                0.2,
                &[],
            ),
        ],
    )
    .await;
    let full = summary(&mut sandbox, &scope).await;
    assert_eq!(
        (full.semantic_count, full.episodic_count, full.pinned_count),
        (2, 1, 1)
    );
    assert!(full.memory_enabled);
    assert!(
        full.summary
            .contains("## Pinned\n- [guideline] Always answer in British English"),
        "{}",
        full.summary
    );
    assert!(
        full.summary
            .contains("### preference (1)\n- I like green tea in the morning"),
        "{}",
        full.summary
    );
    assert!(
        full.summary.contains("**Quarterly planning**"),
        "{}",
        full.summary
    );
    assert_eq!(full.categories.len(), 2);
}
