//! Request builders shared by the API tests.

use std::time::{Duration, Instant};

use engram_e2e::Sandbox;
use engram_proto::v1;
use tonic::{Code, Status};
use uuid::Uuid;

/// A scope of a fresh user.
pub(crate) fn new_scope(space: &str) -> v1::Scope {
    v1::Scope {
        user_id: Uuid::new_v4().to_string(),
        space: space.to_owned(),
    }
}

pub(crate) fn remember(scope: &v1::Scope, text: &str) -> v1::RememberRequest {
    v1::RememberRequest {
        scope: Some(scope.clone()),
        text: text.to_owned(),
        ..Default::default()
    }
}

pub(crate) fn outcome(response: &v1::RememberResponse) -> v1::RememberOutcome {
    v1::RememberOutcome::try_from(response.outcome).expect("known outcome")
}

pub(crate) fn audit_actions(events: &[v1::AuditEvent]) -> Vec<v1::AuditAction> {
    events
        .iter()
        .map(|event| v1::AuditAction::try_from(event.action).expect("known action"))
        .collect()
}

/// Holds a space's locks (`access`) on a connection of the test's own until the transaction
/// ends.
pub(crate) async fn hold_space_lock(
    pool: &sqlx::PgPool,
    access: engram_store::SpaceAccess,
    scope: &v1::Scope,
) -> sqlx::Transaction<'static, sqlx::Postgres> {
    let core_scope = engram_core::Scope::parse("scope", &scope.user_id, &scope.space).unwrap();
    engram_store::begin_with_spaces_locked(pool, access, [&core_scope])
        .await
        .unwrap()
}

/// Asserts a status code and that the message mentions `needle`.
#[track_caller]
pub(crate) fn assert_status(status: Status, code: Code, needle: &str) {
    assert_eq!(status.code(), code, "unexpected status: {status:?}");
    assert!(
        status.message().contains(needle),
        "message {:?} should mention {needle:?}",
        status.message()
    );
}

/// Sends a Remember and returns its answer.
pub(crate) async fn remember_response(
    sandbox: &mut Sandbox,
    request: v1::RememberRequest,
) -> v1::RememberResponse {
    sandbox.ingest.remember(request).await.unwrap().into_inner()
}

/// Remembers a text and returns the stored (created or merged) memory.
pub(crate) async fn remember_memory(
    sandbox: &mut Sandbox,
    scope: &v1::Scope,
    text: &str,
) -> v1::Memory {
    remember_response(sandbox, remember(scope, text))
        .await
        .memory
        .expect("a stored memory")
}

/// Every entry of the space, newest first (one page).
pub(crate) async fn entries(sandbox: &mut Sandbox, scope: &v1::Scope) -> Vec<v1::Memory> {
    let request = v1::ListEntriesRequest {
        scope: Some(scope.clone()),
        ..Default::default()
    };
    sandbox
        .retrieval
        .list_entries(request)
        .await
        .unwrap()
        .into_inner()
        .entries
}

/// Pins an entry of the space and returns it as Pin answers.
pub(crate) async fn pin(sandbox: &mut Sandbox, scope: &v1::Scope, memory_id: &str) -> v1::Memory {
    sandbox
        .ingest
        .pin(v1::PinRequest {
            scope: Some(scope.clone()),
            memory_id: memory_id.to_owned(),
        })
        .await
        .unwrap()
        .into_inner()
        .memory
        .unwrap()
}

pub(crate) async fn space_settings(sandbox: &mut Sandbox, scope: &v1::Scope) -> v1::SpaceSettings {
    let request = v1::GetSettingsRequest {
        scope: Some(scope.clone()),
    };
    sandbox
        .ingest
        .get_settings(request)
        .await
        .unwrap()
        .into_inner()
        .settings
        .expect("settings")
}

/// One setting of a space, as UpdateSettings changes it (the others keep their value).
pub(crate) enum Setting {
    MemoryEnabled(bool),
    IncognitoDefault(bool),
    SoftCap(u32),
}

/// Changes one setting of the space and returns the space's settings after the change.
pub(crate) async fn update_setting(
    sandbox: &mut Sandbox,
    scope: &v1::Scope,
    setting: Setting,
) -> v1::SpaceSettings {
    let mut request = v1::UpdateSettingsRequest {
        scope: Some(scope.clone()),
        ..Default::default()
    };
    match setting {
        Setting::MemoryEnabled(on) => request.memory_enabled = Some(on),
        Setting::IncognitoDefault(on) => request.incognito_default = Some(on),
        Setting::SoftCap(cap) => request.soft_cap = Some(cap),
    }
    sandbox
        .ingest
        .update_settings(request)
        .await
        .unwrap()
        .into_inner()
        .settings
        .expect("settings")
}

/// Starts incognito for a conversation of the space.
pub(crate) async fn start_incognito(sandbox: &mut Sandbox, scope: &v1::Scope, conversation: &str) {
    let request = v1::StartIncognitoRequest {
        scope: Some(scope.clone()),
        conversation_id: conversation.to_owned(),
    };
    sandbox.ingest.start_incognito(request).await.unwrap();
}

/// Ends incognito for a conversation of the space.
pub(crate) async fn end_incognito(sandbox: &mut Sandbox, scope: &v1::Scope, conversation: &str) {
    let request = v1::EndIncognitoRequest {
        scope: Some(scope.clone()),
        conversation_id: conversation.to_owned(),
    };
    sandbox.ingest.end_incognito(request).await.unwrap();
}

/// The space's audit trail, newest first (one page).
pub(crate) async fn audit(sandbox: &mut Sandbox, scope: &v1::Scope) -> Vec<v1::AuditEvent> {
    let request = v1::ListAuditRequest {
        scope: Some(scope.clone()),
        ..Default::default()
    };
    sandbox
        .ingest
        .list_audit(request)
        .await
        .unwrap()
        .into_inner()
        .events
}

/// Waits until no entry needs an embedding (or fails the test after `limit`).
pub(crate) async fn wait_until_embedded(sandbox: &Sandbox, limit: Duration) {
    let started = Instant::now();
    loop {
        let pending: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM memories WHERE needs_embedding AND embedding_failures < 5",
        )
        .fetch_one(&sandbox.pool)
        .await
        .unwrap();
        if pending == 0 {
            return;
        }
        assert!(
            started.elapsed() < limit,
            "{pending} entries still need an embedding after {limit:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The soft cap's narrow table (`memory_retention`, kept by triggers) agrees with `memories`:
/// one row per entry, with the entry's importance and protection, and a cached total and time
/// read from its own cached scores (which retrievals write there alone).
pub(crate) async fn assert_retention_in_step(pool: &sqlx::PgPool) {
    let disagreements: Vec<(Option<Uuid>, Option<Uuid>)> = sqlx::query_as(
        // A cached score counts only when both its total and its time are there (a malformed one
        // is missing, and the soft cap recomputes it): the schema's own reading of last_scores.
        "SELECT m.id, r.memory_id FROM memories m FULL JOIN memory_retention r ON r.user_id = m.user_id AND r.memory_id = m.id \
         WHERE m.id IS NULL OR r.memory_id IS NULL \
            OR r.user_id <> m.user_id OR r.space <> m.space OR r.created_at <> m.created_at \
            OR r.importance <> m.importance OR r.protected <> (m.pinned OR m.manually_saved) \
            OR r.last_total IS DISTINCT FROM engram_cached_total(r.last_scores) \
            OR r.last_scored_at IS DISTINCT FROM engram_cached_at(r.last_scores)",
    )
    .fetch_all(pool)
    .await
    .unwrap();
    assert!(
        disagreements.is_empty(),
        "memory_retention out of step with memories: {disagreements:?}"
    );
}

/// Imports entries into the space and returns the answer.
pub(crate) async fn import(
    sandbox: &mut Sandbox,
    scope: &v1::Scope,
    memories: Vec<v1::ImportedMemory>,
) -> v1::ImportMemoriesResponse {
    sandbox
        .ingest
        .import_memories(v1::ImportMemoriesRequest {
            scope: Some(scope.clone()),
            memories,
            context_turns: None,
        })
        .await
        .unwrap()
        .into_inner()
}

/// A fact to import, made at `created_seconds` (Unix time).
pub(crate) fn imported_fact(
    client_id: &str,
    text: &str,
    created_seconds: i64,
) -> v1::ImportedMemory {
    v1::ImportedMemory {
        client_id: client_id.to_owned(),
        kind: v1::MemoryKind::Semantic.into(),
        text: text.to_owned(),
        created_at: Some(prost_types::Timestamp {
            seconds: created_seconds,
            nanos: 0,
        }),
        ..Default::default()
    }
}

/// Every memory ExportSpace streams for the space, in order.
pub(crate) async fn export_all(
    sandbox: &mut Sandbox,
    scope: &v1::Scope,
) -> Vec<v1::ExportedMemory> {
    let mut stream = sandbox
        .retrieval
        .export_space(v1::ExportSpaceRequest {
            scope: Some(scope.clone()),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let mut exported = Vec::new();
    while let Some(page) = stream.message().await.expect("a message a client can read") {
        exported.extend(page.memories);
    }
    exported
}

/// Removes a test's exchanges and queues from the broker.
pub(crate) async fn delete_topology(bus: &engram_e2e::TestBus) {
    engram_testkit::drop_topology(&bus.url, &bus.topology_prefix)
        .await
        .unwrap();
}

/// The payload of the next message in one of the test's queues (`review.segment-closed`, say),
/// taken off the queue; fails after 20 s without one.
pub(crate) async fn next_event(bus: &engram_e2e::TestBus, queue: &str) -> Vec<u8> {
    let connection = lapin::Connection::connect(&bus.url, Default::default())
        .await
        .unwrap();
    let channel = connection.create_channel().await.unwrap();
    let name = engram_bus::Topology::new(bus.topology_prefix.clone()).queue(queue);
    let waited = Instant::now();
    loop {
        let got = channel
            .basic_get(
                name.clone().into(),
                lapin::options::BasicGetOptions { no_ack: true },
            )
            .await
            .unwrap();
        if let Some(message) = got {
            return message.delivery.data;
        }
        assert!(
            waited.elapsed() < Duration::from_secs(20),
            "no message in {name} after 20 s"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
