//! RetrieveMemory and ContextPreRetrieve end to end: the Markdown layout (golden files), the
//! structured results and their score parts, BM25 against a reference implementation, the
//! fallbacks, the side effects (and their absence), memory off and incognito, and the recall
//! command of ApplyCommand. Entries are loaded with ImportMemories, so the tests control their age,
//! FSRS state and conversation.

use std::path::PathBuf;

use chrono::{Duration, Utc};
use engram_core::retrieval::bm25;
use engram_e2e::Sandbox;
use engram_proto::v1;
use engram_server::time::to_proto;
use tonic::Code;
use uuid::Uuid;

use crate::helpers::{
    Setting, assert_status, import, imported_fact, new_scope, remember, start_incognito,
    update_setting,
};

pub(crate) fn fact(client_id: &str, text: &str, days_ago: f64) -> v1::ImportedMemory {
    v1::ImportedMemory {
        client_id: client_id.to_owned(),
        kind: v1::MemoryKind::Semantic.into(),
        text: text.to_owned(),
        created_at: Some(to_proto(ago(days_ago))),
        ..Default::default()
    }
}

pub(crate) fn episode(
    client_id: &str,
    conversation: Uuid,
    title: &str,
    summary: &str,
    days_ago: f64,
    surprise: f64,
    turns: &[(&str, &str)],
) -> v1::ImportedMemory {
    v1::ImportedMemory {
        client_id: client_id.to_owned(),
        kind: v1::MemoryKind::Episodic.into(),
        text: summary.to_owned(),
        title: title.to_owned(),
        conversation_id: conversation.to_string(),
        created_at: Some(to_proto(ago(days_ago))),
        end_at: Some(to_proto(ago(days_ago))),
        start_at: Some(to_proto(ago(days_ago) - Duration::minutes(20))),
        surprise: Some(surprise),
        messages: turns
            .iter()
            .map(|(role, content)| v1::Message {
                role: match *role {
                    "assistant" => v1::SpeakerRole::Assistant,
                    _ => v1::SpeakerRole::User,
                }
                .into(),
                content: (*content).to_owned(),
            })
            .collect(),
        ..Default::default()
    }
}

fn ago(days: f64) -> chrono::DateTime<Utc> {
    Utc::now() - Duration::milliseconds((days * 86_400_000.0) as i64)
}

pub(crate) fn query(scope: &v1::Scope, text: &str) -> v1::RetrieveMemoryRequest {
    v1::RetrieveMemoryRequest {
        scope: Some(scope.clone()),
        query: text.to_owned(),
        ..Default::default()
    }
}

pub(crate) async fn retrieve(
    sandbox: &mut Sandbox,
    request: v1::RetrieveMemoryRequest,
) -> v1::RetrieveMemoryResponse {
    sandbox
        .retrieval
        .retrieve_memory(request)
        .await
        .expect("retrieval succeeds")
        .into_inner()
}

fn texts(results: &[v1::RetrievedMemory]) -> Vec<String> {
    results
        .iter()
        .map(|r| r.memory.as_ref().unwrap().text.clone())
        .collect()
}

fn served_by(response: &v1::RetrieveMemoryResponse) -> &v1::ServedBy {
    response.served_by.as_ref().expect("served_by is set")
}

/// The Markdown with the calendar dates of "**When:**" lines and of line blocks' headings
/// ("### Title — 25 Nov 2026 (3 days ago)") written as "(date)": the test's data is dated
/// relative to now.
fn without_calendar_dates(markdown: &str) -> String {
    markdown
        .lines()
        .map(|line| {
            if line.starts_with("**When:** ")
                && line.ends_with(')')
                && let Some(open) = line.rfind(" (")
            {
                return format!("{} (date)", &line[..open]);
            }
            if line.starts_with("### ")
                && let Some((title, when)) = line.split_once(" — ")
                && let Some(open) = when.find(" (")
            {
                return format!("{title} — (date){}", &when[open..]);
            }
            line.to_owned()
        })
        .map(|line| line + "\n")
        .collect()
}

/// Compares with a committed golden file; `ENGRAM_UPDATE_GOLDEN=1` rewrites it.
fn assert_golden(name: &str, actual: &str) {
    let actual = &without_calendar_dates(actual);
    // At run time (cargo sets it for tests), so a binary built from another checkout that shares
    // CARGO_TARGET_DIR still compares with this checkout's files.
    let path = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("run by cargo"))
        .join("tests/api/golden")
        .join(name);
    if std::env::var_os("ENGRAM_UPDATE_GOLDEN").is_some() {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, actual).unwrap();
        return;
    }
    let expected = std::fs::read_to_string(&path).unwrap_or_else(|_| {
        panic!(
            "{} is missing; run with ENGRAM_UPDATE_GOLDEN=1",
            path.display()
        )
    });
    assert_eq!(
        *actual,
        expected,
        "Markdown differs from {}",
        path.display()
    );
}

/// A small life: preferences, a meeting, and two episodes (one surprising, with details).
async fn load_life(sandbox: &mut Sandbox, scope: &v1::Scope) -> Uuid {
    let conversation = Uuid::new_v4();
    let mut editor = fact(
        "pref-theme",
        "I prefer the solarized dark theme in my editor",
        10.0,
    );
    editor.category = v1::Category::Preference.into();
    editor.source_ids = vec!["chat-1".into(), "chat-2".into()];
    let mut standup = fact(
        "meeting",
        "Team standup is every Tuesday at 9:30 with Priya and Tom",
        20.0,
    );
    standup.category = v1::Category::Fact.into();
    standup.manually_saved = true;
    let mut coffee = fact("coffee", "I drink my coffee black, no sugar", 40.0);
    coffee.category = v1::Category::Preference.into();
    let mut review = episode(
        "launch-review",
        conversation,
        "Launch review of the editor plugin",
        "The plugin launch slipped a week because the theme loader crashed on startup",
        3.0,
        0.85,
        &[
            ("user", "The theme loader crashes on startup again"),
            (
                "assistant",
                "Then we hold the launch until the loader is fixed",
            ),
        ],
    );
    review.fsrs = Some(v1::FsrsState {
        stability: 4.0,
        difficulty: 5.0,
        last_reviewed_at: Some(to_proto(ago(2.0))),
    });
    let planning = episode(
        "sprint-planning",
        conversation,
        "Sprint planning",
        "Planned the editor theme settings page and the standup rotation",
        8.0,
        0.2,
        &[("user", "Let's build the theme settings page this sprint")],
    );
    import(
        sandbox,
        scope,
        vec![editor, standup, coffee, review, planning],
    )
    .await;
    conversation
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retrieval_answers_with_markdown_and_the_reasons_for_each_rank() {
    let mut sandbox = Sandbox::start().await;
    let scope = new_scope("work");
    load_life(&mut sandbox, &scope).await;

    let mut request = query(&scope, "which editor theme do I prefer?");
    request.ranking = Some(v1::RankingOptions {
        profile: v1::RankingProfile::Fsrs.into(),
        ..Default::default()
    });
    let response = retrieve(&mut sandbox, request).await;
    assert!(
        response.markdown.starts_with("## Semantic Memory\n"),
        "{}",
        response.markdown
    );
    assert!(response.markdown.contains(
        "[preference] I prefer the solarized dark theme in my editor (sources: 2 references)"
    ));
    assert!(response.markdown.contains("## Episodic Memories"));
    let top = &response.semantic[0];
    assert_eq!(
        top.memory.as_ref().unwrap().text,
        "I prefer the solarized dark theme in my editor"
    );
    assert_eq!(top.rank, 1);
    let score = top.score.as_ref().unwrap();
    assert_eq!(score.sparse_rank, 1);
    assert!(score.sparse_score > 0.0 && score.rrf > 0.0 && score.total > 0.0);
    assert_eq!(score.dense_rank, 0, "no embedder runs in this sandbox");
    // Episodes carry their FSRS state and retrievability.
    let launch = response
        .episodic
        .iter()
        .find(|e| e.memory.as_ref().unwrap().title == "Launch review of the editor plugin")
        .expect("the launch review is found");
    let memory = launch.memory.as_ref().unwrap();
    assert_eq!(memory.fsrs.as_ref().unwrap().stability, 4.0);
    assert_eq!(memory.messages.len(), 2);
    let retrievability = launch.score.as_ref().unwrap().retrievability;
    assert!(
        retrievability > 0.0 && retrievability < 1.0,
        "{retrievability}"
    );

    let served = served_by(&response);
    assert_eq!(served.path, "bm25");
    assert_eq!(served.ranking_profile, "fsrs");
    assert!(served.used_fallback);
    assert!(
        served.fallback_reason.contains("no embedder"),
        "{}",
        served.fallback_reason
    );
    assert!(response.tokens > 0 && response.tokens <= 2_000);
    assert!(!response.truncated);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_markdown_layout_is_pinned_by_golden_files() {
    let mut sandbox = Sandbox::start().await;
    let scope = new_scope("work");
    load_life(&mut sandbox, &scope).await;
    // The layout is what is pinned; the ranking is fixed (fsrs, RRF k = 60) so that tuning the
    // service's default ranking does not rewrite these files.
    let pinned_ranking = Some(v1::RankingOptions {
        profile: v1::RankingProfile::Fsrs.into(),
        rrf_k: Some(60.0),
        ..Default::default()
    });
    for (detail, file) in [
        (v1::DetailLevel::Auto, "retrieve_detail_auto.md"),
        (v1::DetailLevel::High, "retrieve_detail_high.md"),
        (v1::DetailLevel::None, "retrieve_detail_none.md"),
    ] {
        let mut request = query(&scope, "editor theme launch standup");
        request.ranking = pinned_ranking;
        request.detail = detail.into();
        let response = retrieve(&mut sandbox, request).await;
        assert_golden(file, &response.markdown);
    }
    // A tight budget drops details, then whole entries, and says so.
    let mut request = query(&scope, "editor theme launch standup");
    request.ranking = pinned_ranking;
    request.token_budget = Some(60);
    let response = retrieve(&mut sandbox, request).await;
    assert!(response.truncated);
    assert!(response.tokens <= 60, "{} tokens", response.tokens);
    assert_golden("retrieve_budget_60.md", &response.markdown);

    let nothing = retrieve(&mut sandbox, query(&new_scope("empty"), "anything at all")).await;
    assert_golden("retrieve_nothing.md", &nothing.markdown);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bm25_in_postgres_matches_a_reference_implementation() {
    let mut sandbox = Sandbox::start().await;
    let scope = new_scope("bm25");
    let corpus = [
        "apple banana apple",
        "banana cherry",
        "cherry cherry cherry date elderberry fig grape",
        "apple",
        "kiwi lemon mango",
        "banana banana banana banana apple cherry lemon",
    ];
    let memories = corpus
        .iter()
        .enumerate()
        .map(|(index, text)| {
            let mut memory = fact(&format!("doc-{index}"), text, 1.0);
            memory.category = v1::Category::Fact.into();
            memory.tags = vec!["fruit".into()];
            memory
        })
        .collect();
    import(&mut sandbox, &scope, memories).await;

    let question = "apple cherry lemon";
    let mut request = query(&scope, question);
    request.semantic_limit = Some(20);
    request.episodic_limit = Some(1);
    let response = retrieve(&mut sandbox, request).await;

    // The stored document is the text plus the tags.
    let documents: Vec<Vec<String>> = corpus
        .iter()
        .map(|text| {
            format!("{text} fruit")
                .split_whitespace()
                .map(str::to_owned)
                .collect()
        })
        .collect();
    let terms: Vec<String> = question.split_whitespace().map(str::to_owned).collect();
    let expected = bm25::reference_scores(&documents, &terms);
    let matching = expected.iter().filter(|score| **score > 0.0).count();
    assert_eq!(response.semantic.len(), matching);
    for result in &response.semantic {
        let text = &result.memory.as_ref().unwrap().text;
        let index = corpus.iter().position(|doc| doc == text).unwrap();
        let actual = result.score.as_ref().unwrap().sparse_score;
        assert!(
            (actual - expected[index]).abs() < 1e-9,
            "{text:?}: Postgres {actual}, reference {}",
            expected[index]
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chinese_matches_by_bigrams_misspellings_by_trigrams_and_nonsense_gets_nothing() {
    let mut sandbox = Sandbox::start().await;
    let scope = new_scope("zh");
    let mut hiking = fact("hiking", "我喜欢在周末去爬山和露营", 2.0);
    hiking.category = v1::Category::Preference.into();
    let mut tea = fact("tea", "每天早上喝一杯绿茶", 1.0);
    tea.category = v1::Category::Preference.into();
    let mut editor = fact(
        "editor",
        "I prefer the solarized dark theme in my editor",
        3.0,
    );
    editor.category = v1::Category::Preference.into();
    import(&mut sandbox, &scope, vec![hiking, tea, editor]).await;

    // Chinese has no spaces between words: BM25 indexes character bigrams (周末, 爬山 ...).
    let response = retrieve(&mut sandbox, query(&scope, "上次说的周末爬山")).await;
    let served = served_by(&response);
    assert_eq!(served.path, "bm25", "{served:?}");
    assert_eq!(texts(&response.semantic), vec!["我喜欢在周末去爬山和露营"]);

    // No word matches a misspelt query; trigram similarity still finds the entry.
    let response = retrieve(&mut sandbox, query(&scope, "solarised thme")).await;
    let served = served_by(&response);
    assert_eq!(served.path, "trigram", "{served:?}");
    assert!(served.fallback_reason.contains("no word"), "{served:?}");
    assert_eq!(
        texts(&response.semantic),
        vec!["I prefer the solarized dark theme in my editor"]
    );

    // Nothing matches nonsense: nothing is served (the newest entries would only be noise).
    let response = retrieve(&mut sandbox, query(&scope, "xylophone quartz")).await;
    let served = served_by(&response);
    assert_eq!(served.path, "none", "{served:?}");
    assert!(
        served.fallback_reason.contains("nothing matched"),
        "{served:?}"
    );
    assert!(response.semantic.is_empty() && response.episodic.is_empty());
    assert_eq!(response.markdown, "No relevant memories.\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parallel_retrievals_in_one_conversation_all_reach_its_pending_reviews() {
    let sandbox = Sandbox::start().await;
    let scope = new_scope("work");
    let mut loader = sandbox.ingest.clone();
    let conversation = Uuid::new_v4();
    let episodes = (0..5)
        .map(|i| {
            episode(
                &format!("e{i}"),
                conversation,
                &format!("Design review number {i}"),
                "Reviewed the storage design and its failure modes",
                1.0 + f64::from(i),
                0.3,
                &[],
            )
        })
        .collect();
    loader
        .import_memories(v1::ImportMemoriesRequest {
            scope: Some(scope.clone()),
            memories: episodes,
            context_turns: None,
        })
        .await
        .unwrap();

    const CALLS: usize = 16;
    let calls = (0..CALLS).map(|i| {
        let mut client = sandbox.retrieval.clone();
        let mut request = query(&scope, &format!("storage design review {i}"));
        request.conversation_id = conversation.to_string();
        async move {
            client
                .retrieve_memory(request)
                .await
                .map(|r| r.into_inner())
        }
    });
    let responses = futures::future::join_all(calls).await;
    for response in responses {
        assert!(!response.unwrap().episodic.is_empty());
    }
    let reviews: i32 = sqlx::query_scalar(
        "SELECT jsonb_array_length(pending_reviews) FROM conversations WHERE conversation_id = $1",
    )
    .bind(conversation)
    .fetch_one(&sandbox.pool)
    .await
    .unwrap();
    assert_eq!(reviews as usize, CALLS, "every retrieval is pending review");
    sandbox.write_read_traces().await;
    let metrics: i64 =
        sqlx::query_scalar("SELECT count(*) FROM retrieval_metrics WHERE conversation_id = $1")
            .bind(conversation)
            .fetch_one(&sandbox.pool)
            .await
            .unwrap();
    assert_eq!(metrics as usize, CALLS);
}

/// A sandbox whose retrieval service writes its traces every `millis`, and a new space of it.
async fn sandbox_with_trace_flush(millis: u64) -> (Sandbox, v1::Scope) {
    let sandbox = Sandbox::start_with(engram_e2e::SandboxOptions {
        trace_flush_ms: Some(millis),
        ..Default::default()
    })
    .await;
    (sandbox, new_scope("work"))
}

/// What a crash right after a response loses: a pending review never (it is written before the
/// response returns), the retrieval's cached scores, returned note and metrics row at most (they
/// wait for the trace writer's next interval, `recall.trace_flush_ms`); a graceful stop writes
/// them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pending_reviews_are_written_before_the_response_and_traces_by_a_graceful_stop() {
    // Longer than the test: nothing is written on the interval meanwhile.
    let (mut sandbox, scope) = sandbox_with_trace_flush(60_000).await;
    let conversation = load_life(&mut sandbox, &scope).await;
    let traces = |pool: sqlx::PgPool| async move {
        sqlx::query_as::<_, (i64, i64, i64)>(
            "SELECT (SELECT coalesce(sum(jsonb_array_length(pending_reviews)), 0) FROM conversations), \
                    (SELECT count(*) FROM retrieval_metrics), \
                    (SELECT count(*) FROM memory_retention WHERE last_scores IS NOT NULL)",
        )
        .fetch_one(&pool)
        .await
        .unwrap()
    };
    const CALLS: i64 = 3;
    for _ in 0..CALLS {
        let mut request = query(&scope, "editor theme launch");
        request.conversation_id = conversation.to_string();
        let response = retrieve(&mut sandbox, request).await;
        assert!(!response.episodic.is_empty());
    }
    // The moment a crash could come: every review is there, no trace yet.
    assert_eq!(traces(sandbox.pool.clone()).await, (CALLS, 0, 0));
    let retrieval = sandbox.services.remove(1);
    retrieval.stop().await.unwrap();
    let (reviews, metrics, scored) = traces(sandbox.pool.clone()).await;
    assert_eq!(
        (reviews, metrics),
        (CALLS, CALLS),
        "the stop wrote every metrics row"
    );
    assert!(scored > 0, "and the returned entries' scores");
    crate::helpers::assert_retention_in_step(&sandbox.pool).await;
}

/// A retrieval's metrics row waiting for its batch does not bring a forgotten conversation's
/// query back after ForgetConversation deleted its rows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_conversation_forgotten_before_its_traces_are_written_leaves_no_metrics_row() {
    let (mut sandbox, scope) = sandbox_with_trace_flush(60_000).await;
    let conversation = load_life(&mut sandbox, &scope).await;
    let mut request = query(&scope, "editor theme launch");
    request.conversation_id = conversation.to_string();
    retrieve(&mut sandbox, request).await;
    // One without a conversation beside it, whose row stays.
    retrieve(&mut sandbox, query(&scope, "editor theme")).await;
    sandbox
        .ingest
        .forget_conversation(v1::ForgetConversationRequest {
            scope: Some(scope.clone()),
            conversation_id: conversation.to_string(),
        })
        .await
        .unwrap();
    sandbox.write_read_traces().await;
    let rows: Vec<Option<Uuid>> =
        sqlx::query_scalar("SELECT conversation_id FROM retrieval_metrics")
            .fetch_all(&sandbox.pool)
            .await
            .unwrap();
    assert_eq!(rows, vec![None]);
}

/// Without a stop, the traces are written within the interval.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn traces_are_written_within_the_flush_interval() {
    let (mut sandbox, scope) = sandbox_with_trace_flush(50).await;
    load_life(&mut sandbox, &scope).await;
    retrieve(&mut sandbox, query(&scope, "editor theme")).await;
    let mut rows = 0i64;
    // Polled for far longer than the interval: a loaded CI machine may be slow to schedule.
    for _ in 0..100 {
        rows = sqlx::query_scalar("SELECT count(*) FROM retrieval_metrics")
            .fetch_one(&sandbox.pool)
            .await
            .unwrap();
        if rows == 1 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert_eq!(rows, 1, "the metrics row is written without a flush");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retrieval_records_scores_and_metrics_but_never_touches_fsrs_state() {
    let mut sandbox = Sandbox::start().await;
    let scope = new_scope("work");
    let conversation = load_life(&mut sandbox, &scope).await;
    let fsrs_state = |pool: sqlx::PgPool| async move {
        sqlx::query_as::<_, (Uuid, f64, f64, chrono::DateTime<Utc>)>(
            "SELECT id, stability, difficulty, last_reviewed_at FROM memories \
             WHERE kind = 'episodic' ORDER BY id",
        )
        .fetch_all(&pool)
        .await
        .unwrap()
    };
    let before = fsrs_state(sandbox.pool.clone()).await;

    // ContextPreRetrieve: facts only, and no trace at all.
    let context = sandbox
        .retrieval
        .context_pre_retrieve(v1::ContextPreRetrieveRequest {
            scope: Some(scope.clone()),
            query: "editor theme".into(),
            conversation_id: conversation.to_string(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(!context.semantic.is_empty());
    assert!(!context.markdown.contains("## Episodic Memories"));
    sandbox.write_read_traces().await;
    let traces: (i64, i64, i64) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM retrieval_metrics), \
                (SELECT count(*) FROM memory_retention WHERE last_scores IS NOT NULL), \
                (SELECT count(*) FROM conversations WHERE pending_reviews IS NOT NULL)",
    )
    .fetch_one(&sandbox.pool)
    .await
    .unwrap();
    assert_eq!(traces, (0, 0, 0), "ContextPreRetrieve has no side effects");

    let mut request = query(&scope, "editor theme launch");
    request.conversation_id = conversation.to_string();
    let response = retrieve(&mut sandbox, request).await;
    let returned: Vec<Uuid> = response
        .semantic
        .iter()
        .chain(&response.episodic)
        .map(|r| r.memory.as_ref().unwrap().id.parse().unwrap())
        .collect();
    sandbox.write_read_traces().await;
    let scored: Vec<Uuid> = sqlx::query_scalar(
        "SELECT memory_id FROM memory_retention WHERE last_scores ? 'computed_at' \
             ORDER BY memory_id",
    )
    .fetch_all(&sandbox.pool)
    .await
    .unwrap();
    let mut expected = returned.clone();
    expected.sort();
    assert_eq!(
        scored, expected,
        "last_scores of exactly the returned entries"
    );
    let (path, items, tokens): (String, i32, i32) = sqlx::query_as(
        "SELECT retrieval_path, context_items, estimated_tokens FROM retrieval_metrics",
    )
    .fetch_one(&sandbox.pool)
    .await
    .unwrap();
    assert_eq!(path, "bm25");
    assert_eq!(items as usize, returned.len());
    assert_eq!(tokens as u32, response.tokens);
    assert_eq!(
        fsrs_state(sandbox.pool.clone()).await,
        before,
        "FSRS state unchanged"
    );
    crate::helpers::assert_retention_in_step(&sandbox.pool).await;
}

/// A retrieval's cached scores are written to the entry's narrow retention row alone (issue 41):
/// the wide memories row keeps its version, readers show the scores, and a pin afterwards (a
/// write of the entry that leaves its scores alone) keeps them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retrievals_cached_scores_live_beside_the_entry_and_outlive_a_pin() {
    let mut sandbox = Sandbox::start().await;
    let scope = new_scope("work");
    load_life(&mut sandbox, &scope).await;
    let response = retrieve(&mut sandbox, query(&scope, "editor theme launch")).await;
    let fact = response.semantic[0].memory.clone().unwrap();
    let id: Uuid = fact.id.parse().unwrap();
    let ranked = response.semantic[0].score.unwrap();
    let shown_in_response = fact.last_scores.as_ref().unwrap();
    assert_eq!(
        (shown_in_response.relevance, shown_in_response.total),
        (
            ranked.relevance,
            ranked.relevance + ranked.recency + ranked.importance
        ),
        "the response shows the scores this retrieval leaves for the cache"
    );
    let row_version = |pool: sqlx::PgPool| async move {
        sqlx::query_scalar::<_, String>("SELECT xmin::text FROM memories WHERE id = $1")
            .bind(id)
            .fetch_one(&pool)
            .await
            .unwrap()
    };
    let before = row_version(sandbox.pool.clone()).await;
    sandbox.write_read_traces().await;
    assert_eq!(
        row_version(sandbox.pool.clone()).await,
        before,
        "the memories row is not rewritten"
    );
    let cached: Option<serde_json::Value> =
        sqlx::query_scalar("SELECT last_scores FROM memory_retention WHERE memory_id = $1")
            .bind(id)
            .fetch_one(&sandbox.pool)
            .await
            .unwrap();
    let cached = cached.expect("the retrieval's scores are cached");
    assert!(cached["relevance"].as_f64().unwrap() > 0.0, "{cached}");

    let listed = crate::helpers::entries(&mut sandbox, &scope).await;
    let shown = |memory: &v1::Memory| memory.last_scores.as_ref().map(|scores| scores.total);
    let listed = listed.iter().find(|memory| memory.id == fact.id).unwrap();
    assert_eq!(
        shown(listed),
        cached["total"].as_f64(),
        "readers show the cache"
    );
    assert_eq!(
        shown(listed),
        Some(shown_in_response.total),
        "which holds what the response showed"
    );

    let pinned = crate::helpers::pin(&mut sandbox, &scope, &fact.id).await;
    assert!(pinned.pinned);
    assert_eq!(shown(&pinned), cached["total"].as_f64(), "a pin keeps them");
    crate::helpers::assert_retention_in_step(&sandbox.pool).await;
}

/// What a retrieval leaves on an entry's retention row is decided where the cache is, by the
/// trace writer (the request never reads it): its scores replace the cached ones only when those
/// are missing, over an hour old or lower, its note that the entry was returned only when a day
/// old, both in one update, and an entry with neither due is not written at all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retrievals_scores_and_note_are_written_only_when_due() {
    let mut sandbox = Sandbox::start().await;
    let scope = new_scope("work");
    load_life(&mut sandbox, &scope).await;
    // Retrieves, then writes the traces.
    async fn ask(sandbox: &mut Sandbox, scope: &v1::Scope) -> v1::RetrieveMemoryResponse {
        let response = retrieve(sandbox, query(scope, "editor theme launch")).await;
        sandbox.write_read_traces().await;
        response
    }
    let response = ask(&mut sandbox, &scope).await;
    let id: Uuid = response.semantic[0]
        .memory
        .as_ref()
        .unwrap()
        .id
        .parse()
        .unwrap();
    // The row's version, its cached total and when, and when it was last returned.
    let row = |pool: sqlx::PgPool| async move {
        sqlx::query_as::<
            _,
            (
                String,
                Option<f64>,
                Option<chrono::DateTime<Utc>>,
                Option<chrono::DateTime<Utc>>,
            ),
        >(
            "SELECT xmin::text, last_total, last_scored_at, last_returned_at \
             FROM memory_retention WHERE memory_id = $1",
        )
        .bind(id)
        .fetch_one(&pool)
        .await
        .unwrap()
    };
    let set = |pool: sqlx::PgPool, update: &'static str| async move {
        sqlx::query(update).bind(id).execute(&pool).await.unwrap();
    };
    let first = row(sandbox.pool.clone()).await;
    let (total, scored_at) = (first.1.expect("scores cached"), first.2.expect("and when"));
    assert!(first.3.is_some(), "the note that it was returned");

    ask(&mut sandbox, &scope).await;
    assert_eq!(
        row(sandbox.pool.clone()).await,
        first,
        "nothing due: the row is not written"
    );

    set(
        sandbox.pool.clone(),
        "UPDATE memory_retention SET last_total = last_total + 10 WHERE memory_id = $1",
    )
    .await;
    let higher = row(sandbox.pool.clone()).await;
    ask(&mut sandbox, &scope).await;
    assert_eq!(
        row(sandbox.pool.clone()).await,
        higher,
        "a higher cached total stays"
    );

    set(
        sandbox.pool.clone(),
        "UPDATE memory_retention SET last_total = 0 WHERE memory_id = $1",
    )
    .await;
    ask(&mut sandbox, &scope).await;
    let lower = row(sandbox.pool.clone()).await;
    assert!(
        (lower.1.unwrap() - total).abs() < 0.05,
        "a lower total is replaced: {lower:?}"
    );
    assert!(lower.2.unwrap() > scored_at);
    assert_eq!(lower.3, first.3, "the note is not due yet");

    set(
        sandbox.pool.clone(),
        "UPDATE memory_retention SET last_total = last_total + 10, \
         last_scored_at = last_scored_at - interval '2 hours' WHERE memory_id = $1",
    )
    .await;
    ask(&mut sandbox, &scope).await;
    let stale = row(sandbox.pool.clone()).await;
    assert!(
        (stale.1.unwrap() - total).abs() < 0.05,
        "stale scores are replaced: {stale:?}"
    );
    assert_eq!(stale.3, first.3);

    set(sandbox.pool.clone(), "UPDATE memory_retention SET last_returned_at = last_returned_at - interval '2 days' WHERE memory_id = $1").await;
    let old_note = row(sandbox.pool.clone()).await;
    ask(&mut sandbox, &scope).await;
    let noted = row(sandbox.pool.clone()).await;
    assert!(
        noted.3.unwrap() > first.3.unwrap(),
        "a day-old note is rewritten"
    );
    assert_eq!(
        (noted.1, noted.2),
        (old_note.1, old_note.2),
        "with the scores left as they were"
    );
    crate::helpers::assert_retention_in_step(&sandbox.pool).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_off_and_incognito_get_nothing_from_storage() {
    let mut sandbox = Sandbox::start().await;
    let scope = new_scope("work");
    let conversation = load_life(&mut sandbox, &scope).await;

    let incognito = Uuid::new_v4();
    start_incognito(&mut sandbox, &scope, &incognito.to_string()).await;
    let mut request = query(&scope, "editor theme");
    request.conversation_id = incognito.to_string();
    let response = retrieve(&mut sandbox, request).await;
    assert_eq!(served_by(&response).path, "incognito");
    assert!(response.semantic.is_empty() && response.episodic.is_empty());
    assert_eq!(response.markdown, "No relevant memories.\n");

    update_setting(&mut sandbox, &scope, Setting::MemoryEnabled(false)).await;
    let mut request = query(&scope, "editor theme");
    request.conversation_id = conversation.to_string();
    let response = retrieve(&mut sandbox, request).await;
    assert_eq!(served_by(&response).path, "memory_off");
    assert!(response.semantic.is_empty() && response.episodic.is_empty());
    let recall = sandbox
        .ingest
        .apply_command(v1::ApplyCommandRequest {
            scope: Some(scope.clone()),
            conversation_id: conversation.to_string(),
            message: "What do you remember about my editor theme?".into(),
        })
        .await
        .unwrap()
        .into_inner();
    // The recall says why it has nothing (issue 39), not "No relevant memories.".
    assert!(
        recall.reply.starts_with("Memory is off for this space"),
        "{}",
        recall.reply
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_do_you_remember_answers_with_the_markdown_of_a_retrieval() {
    let mut sandbox = Sandbox::start().await;
    let scope = new_scope("work");
    let conversation = load_life(&mut sandbox, &scope).await;
    for message in [
        "What do you remember about my editor theme?",
        "你还记得 editor theme 吗？",
    ] {
        let response = sandbox
            .ingest
            .apply_command(v1::ApplyCommandRequest {
                scope: Some(scope.clone()),
                conversation_id: conversation.to_string(),
                message: message.into(),
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(
            response.action,
            v1::CommandAction::Recall as i32,
            "{message}"
        );
        assert!(response.applied);
        assert!(
            response
                .reply
                .contains("[preference] I prefer the solarized dark theme in my editor"),
            "{message}: {}",
            response.reply
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_out_of_bounds_are_rejected_with_the_field_named() {
    let mut sandbox = Sandbox::start().await;
    let scope = new_scope("work");
    let cases: Vec<(v1::RetrieveMemoryRequest, &str)> = vec![
        (query(&scope, "   "), "query"),
        (query(&scope, &"x".repeat(2_049)), "query"),
        (
            v1::RetrieveMemoryRequest {
                episodic_limit: Some(101),
                ..query(&scope, "q")
            },
            "episodic_limit",
        ),
        (
            v1::RetrieveMemoryRequest {
                semantic_limit: Some(101),
                ..query(&scope, "q")
            },
            "semantic_limit",
        ),
        (
            v1::RetrieveMemoryRequest {
                token_budget: Some(10),
                ..query(&scope, "q")
            },
            "token_budget",
        ),
        (
            v1::RetrieveMemoryRequest {
                detail: 42,
                ..query(&scope, "q")
            },
            "detail",
        ),
        (
            v1::RetrieveMemoryRequest {
                category: 42,
                ..query(&scope, "q")
            },
            "category",
        ),
        (
            v1::RetrieveMemoryRequest {
                conversation_id: "not-a-uuid".into(),
                ..query(&scope, "q")
            },
            "conversation_id",
        ),
        (
            v1::RetrieveMemoryRequest {
                ranking: Some(v1::RankingOptions {
                    profile: 7,
                    ..Default::default()
                }),
                ..query(&scope, "q")
            },
            "ranking.profile",
        ),
        (
            v1::RetrieveMemoryRequest {
                ranking: Some(v1::RankingOptions {
                    mmr_lambda: Some(1.5),
                    ..Default::default()
                }),
                ..query(&scope, "q")
            },
            "ranking.mmr_lambda",
        ),
        (
            v1::RetrieveMemoryRequest {
                ranking: Some(v1::RankingOptions {
                    candidates_per_leg: Some(0),
                    ..Default::default()
                }),
                ..query(&scope, "q")
            },
            "ranking.candidates_per_leg",
        ),
        (
            v1::RetrieveMemoryRequest {
                ranking: Some(v1::RankingOptions {
                    sparse_weight: Some(1.5),
                    ..Default::default()
                }),
                ..query(&scope, "q")
            },
            "ranking.sparse_weight",
        ),
        (
            v1::RetrieveMemoryRequest {
                ranking: Some(v1::RankingOptions {
                    question_weight: Some(-0.1),
                    ..Default::default()
                }),
                ..query(&scope, "q")
            },
            "ranking.question_weight",
        ),
        (
            v1::RetrieveMemoryRequest {
                ranking: Some(v1::RankingOptions {
                    other_speaker_weight: Some(1.5),
                    ..Default::default()
                }),
                ..query(&scope, "q")
            },
            "ranking.other_speaker_weight",
        ),
        (
            v1::RetrieveMemoryRequest {
                scope: None,
                ..query(&scope, "q")
            },
            "scope",
        ),
    ];
    for (request, field) in cases {
        let status = sandbox
            .retrieval
            .retrieve_memory(request)
            .await
            .unwrap_err();
        assert_status(status, Code::InvalidArgument, field);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_triscore_profile_ranks_by_relevance_recency_and_importance() {
    let mut sandbox = Sandbox::start().await;
    let scope = new_scope("work");
    let mut old = fact("old", "Lives in Lisbon near the river", 90.0);
    old.importance = Some(0.2);
    let mut new = fact("new", "Moved to Porto, lives near the river now", 1.0);
    new.importance = Some(0.2);
    import(&mut sandbox, &scope, vec![old, new]).await;

    let mut request = query(&scope, "where does the user live near the river");
    request.ranking = Some(v1::RankingOptions {
        profile: v1::RankingProfile::Triscore.into(),
        alpha: Some(1.0),
        beta: Some(5.0),
        gamma: Some(1.0),
        ..Default::default()
    });
    let response = retrieve(&mut sandbox, request).await;
    assert_eq!(served_by(&response).ranking_profile, "triscore");
    assert_eq!(
        texts(&response.semantic)[0],
        "Moved to Porto, lives near the river now"
    );
    let top = response.semantic[0].score.as_ref().unwrap();
    let expected = top.relevance + 5.0 * top.recency + top.importance;
    assert!((top.total - expected).abs() < 1e-9, "{top:?}");
    assert!(top.recency > 0.8, "{top:?}");
}

/// In a chat history the question shares the asker's words, the answer holds what was asked
/// for. triscore's relevance weighs both legs' scores and discounts a fact that is a question,
/// so the answer comes first; with the question weight at 1 the question would.
#[tokio::test]
async fn the_answer_outranks_the_question_that_asked_for_it() {
    let mut sandbox = Sandbox::start().await;
    let scope = new_scope("dogs");
    let start = Utc::now() - Duration::days(20);
    let said = |id: &str, text: &str, minutes: i64| {
        imported_fact(id, text, (start + Duration::minutes(minutes)).timestamp())
    };
    // Each line searched alone (context_turns 0): with its neighbours' words the piano line
    // would match the dogs too, and this test is about the question.
    sandbox
        .ingest
        .import_memories(v1::ImportMemoriesRequest {
            scope: Some(scope.clone()),
            memories: vec![
                said("q", "Maria: What are the names of your dogs?", 0),
                said(
                    "a",
                    "Andrew: Our dogs are Toby and Buddy, two rescue pups.",
                    1,
                ),
                said("x", "Maria: My sister finally booked her piano lessons.", 2),
            ],
            context_turns: Some(0),
        })
        .await
        .unwrap();
    let ask = |question_weight: Option<f64>| {
        let mut request = query(&scope, "What are the names of Andrew's dogs?");
        request.ranking = Some(v1::RankingOptions {
            profile: v1::RankingProfile::Triscore.into(),
            question_weight,
            ..Default::default()
        });
        request
    };
    let by_default = retrieve(&mut sandbox, ask(None)).await;
    assert_eq!(
        texts(&by_default.semantic)[..2],
        [
            "Andrew: Our dogs are Toby and Buddy, two rescue pups.",
            "Maria: What are the names of your dogs?"
        ]
    );
    let relevance_of = |response: &v1::RetrieveMemoryResponse, text: &str| {
        response
            .semantic
            .iter()
            .find(|m| m.memory.as_ref().unwrap().text == text)
            .unwrap()
            .score
            .unwrap()
            .relevance
    };
    let unweighted = retrieve(&mut sandbox, ask(Some(1.0))).await;
    let weighted = retrieve(&mut sandbox, ask(Some(0.5))).await;
    let question = "Maria: What are the names of your dogs?";
    let answer = "Andrew: Our dogs are Toby and Buddy, two rescue pups.";
    assert!(
        (relevance_of(&weighted, question) - 0.5 * relevance_of(&unweighted, question)).abs()
            < 1e-9
    );
    assert_eq!(
        relevance_of(&weighted, answer),
        relevance_of(&unweighted, answer)
    );
}

/// A question that names a speaker is mostly answered by that speaker's own lines; the other
/// speaker echoing the name counts less (`ranking.other_speaker_weight`). A line without a
/// speaker, and every line when the question names nobody, keep their relevance.
#[tokio::test]
async fn a_question_naming_a_speaker_discounts_the_other_speakers_lines() {
    let mut sandbox = Sandbox::start().await;
    let scope = new_scope("speakers");
    // Two hours apart: no line is another's neighbour.
    let start = Utc::now() - Duration::days(20);
    let said = |id: &str, text: &str, step: i64| {
        imported_fact(id, text, (start + Duration::hours(2 * step)).timestamp())
    };
    let echo = "Clara: Jonas, your dog Biscuit is such a good whippet.";
    let own = "Jonas: Biscuit is a whippet cross from the rescue.";
    let unlabelled = "Whippet crosses like Biscuit need two walks a day.";
    import(
        &mut sandbox,
        &scope,
        // Four lines of five carry a speaker: the space reads as a dialog.
        vec![
            said("c", echo, 0),
            said("j", own, 1),
            said("c2", "Clara: Biscuit chased a squirrel across the park.", 2),
            said("j2", "Jonas: Biscuit sleeps on my bed every night.", 3),
            said("n", unlabelled, 4),
        ],
    )
    .await;
    let relevance = async |sandbox: &mut Sandbox, question: &str, weight: f64| {
        let mut request = query(&scope, question);
        request.ranking = Some(v1::RankingOptions {
            profile: v1::RankingProfile::Triscore.into(),
            other_speaker_weight: Some(weight),
            ..Default::default()
        });
        let response = retrieve(sandbox, request).await;
        [echo, own, unlabelled].map(|text| {
            response
                .semantic
                .iter()
                .find(|m| m.memory.as_ref().unwrap().text == text)
                .unwrap_or_else(|| panic!("{text} not returned for {question}"))
                .score
                .unwrap()
                .relevance
        })
    };
    let naming = "What breed is Jonas's dog Biscuit?";
    let plain = relevance(&mut sandbox, naming, 1.0).await;
    let weighted = relevance(&mut sandbox, naming, 0.5).await;
    assert!(
        (weighted[0] - 0.5 * plain[0]).abs() < 1e-9,
        "{weighted:?} {plain:?}"
    );
    assert_eq!(
        weighted[1..],
        plain[1..],
        "Jonas's line and the unlabelled one"
    );
    // Named by nobody: who said it changes nothing.
    let nobody = "What breed is the dog Biscuit?";
    assert_eq!(
        relevance(&mut sandbox, nobody, 0.5).await,
        relevance(&mut sandbox, nobody, 1.0).await
    );
}

/// A question that names a month ranks what took place in that month first: the three vet visits
/// match the question's words alike, the one from March 2025 wins once dates count, and the
/// structured results say which entries matched the month.
#[tokio::test]
async fn a_question_naming_a_month_prefers_what_took_place_then() {
    let mut sandbox = Sandbox::start().await;
    let scope = new_scope("vet");
    let at = |text: &str| {
        chrono::DateTime::parse_from_rfc3339(text)
            .unwrap()
            .with_timezone(&Utc)
    };
    let visit = |id: &str, text: &str, when: &str| v1::ImportedMemory {
        client_id: id.into(),
        kind: v1::MemoryKind::Semantic.into(),
        text: text.into(),
        created_at: Some(to_proto(at(when))),
        ..Default::default()
    };
    import(
        &mut sandbox,
        &scope,
        vec![
            visit(
                "jan",
                "The vet checked Biscuit's teeth and found nothing wrong",
                "2025-01-14T10:00:00Z",
            ),
            visit(
                "mar",
                "The vet found a sock in Biscuit's stomach",
                "2025-03-09T10:00:00Z",
            ),
            visit(
                "may",
                "The vet gave Biscuit her yearly vaccines",
                "2025-05-20T10:00:00Z",
            ),
        ],
    )
    .await;
    let ask = |boost: f64| {
        let mut request = query(&scope, "What did the vet do for Biscuit in March 2025?");
        request.ranking = Some(v1::RankingOptions {
            time_match_boost: Some(boost),
            ..Default::default()
        });
        request
    };

    let boosted = retrieve(&mut sandbox, ask(3.0)).await;
    assert_eq!(
        texts(&boosted.semantic)[0],
        "The vet found a sock in Biscuit's stomach"
    );
    let matched: Vec<bool> = boosted
        .semantic
        .iter()
        .map(|m| m.score.as_ref().unwrap().time_match)
        .collect();
    assert_eq!(matched.iter().filter(|m| **m).count(), 1, "{matched:?}");
    assert!(matched[0]);

    // Without the boost the match is still reported, and the order is the other signals'.
    let plain = retrieve(&mut sandbox, ask(0.0)).await;
    let march = plain
        .semantic
        .iter()
        .find(|m| m.memory.as_ref().unwrap().text.contains("sock"))
        .unwrap()
        .score
        .unwrap();
    assert!(march.time_match);
    let boosted_march = boosted.semantic[0].score.unwrap();
    assert!(
        (boosted_march.total - 4.0 * march.total).abs() < 1e-6,
        "{boosted_march:?} {march:?}"
    );

    // Out of range: the field is named.
    let status = sandbox
        .retrieval
        .retrieve_memory(ask(11.0))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(
        status.message().contains("time_match_boost"),
        "{}",
        status.message()
    );
}

/// Facts the user never saved were labelled "(saved by the user)" in the Markdown; each label
/// now says only what is true of the entry.
#[tokio::test]
async fn facts_are_labelled_with_what_is_true_of_them() {
    let mut sandbox = Sandbox::start().await;
    let scope = new_scope("labels");
    let conversation = Uuid::new_v4().to_string();
    for request in [
        remember(&scope, "The boiler service is due in March"),
        v1::RememberRequest {
            manually_saved: true,
            pin: true,
            ..remember(&scope, "The boiler warranty number is W-5531")
        },
        v1::RememberRequest {
            conversation_id: conversation.clone(),
            source_ids: vec!["msg-17".into()],
            ..remember(&scope, "The boiler engineer is called Dana")
        },
    ] {
        sandbox.ingest.remember(request).await.unwrap();
    }
    let markdown = retrieve(&mut sandbox, query(&scope, "boiler"))
        .await
        .markdown;
    for line in [
        "The boiler service is due in March\n",
        "The boiler warranty number is W-5531 (saved by the user; pinned)\n",
        "The boiler engineer is called Dana (sources: 1 conversation, 1 reference)\n",
    ] {
        assert!(markdown.contains(line), "{line:?} in\n{markdown}");
    }
}

/// Relative dates keep their meaning: "下周三" said on Wednesday 25 November 2026 is stored as
/// said, tagged with the day it meant, and shown with that day in the Markdown.
#[tokio::test]
async fn relative_dates_are_resolved_against_when_they_were_said() {
    let mut sandbox = Sandbox::start().await;
    let scope = new_scope("dates");
    let said_at = chrono::DateTime::parse_from_rfc3339("2026-11-25T15:00:00Z")
        .unwrap()
        .with_timezone(&Utc);
    import(
        &mut sandbox,
        &scope,
        vec![v1::ImportedMemory {
            client_id: "trip".into(),
            kind: v1::MemoryKind::Semantic.into(),
            text: "记住我下周三要去上海出差".into(),
            created_at: Some(to_proto(said_at)),
            ..Default::default()
        }],
    )
    .await;
    let stored = crate::helpers::entries(&mut sandbox, &scope).await;
    assert_eq!(
        stored[0].text, "记住我下周三要去上海出差",
        "the text is kept as said"
    );
    assert!(
        stored[0].tags.contains(&"2026-12-02".to_owned()),
        "{:?}",
        stored[0].tags
    );
    let answer = sandbox
        .retrieval
        .retrieve_memory(v1::RetrieveMemoryRequest {
            scope: Some(scope.clone()),
            query: "上海出差".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(
        answer.markdown.contains("\"下周三\" = Wed 2026-12-02"),
        "{}",
        answer.markdown
    );
    // Said today, "tomorrow" is tomorrow (either side of midnight, should the call cross it).
    let tomorrow = || {
        (Utc::now() + Duration::days(1))
            .format("%Y-%m-%d")
            .to_string()
    };
    let before = tomorrow();
    sandbox
        .ingest
        .remember(remember(&scope, "Call the plumber tomorrow morning"))
        .await
        .unwrap();
    let after = tomorrow();
    let plumber = crate::helpers::entries(&mut sandbox, &scope)
        .await
        .into_iter()
        .find(|m| m.text.contains("plumber"))
        .unwrap();
    assert!(
        plumber.tags.contains(&before) || plumber.tags.contains(&after),
        "{:?}",
        plumber.tags
    );
}

/// A chat history imported turn by turn: a short turn is found by what its neighbours say, and
/// shown as it was said. A history that reads as a dialog gets that context by default; with
/// context_turns 0 the short turn is not found.
#[tokio::test]
async fn imported_turns_are_found_by_their_neighbours_words() {
    let mut sandbox = Sandbox::start().await;
    let start = Utc::now() - Duration::days(30);
    let turn = |id: &str, text: &str, minutes: i64| v1::ImportedMemory {
        client_id: id.into(),
        kind: v1::MemoryKind::Semantic.into(),
        text: text.into(),
        created_at: Some(to_proto(start + Duration::minutes(minutes))),
        ..Default::default()
    };
    let history = vec![
        turn("t1", "Maria: Did you ever make it to Lisbon?", 0),
        turn("t2", "Ana: Yes, last week!", 1),
        turn(
            "t3",
            "Maria: A different day: my sister's piano recital",
            600,
        ),
    ];
    let import_history =
        async |sandbox: &mut Sandbox, scope: &v1::Scope, context_turns: Option<u32>| {
            sandbox
                .ingest
                .import_memories(v1::ImportMemoriesRequest {
                    scope: Some(scope.clone()),
                    memories: history.clone(),
                    context_turns,
                })
                .await
                .map(tonic::Response::into_inner)
        };
    let forget = async |sandbox: &mut Sandbox, scope: &v1::Scope, memory_id: String| {
        sandbox
            .ingest
            .forget(v1::ForgetRequest {
                scope: Some(scope.clone()),
                memory_id,
            })
            .await
            .unwrap();
    };
    // "Lisbon" by BM25 alone: the texts found, and how many entries a word matched (with none,
    // the fallbacks serve whatever is newest).
    let lisbon = async |sandbox: &mut Sandbox, scope: &v1::Scope| -> (Vec<String>, u32) {
        let mut request = query(scope, "Lisbon");
        request.ranking = Some(v1::RankingOptions {
            sparse_only: true,
            ..Default::default()
        });
        let response = retrieve(sandbox, request).await;
        let texts = response
            .semantic
            .into_iter()
            .map(|m| m.memory.unwrap().text)
            .collect();
        (texts, response.served_by.unwrap().sparse_hits)
    };
    let both = vec![
        "Maria: Did you ever make it to Lisbon?",
        "Ana: Yes, last week!",
    ];
    for (context_turns, applied, expected) in [
        (Some(2), 2, both.clone()),
        (None, engram_ingest::import::DIALOG_CONTEXT_TURNS, both),
        (Some(0), 0, vec!["Maria: Did you ever make it to Lisbon?"]),
    ] {
        let scope = new_scope("history");
        let imported = import_history(&mut sandbox, &scope, context_turns)
            .await
            .unwrap();
        assert_eq!(imported.context_turns, applied, "{context_turns:?}");
        let (mut found, _) = lisbon(&mut sandbox, &scope).await;
        found.sort();
        let mut expected: Vec<String> = expected.into_iter().map(str::to_owned).collect();
        expected.sort();
        assert_eq!(found, expected, "context_turns {context_turns:?}");
    }
    // Facts that are not a dialog are each searched alone unless the request asks otherwise.
    let facts = sandbox
        .ingest
        .import_memories(v1::ImportMemoriesRequest {
            scope: Some(new_scope("history")),
            memories: vec![
                turn("f1", "I prefer dark mode", 0),
                turn("f2", "My manager is Alice Chen", 1),
            ],
            context_turns: None,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(facts.context_turns, 0);
    // What the user forgets is not found through its neighbours either: forgetting the Lisbon
    // turn takes its words out of the other turn's context, and a turn a tombstone suppresses at
    // import is nobody's context.
    let scope = new_scope("history");
    let imported = import_history(&mut sandbox, &scope, Some(2)).await.unwrap();
    let lisbon_turn = imported
        .entries
        .iter()
        .find(|e| e.client_id == "t1")
        .unwrap()
        .id
        .clone();
    forget(&mut sandbox, &scope, lisbon_turn).await;
    assert_eq!(lisbon(&mut sandbox, &scope).await.1, 0);
    let again = import_history(&mut sandbox, &scope, Some(2)).await.unwrap();
    assert_eq!(again.suppressed, 1, "the forgotten turn stays forgotten");
    let fresh = new_scope("history");
    sandbox
        .ingest
        .remember(remember(&fresh, "Maria: Did you ever make it to Lisbon?"))
        .await
        .unwrap();
    let remembered = crate::helpers::entries(&mut sandbox, &fresh).await;
    forget(&mut sandbox, &fresh, remembered[0].id.clone()).await;
    import_history(&mut sandbox, &fresh, Some(2)).await.unwrap();
    assert_eq!(lisbon(&mut sandbox, &fresh).await.1, 0);

    let status = import_history(&mut sandbox, &new_scope("history"), Some(6))
        .await
        .unwrap_err();
    assert_status(
        status,
        Code::InvalidArgument,
        "context_turns: must be 0 to 5, got 6",
    );
}

/// A conversation id never hides the rest of the space (issue 38): asked in the day-3 session,
/// "when is the Lisbon offsite?" finds the day-2 episode that says when, although the day-3
/// session has entries of its own about the offsite (once, a search of the conversation that
/// found three or more entries never looked further).
#[tokio::test]
async fn a_conversation_id_never_hides_an_answer_in_another_session() {
    let mut sandbox = Sandbox::start().await;
    let scope = new_scope("work");
    let day_two = Uuid::new_v4();
    let day_three = Uuid::new_v4();
    let mut memories = vec![episode(
        "day-2",
        day_two,
        "Lisbon offsite travel",
        "We fly out next Friday for the Lisbon offsite; the team meets at the airport at 7.",
        1.0,
        0.5,
        &[
            ("user", "When do we leave for the Lisbon offsite?"),
            (
                "assistant",
                "We fly out next Friday; the team meets at the airport at 7.",
            ),
        ],
    )];
    for (client_id, text) in [
        (
            "day-3-a",
            "I still need to book a hotel for the Lisbon offsite",
        ),
        ("day-3-b", "The offsite agenda has too many talks"),
        ("day-3-c", "Lisbon hotels near the offsite venue are pricey"),
    ] {
        memories.push(v1::ImportedMemory {
            conversation_id: day_three.to_string(),
            ..fact(client_id, text, 0.1)
        });
    }
    import(&mut sandbox, &scope, memories).await;

    let answer = sandbox
        .retrieval
        .retrieve_memory(v1::RetrieveMemoryRequest {
            scope: Some(scope.clone()),
            query: "when is the Lisbon offsite?".to_owned(),
            conversation_id: day_three.to_string(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(
        answer
            .episodic
            .iter()
            .any(|m| m.memory.as_ref().unwrap().conversation_id == day_two.to_string()),
        "the day-2 episode is returned: {:#?}",
        answer.episodic
    );
    assert!(
        answer.markdown.contains("We fly out next Friday"),
        "{}",
        answer.markdown
    );
    assert_eq!(answer.served_by.unwrap().searched, "space");
}
