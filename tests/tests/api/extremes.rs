//! Every read answers for data at the edges of what can be stored: entries from year 1 (imported
//! history), entries dated in the far future (a client's clock, or a database clock set back),
//! FSRS states at the ends of their ranges. Scores stay finite and within their ranges.

use engram_e2e::Sandbox;
use engram_proto::v1;

use crate::helpers::{export_all, import, imported_fact, new_scope, remember_memory};

const YEAR_ONE: i64 = -62_135_596_800;
const YEAR_2011: i64 = 1_293_840_000;

fn at(seconds: i64) -> Option<prost_types::Timestamp> {
    Some(prost_types::Timestamp { seconds, nanos: 0 })
}

fn assert_scores_in_range(memories: &[v1::RetrievedMemory]) {
    for retrieved in memories {
        let score = retrieved.score.as_ref().expect("a score breakdown");
        for (name, part) in [
            ("retrievability", score.retrievability),
            ("relevance", score.relevance),
            ("recency", score.recency),
            ("importance", score.importance),
        ] {
            assert!((0.0..=1.0).contains(&part), "{name} = {part}: {score:?}");
        }
        assert!(score.total.is_finite() && score.total >= 0.0, "{score:?}");
    }
}

#[tokio::test]
async fn reads_answer_for_entries_from_year_one_to_the_far_future() {
    let mut sandbox = Sandbox::start().await;
    let scope = new_scope("edges");
    let episode = |client_id: &str, stability: f64, reviewed: i64| v1::ImportedMemory {
        client_id: client_id.to_owned(),
        kind: v1::MemoryKind::Episodic.into(),
        title: format!("Harbour walk {client_id}"),
        text: "We walked along the harbour and talked about boats".to_owned(),
        created_at: at(reviewed),
        end_at: at(reviewed),
        surprise: Some(1.0),
        conversation_id: uuid::Uuid::new_v4().to_string(),
        fsrs: Some(v1::FsrsState {
            stability,
            difficulty: 10.0,
            last_reviewed_at: at(reviewed),
        }),
        messages: vec![v1::Message {
            role: v1::SpeakerRole::User.into(),
            content: "the harbour boats were lovely".to_owned(),
        }],
        ..Default::default()
    };
    import(
        &mut sandbox,
        &scope,
        vec![
            imported_fact("year-one", "The harbour boats are painted blue", YEAR_ONE),
            imported_fact("2011", "The harbour master is called Ines", YEAR_2011),
            episode("short", 0.001, YEAR_ONE),
            episode("long", 36_500.0, YEAR_ONE),
        ],
    )
    .await;
    // A clock far ahead: the entry says it was made in year 9999.
    let future = remember_memory(&mut sandbox, &scope, "The harbour ferry leaves at noon").await;
    sqlx::query("UPDATE memories SET created_at = '9999-12-31 23:59:59+00' WHERE id = $1::uuid")
        .bind(&future.id)
        .execute(&sandbox.pool)
        .await
        .unwrap();

    for profile in [v1::RankingProfile::Fsrs, v1::RankingProfile::Triscore] {
        let answer = sandbox
            .retrieval
            .retrieve_memory(v1::RetrieveMemoryRequest {
                scope: Some(scope.clone()),
                query: "harbour boats".to_owned(),
                detail: v1::DetailLevel::High.into(),
                ranking: Some(v1::RankingOptions {
                    profile: profile.into(),
                    sparse_only: true,
                    recency_tau_days: Some(0.01),
                    ..Default::default()
                }),
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(answer.semantic.len(), 3, "{profile:?}: {}", answer.markdown);
        assert_eq!(answer.episodic.len(), 2, "{profile:?}: {}", answer.markdown);
        assert_scores_in_range(&answer.semantic);
        assert_scores_in_range(&answer.episodic);
    }
    let summary = sandbox
        .retrieval
        .get_summary(v1::GetSummaryRequest {
            scope: Some(scope.clone()),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(summary.semantic_count, 3);
    assert_eq!(summary.oldest_at.unwrap().seconds, YEAR_ONE);
    let listed = sandbox
        .retrieval
        .list_entries(v1::ListEntriesRequest {
            scope: Some(scope.clone()),
            page_size: 2,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(listed.entries[0].id, future.id, "newest first");
    let next = sandbox
        .retrieval
        .list_entries(v1::ListEntriesRequest {
            scope: Some(scope.clone()),
            page_size: 10,
            page_token: listed.next_page_token,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(next.entries.len(), 3);
    for entry in next
        .entries
        .iter()
        .filter(|m| m.kind() == v1::MemoryKind::Episodic)
    {
        let state = sandbox
            .review
            .get_memory_state(v1::GetMemoryStateRequest {
                scope: Some(scope.clone()),
                memory_id: entry.id.clone(),
            })
            .await
            .unwrap()
            .into_inner();
        assert!(
            (0.0..=1.0).contains(&state.retrievability),
            "{}: {}",
            entry.title,
            state.retrievability
        );
    }
    assert_eq!(export_all(&mut sandbox, &scope).await.len(), 5);
}
