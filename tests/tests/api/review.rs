//! The review service end to end: a conversation, a retrieval that records pending reviews, the
//! segment closing, the graded memories' FSRS state moving as their ratings say, the reviews in
//! the audit trail, and the same segment delivered again changing nothing.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use chrono::Utc;
use engram_bus::{Bus, OutgoingEvent, Topology};
use engram_e2e::{Sandbox, SandboxOptions, TestBus, TestEmbedder};
use engram_proto::v1;
use prost::Message as _;
use tonic::Code;
use uuid::Uuid;

use crate::conversations::{Chat, assistant, user};
use crate::helpers::{assert_status, audit, import};

/// Four past episodes about one trip, each to be rated differently, all found by one query.
fn trip_episodes(chat: &Chat) -> Vec<v1::ImportedMemory> {
    let reviewed = Utc::now() - chrono::Duration::days(3);
    ["Easy", "Good", "Hard", "Again"]
        .iter()
        .map(|rating| v1::ImportedMemory {
            client_id: rating.to_string(),
            kind: v1::MemoryKind::Episodic.into(),
            title: format!("{rating} Lisbon trip notes"),
            text: format!("The user talked about the Lisbon trip ({rating})"),
            conversation_id: Uuid::new_v4().to_string(),
            created_at: Some(engram_server::time::to_proto(reviewed)),
            fsrs: Some(v1::FsrsState {
                stability: 2.3065,
                difficulty: 5.0,
                last_reviewed_at: Some(engram_server::time::to_proto(reviewed)),
            }),
            ..Default::default()
        })
        .chain(std::iter::once(v1::ImportedMemory {
            client_id: "fact".into(),
            kind: v1::MemoryKind::Semantic.into(),
            text: "The user's Lisbon trip is in May".into(),
            ..Default::default()
        }))
        .map(|mut memory| {
            memory.client_id = format!("{}-{}", chat.id, memory.client_id);
            memory
        })
        .collect()
}

/// Retrieves for the conversation (recording the pending review), appends the rest of the
/// segment and closes it; returns the retrieved episodes by title.
async fn converse_and_close(sandbox: &mut Sandbox, chat: &Chat) -> HashMap<String, String> {
    let start = Utc::now() - chrono::Duration::minutes(10);
    chat.append(
        sandbox,
        vec![user("I'm thinking about the Lisbon trip again.", start)],
    )
    .await;
    let answer = sandbox
        .retrieval
        .retrieve_memory(v1::RetrieveMemoryRequest {
            scope: Some(chat.scope.clone()),
            query: "Lisbon trip".into(),
            conversation_id: chat.id.clone(),
            episodic_limit: Some(4),
            ranking: Some(v1::RankingOptions {
                sparse_only: true,
                ..Default::default()
            }),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(answer.episodic.len(), 4, "{}", answer.markdown);
    chat.append(
        sandbox,
        vec![
            assistant(
                "Your Lisbon trip notes say you loved the trams; shall we plan the same route?",
                start + chrono::Duration::minutes(1),
            ),
            user(
                "Yes, the trams again please.",
                start + chrono::Duration::minutes(2),
            ),
        ],
    )
    .await;
    chat.close(sandbox).await;
    answer
        .episodic
        .iter()
        .map(|m| {
            let memory = m.memory.as_ref().unwrap();
            (memory.title.clone(), memory.id.clone())
        })
        .collect()
}

async fn wait_for_reviews(sandbox: &Sandbox, expected: i64) {
    let deadline = Instant::now() + Duration::from_secs(40);
    loop {
        let applied: i64 = sqlx::query_scalar("SELECT count(*) FROM applied_reviews")
            .fetch_one(&sandbox.pool)
            .await
            .unwrap();
        if applied >= expected {
            assert_eq!(applied, expected);
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{applied} of {expected} reviews after 40 s"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A SegmentClosed for `chat`, as the ingest service would publish it: the assistant's turn that
/// used the Lisbon notes, and one query that retrieved `memory_ids`.
fn segment_closed(
    chat: &Chat,
    segment_id: Uuid,
    reviewed_at: chrono::DateTime<Utc>,
    memory_ids: impl IntoIterator<Item = String>,
) -> v1::SegmentClosed {
    v1::SegmentClosed {
        scope: Some(chat.scope.clone()),
        conversation_id: chat.id.clone(),
        segment_id: segment_id.to_string(),
        reviewed_at: Some(engram_server::time::to_proto(reviewed_at)),
        context: vec![v1::Message {
            role: v1::SpeakerRole::Assistant.into(),
            content: "Your Lisbon trip notes say you loved the trams".into(),
        }],
        pending_reviews: vec![v1::PendingReview {
            query: "Lisbon trip".into(),
            memory_ids: memory_ids.into_iter().collect(),
            retrieved_at: None,
        }],
        ..Default::default()
    }
}

/// Publishes `event` to the review service's queue, as the outbox relay would; returns the
/// connection, to be closed by the caller.
async fn publish_segment_closed(bus: &TestBus, event: v1::SegmentClosed) -> Bus {
    let broker = Bus::connect(&bus.url, Topology::new(bus.topology_prefix.clone()))
        .await
        .unwrap();
    broker
        .publisher()
        .await
        .unwrap()
        .publish(&OutgoingEvent {
            routing_key: engram_bus::queues::routes::SEGMENT_CLOSED.into(),
            message_id: Uuid::new_v4(),
            type_name: engram_bus::queues::routes::SEGMENT_CLOSED_TYPE.into(),
            payload: event.encode_to_vec(),
            trace_headers: Default::default(),
        })
        .await
        .unwrap();
    broker
}

async fn stability(sandbox: &mut Sandbox, scope: &v1::Scope, id: &str) -> (f64, f64) {
    let state = sandbox
        .review
        .get_memory_state(v1::GetMemoryStateRequest {
            scope: Some(scope.clone()),
            memory_id: id.to_owned(),
        })
        .await
        .unwrap()
        .into_inner()
        .fsrs
        .unwrap();
    (state.stability, state.difficulty)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closed_segment_is_graded_and_each_rating_moves_fsrs_state_once() {
    let llm = engram_testkit::FakeLlm::start().await;
    llm.set_responder(|request| {
        let task = request["response_format"]["json_schema"]["name"]
            .as_str()
            .unwrap_or("");
        let asked = request["messages"][1]["content"]
            .as_str()
            .unwrap_or("")
            .to_owned();
        if task == "memory_review" {
            // Rate each memory by the word its title starts with.
            let mut ratings = Vec::new();
            let mut label = String::new();
            for line in asked.lines() {
                if let Some(found) = line.strip_prefix("### ") {
                    label = found.to_owned();
                }
                if let Some(title) = line.strip_prefix("**Title:** ") {
                    let rating = title.split_whitespace().next().unwrap().to_lowercase();
                    ratings.push(serde_json::json!({"memory": label, "rating": rating}));
                }
            }
            ratings.push(serde_json::json!({"memory": "M42", "rating": "easy"}));
            return engram_testkit::FakeAnswer::Json(serde_json::json!({ "ratings": ratings }));
        }
        engram_testkit::FakeAnswer::Json(serde_json::json!({
            "title": "Planning Lisbon again",
            "summary": "The user wants to repeat the Lisbon tram route.",
            "surprise": 0.2,
            "established": {"facts": [], "preferences": [], "decisions": [], "todos": [],
                            "goals": [], "entities": ["Lisbon"]}
        }))
    });
    let bus = TestBus::local();
    let mut sandbox = Sandbox::start_with(SandboxOptions {
        bus: Some(bus.clone()),
        llm_base_url: Some(llm.base_url()),
        ..Default::default()
    })
    .await;
    let chat = Chat::new("trips");
    import(&mut sandbox, &chat.scope, trip_episodes(&chat)).await;
    let retrieved = converse_and_close(&mut sandbox, &chat).await;
    wait_for_reviews(&sandbox, 4).await;

    let mut after = HashMap::new();
    for (title, id) in &retrieved {
        after.insert(
            title.split_whitespace().next().unwrap().to_owned(),
            stability(&mut sandbox, &chat.scope, id).await,
        );
    }
    let (easy, good, hard, again) = (after["Easy"], after["Good"], after["Hard"], after["Again"]);
    assert!(
        easy.0 > good.0 && good.0 > hard.0 && hard.0 > again.0,
        "stability after easy > good > hard > again: {after:?}"
    );
    assert!(again.0 < 2.3065, "again lowers stability: {after:?}");
    assert!(
        easy.1 < again.1,
        "easy lowers difficulty more than again: {after:?}"
    );
    assert_eq!(
        sandbox.review_metrics.counts().invented,
        1,
        "M42 was never given"
    );

    // Every rating is in the audit trail, with the state before and after.
    let reviews: Vec<v1::AuditEvent> = audit(&mut sandbox, &chat.scope)
        .await
        .into_iter()
        .filter(|e| e.action() == v1::AuditAction::Review)
        .collect();
    assert_eq!(reviews.len(), 4);
    assert!(
        reviews
            .iter()
            .all(|e| e.detail_json.contains("\"graded_by\":\"llm\"")
                && e.detail_json.contains("stability_after"))
    );

    let stats = sandbox
        .review
        .get_review_stats(v1::GetReviewStatsRequest {
            scope: Some(chat.scope.clone()),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!((stats.graded, stats.applied, stats.segments), (4, 4, 1));
    assert!((stats.again_share - 0.25).abs() < 1e-9);
    assert_eq!(stats.graded_by_llm, 4);

    // The same segment delivered again (a redelivery after a broker hiccup) changes nothing.
    let segment_id: Uuid = sqlx::query_scalar("SELECT DISTINCT segment_id FROM applied_reviews")
        .fetch_one(&sandbox.pool)
        .await
        .unwrap();
    let broker = publish_segment_closed(
        &bus,
        segment_closed(&chat, segment_id, Utc::now(), retrieved.values().cloned()),
    )
    .await;
    let deadline = Instant::now() + Duration::from_secs(30);
    while sandbox.review_metrics.counts().redelivered < 4 {
        assert!(
            Instant::now() < deadline,
            "the redelivery was never handled"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for (title, id) in &retrieved {
        let rating = title.split_whitespace().next().unwrap();
        assert_eq!(
            stability(&mut sandbox, &chat.scope, id).await,
            after[rating],
            "{rating} unchanged"
        );
    }
    wait_for_reviews(&sandbox, 4).await;
    broker.close().await;
    drop(sandbox);
    crate::helpers::delete_topology(&bus).await;
}

/// Without an LLM the local grader judges from what the assistant said: the memory the
/// assistant built its answer on is rated above the ones it never touched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_local_grader_rates_what_the_assistant_used_above_what_it_ignored() {
    let bus = TestBus::local();
    let mut sandbox = Sandbox::start_with(SandboxOptions {
        bus: Some(bus.clone()),
        embedder: TestEmbedder::Local,
        ..Default::default()
    })
    .await;
    let chat = Chat::new("local");
    let reviewed = Utc::now() - chrono::Duration::days(3);
    let episode = |key: &str, title: &str, text: &str| v1::ImportedMemory {
        client_id: key.into(),
        kind: v1::MemoryKind::Episodic.into(),
        title: title.into(),
        text: text.into(),
        conversation_id: Uuid::new_v4().to_string(),
        created_at: Some(engram_server::time::to_proto(reviewed)),
        fsrs: Some(v1::FsrsState {
            stability: 2.3065,
            difficulty: 5.0,
            last_reviewed_at: Some(engram_server::time::to_proto(reviewed)),
        }),
        ..Default::default()
    };
    import(
        &mut sandbox,
        &chat.scope,
        vec![
            episode(
                "knee",
                "Knee injury from running",
                "The user tore a meniscus while running and must avoid hills for two months",
            ),
            episode(
                "stocks",
                "Apple stock worries",
                "The user worried about their Apple shares dropping before earnings",
            ),
        ],
    )
    .await;
    let start = Utc::now() - chrono::Duration::minutes(10);
    chat.append(
        &mut sandbox,
        vec![user("Can you plan my running week?", start)],
    )
    .await;
    let answer = sandbox
        .retrieval
        .retrieve_memory(v1::RetrieveMemoryRequest {
            scope: Some(chat.scope.clone()),
            query: "running knee apple".into(),
            conversation_id: chat.id.clone(),
            ranking: Some(v1::RankingOptions {
                sparse_only: true,
                ..Default::default()
            }),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(answer.episodic.len(), 2, "{}", answer.markdown);
    chat.append(
        &mut sandbox,
        vec![
            assistant(
                "Since you tore your meniscus running, let's keep it flat: no hills for now, \
                 three easy runs on level ground, and stop if the knee hurts.",
                start + chrono::Duration::minutes(1),
            ),
            user(
                "Perfect, flat runs it is.",
                start + chrono::Duration::minutes(2),
            ),
        ],
    )
    .await;
    chat.close(&mut sandbox).await;
    wait_for_reviews(&sandbox, 2).await;
    let ratings: HashMap<String, String> = sqlx::query_as(
        "SELECT m.title, r.rating FROM applied_reviews r JOIN memories m ON m.id = r.memory_id",
    )
    .fetch_all(&sandbox.pool)
    .await
    .unwrap()
    .into_iter()
    .collect();
    let rank = |title: &str| engram_core::review::Rating::parse(&ratings[title]).unwrap();
    assert!(
        rank("Knee injury from running") >= engram_core::review::Rating::Good,
        "{ratings:?}"
    );
    assert_eq!(
        rank("Apple stock worries"),
        engram_core::review::Rating::Again,
        "{ratings:?}"
    );
    let graded_by: Vec<String> = sqlx::query_scalar("SELECT graded_by FROM applied_reviews")
        .fetch_all(&sandbox.pool)
        .await
        .unwrap();
    assert!(graded_by.iter().all(|g| g == "local"));

    // The segment's episode is embedded once, by the embedding consumer like every entry, and
    // the same transaction measures its surprise against the space's earlier episodes (the two
    // imported ones) and sets its initial FSRS state from it.
    let episode_id: Uuid = sqlx::query_scalar(
        "SELECT id FROM memories WHERE kind = 'episodic' AND conversation_id = $1",
    )
    .bind(Uuid::parse_str(&chat.id).unwrap())
    .fetch_one(&sandbox.pool)
    .await
    .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let (surprise, stability): (f64, f64) = loop {
        let settled: Option<(f64, f64)> = sqlx::query_as(
            "SELECT surprise, stability FROM memories \
             WHERE id = $1 AND NOT needs_embedding AND NOT surprise_pending",
        )
        .bind(episode_id)
        .fetch_optional(&sandbox.pool)
        .await
        .unwrap();
        if let Some(settled) = settled {
            break settled;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the episode was never embedded and measured"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    };
    let nearest: f64 = sqlx::query_scalar(
        "SELECT max(1 - (other.embedding <=> own.embedding))::float8 \
         FROM memory_embeddings own, memory_embeddings other \
         WHERE own.memory_id = $1 AND other.memory_id <> $1 AND other.kind = 'episodic' \
           AND other.user_id = own.user_id AND other.space = own.space",
    )
    .bind(episode_id)
    .fetch_one(&sandbox.pool)
    .await
    .unwrap();
    assert!(
        (surprise - (1.0 - nearest).clamp(0.0, 1.0)).abs() < 1e-9,
        "{surprise} {nearest}"
    );
    assert!(
        (surprise - engram_core::memory_state::NEUTRAL_SURPRISE).abs() > 1e-6,
        "measured, not left neutral: {surprise}"
    );
    let (expected_stability, _) = engram_core::memory_state::initial_state(surprise);
    assert!((stability - expected_stability).abs() < 1e-9, "{stability}");
    let embedded: i64 =
        sqlx::query_scalar("SELECT count(*) FROM memory_embeddings WHERE memory_id = $1")
            .bind(episode_id)
            .fetch_one(&sandbox.pool)
            .await
            .unwrap();
    assert_eq!(embedded, 1);
    drop(sandbox);
    crate::helpers::delete_topology(&bus).await;
}

/// GradeMemories: a dry run changes nothing; a real one applies; bad requests are precise.
#[tokio::test]
async fn grade_memories_on_request() {
    let mut sandbox = Sandbox::start().await;
    let chat = Chat::new("ops");
    import(&mut sandbox, &chat.scope, trip_episodes(&chat)).await;
    let listed = crate::helpers::entries(&mut sandbox, &chat.scope).await;
    let episode = listed
        .iter()
        .find(|m| m.kind() == v1::MemoryKind::Episodic)
        .unwrap();
    let fact = listed
        .iter()
        .find(|m| m.kind() == v1::MemoryKind::Semantic)
        .unwrap();
    let request = |dry_run: bool| v1::GradeMemoriesRequest {
        scope: Some(chat.scope.clone()),
        context: vec![v1::Message {
            role: v1::SpeakerRole::Assistant.into(),
            content: format!("Per your notes: {}", episode.text),
        }],
        memories: vec![
            v1::MemoryToGrade {
                memory_id: episode.id.clone(),
                queries: vec!["lisbon".into()],
            },
            v1::MemoryToGrade {
                memory_id: fact.id.clone(),
                queries: vec![],
            },
        ],
        dry_run,
        grader: v1::Grader::Local.into(),
    };
    let before = stability(&mut sandbox, &chat.scope, &episode.id).await;
    let dry = sandbox
        .review
        .grade_memories(request(true))
        .await
        .unwrap()
        .into_inner();
    assert!(dry.graded.iter().all(|g| !g.applied));
    assert_eq!(dry.graded[0].skipped_reason, "dry run");
    assert!(
        dry.graded[0].after.is_some(),
        "a dry run says what would change"
    );
    assert_eq!(
        stability(&mut sandbox, &chat.scope, &episode.id).await,
        before
    );
    let applied = sandbox
        .review
        .grade_memories(request(false))
        .await
        .unwrap()
        .into_inner();
    assert!(applied.graded[0].applied, "{:?}", applied.graded[0]);
    assert_eq!(applied.graded[0].graded_by, "local");
    assert!(!applied.graded[1].applied);
    assert!(
        applied.graded[1]
            .skipped_reason
            .contains("facts do not decay")
    );
    let applied_stability = stability(&mut sandbox, &chat.scope, &episode.id).await;
    assert_ne!(applied_stability, before);

    // With memory off nothing is learnt: the grades come back, nothing changes.
    crate::helpers::update_setting(
        &mut sandbox,
        &chat.scope,
        crate::helpers::Setting::MemoryEnabled(false),
    )
    .await;
    let paused = sandbox
        .review
        .grade_memories(request(false))
        .await
        .unwrap()
        .into_inner();
    assert!(!paused.graded[0].applied);
    assert_eq!(
        paused.graded[0].skipped_reason,
        "memory is off for this space: graded, nothing recorded"
    );
    assert_eq!(
        stability(&mut sandbox, &chat.scope, &episode.id).await,
        applied_stability
    );
    crate::helpers::update_setting(
        &mut sandbox,
        &chat.scope,
        crate::helpers::Setting::MemoryEnabled(true),
    )
    .await;

    let mut unknown = request(false);
    unknown.memories[0].memory_id = Uuid::new_v4().to_string();
    let status = sandbox.review.grade_memories(unknown).await.unwrap_err();
    assert_eq!(status.code(), Code::NotFound);
    let mut empty = request(false);
    empty.context.clear();
    let status = sandbox.review.grade_memories(empty).await.unwrap_err();
    assert_status(
        status,
        Code::InvalidArgument,
        "context: must hold 1 to 200 turns",
    );
    let mut llm = request(false);
    llm.grader = v1::Grader::Llm.into();
    let status = sandbox.review.grade_memories(llm).await.unwrap_err();
    assert_status(status, Code::FailedPrecondition, "no LLM is configured");
}

/// An LLM answering garbage: after the client's retry the local grader rates the memories, and
/// says so; configured to retry instead, the review fails with UNAVAILABLE (a bus message is then
/// retried later, and dead-lettered in the end).
#[tokio::test]
async fn a_failing_llm_falls_back_to_the_local_grader_or_fails_the_review() {
    let llm = engram_testkit::FakeLlm::start().await;
    llm.set_responder(|_| engram_testkit::FakeAnswer::RawContent("I'd rather not say".into()));
    let mut sandbox = Sandbox::start_with(SandboxOptions {
        llm_base_url: Some(llm.base_url()),
        ..Default::default()
    })
    .await;
    let chat = Chat::new("fallback");
    import(&mut sandbox, &chat.scope, trip_episodes(&chat)).await;
    let episode = crate::helpers::entries(&mut sandbox, &chat.scope)
        .await
        .into_iter()
        .find(|m| m.kind() == v1::MemoryKind::Episodic)
        .unwrap();
    let request = v1::GradeMemoriesRequest {
        scope: Some(chat.scope.clone()),
        context: vec![v1::Message {
            role: v1::SpeakerRole::Assistant.into(),
            content: "Shall we plan the Lisbon trip?".into(),
        }],
        memories: vec![v1::MemoryToGrade {
            memory_id: episode.id.clone(),
            queries: vec![],
        }],
        dry_run: false,
        grader: v1::Grader::Unspecified.into(),
    };
    let graded = sandbox
        .review
        .grade_memories(request.clone())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(graded.graded[0].graded_by, "local: the LLM failed");
    assert!(graded.graded[0].applied);
    assert_eq!(sandbox.review_metrics.counts().llm_fallbacks, 1);
    assert_eq!(llm.requests().len(), 2, "the client tried again once");

    let mut strict = Sandbox::start_with(SandboxOptions {
        llm_base_url: Some(llm.base_url()),
        review_on_llm_failure: Some(engram_review::config::LlmFailure::Retry),
        ..Default::default()
    })
    .await;
    import(&mut strict, &chat.scope, trip_episodes(&chat)).await;
    let status = strict.review.grade_memories(request).await.unwrap_err();
    assert_status(status, Code::Unavailable, "the LLM could not grade");
    let recorded: i64 = sqlx::query_scalar("SELECT count(*) FROM applied_reviews")
        .fetch_one(&strict.pool)
        .await
        .unwrap();
    assert_eq!(recorded, 0, "nothing applied when the review fails");
}

/// The broker goes away while segments close: their SegmentClosed events wait in the outbox, and
/// when it returns every review is applied, each once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_outage_loses_no_review_and_applies_none_twice() {
    let broker: std::net::SocketAddr = {
        let url = url::Url::parse(&engram_e2e::amqp_url()).unwrap();
        let host = url.host_str().unwrap().to_owned();
        tokio::net::lookup_host((host, url.port().unwrap_or(5672)))
            .await
            .unwrap()
            .next()
            .unwrap()
    };
    let proxy = engram_testkit::TcpProxy::start(broker).await.unwrap();
    let mut bus = TestBus::local();
    let mut url = url::Url::parse(&bus.url).unwrap();
    url.set_ip_host(proxy.address().ip()).unwrap();
    url.set_port(Some(proxy.address().port())).unwrap();
    bus.url = url.to_string();
    let mut sandbox = Sandbox::start_with(SandboxOptions {
        bus: Some(bus.clone()),
        ..Default::default()
    })
    .await;
    let chat = Chat::new("outage");
    import(&mut sandbox, &chat.scope, trip_episodes(&chat)).await;
    proxy.cut();
    converse_and_close(&mut sandbox, &chat).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let applied: i64 = sqlx::query_scalar("SELECT count(*) FROM applied_reviews")
        .fetch_one(&sandbox.pool)
        .await
        .unwrap();
    assert_eq!(
        applied, 0,
        "nothing reaches review while the broker is away"
    );
    proxy.restore().await.unwrap();
    wait_for_reviews(&sandbox, 4).await;
    // Whatever the reconnections redelivered was recognised.
    tokio::time::sleep(Duration::from_secs(2)).await;
    wait_for_reviews(&sandbox, 4).await;
    let audited: i64 =
        sqlx::query_scalar("SELECT count(*) FROM audit_events WHERE action = 'review'")
            .fetch_one(&sandbox.pool)
            .await
            .unwrap();
    assert_eq!(audited, 4);
    drop(sandbox);
    crate::helpers::delete_topology(&bus).await;
}

/// The database away while a segment is reviewed, for longer than a message's attempts last
/// (5, each failing after a 1 s wait for a connection, 200 ms apart): the message goes back for
/// later deliveries instead of being acknowledged or dead-lettered (an outage is no fault of the
/// message), and the review lands once the database answers again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_outage_retries_the_review_instead_of_dropping_it() {
    let bus = TestBus::local();
    let mut sandbox = Sandbox::start_with(SandboxOptions {
        bus: Some(bus.clone()),
        database_proxy: true,
        database_connect_timeout_secs: Some(1),
        ..Default::default()
    })
    .await;
    let chat = Chat::new("dbdown");
    import(&mut sandbox, &chat.scope, trip_episodes(&chat)).await;
    let retrieved = converse_and_close(&mut sandbox, &chat).await;
    // Cut the database before the review can land (or, if it already did, the check below
    // still holds: every review exactly once).
    let proxy = sandbox.database_proxy.as_ref().unwrap();
    proxy.cut();
    // A copy of the segment's event, delivered while the database is away.
    let broker = publish_segment_closed(
        &bus,
        segment_closed(
            &chat,
            Uuid::new_v4(),
            Utc::now(),
            retrieved.values().cloned(),
        ),
    )
    .await;
    tokio::time::sleep(Duration::from_secs(9)).await;
    proxy.restore().await.unwrap();
    // Both segments' reviews land: the one the segment closed and the copy, four memories each.
    wait_for_reviews(&sandbox, 8).await;
    broker.close().await;
    drop(sandbox);
    crate::helpers::delete_topology(&bus).await;
}

/// A review older than a memory's last review changes nothing (stale skip), and a memory
/// forgotten since it was retrieved is skipped: neither is applied, and the rest of the segment
/// is still recorded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_reviews_and_forgotten_memories_change_nothing() {
    let bus = TestBus::local();
    let mut sandbox = Sandbox::start_with(SandboxOptions {
        bus: Some(bus.clone()),
        ..Default::default()
    })
    .await;
    let chat = Chat::new("stale");
    import(&mut sandbox, &chat.scope, trip_episodes(&chat)).await;
    let episodes: Vec<v1::Memory> = crate::helpers::entries(&mut sandbox, &chat.scope)
        .await
        .into_iter()
        .filter(|m| m.kind() == v1::MemoryKind::Episodic)
        .collect();
    let (forgotten, kept) = episodes.split_first().unwrap();
    sandbox
        .ingest
        .forget(v1::ForgetRequest {
            scope: Some(chat.scope.clone()),
            memory_id: forgotten.id.clone(),
        })
        .await
        .unwrap();
    let mut before = Vec::new();
    for memory in kept {
        before.push(stability(&mut sandbox, &chat.scope, &memory.id).await);
    }

    // Reviewed four days ago: before the episodes' last review, three days ago.
    let broker = publish_segment_closed(
        &bus,
        segment_closed(
            &chat,
            Uuid::new_v4(),
            Utc::now() - chrono::Duration::days(4),
            episodes.iter().map(|m| m.id.clone()),
        ),
    )
    .await;
    wait_for_reviews(&sandbox, kept.len() as i64).await;

    let applied: Vec<(Uuid, bool)> =
        sqlx::query_as("SELECT memory_id, applied FROM applied_reviews ORDER BY memory_id")
            .fetch_all(&sandbox.pool)
            .await
            .unwrap();
    assert!(
        applied.iter().all(|(_, applied)| !applied),
        "stale reviews are recorded, not applied: {applied:?}"
    );
    assert!(
        applied.iter().all(|(id, _)| id.to_string() != forgotten.id),
        "a forgotten memory has no review"
    );
    for (memory, before) in kept.iter().zip(before) {
        assert_eq!(
            stability(&mut sandbox, &chat.scope, &memory.id).await,
            before,
            "{} unchanged",
            memory.title
        );
    }
    broker.close().await;
    drop(sandbox);
    crate::helpers::delete_topology(&bus).await;
}

/// An LLM that rates one memory of two and one it was never given: the invented rating is ignored
/// and counted, the memory it left out is rated by the local grader and counted, none guessed.
#[tokio::test]
async fn memories_the_llm_leaves_out_are_graded_locally_and_invented_ones_ignored() {
    let llm = engram_testkit::FakeLlm::start().await;
    llm.set_responder(|request| {
        let asked = request["messages"][1]["content"].as_str().unwrap_or("");
        let first = asked
            .lines()
            .find_map(|line| line.strip_prefix("### "))
            .unwrap_or("")
            .to_owned();
        engram_testkit::FakeAnswer::Json(serde_json::json!({ "ratings": [
            {"memory": first, "rating": "good"},
            {"memory": "M99", "rating": "easy"},
        ]}))
    });
    let mut sandbox = Sandbox::start_with(SandboxOptions {
        llm_base_url: Some(llm.base_url()),
        ..Default::default()
    })
    .await;
    let chat = Chat::new("leftout");
    import(&mut sandbox, &chat.scope, trip_episodes(&chat)).await;
    let episodes: Vec<v1::Memory> = crate::helpers::entries(&mut sandbox, &chat.scope)
        .await
        .into_iter()
        .filter(|m| m.kind() == v1::MemoryKind::Episodic)
        .take(2)
        .collect();
    let graded = sandbox
        .review
        .grade_memories(v1::GradeMemoriesRequest {
            scope: Some(chat.scope.clone()),
            context: vec![v1::Message {
                role: v1::SpeakerRole::Assistant.into(),
                content: "Your Lisbon trip notes say you loved the trams".into(),
            }],
            memories: episodes
                .iter()
                .map(|m| v1::MemoryToGrade {
                    memory_id: m.id.clone(),
                    queries: vec!["Lisbon trip".into()],
                })
                .collect(),
            dry_run: true,
            grader: v1::Grader::Llm.into(),
        })
        .await
        .unwrap()
        .into_inner()
        .graded;
    let graded_by: Vec<&str> = graded.iter().map(|g| g.graded_by.as_str()).collect();
    assert_eq!(graded_by, ["llm", "local: the LLM left it out"]);
    assert_eq!(graded.len(), 2, "no rating for a memory it was not given");
    let counts = sandbox.review_metrics.counts();
    assert_eq!((counts.invented, counts.omitted), (1, 1));
}
