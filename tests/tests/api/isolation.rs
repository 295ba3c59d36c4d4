//! Isolation: whatever ids, conversations or filters a request sends, it only ever sees its own
//! user's own space. An adversarial suite: a second user with the same space name, the same
//! client ids, the victim's conversation id, and queries made of the victim's words.

use engram_e2e::Sandbox;
use engram_proto::v1;
use futures::StreamExt;
use uuid::Uuid;

use crate::helpers::import;
use crate::helpers::new_scope;
use crate::retrieval::{episode, fact, query, retrieve};

fn ids(results: &[v1::RetrievedMemory]) -> Vec<String> {
    results
        .iter()
        .map(|r| r.memory.as_ref().unwrap().id.clone())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_request_sees_another_users_or_another_spaces_memories() {
    let mut sandbox = Sandbox::start().await;
    let victim = new_scope("work");
    let victim_conversation = Uuid::new_v4();
    let imported = import(
        &mut sandbox,
        &victim,
        vec![
            fact("secret", "The vault combination is 31-17-42", 1.0),
            episode(
                "meeting",
                victim_conversation,
                "Vault combination handover",
                "Handed over the vault combination to the night shift",
                1.0,
                0.9,
                &[("user", "The vault combination is 31-17-42")],
            ),
        ],
    )
    .await;
    let victim_ids: Vec<String> = imported.entries.iter().map(|e| e.id.clone()).collect();

    // Same space name, another user; and the same user's other space.
    let attacker = v1::Scope {
        user_id: Uuid::new_v4().to_string(),
        space: victim.space.clone(),
    };
    let sibling = v1::Scope {
        user_id: victim.user_id.clone(),
        space: "home".into(),
    };
    import(
        &mut sandbox,
        &sibling,
        vec![fact("own", "Groceries on Saturday", 1.0)],
    )
    .await;
    // The attacker imports entries under the victim's client ids: they get ids of their own.
    let attacker_import = import(
        &mut sandbox,
        &attacker,
        vec![fact("secret", "Attacker's own note", 1.0)],
    )
    .await;
    assert!(!victim_ids.contains(&attacker_import.entries[0].id));

    for scope in [&attacker, &sibling] {
        for text in [
            "vault combination",
            "31-17-42",
            "What is the vault combination handover?",
            "vault",
        ] {
            for conversation in [String::new(), victim_conversation.to_string()] {
                for category in [v1::Category::Unspecified, v1::Category::Fact] {
                    let mut request = query(scope, text);
                    request.conversation_id = conversation.clone();
                    request.category = category.into();
                    request.detail = v1::DetailLevel::High.into();
                    request.semantic_limit = Some(100);
                    request.episodic_limit = Some(100);
                    let response = retrieve(&mut sandbox, request).await;
                    let seen: Vec<String> = ids(&response.semantic)
                        .into_iter()
                        .chain(ids(&response.episodic))
                        .collect();
                    assert!(
                        seen.iter().all(|id| !victim_ids.contains(id)),
                        "{scope:?} saw the victim's memory for {text:?}"
                    );
                    assert!(
                        !response.markdown.contains("31-17-42"),
                        "{}",
                        response.markdown
                    );
                    for result in response.semantic.iter().chain(&response.episodic) {
                        assert_eq!(result.memory.as_ref().unwrap().scope.as_ref(), Some(scope));
                    }
                }
            }
            let context = sandbox
                .retrieval
                .context_pre_retrieve(v1::ContextPreRetrieveRequest {
                    scope: Some(scope.clone()),
                    query: text.into(),
                    conversation_id: victim_conversation.to_string(),
                    ..Default::default()
                })
                .await
                .unwrap()
                .into_inner();
            assert!(!context.markdown.contains("31-17-42"));
        }
        // Listing, exporting and summarising stay inside the scope too.
        let listed = sandbox
            .retrieval
            .list_entries(v1::ListEntriesRequest {
                scope: Some(scope.clone()),
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner()
            .entries;
        assert!(listed.iter().all(|m| !victim_ids.contains(&m.id)));
        let mut stream = sandbox
            .retrieval
            .export_space(v1::ExportSpaceRequest {
                scope: Some(scope.clone()),
                include_embeddings: true,
                page_size: 0,
            })
            .await
            .unwrap()
            .into_inner();
        while let Some(page) = stream.next().await {
            for exported in page.unwrap().memories {
                assert!(!victim_ids.contains(&exported.memory.unwrap().id));
            }
        }
        let summary = sandbox
            .retrieval
            .get_summary(v1::GetSummaryRequest {
                scope: Some(scope.clone()),
            })
            .await
            .unwrap()
            .into_inner();
        assert!(!summary.summary.contains("vault"), "{}", summary.summary);
        let recall = sandbox
            .ingest
            .apply_command(v1::ApplyCommandRequest {
                scope: Some(scope.clone()),
                conversation_id: victim_conversation.to_string(),
                message: "What do you remember about the vault combination?".into(),
            })
            .await
            .unwrap()
            .into_inner();
        assert!(!recall.reply.contains("31-17-42"), "{}", recall.reply);
    }

    // The attacker's retrievals with the victim's conversation id never touched the victim's
    // conversation: its pending reviews hold nothing.
    let victim_reviews: Option<serde_json::Value> = sqlx::query_scalar(
        "SELECT pending_reviews FROM conversations WHERE user_id = $1 AND conversation_id = $2",
    )
    .bind(victim.user_id.parse::<Uuid>().unwrap())
    .bind(victim_conversation)
    .fetch_optional(&sandbox.pool)
    .await
    .unwrap()
    .flatten();
    assert_eq!(victim_reviews, None);
    // And the victim still finds their own memory.
    let own = retrieve(&mut sandbox, query(&victim, "vault combination")).await;
    assert!(ids(&own.semantic).iter().any(|id| victim_ids.contains(id)));
}
