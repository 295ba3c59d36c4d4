//! Bearer tokens: required when configured, limited by user and space; health and reflection open.

use engram_e2e::{Sandbox, SandboxOptions};
use engram_proto::v1;
use tonic::Code;
use tonic::metadata::MetadataValue;
use tonic_health::pb::health_client::HealthClient;
use uuid::Uuid;

use crate::helpers::{assert_status, new_scope, remember};

const ADMIN_TOKEN: &str = "admin-token-0123456789";
const CRM_TOKEN: &str = "crm-token-0123456789ab";
const PLATFORM_TOKEN: &str = "platform-token-0123456789";

/// The sandbox's services, in the order of `Sandbox::services`.
const SERVICES: [&str; 3] = [
    "engram.v1.IngestService",
    "engram.v1.RetrievalService",
    "engram.v1.ReviewService",
];

fn authorized<T>(message: T, token: &str) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    let value: MetadataValue<_> = format!("Bearer {token}").parse().unwrap();
    request.metadata_mut().insert("authorization", value);
    request
}

#[tokio::test]
async fn tokens_are_required_and_limited_to_their_grant() {
    let crm_user = Uuid::new_v4();
    let dir = std::env::temp_dir().join(format!("engram-tokens-{}", Uuid::new_v4()));
    std::fs::create_dir_all(&dir).unwrap();
    let tokens_file = dir.join("tokens.json");
    std::fs::write(
        &tokens_file,
        serde_json::json!({ "tokens": [
            { "name": "admin", "token": ADMIN_TOKEN, "admin": true },
            { "name": "platform", "token": PLATFORM_TOKEN },
            { "name": "crm", "token": CRM_TOKEN, "users": [crm_user], "spaces": ["crm"] },
        ]})
        .to_string(),
    )
    .unwrap();
    let mut sandbox = Sandbox::start_with(SandboxOptions {
        tokens_file: Some(tokens_file),
        ..Default::default()
    })
    .await;
    let crm_scope = v1::Scope {
        user_id: crm_user.to_string(),
        space: "crm".into(),
    };

    // No token, a malformed header, an unknown token: Unauthenticated.
    let missing = sandbox
        .ingest
        .remember(remember(&crm_scope, "x marks the spot"))
        .await
        .unwrap_err();
    assert_status(missing, Code::Unauthenticated, "Bearer");
    let unknown = sandbox
        .ingest
        .remember(authorized(remember(&crm_scope, "x marks the spot"), "nope"))
        .await
        .unwrap_err();
    assert_status(unknown, Code::Unauthenticated, "unknown bearer token");

    // Within the grant: allowed. Another space or user: PermissionDenied, on every service.
    sandbox
        .ingest
        .remember(authorized(
            remember(&crm_scope, "the client prefers email"),
            CRM_TOKEN,
        ))
        .await
        .unwrap();
    let other_space = v1::Scope {
        space: "hr".into(),
        ..crm_scope.clone()
    };
    let denied = sandbox
        .ingest
        .remember(authorized(
            remember(&other_space, "salary review"),
            CRM_TOKEN,
        ))
        .await
        .unwrap_err();
    assert_status(denied, Code::PermissionDenied, "not granted space");
    let other_user = new_scope("crm");
    let denied = sandbox
        .retrieval
        .list_entries(authorized(
            v1::ListEntriesRequest {
                scope: Some(other_user.clone()),
                ..Default::default()
            },
            CRM_TOKEN,
        ))
        .await
        .unwrap_err();
    assert_status(denied, Code::PermissionDenied, "not granted user");
    let denied = sandbox
        .review
        .get_memory_state(authorized(
            v1::GetMemoryStateRequest {
                scope: Some(other_user.clone()),
                memory_id: Uuid::new_v4().to_string(),
            },
            CRM_TOKEN,
        ))
        .await
        .unwrap_err();
    assert_eq!(denied.code(), Code::PermissionDenied);

    // An unrestricted token reaches any scope.
    sandbox
        .ingest
        .remember(authorized(
            remember(&other_user, "anything goes"),
            ADMIN_TOKEN,
        ))
        .await
        .unwrap();
    let listed = sandbox
        .retrieval
        .list_entries(authorized(
            v1::ListEntriesRequest {
                scope: Some(crm_scope.clone()),
                ..Default::default()
            },
            ADMIN_TOKEN,
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(listed.entries.len(), 1);

    // Re-embedding every space needs an admin token, and saying so; any token may re-embed a
    // space it reaches.
    let every_space = v1::ReembedRequest {
        scope: None,
        only_other_models: false,
        all_spaces: true,
    };
    for token in [CRM_TOKEN, PLATFORM_TOKEN] {
        let denied = sandbox
            .ingest
            .reembed(authorized(every_space.clone(), token))
            .await
            .unwrap_err();
        assert_status(denied, Code::PermissionDenied, "needs an admin token");
    }
    sandbox
        .ingest
        .reembed(authorized(every_space, ADMIN_TOKEN))
        .await
        .unwrap();
    let no_scope = sandbox
        .ingest
        .reembed(authorized(v1::ReembedRequest::default(), ADMIN_TOKEN))
        .await
        .unwrap_err();
    assert_status(no_scope, Code::InvalidArgument, "scope: is required");
    sandbox
        .ingest
        .reembed(authorized(
            v1::ReembedRequest {
                scope: Some(crm_scope.clone()),
                ..Default::default()
            },
            CRM_TOKEN,
        ))
        .await
        .unwrap();

    // Health needs no token (Kubernetes probes).
    let mut health = HealthClient::new(sandbox.ingest_service().channel().await);
    let status = health
        .check(tonic_health::pb::HealthCheckRequest {
            service: "engram.v1.IngestService".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        status.status,
        tonic_health::pb::health_check_response::ServingStatus::Serving as i32
    );
    std::fs::remove_dir_all(dir).unwrap();
}

#[tokio::test]
async fn every_service_reports_serving_and_stops_gracefully() {
    let mut sandbox = Sandbox::start().await;
    for (index, name) in SERVICES.into_iter().enumerate() {
        let mut health = HealthClient::new(sandbox.services[index].channel().await);
        for service in ["", name] {
            let status = health
                .check(tonic_health::pb::HealthCheckRequest {
                    service: service.into(),
                })
                .await
                .unwrap()
                .into_inner();
            assert_eq!(
                status.status,
                tonic_health::pb::health_check_response::ServingStatus::Serving as i32,
                "{service:?}"
            );
        }
    }
    let ingest = sandbox.services.remove(0);
    ingest.stop().await.expect("graceful stop");
    assert!(
        sandbox
            .ingest
            .remember(remember(&new_scope("work"), "after shutdown"))
            .await
            .is_err()
    );
}

/// The services a server's reflection lists (what `grpcurl list` shows).
async fn listed_services(channel: tonic::transport::Channel) -> Vec<String> {
    use tonic_reflection::pb::v1alpha::ServerReflectionRequest;
    use tonic_reflection::pb::v1alpha::server_reflection_client::ServerReflectionClient;
    use tonic_reflection::pb::v1alpha::server_reflection_request::MessageRequest;
    use tonic_reflection::pb::v1alpha::server_reflection_response::MessageResponse;

    let request = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    };
    let mut responses = ServerReflectionClient::new(channel)
        .server_reflection_info(tokio_stream::once(request))
        .await
        .unwrap()
        .into_inner();
    let response = responses.message().await.unwrap().expect("a response");
    match response.message_response {
        Some(MessageResponse::ListServicesResponse(list)) => {
            let mut names: Vec<String> = list.service.into_iter().map(|s| s.name).collect();
            names.sort();
            names
        }
        other => panic!("expected a list of services, got {other:?}"),
    }
}

#[tokio::test]
async fn reflection_lists_only_the_services_each_server_serves() {
    let sandbox = Sandbox::start().await;
    for (index, name) in SERVICES.into_iter().enumerate() {
        let listed = listed_services(sandbox.services[index].channel().await).await;
        assert_eq!(
            listed,
            [
                name,
                "grpc.health.v1.Health",
                "grpc.reflection.v1.ServerReflection",
                "grpc.reflection.v1alpha.ServerReflection",
            ],
            "{name}"
        );
    }
}
