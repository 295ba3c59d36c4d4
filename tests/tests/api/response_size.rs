//! Every answer stays within what gRPC clients accept by default (4 MiB): pages end early and
//! hand a token, streamed messages are bounded, and RetrieveMemory leaves conversation excerpts
//! out before it would pass the limit. The clients here keep tonic's 4 MiB default.

use engram_e2e::Sandbox;
use engram_proto::v1;
use rand::{Rng as _, SeedableRng as _};
use tonic::Code;

use crate::helpers::{assert_status, export_all, import, new_scope};

/// `chars` random CJK ideographs (3 bytes each in UTF-8); random so that nothing merges.
fn cjk_text(rng: &mut rand::rngs::StdRng, chars: usize) -> String {
    (0..chars)
        .map(|_| char::from_u32(rng.random_range(0x4E00..0x9FA5)).expect("a CJK ideograph"))
        .collect()
}

async fn import_all(sandbox: &mut Sandbox, scope: &v1::Scope, memories: Vec<v1::ImportedMemory>) {
    let response = import(sandbox, scope, memories).await;
    assert_eq!(response.skipped_incognito + response.suppressed, 0);
}

/// 200 facts of 8,192 CJK characters: within the soft cap and the text limit, about 4.9 MB.
#[tokio::test]
async fn pages_of_large_entries_end_early_and_hand_a_token() {
    let mut sandbox = Sandbox::start().await;
    let scope = new_scope("large");
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    for batch in 0..4 {
        let memories = (0..50)
            .map(|i| v1::ImportedMemory {
                client_id: format!("fact-{batch}-{i}"),
                kind: v1::MemoryKind::Semantic.into(),
                text: cjk_text(&mut rng, 8_192),
                ..Default::default()
            })
            .collect();
        import_all(&mut sandbox, &scope, memories).await;
    }

    let mut listed = 0;
    let mut pages = 0;
    let mut token = String::new();
    loop {
        let page = sandbox
            .retrieval
            .list_entries(v1::ListEntriesRequest {
                scope: Some(scope.clone()),
                page_size: 200,
                page_token: token,
                ..Default::default()
            })
            .await
            .expect("a page a default client can read")
            .into_inner();
        assert!(!page.entries.is_empty());
        listed += page.entries.len();
        pages += 1;
        token = page.next_page_token;
        if token.is_empty() {
            break;
        }
    }
    assert_eq!(listed, 200);
    assert!(pages >= 2, "the first page ended early");

    let mut exported = std::collections::HashSet::new();
    for memory in export_all(&mut sandbox, &scope).await {
        assert!(exported.insert(memory.memory.unwrap().id), "exported twice");
    }
    assert_eq!(exported.len(), 200);
}

/// Episodes with long conversation excerpts: a retrieval of many of them leaves excerpts out
/// (marked), from the lowest rank up, rather than answer what no client accepts.
#[tokio::test]
async fn retrieval_leaves_excerpts_out_before_passing_the_limit() {
    let mut sandbox = Sandbox::start().await;
    let scope = new_scope("episodes");
    let mut rng = rand::rngs::StdRng::seed_from_u64(11);
    for batch in 0..12 {
        let memories = (0..5)
            .map(|i| v1::ImportedMemory {
                client_id: format!("episode-{batch}-{i}"),
                kind: v1::MemoryKind::Episodic.into(),
                title: format!("Lantern festival {batch}-{i}"),
                text: "We talked about the lantern festival".to_owned(),
                conversation_id: uuid::Uuid::new_v4().to_string(),
                messages: (0..8)
                    .map(|_| v1::Message {
                        role: v1::SpeakerRole::User.into(),
                        content: cjk_text(&mut rng, 8_192),
                    })
                    .collect(),
                ..Default::default()
            })
            .collect();
        import_all(&mut sandbox, &scope, memories).await;
    }
    let answer = sandbox
        .retrieval
        .retrieve_memory(v1::RetrieveMemoryRequest {
            scope: Some(scope.clone()),
            query: "lantern festival".to_owned(),
            episodic_limit: Some(100),
            token_budget: Some(32_000),
            detail: v1::DetailLevel::None.into(),
            ranking: Some(v1::RankingOptions {
                sparse_only: true,
                candidates_per_leg: Some(100),
                ..Default::default()
            }),
            ..Default::default()
        })
        .await
        .expect("an answer a default client can read")
        .into_inner();
    assert_eq!(
        answer.episodic.len(),
        60,
        "{}",
        answer.served_by.unwrap().path
    );
    let omitted: Vec<bool> = answer.episodic.iter().map(|e| e.messages_omitted).collect();
    let first_omitted = omitted
        .iter()
        .position(|o| *o)
        .expect("some excerpts left out");
    assert!(first_omitted > 0, "the best-ranked keep their excerpts");
    assert!(
        omitted[first_omitted..].iter().all(|o| *o),
        "lowest ranks first"
    );
    for kept in &answer.episodic[..first_omitted] {
        assert_eq!(kept.memory.as_ref().unwrap().messages.len(), 8);
    }
}

#[tokio::test]
async fn an_episode_excerpt_over_its_limit_is_refused() {
    let mut sandbox = Sandbox::start().await;
    let status = sandbox
        .ingest
        .import_memories(v1::ImportMemoriesRequest {
            scope: Some(new_scope("episodes")),
            memories: vec![v1::ImportedMemory {
                client_id: "huge".to_owned(),
                kind: v1::MemoryKind::Episodic.into(),
                title: "A long evening".to_owned(),
                text: "We talked all evening".to_owned(),
                conversation_id: uuid::Uuid::new_v4().to_string(),
                messages: (0..9)
                    .map(|_| v1::Message {
                        role: v1::SpeakerRole::User.into(),
                        content: "a".repeat(8_000),
                    })
                    .collect(),
                ..Default::default()
            }],
            context_turns: None,
        })
        .await
        .unwrap_err();
    assert_status(
        status,
        Code::InvalidArgument,
        "memories[0].messages: hold 72000 characters",
    );
}

/// A page token whose time no stored entry can have was answered INTERNAL (Postgres: timestamp
/// out of range); it is a malformed token.
#[tokio::test]
async fn a_page_token_with_an_impossible_time_is_invalid() {
    let mut sandbox = Sandbox::start().await;
    let id = uuid::Uuid::new_v4();
    for token in [
        format!("-220000000000000000.{id}"),
        format!("9223372036854775807.{id}"),
    ] {
        let status = sandbox
            .retrieval
            .list_entries(v1::ListEntriesRequest {
                scope: Some(new_scope("work")),
                page_token: token,
                ..Default::default()
            })
            .await
            .unwrap_err();
        assert_status(status, Code::InvalidArgument, "page_token: is not a token");
    }
}
