//! Remember: normalization, near-duplicate merging, importance, metadata.

use engram_e2e::Sandbox;
use engram_proto::v1;

use crate::helpers::{new_scope, outcome, remember, remember_response};

#[tokio::test]
async fn a_new_memory_is_stored_as_given_and_awaits_an_embedding() {
    let mut sandbox = Sandbox::start().await;
    let scope = new_scope("work");
    let text = "  My sister Maria Lopez moved to New York on 2025-03-01 https://example.com/x ";
    let response = remember_response(&mut sandbox, remember(&scope, text)).await;
    assert_eq!(outcome(&response), v1::RememberOutcome::Created);
    let memory = response.memory.unwrap();
    assert_eq!(
        memory.text, text,
        "the stored text stays as the user gave it"
    );
    assert!(memory.needs_embedding);
    assert_eq!(memory.repeat_count, 0);
    assert_eq!(
        v1::MemoryKind::try_from(memory.kind).unwrap(),
        v1::MemoryKind::Semantic
    );
    for tag in ["maria lopez", "new york", "2025-03-01"] {
        assert!(
            memory.tags.contains(&tag.to_owned()),
            "{tag} in {:?}",
            memory.tags
        );
    }
    assert!(
        memory.metadata_confidence >= 0.6,
        "{}",
        memory.metadata_confidence
    );
    // Confident metadata: 0.3 base + 0.2.
    assert!(
        (memory.importance - 0.5).abs() < 1e-9,
        "{}",
        memory.importance
    );

    let needs_embedding: bool =
        sqlx::query_scalar("SELECT needs_embedding FROM memories WHERE id = $1::uuid")
            .bind(&memory.id)
            .fetch_one(&sandbox.pool)
            .await
            .unwrap();
    assert!(needs_embedding);
}

/// The metadata confidence is a mean of hundredths, kept in hundredths: three keyphrases at 0.4
/// are 0.4, stored and answered, not 0.4000000000000001 (issue 37).
#[tokio::test]
async fn the_metadata_confidence_is_an_exact_decimal() {
    let mut sandbox = Sandbox::start().await;
    let scope = new_scope("work");
    let text = "the database migration failed twice during deployment";
    let memory = remember_response(&mut sandbox, remember(&scope, text))
        .await
        .memory
        .unwrap();
    assert_eq!(memory.tags.len(), 3, "{:?}", memory.tags);
    assert_eq!(memory.metadata_confidence, 0.4);
    let stored: String =
        sqlx::query_scalar("SELECT metadata_confidence::text FROM memories WHERE id = $1::uuid")
            .bind(&memory.id)
            .fetch_one(&sandbox.pool)
            .await
            .unwrap();
    assert_eq!(stored, "0.4");
}

#[tokio::test]
async fn near_duplicates_merge_into_one_entry() {
    let mut sandbox = Sandbox::start().await;
    let scope = new_scope("work");
    let first = remember_response(
        &mut sandbox,
        v1::RememberRequest {
            tags: vec!["editor".into()],
            source_ids: vec!["msg-1".into()],
            ..remember(&scope, "I prefer dark mode in every editor")
        },
    )
    .await;
    let first = first.memory.unwrap();
    assert!(!first.manually_saved);

    // Case, spacing, a URL and a citation do not make it a different memory.
    let second = remember_response(
        &mut sandbox,
        v1::RememberRequest {
            tags: vec!["ui".into()],
            source_ids: vec!["msg-2".into()],
            manually_saved: true,
            ..remember(
                &scope,
                "i PREFER dark   mode in every editor [1] https://x.io/a",
            )
        },
    )
    .await;
    assert_eq!(outcome(&second), v1::RememberOutcome::Merged);
    let merged = second.memory.unwrap();
    assert_eq!(merged.id, first.id);
    assert_eq!(merged.text, first.text, "the canonical text is kept");
    assert_eq!(merged.repeat_count, 1);
    assert!(merged.importance > first.importance && merged.importance <= 1.0);
    assert!(merged.manually_saved, "manual save is ORed in");
    assert!(merged.tags.contains(&"editor".into()) && merged.tags.contains(&"ui".into()));
    assert_eq!(merged.source_ids, vec!["msg-1", "msg-2"]);

    // A pin request on a repeat pins the canonical entry.
    let third = remember_response(
        &mut sandbox,
        v1::RememberRequest {
            pin: true,
            ..remember(&scope, "I prefer dark mode in every editor.")
        },
    )
    .await;
    let pinned = third.memory.unwrap();
    assert!(pinned.pinned);
    assert_eq!(pinned.repeat_count, 2);

    let count: i64 = sqlx::query_scalar("SELECT count(*) FROM memories")
        .fetch_one(&sandbox.pool)
        .await
        .unwrap();
    assert_eq!(count, 1, "no new row for near-duplicates");

    // The same text in another space, or for another user, is its own memory.
    let other_space = v1::Scope {
        space: "home".into(),
        ..scope.clone()
    };
    let elsewhere = sandbox
        .ingest
        .remember(remember(&other_space, "I prefer dark mode in every editor"))
        .await
        .unwrap();
    assert_eq!(outcome(elsewhere.get_ref()), v1::RememberOutcome::Created);
    let other_user = new_scope("work");
    let elsewhere = sandbox
        .ingest
        .remember(remember(&other_user, "I prefer dark mode in every editor"))
        .await
        .unwrap();
    assert_eq!(outcome(elsewhere.get_ref()), v1::RememberOutcome::Created);
}

#[tokio::test]
async fn different_statements_are_not_merged() {
    let mut sandbox = Sandbox::start().await;
    let scope = new_scope("work");
    for text in [
        "I like green tea",
        "I like black coffee",
        "我喜欢喝绿茶",
        "我讨厌喝咖啡",
    ] {
        let response = remember_response(&mut sandbox, remember(&scope, text)).await;
        assert_eq!(outcome(&response), v1::RememberOutcome::Created, "{text}");
    }
}

#[tokio::test]
async fn importance_follows_the_heuristics() {
    let mut sandbox = Sandbox::start().await;
    let scope = new_scope("work");
    let cases = [
        // (text, manually_saved, expected importance, expected category)
        ("the build box is slow", false, 0.3, v1::Category::Fact),
        (
            "I prefer tabs over spaces",
            false,
            0.6,
            v1::Category::Preference,
        ),
        ("我打算明年学日语", false, 0.6, v1::Category::Goal),
        ("thanks a lot!", false, 0.2, v1::Category::Fact),
        (
            "the wifi password is on the fridge",
            true,
            0.8,
            v1::Category::Fact,
        ),
        (
            "Please remember that I am allergic to peanuts",
            false,
            1.0,
            v1::Category::Preference,
        ),
    ];
    for (text, manually_saved, expected, category) in cases {
        let response = remember_response(
            &mut sandbox,
            v1::RememberRequest {
                manually_saved,
                ..remember(&scope, text)
            },
        )
        .await;
        let memory = response.memory.unwrap();
        assert!(
            (memory.importance - expected).abs() < 1e-9,
            "{text}: {}",
            memory.importance
        );
        assert_eq!(
            v1::Category::try_from(memory.category).unwrap(),
            category,
            "{text}"
        );
        assert_eq!(memory.manually_saved, expected >= 0.8, "{text}");
    }
}

#[tokio::test]
async fn a_given_category_and_role_are_kept() {
    let mut sandbox = Sandbox::start().await;
    let scope = new_scope("work");
    let response = remember_response(
        &mut sandbox,
        v1::RememberRequest {
            category: v1::Category::Guideline.into(),
            role: v1::SpeakerRole::Assistant.into(),
            ..remember(&scope, "Answer with code first, prose second")
        },
    )
    .await;
    let memory = response.memory.unwrap();
    assert_eq!(
        v1::Category::try_from(memory.category).unwrap(),
        v1::Category::Guideline
    );
    assert_eq!(
        v1::SpeakerRole::try_from(memory.role).unwrap(),
        v1::SpeakerRole::Assistant
    );
}

/// Near-duplicate lookup probes the band indexes, never scans the space.
#[tokio::test]
async fn near_duplicate_lookup_uses_the_band_indexes() {
    let sandbox = Sandbox::start().await;
    let user = uuid::Uuid::new_v4();
    sqlx::query(
        "INSERT INTO memories (id, user_id, space, kind, text, category, valid_at, simhash, importance) \
         SELECT gen_random_uuid(), $1, 'big', 'semantic', 'fact ' || i, 'fact', now(), \
                (random() * 9.2e18)::bigint, 0.3 \
         FROM generate_series(1, 20000) AS i",
    )
    .bind(user)
    .execute(&sandbox.pool)
    .await
    .unwrap();
    sqlx::query("ANALYZE memories")
        .execute(&sandbox.pool)
        .await
        .unwrap();
    let plan: Vec<String> = sqlx::query_scalar(
        "EXPLAIN SELECT id FROM memories WHERE user_id = $1 AND space = 'big' AND kind = 'semantic' \
         AND (simhash_band0 = 1 OR simhash_band1 = 2 OR simhash_band2 = 3 OR simhash_band3 = 4) \
         AND bit_count(int8send(simhash # 12345)) <= 3",
    )
    .bind(user)
    .fetch_all(&sandbox.pool)
    .await
    .unwrap();
    let plan = plan.join("\n");
    for band in 0..4 {
        assert!(
            plan.contains(&format!("memories_scope_band{band}")),
            "{plan}"
        );
    }
    assert!(!plan.contains("Seq Scan"), "{plan}");
}

#[tokio::test]
async fn links_alone_are_distinct_and_unicode_forms_are_one_text() {
    let mut sandbox = Sandbox::start().await;
    let scope = new_scope("work");
    // Texts that are nothing but a link (or a citation marker) are what they link to: no two of
    // them are the same memory.
    for text in [
        "https://github.com/rust-lang/rust",
        "https://bank.example.com/login",
        "www.mydoctor.org",
        "[1]",
    ] {
        let response = remember_response(&mut sandbox, remember(&scope, text)).await;
        assert_eq!(outcome(&response), v1::RememberOutcome::Created, "{text}");
    }

    // The composed and the decomposed spelling of the same words (keyboards differ) are one
    // memory, and a Forget of one keeps the other out too.
    let composed = "Zo\u{eb}'s caf\u{e9} is on Rua A\u{e7}ores";
    let decomposed = "Zoe\u{308}'s cafe\u{301} is on Rua Ac\u{327}ores";
    let first = remember_response(&mut sandbox, remember(&scope, composed)).await;
    let second = remember_response(&mut sandbox, remember(&scope, decomposed)).await;
    assert_eq!(outcome(&second), v1::RememberOutcome::Merged);
    let id = first.memory.unwrap().id;
    assert_eq!(second.memory.unwrap().id, id);
    sandbox
        .ingest
        .forget(v1::ForgetRequest {
            scope: Some(scope.clone()),
            memory_id: id,
        })
        .await
        .unwrap();
    let again = remember_response(&mut sandbox, remember(&scope, decomposed)).await;
    assert_eq!(outcome(&again), v1::RememberOutcome::SuppressedByTombstone);
}
