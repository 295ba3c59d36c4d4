//! Readiness follows the database: a service whose database does not answer reports its named
//! service NOT_SERVING (Kubernetes takes it out of the endpoints), while the overall status, which
//! liveness probes read, stays SERVING (restarting would not bring the database back).

use std::time::{Duration, Instant};

use engram_e2e::{Sandbox, SandboxOptions};
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

const SERVICES: [&str; 3] = [
    "engram.v1.IngestService",
    "engram.v1.RetrievalService",
    "engram.v1.ReviewService",
];

async fn status_of(sandbox: &Sandbox, index: usize, service: &str) -> ServingStatus {
    let mut health = HealthClient::new(sandbox.services[index].channel().await);
    let status = health
        .check(HealthCheckRequest {
            service: service.to_owned(),
        })
        .await
        .unwrap()
        .into_inner()
        .status;
    ServingStatus::try_from(status).unwrap()
}

/// Waits until every service reports `expected` for its own name.
async fn wait_for(sandbox: &Sandbox, expected: ServingStatus) {
    let deadline = Instant::now() + Duration::from_secs(15);
    for (index, service) in SERVICES.iter().enumerate() {
        loop {
            let status = status_of(sandbox, index, service).await;
            if status == expected {
                break;
            }
            assert!(Instant::now() < deadline, "{service} stayed {status:?}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

#[tokio::test]
async fn readiness_follows_the_database_and_liveness_does_not() {
    let sandbox = Sandbox::start_with(SandboxOptions {
        database_proxy: true,
        ..Default::default()
    })
    .await;
    wait_for(&sandbox, ServingStatus::Serving).await;
    let proxy = sandbox.database_proxy.as_ref().unwrap();

    proxy.cut();
    wait_for(&sandbox, ServingStatus::NotServing).await;
    for index in 0..SERVICES.len() {
        assert_eq!(
            status_of(&sandbox, index, "").await,
            ServingStatus::Serving,
            "liveness"
        );
    }

    proxy.restore().await.unwrap();
    wait_for(&sandbox, ServingStatus::Serving).await;
}
