//! The largest valid requests do not hold up the small requests beside them (issue 37): their
//! CPU work (cleaning text, counting tokens, ranking and rendering many long texts, the
//! extractive rules that describe their segments) runs off the async runtime, and costs time
//! linear in their size. The test runs alone (`.config/nextest.toml`): it compares latencies.
//!
//! Once, an append of 100 turns of 8,192 unspaced CJK characters took 30 s and a GetSettings
//! beside it waited as long; a retrieval over 200 such facts stalled a ListEntries of another
//! space for 17 s.

use std::time::{Duration, Instant};

use engram_e2e::Sandbox;
use engram_proto::v1;
use engram_proto::v1::ingest_service_client::IngestServiceClient;
use engram_proto::v1::retrieval_service_client::RetrievalServiceClient;
use uuid::Uuid;

use crate::helpers::new_scope;

/// How much later than usual a small request may be answered beside a maximal one.
const TOLERATED_DELAY: Duration = Duration::from_millis(100);
/// Small requests that must have run beside a heavy one for the comparison to mean something.
const MIN_SMALL_REQUESTS: usize = 5;

/// `chars` characters of Chinese without a space or punctuation (one piece for the tokenizer),
/// different for each `seed`.
fn unspaced_cjk(chars: usize, seed: usize) -> String {
    (0..chars)
        .map(|i| char::from_u32(0x4E00 + ((i * 7 + seed * 131) % 5_000) as u32).unwrap())
        .collect()
}

/// The slowest of a few small requests' times, as `small` takes them.
async fn slowest_of<F, Fut>(count: usize, mut small: F) -> Duration
where
    F: FnMut() -> Fut,
    Fut: Future<Output = ()>,
{
    let mut slowest = Duration::ZERO;
    for _ in 0..count {
        let started = Instant::now();
        small().await;
        slowest = slowest.max(started.elapsed());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    slowest
}

/// Runs small requests while `heavy` runs, until it ends; returns how many ran and the slowest.
async fn beside<H, F, Fut>(heavy: H, mut small: F) -> (usize, Duration, Duration)
where
    H: Future<Output = ()> + Send + 'static,
    F: FnMut() -> Fut,
    Fut: Future<Output = ()>,
{
    let started = Instant::now();
    let heavy = tokio::spawn(heavy);
    let mut count = 0;
    let mut slowest = Duration::ZERO;
    while !heavy.is_finished() {
        let asked = Instant::now();
        small().await;
        slowest = slowest.max(asked.elapsed());
        count += 1;
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    heavy.await.unwrap();
    (count, slowest, started.elapsed())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_maximal_append_and_retrieval_do_not_hold_up_small_requests_beside_them() {
    let sandbox = Sandbox::start().await;
    // One client connection, as an assistant's process would have: its requests share it.
    let channel = sandbox.ingest_service().channel().await;
    let mut ingest = IngestServiceClient::new(channel.clone());
    let retrieval = RetrievalServiceClient::new(sandbox.services[1].channel().await);
    let heavy_scope = new_scope("heavy");
    let other_scope = new_scope("other");
    let settings = || v1::GetSettingsRequest {
        scope: Some(other_scope.clone()),
    };
    // The small request: one GetSettings of another space, on the same connection.
    let get_settings = || {
        let mut client = ingest.clone();
        let request = settings();
        async move {
            client.get_settings(request).await.unwrap();
        }
    };
    get_settings().await;
    let usual = slowest_of(10, &get_settings).await;

    // The largest append: 100 turns of 8,192 characters.
    let conversation = Uuid::new_v4().to_string();
    let heavy_scope_for_segmentation = heavy_scope.clone();
    let append = v1::AppendMessagesRequest {
        scope: Some(heavy_scope.clone()),
        conversation_id: conversation.clone(),
        messages: (0..100)
            .map(|turn| v1::ConversationMessage {
                role: v1::SpeakerRole::User.into(),
                content: unspaced_cjk(8_192, turn),
                ..Default::default()
            })
            .collect(),
        close_segment: false,
    };
    let mut heavy_client = IngestServiceClient::new(channel.clone());
    let (count, slowest, took) = beside(
        async move {
            let answer = heavy_client
                .append_messages(append)
                .await
                .unwrap()
                .into_inner();
            assert_eq!(answer.turns.len(), 100);
            assert!(
                answer
                    .turns
                    .iter()
                    .all(|turn| turn.outcome() == v1::TurnOutcome::Stored)
            );
        },
        &get_settings,
    )
    .await;
    eprintln!(
        "append: {count} GetSettings beside it, slowest {slowest:?} (usual {usual:?}); it took {took:?}"
    );
    assert!(
        count >= MIN_SMALL_REQUESTS,
        "only {count} GetSettings ran beside the append"
    );
    assert!(
        slowest <= usual + TOLERATED_DELAY,
        "a GetSettings beside the maximal append took {slowest:?} (usually {usual:?})"
    );
    // Then segmentation writes episodes of those turns in the background, beside requests too.
    let mut segmentation_client = ingest.clone();
    let (count, slowest, took) = beside(
        async move {
            let waited = Instant::now();
            loop {
                let state = segmentation_client
                    .get_conversation(v1::GetConversationRequest {
                        scope: Some(heavy_scope_for_segmentation.clone()),
                        conversation_id: conversation.clone(),
                        page_size: 1,
                        ..Default::default()
                    })
                    .await
                    .unwrap()
                    .into_inner();
                if state.segmented_through >= 0 {
                    break;
                }
                assert!(
                    waited.elapsed() < Duration::from_secs(60),
                    "no segment of the long turns was written in 60 s"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        },
        &get_settings,
    )
    .await;
    eprintln!("segmentation: {count} GetSettings beside it, slowest {slowest:?}; it took {took:?}");
    assert!(
        slowest <= usual + TOLERATED_DELAY,
        "a GetSettings beside the segmentation of the long turns took {slowest:?} (usually {usual:?})"
    );

    // 200 facts as long, then the retrieval that asks for all it may.
    for batch in 0..4 {
        let memories = (0..50)
            .map(|i| v1::ImportedMemory {
                client_id: format!("long-{batch}-{i}"),
                kind: v1::MemoryKind::Semantic.into(),
                text: format!("的{}", unspaced_cjk(8_191, batch * 50 + i)),
                ..Default::default()
            })
            .collect();
        ingest
            .import_memories(v1::ImportMemoriesRequest {
                scope: Some(heavy_scope.clone()),
                memories,
                ..Default::default()
            })
            .await
            .unwrap();
    }
    let mut heavy_retrieval = retrieval.clone();
    let query = v1::RetrieveMemoryRequest {
        scope: Some(heavy_scope.clone()),
        query: "的".to_owned(),
        episodic_limit: Some(100),
        semantic_limit: Some(100),
        token_budget: Some(32_000),
        ..Default::default()
    };
    let list = || v1::ListEntriesRequest {
        scope: Some(other_scope.clone()),
        ..Default::default()
    };
    // The small request here: one ListEntries of another space.
    let list_entries = || {
        let mut client = retrieval.clone();
        let request = list();
        async move {
            client.list_entries(request).await.unwrap();
        }
    };
    list_entries().await;
    let usual_list = slowest_of(10, &list_entries).await;
    let (count, slowest, took) = beside(
        async move {
            let answer = heavy_retrieval
                .retrieve_memory(query)
                .await
                .unwrap()
                .into_inner();
            assert!(!answer.semantic.is_empty(), "the long facts are found");
        },
        &list_entries,
    )
    .await;
    eprintln!(
        "retrieval: {count} ListEntries beside it, slowest {slowest:?} (usual {usual_list:?}); it took {took:?}"
    );
    assert!(
        count >= MIN_SMALL_REQUESTS,
        "only {count} ListEntries ran beside the retrieval"
    );
    assert!(
        slowest <= usual_list + TOLERATED_DELAY,
        "a ListEntries beside the maximal retrieval took {slowest:?} (usually {usual_list:?})"
    );
}
