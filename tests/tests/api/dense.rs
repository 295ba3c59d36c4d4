//! The dense leg: the local model finds paraphrases that share no word with the query, HNSW
//! agrees with exact search on a large space, and a failing embedder leaves BM25 serving alone.

use std::time::Duration;

use axum::http::StatusCode;
use engram_core::Scope;
use engram_e2e::{Sandbox, SandboxOptions, TestEmbedder};
use engram_proto::v1;
use engram_store::retrieval::{DenseMethod, SearchFilter, dense_search};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::helpers::import;
use crate::helpers::{new_scope, wait_until_embedded};
use crate::retrieval::{fact, query, retrieve};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_vector_leg_finds_paraphrases_that_share_no_word() {
    let mut sandbox = Sandbox::start_with(SandboxOptions {
        embedder: TestEmbedder::Local,
        ..SandboxOptions::default()
    })
    .await;
    let scope = new_scope("health");
    import(
        &mut sandbox,
        &scope,
        vec![
            fact("allergy", "I am allergic to peanuts", 5.0),
            fact("car", "My car is a blue hatchback", 5.0),
            fact("job", "I work as a nurse on night shifts", 5.0),
        ],
    )
    .await;
    wait_until_embedded(&sandbox, Duration::from_secs(60)).await;

    let response = retrieve(
        &mut sandbox,
        query(&scope, "Which foods should be avoided at restaurants?"),
    )
    .await;
    let served = response.served_by.as_ref().unwrap();
    assert_eq!(served.path, "vector", "{served:?}");
    // BM25 found no word, so the trigram fallback was tried (and found nothing); the vector leg
    // itself worked.
    assert_eq!(
        served.fallback_reason, "no word of the query matched",
        "{served:?}"
    );
    let top = &response.semantic[0];
    assert_eq!(
        top.memory.as_ref().unwrap().text,
        "I am allergic to peanuts"
    );
    let score = top.score.as_ref().unwrap();
    assert_eq!(score.dense_rank, 1);
    assert!(score.dense_score > 0.2, "{score:?}");

    // Both legs together when words match too; asking for sparse only leaves the vector out.
    let response = retrieve(&mut sandbox, query(&scope, "peanuts allergy")).await;
    assert_eq!(response.served_by.as_ref().unwrap().path, "bm25+vector");
    let mut sparse_only = query(&scope, "peanuts allergy");
    sparse_only.ranking = Some(v1::RankingOptions {
        sparse_only: true,
        ..Default::default()
    });
    let response = retrieve(&mut sandbox, sparse_only).await;
    let served = response.served_by.as_ref().unwrap();
    assert_eq!(served.path, "bm25");
    assert!(
        !served.used_fallback,
        "sparse only was asked for: {served:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_embedder_leaves_bm25_serving_and_says_why() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base_url = format!("http://{}", listener.local_addr().unwrap());
    let app = axum::Router::new().route(
        "/v1/embeddings",
        axum::routing::post(|| async { (StatusCode::INTERNAL_SERVER_ERROR, "model crashed") }),
    );
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let mut sandbox = Sandbox::start_with(SandboxOptions {
        embedder: TestEmbedder::OpenAi {
            base_url,
            dimension: 384,
        },
        ..SandboxOptions::default()
    })
    .await;
    let scope = new_scope("work");
    import(
        &mut sandbox,
        &scope,
        vec![fact("f", "Deploys happen on Thursdays", 1.0)],
    )
    .await;
    let response = retrieve(&mut sandbox, query(&scope, "when do deploys happen")).await;
    let served = response.served_by.as_ref().unwrap();
    assert_eq!(served.path, "bm25", "{served:?}");
    assert!(served.used_fallback);
    assert!(
        served.fallback_reason.contains("embedder unavailable"),
        "{served:?}"
    );
    assert_eq!(
        response.semantic[0].memory.as_ref().unwrap().text,
        "Deploys happen on Thursdays"
    );
}

fn random_unit_vector(rng: &mut StdRng) -> Vec<f32> {
    let vector: Vec<f32> = (0..384).map(|_| rng.random_range(-1.0f32..1.0)).collect();
    let norm = vector.iter().map(|x| x * x).sum::<f32>().sqrt();
    vector.into_iter().map(|x| x / norm).collect()
}

async fn import_vectors(sandbox: &mut Sandbox, scope: &v1::Scope, count: usize, rng: &mut StdRng) {
    for start in (0..count).step_by(500) {
        let batch = (start..(start + 500).min(count))
            .map(|i| {
                let mut memory = fact(&format!("v{i}"), &format!("synthetic entry {i}"), 1.0);
                memory.category = v1::Category::Fact.into();
                memory.tags = vec!["synthetic".into()];
                memory.embedding = random_unit_vector(rng);
                memory.embedding_model = "synthetic".into();
                memory
            })
            .collect();
        import(sandbox, scope, batch).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hnsw_search_agrees_with_exact_search_within_a_space() {
    let mut sandbox = Sandbox::start().await;
    let mut rng = StdRng::seed_from_u64(7);
    let target = new_scope("large");
    import_vectors(&mut sandbox, &target, 3_000, &mut rng).await;
    // Another user's vectors share the index: the space filter must hold during the graph walk.
    import_vectors(&mut sandbox, &new_scope("large"), 1_000, &mut rng).await;
    sqlx::query("ANALYZE memory_embeddings")
        .execute(&sandbox.pool)
        .await
        .unwrap();

    let scope = Scope::parse("scope", &target.user_id, &target.space).unwrap();
    let filter = SearchFilter {
        scope: &scope,
        kind: engram_core::MemoryKind::Semantic,
        conversation: None,
        category: None,
        include_inactive: false,
    };
    let own: std::collections::HashSet<uuid::Uuid> =
        sqlx::query_scalar("SELECT id FROM memories WHERE user_id = $1")
            .bind(scope.user_id.as_uuid())
            .fetch_all(&sandbox.pool)
            .await
            .unwrap()
            .into_iter()
            .collect();
    let (mut found, mut wanted) = (0usize, 0usize);
    for _ in 0..20 {
        let probe = random_unit_vector(&mut rng);
        let exact = dense_search(&sandbox.pool, &filter, &probe, DenseMethod::Exact, 10)
            .await
            .unwrap();
        let approximate = dense_search(
            &sandbox.pool,
            &filter,
            &probe,
            DenseMethod::Approximate { ef_search: 200 },
            10,
        )
        .await
        .unwrap();
        assert_eq!(exact.len(), 10);
        assert!(
            approximate.iter().all(|(id, _)| own.contains(id)),
            "another space's vector"
        );
        wanted += exact.len();
        found += exact
            .iter()
            .filter(|(id, _)| approximate.iter().any(|(other, _)| other == id))
            .count();
    }
    let recall = found as f64 / wanted as f64;
    assert!(
        recall >= 0.9,
        "HNSW recall@10 against exact search: {recall:.3}"
    );
}

/// The relevance floor: without it a 5-entry space answers "who is my manager?" with every entry
/// (the vector leg ranks them all); with it, entries no word matched and whose cosine is below
/// the floor are left out, word matches stay, and a query nothing clears answers nothing (not
/// the most recent entries).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_relevance_floor_leaves_unrelated_entries_out() {
    let mut sandbox = Sandbox::start_with(SandboxOptions {
        embedder: TestEmbedder::Local,
        ..SandboxOptions::default()
    })
    .await;
    let scope = new_scope("floor");
    import(
        &mut sandbox,
        &scope,
        vec![
            fact("allergy", "I am allergic to peanuts", 5.0),
            fact("theme", "I prefer dark mode in every editor", 5.0),
            fact("boss", "My manager is Alice Chen", 5.0),
            fact("car", "My car is a blue hatchback", 5.0),
            fact("bike", "The bike lock code is 9981", 5.0),
        ],
    )
    .await;
    wait_until_embedded(&sandbox, Duration::from_secs(60)).await;
    let with_floor = |text: &str, floor: Option<f64>| {
        let mut request = query(&scope, text);
        request.ranking = Some(v1::RankingOptions {
            min_similarity: floor,
            ..Default::default()
        });
        request
    };
    let texts = |response: &v1::RetrieveMemoryResponse| -> Vec<String> {
        response
            .semantic
            .iter()
            .map(|m| m.memory.as_ref().unwrap().text.clone())
            .collect()
    };

    let everything = retrieve(&mut sandbox, with_floor("who is my manager?", Some(0.0))).await;
    assert_eq!(
        everything.semantic.len(),
        5,
        "no floor: {:?}",
        texts(&everything)
    );
    let floored = retrieve(&mut sandbox, with_floor("who is my manager?", Some(0.3))).await;
    let kept = texts(&floored);
    assert!(
        kept.len() < 5 && kept.contains(&"My manager is Alice Chen".to_owned()),
        "{kept:?}"
    );
    for result in &floored.semantic {
        let score = result.score.as_ref().unwrap();
        assert!(
            score.sparse_rank > 0 || score.dense_score >= 0.3,
            "{score:?}"
        );
    }

    // A word match stays whatever its cosine.
    let lock = retrieve(&mut sandbox, with_floor("9981", Some(0.9))).await;
    assert_eq!(texts(&lock), ["The bike lock code is 9981"]);

    // Nothing clears the floor: nothing is returned, and the response says why.
    let nothing = retrieve(
        &mut sandbox,
        with_floor("quantum chromodynamics lecture notes", Some(0.9)),
    )
    .await;
    assert!(nothing.semantic.is_empty(), "{:?}", texts(&nothing));
    let served = nothing.served_by.unwrap();
    assert!(
        served
            .fallback_reason
            .contains("nothing above the relevance floor"),
        "{served:?}"
    );

    let status = sandbox
        .retrieval
        .retrieve_memory(with_floor("manager", Some(1.5)))
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert!(
        status.message().contains("min_similarity"),
        "{}",
        status.message()
    );
}

/// The exact search's statement searches the entries' words too when the retrieval has an
/// embedding (one pass over the space's entries for both legs, issue 41). It must find what
/// the word leg's own statement finds, with the same scores in the same order, leave the
/// nearest entries as they were, and load every word hit with its vector (MMR compares them),
/// over both kinds, a category, a conversation, inactive and superseded entries.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_exact_search_finds_the_word_hits_of_the_word_leg() {
    use engram_core::MemoryKind;
    use engram_store::retrieval::{
        Bm25, SpaceFilter, WordsLeg, exact_search_loading, sparse_search_kinds,
    };

    let mut sandbox = Sandbox::start().await;
    let mut rng = StdRng::seed_from_u64(41);
    let target = new_scope("words");
    let conversations = [uuid::Uuid::new_v4(), uuid::Uuid::new_v4()];
    let words = [
        "garden", "tomatoes", "deploy", "thursday", "sister", "wedding", "paris", "train",
        "allergy", "peanuts", "budget", "rent",
    ];
    let mut memories = Vec::new();
    for i in 0..60usize {
        let text = format!(
            "note {i}: the {} and the {} {}",
            words[i % words.len()],
            words[(i * 7 + 3) % words.len()],
            if i % 5 == 0 {
                words[(i + 1) % words.len()]
            } else {
                "today"
            },
        );
        let mut memory = if i % 3 == 0 {
            crate::retrieval::episode(
                &format!("e{i}"),
                conversations[i % 2],
                &format!("episode {i}"),
                &text,
                1.0 + i as f64,
                0.1,
                &[("user", text.as_str())],
            )
        } else {
            let mut memory = fact(&format!("f{i}"), &text, 1.0 + i as f64);
            memory.category = if i % 2 == 0 {
                v1::Category::Preference
            } else {
                v1::Category::Fact
            }
            .into();
            memory
        };
        memory.embedding = random_unit_vector(&mut rng);
        memory.embedding_model = "synthetic".into();
        memories.push(memory);
    }
    import(&mut sandbox, &target, memories).await;
    // Entries the word leg leaves out unless asked: inactive and superseded.
    sqlx::query(
        "UPDATE memories SET inactive_since = now() \
         WHERE user_id = $1::uuid AND id IN (SELECT id FROM memories WHERE user_id = $1::uuid \
                                             ORDER BY id LIMIT 6)",
    )
    .bind(&target.user_id)
    .execute(&sandbox.pool)
    .await
    .unwrap();
    sqlx::query(
        "UPDATE memories SET invalid_at = now() \
         WHERE user_id = $1::uuid AND id IN (SELECT id FROM memories WHERE user_id = $1::uuid \
                                             ORDER BY id DESC LIMIT 4)",
    )
    .bind(&target.user_id)
    .execute(&sandbox.pool)
    .await
    .unwrap();

    let scope = Scope::parse("scope", &target.user_id, &target.space).unwrap();
    let bm25 = Bm25 { k1: 1.2, b: 0.75 };
    let both = |category: Option<&'static str>, conversation, include_inactive| SpaceFilter {
        scope: &scope,
        kinds: vec![
            (MemoryKind::Semantic, category),
            (MemoryKind::Episodic, None),
        ],
        conversation,
        include_inactive,
    };
    let filters = [
        both(None, None, false),
        both(Some("preference"), None, false),
        both(None, Some(conversations[0]), false),
        both(None, None, true),
    ];
    let queries = [
        "garden tomatoes",
        "when is the wedding in paris",
        "deploy on thursday today",
        "peanuts",
        "nothing here matches",
    ];
    let mut word_hits = 0;
    for filter in &filters {
        for text in queries {
            let probe = random_unit_vector(&mut rng);
            let alone = sparse_search_kinds(&sandbox.pool, filter, text, bm25, 8)
                .await
                .unwrap();
            let vectors_alone =
                exact_search_loading(&sandbox.pool, filter, &probe, None, 8, &[], &[])
                    .await
                    .unwrap();
            let together = exact_search_loading(
                &sandbox.pool,
                filter,
                &probe,
                Some(WordsLeg { query: text, bm25 }),
                8,
                &[],
                &[],
            )
            .await
            .unwrap();
            let what = format!("{text:?} over {filter:?}");
            assert_eq!(together.words.len(), alone.len(), "{what}");
            for (kind, (found, expected)) in together.words.iter().zip(&alone).enumerate() {
                let ids = |hits: &[(uuid::Uuid, f64)]| hits.iter().map(|h| h.0).collect::<Vec<_>>();
                assert_eq!(
                    ids(found),
                    ids(expected),
                    "{what}, kind {kind}: the word hits"
                );
                for ((_, a), (_, b)) in found.iter().zip(expected) {
                    assert!((a - b).abs() < 1e-9, "{what}: BM25 {a} against {b}");
                }
                word_hits += found.len();
            }
            assert_eq!(
                together.nearest, vectors_alone.nearest,
                "{what}: the nearest entries"
            );
            for (id, _) in together.words.iter().flatten() {
                let loaded = together
                    .loaded
                    .iter()
                    .find(|candidate| candidate.record.id == *id)
                    .unwrap_or_else(|| panic!("{what}: word hit {id} not loaded"));
                assert!(
                    loaded.embedding.is_some(),
                    "{what}: {id} without its vector"
                );
            }
        }
    }
    assert!(word_hits > 40, "too few word hits to compare: {word_hits}");
}
