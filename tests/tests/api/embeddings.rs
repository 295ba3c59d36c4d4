//! The embedding backfill: new entries get embeddings from the configured model, entries written
//! by anything else are picked up by the poll, a poison entry is set aside without blocking the
//! rest, and a model that does not fit the store stops the service at start.

use std::time::{Duration, Instant};

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use engram_e2e::{Sandbox, SandboxOptions, TestEmbedder, local_model_dir};
use engram_embed::{Embedder, LocalEmbedder, LocalModelSettings, cosine};
use serde_json::{Value, json};

use crate::helpers::{new_scope, remember, remember_memory, wait_until_embedded};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn new_memories_get_embeddings_from_the_local_model() {
    let mut sandbox = Sandbox::start_with(SandboxOptions {
        embedder: TestEmbedder::Local,
        ..Default::default()
    })
    .await;
    let scope = new_scope("work");
    let text = "My flight to Lisbon leaves on Friday at 7am";
    let memory = remember_memory(&mut sandbox, &scope, text).await;
    assert!(
        memory.needs_embedding,
        "the write path does not wait for the embedding"
    );
    wait_until_embedded(&sandbox, Duration::from_secs(30)).await;

    let (stored, model, embedded_at): (pgvector::Vector, String, Option<String>) = sqlx::query_as(
        "SELECT e.embedding, m.embedding_model, m.embedded_at::text FROM memories m JOIN memory_embeddings e ON e.memory_id = m.id WHERE m.id = $1::uuid",
    )
    .bind(&memory.id)
    .fetch_one(&sandbox.pool)
    .await
    .unwrap();
    assert_eq!(model, "sentence-transformers/all-MiniLM-L6-v2");
    assert!(embedded_at.is_some());
    let reference = LocalEmbedder::load(&LocalModelSettings {
        model_dir: local_model_dir(),
        max_batch: 8,
        max_tokens: 256,
        inference_nice: 0,
        yield_to_requests: None,
    })
    .unwrap()
    .embed(&[text.to_owned()])
    .await
    .unwrap()
    .remove(0);
    let similarity = cosine(&stored.to_vec(), &reference);
    assert!(
        similarity > 0.9999,
        "stored embedding is the model's embedding of the text: {similarity}"
    );

    // The entry now reads as embedded, and the metrics saw it.
    let listed = sandbox
        .retrieval
        .list_entries(engram_proto::v1::ListEntriesRequest {
            scope: Some(scope.clone()),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .entries;
    assert!(!listed[0].needs_embedding);
    assert!(sandbox.ingest_metrics.embedded() >= 1);
    assert!(
        sandbox
            .ingest_metrics
            .embedding_latency_percentile(95.0)
            .is_some()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn entries_written_elsewhere_are_picked_up_by_the_poll() {
    let sandbox = Sandbox::start_with(SandboxOptions {
        embedder: TestEmbedder::Local,
        ..Default::default()
    })
    .await;
    // As if written by another process whose wake-up never arrived (or a lost message).
    sqlx::query(
        "INSERT INTO memories (id, user_id, space, kind, text, category, valid_at, simhash, importance) \
         SELECT gen_random_uuid(), gen_random_uuid(), 'work', 'semantic', 'imported fact number ' || i, 'fact', \
                now(), i, 0.3 FROM generate_series(1, 70) AS i",
    )
    .execute(&sandbox.pool)
    .await
    .unwrap();
    wait_until_embedded(&sandbox, Duration::from_secs(60)).await;
    let embedded: i64 = sqlx::query_scalar("SELECT count(*) FROM memory_embeddings")
        .fetch_one(&sandbox.pool)
        .await
        .unwrap();
    assert_eq!(embedded, 70);
}

/// A fake OpenAI-compatible endpoint that rejects (400) any batch holding the word POISON.
async fn picky_embeddings(Json(body): Json<Value>) -> Response {
    let inputs: Vec<String> = serde_json::from_value(body["input"].clone()).unwrap();
    if inputs.iter().any(|text| text.contains("POISON")) {
        return (StatusCode::BAD_REQUEST, "input rejected").into_response();
    }
    let data: Vec<Value> = inputs
        .iter()
        .enumerate()
        .map(|(index, text)| {
            let mut vector = vec![0.0f32; 384];
            vector[index % 384] = 1.0;
            vector[(text.len() + 1) % 384] += 0.5;
            json!({ "index": index, "embedding": vector })
        })
        .collect();
    Json(json!({ "data": data })).into_response()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_poison_entry_is_set_aside_and_does_not_block_the_rest() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base_url = format!("http://{}", listener.local_addr().unwrap());
    let app = axum::Router::new().route("/v1/embeddings", axum::routing::post(picky_embeddings));
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });

    let mut sandbox = Sandbox::start_with(SandboxOptions {
        embedder: TestEmbedder::OpenAi {
            base_url,
            dimension: 384,
        },
        ..Default::default()
    })
    .await;
    let scope = new_scope("work");
    sandbox
        .ingest
        .remember(remember(&scope, "this entry is POISON for the endpoint"))
        .await
        .unwrap();
    for index in 0..5 {
        sandbox
            .ingest
            .remember(remember(
                &scope,
                &format!("healthy entry {index} about topic {index}"),
            ))
            .await
            .unwrap();
    }
    wait_until_embedded(&sandbox, Duration::from_secs(30)).await;

    let started = Instant::now();
    while sandbox.ingest_metrics.dead_lettered() == 0 {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the poison entry was never set aside"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (failures, error, needs): (i32, Option<String>, bool) = sqlx::query_as(
        "SELECT embedding_failures, embedding_error, needs_embedding FROM memories WHERE text LIKE '%POISON%'",
    )
    .fetch_one(&sandbox.pool)
    .await
    .unwrap();
    assert_eq!(failures, 5);
    assert!(
        needs,
        "the flag stays set: the entry is not silently marked as embedded"
    );
    assert!(error.unwrap().contains("400"));
    let healthy: i64 = sqlx::query_scalar("SELECT count(*) FROM memory_embeddings")
        .fetch_one(&sandbox.pool)
        .await
        .unwrap();
    assert_eq!(healthy, 5);
}

#[tokio::test]
async fn a_model_of_the_wrong_dimension_stops_the_service_at_start() {
    let database = engram_testkit::TestDatabase::create().await.unwrap();
    let mut settings: engram_ingest::IngestSettings =
        engram_server::settings::load_defaults_only::<engram_ingest::IngestSettings>().unwrap();
    settings.grpc.listen_addr = "127.0.0.1:0".parse().unwrap();
    settings.database.url = database.url().to_owned().into();
    settings.embed.model.provider = engram_ingest::config::EmbedProvider::Openai;
    settings.embed.model.openai.base_url = "http://127.0.0.1:9".into();
    settings.embed.model.openai.dimension = 1536;
    let error = engram_ingest::App::build(settings)
        .await
        .err()
        .expect("start-up refused");
    let message = format!("{error:#}");
    assert!(
        message.contains("embedding dimension mismatch"),
        "{message}"
    );
    assert!(
        message.contains("1536") && message.contains("vector(384)"),
        "{message}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reembed_replaces_embeddings_of_other_models_without_removing_them_first() {
    let mut sandbox = Sandbox::start_with(SandboxOptions {
        embedder: TestEmbedder::Local,
        ..Default::default()
    })
    .await;
    let scope = new_scope("work");
    for text in [
        "I prefer window seats",
        "The standup is at 9:30",
        "My sister lives in Madrid",
    ] {
        sandbox
            .ingest
            .remember(remember(&scope, text))
            .await
            .unwrap();
    }
    wait_until_embedded(&sandbox, Duration::from_secs(30)).await;
    // Pretend two entries came from an older model.
    sqlx::query(
        "UPDATE memories SET embedding_model = 'old-model' WHERE id IN (SELECT id FROM memories ORDER BY created_at LIMIT 2)",
    )
    .execute(&sandbox.pool)
    .await
    .unwrap();

    let response = sandbox
        .ingest
        .reembed(engram_proto::v1::ReembedRequest {
            scope: Some(scope.clone()),
            only_other_models: true,
            all_spaces: false,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(response.queued, 2);
    assert_eq!(response.model, "sentence-transformers/all-MiniLM-L6-v2");
    // Queued entries keep their old embedding (still searchable) until the new one lands.
    let searchable: i64 = sqlx::query_scalar("SELECT count(*) FROM memory_embeddings")
        .fetch_one(&sandbox.pool)
        .await
        .unwrap();
    assert_eq!(searchable, 3);
    wait_until_embedded(&sandbox, Duration::from_secs(30)).await;
    let old: i64 =
        sqlx::query_scalar("SELECT count(*) FROM memories WHERE embedding_model = 'old-model'")
            .fetch_one(&sandbox.pool)
            .await
            .unwrap();
    assert_eq!(old, 0);

    // An empty request re-flagged the whole store (every tenant); it names nothing, so it is
    // refused and queues nothing.
    let empty = sandbox
        .ingest
        .reembed(engram_proto::v1::ReembedRequest::default())
        .await
        .unwrap_err();
    assert_eq!(empty.code(), tonic::Code::InvalidArgument, "{empty:?}");
    let flagged: i64 = sqlx::query_scalar("SELECT count(*) FROM memories WHERE needs_embedding")
        .fetch_one(&sandbox.pool)
        .await
        .unwrap();
    assert_eq!(flagged, 0);
    // Every space at once is an admin operation, asked for explicitly; with open access every
    // caller is trusted.
    let all = sandbox
        .ingest
        .reembed(engram_proto::v1::ReembedRequest {
            scope: None,
            only_other_models: false,
            all_spaces: true,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(all.queued, 3);
}
