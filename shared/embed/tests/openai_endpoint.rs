//! The OpenAI-compatible embedder against a local HTTP server that speaks `/v1/embeddings`:
//! batching, ordering, retries on 5xx and 429 with Retry-After, and giving up.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use axum::Json;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use engram_embed::{EmbedError, Embedder, OpenAiEmbedder, OpenAiSettings};
use serde_json::{Value, json};

const DIMENSION: usize = 8;

/// How the fake endpoint behaves for the first `failures` requests.
#[derive(Clone, Copy)]
enum Failure {
    None,
    ServerError,
    RateLimited { retry_after_secs: u64 },
    WrongDimension,
}

#[derive(Clone)]
struct Fake {
    failure: Failure,
    failures: usize,
    requests: Arc<AtomicUsize>,
    batch_sizes: Arc<std::sync::Mutex<Vec<usize>>>,
}

/// A deterministic vector for a text: its length and first byte, so tests can check ordering.
fn vector_for(text: &str) -> Vec<f32> {
    let mut vector = vec![0.0; DIMENSION];
    vector[0] = text.len() as f32;
    vector[1] = f32::from(text.as_bytes().first().copied().unwrap_or(0));
    vector[2] = 1.0;
    vector
}

async fn embeddings(
    State(fake): State<Fake>,
    headers: HeaderMap,
    Json(body): Json<Value>,
) -> Response {
    let attempt = fake.requests.fetch_add(1, Ordering::SeqCst);
    assert_eq!(
        headers.get("authorization").and_then(|v| v.to_str().ok()),
        Some("Bearer test-key")
    );
    let inputs: Vec<String> = serde_json::from_value(body["input"].clone()).unwrap();
    fake.batch_sizes.lock().unwrap().push(inputs.len());
    if attempt < fake.failures {
        match fake.failure {
            Failure::None => {}
            Failure::ServerError => {
                return (StatusCode::SERVICE_UNAVAILABLE, "overloaded").into_response();
            }
            Failure::RateLimited { retry_after_secs } => {
                return (
                    StatusCode::TOO_MANY_REQUESTS,
                    [("retry-after", retry_after_secs.to_string())],
                    "slow down",
                )
                    .into_response();
            }
            Failure::WrongDimension => {
                let data: Vec<Value> = inputs
                    .iter()
                    .enumerate()
                    .map(|(i, _)| json!({"index": i, "embedding": [1.0, 2.0]}))
                    .collect();
                return Json(json!({"data": data})).into_response();
            }
        }
    }
    // Answer out of order: the client must place vectors by index.
    let mut data: Vec<Value> = inputs
        .iter()
        .enumerate()
        .map(|(i, text)| json!({"index": i, "embedding": vector_for(text)}))
        .collect();
    data.reverse();
    Json(json!({"object": "list", "data": data, "model": body["model"]})).into_response()
}

async fn start(failure: Failure, failures: usize) -> (String, Fake) {
    let fake = Fake {
        failure,
        failures,
        requests: Arc::new(AtomicUsize::new(0)),
        batch_sizes: Arc::new(std::sync::Mutex::new(Vec::new())),
    };
    let app = axum::Router::new()
        .route("/v1/embeddings", axum::routing::post(embeddings))
        .with_state(fake.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (format!("http://{address}"), fake)
}

fn embedder(base_url: String, max_retries: usize) -> OpenAiEmbedder {
    OpenAiEmbedder::new(OpenAiSettings {
        base_url,
        model: "test-embedder".into(),
        api_key: Some("test-key".to_owned().into()),
        dimension: DIMENSION,
        max_batch: 3,
        timeout: Duration::from_secs(5),
        max_retries,
        min_backoff: Duration::from_millis(10),
        max_backoff: Duration::from_millis(200),
    })
    .unwrap()
}

fn inputs(n: usize) -> Vec<String> {
    (0..n)
        .map(|i| format!("{}text number {i}", char::from(b'a' + i as u8)))
        .collect()
}

#[tokio::test]
async fn batches_requests_and_keeps_input_order() {
    let (url, fake) = start(Failure::None, 0).await;
    let texts = inputs(7);
    let vectors = embedder(url, 0).embed(&texts).await.unwrap();
    assert_eq!(*fake.batch_sizes.lock().unwrap(), vec![3, 3, 1]);
    for (text, vector) in texts.iter().zip(&vectors) {
        let expected = vector_for(text);
        let norm = expected.iter().map(|x| x * x).sum::<f32>().sqrt();
        assert!(
            (vector[0] - expected[0] / norm).abs() < 1e-6,
            "{text}: vectors are placed by index and normalized"
        );
        assert!((vector[1] - expected[1] / norm).abs() < 1e-6);
    }
}

#[tokio::test]
async fn retries_server_errors_then_succeeds() {
    let (url, fake) = start(Failure::ServerError, 2).await;
    let vectors = embedder(url, 3).embed(&inputs(2)).await.unwrap();
    assert_eq!(vectors.len(), 2);
    assert_eq!(fake.requests.load(Ordering::SeqCst), 3);
}

#[tokio::test]
async fn honours_retry_after_on_429() {
    let (url, fake) = start(
        Failure::RateLimited {
            retry_after_secs: 1,
        },
        1,
    )
    .await;
    let started = Instant::now();
    embedder(url, 2).embed(&inputs(1)).await.unwrap();
    assert_eq!(fake.requests.load(Ordering::SeqCst), 2);
    assert!(
        started.elapsed() >= Duration::from_millis(950),
        "waited {:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn gives_up_after_the_retry_budget() {
    let (url, fake) = start(Failure::ServerError, usize::MAX).await;
    let error = embedder(url, 2).embed(&inputs(1)).await.unwrap_err();
    assert!(
        matches!(error, EmbedError::Http { status: 503, .. }),
        "{error}"
    );
    assert!(error.is_retryable());
    assert_eq!(
        fake.requests.load(Ordering::SeqCst),
        3,
        "first attempt plus two retries"
    );
}

#[tokio::test]
async fn a_wrong_dimension_is_an_error_and_not_retried() {
    let (url, fake) = start(Failure::WrongDimension, 1).await;
    let error = embedder(url, 3).embed(&inputs(1)).await.unwrap_err();
    assert!(
        matches!(
            error,
            EmbedError::Dimension {
                expected: DIMENSION,
                actual: 2
            }
        ),
        "{error}"
    );
    assert_eq!(fake.requests.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn an_unreachable_endpoint_is_retryable() {
    // A port nothing listens on.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    drop(listener);
    let error = embedder(url, 1).embed(&inputs(1)).await.unwrap_err();
    assert!(matches!(error, EmbedError::Unreachable(_)), "{error}");
    assert!(error.is_retryable());
}
