//! Each service's Prometheus endpoint: after a little traffic, `GET /metrics` on its own port
//! shows the requests per RPC and status code, their latency, the pool's connections and the
//! service's own counters.

use std::net::SocketAddr;

use engram_e2e::Sandbox;
use engram_proto::v1;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

use crate::helpers::{new_scope, remember};

/// What `curl http://addr/metrics` prints: the status line and the body.
async fn scrape(addr: SocketAddr) -> (String, String) {
    http_get(addr, "/metrics").await
}

/// The status line and body of `GET path` on `addr`.
async fn http_get(addr: SocketAddr, path: &str) -> (String, String) {
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream
        .write_all(format!("GET {path} HTTP/1.0\r\nHost: engram\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).await.unwrap();
    let (head, body) = answer.split_once("\r\n\r\n").expect("headers and body");
    (
        head.lines().next().unwrap_or_default().to_owned(),
        body.to_owned(),
    )
}

/// The sample of `metric` whose labels include all of `labels`, if there is one.
fn sample(body: &str, metric: &str, labels: &[&str]) -> Option<f64> {
    body.lines()
        .filter(|line| line.starts_with(metric) && !line.starts_with('#'))
        .find(|line| labels.iter().all(|label| line.contains(label)))
        .and_then(|line| line.rsplit(' ').next())
        .and_then(|value| value.parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_service_serves_its_metrics_to_prometheus() {
    let mut sandbox = Sandbox::start().await;
    let scope = new_scope("work");
    for text in ["The standup moved to 9:30", "The standup moved to 9:30"] {
        sandbox
            .ingest
            .remember(remember(&scope, text))
            .await
            .unwrap();
    }
    sandbox
        .retrieval
        .retrieve_memory(v1::RetrieveMemoryRequest {
            scope: Some(scope.clone()),
            query: "standup".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    let refused = sandbox
        .ingest
        .forget(v1::ForgetRequest {
            scope: Some(scope.clone()),
            memory_id: "not-a-uuid".into(),
        })
        .await;
    assert!(refused.is_err());

    for service in &sandbox.services {
        let (status, body) = scrape(service.metrics_addr).await;
        assert!(status.contains("200"), "{status}");
        assert!(
            sample(&body, "engram_db_pool_connections", &["state=\"in_use\""]).is_some(),
            "the pool gauge on {}:\n{body}",
            service.metrics_addr
        );
    }
    // Retrieval's searches go through a read-only pool of their own, counted apart.
    let (_, retrieval) = scrape(sandbox.retrieval_service().metrics_addr).await;
    for pool in ["pool=\"main\"", "pool=\"reads\""] {
        assert!(
            sample(
                &retrieval,
                "engram_db_pool_connections",
                &[pool, "state=\"idle\""]
            )
            .is_some(),
            "{pool} in:\n{retrieval}"
        );
    }
    let (_, ingest) = scrape(sandbox.ingest_service().metrics_addr).await;
    let remembered = sample(
        &ingest,
        "engram_rpc_requests_total",
        &[
            "/engram.v1.IngestService/Remember",
            "rpc_grpc_status_code=\"0\"",
        ],
    );
    assert_eq!(remembered, Some(2.0), "{ingest}");
    let invalid = sample(
        &ingest,
        "engram_rpc_requests_total",
        &[
            "/engram.v1.IngestService/Forget",
            "rpc_grpc_status_code=\"3\"",
        ],
    );
    assert_eq!(invalid, Some(1.0), "InvalidArgument is code 3: {ingest}");
    assert!(
        sample(
            &ingest,
            "engram_rpc_duration_seconds_count",
            &["/engram.v1.IngestService/Remember"]
        )
        .is_some_and(|count| count >= 2.0),
        "{ingest}"
    );
    assert_eq!(
        sample(&ingest, "engram_ingest_memories_created_total", &[]),
        Some(1.0)
    );
    assert_eq!(
        sample(&ingest, "engram_ingest_dedupe_merges_total", &[]),
        Some(1.0)
    );
    assert!(
        sample(
            &ingest,
            "engram_retrieval_requests_total",
            // No embedder here: BM25 alone answered, a fallback from the hybrid search.
            &["path=\"bm25\"", "fallback=\"true\""]
        )
        .is_some(),
        "retrieval paths: {ingest}"
    );
    let (_, retrieval) = scrape(sandbox.services[1].metrics_addr).await;
    assert!(
        sample(
            &retrieval,
            "engram_rpc_requests_total",
            &["/engram.v1.RetrievalService/RetrieveMemory"]
        )
        .is_some(),
        "{retrieval}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_is_served_over_http_for_probes_that_cannot_speak_grpc() {
    let sandbox = Sandbox::start().await;
    let services = [
        "engram.v1.IngestService",
        "engram.v1.RetrievalService",
        "engram.v1.ReviewService",
    ];
    for (service, name) in sandbox.services.iter().zip(services) {
        let (status, body) = http_get(service.metrics_addr, "/healthz").await;
        assert!(status.contains("200"), "{status}");
        assert_eq!(body, "SERVING\n");
        let (status, _) = http_get(service.metrics_addr, &format!("/healthz?service={name}")).await;
        assert!(status.contains("200"), "{name}: {status}");
        let (status, body) =
            http_get(service.metrics_addr, "/healthz?service=engram.v1.Nothing").await;
        assert!(status.contains("404"), "{status}");
        assert_eq!(body, "SERVICE_UNKNOWN\n");
    }
}
