//! What memory off and incognito leave behind: every one of the 25 RPCs is called in an incognito
//! conversation and in a space with memory off, and the rows of every table are counted before
//! and after. Content never leaves a row (no memory, no metrics row with the query, no pending
//! review, no audit of a skipped write); the user's own controls (settings, incognito switches,
//! forget, pin) are audited without content, because users must be able to see what was done to
//! their memory.

use std::collections::BTreeMap;

use engram_e2e::Sandbox;
use engram_proto::v1;
use uuid::Uuid;

use crate::helpers::{
    Setting, end_incognito, export_all, new_scope, remember, remember_memory, start_incognito,
    update_setting,
};

/// Rows per table of the public schema (every table the migrations made, found at run time so
/// that a new table is counted too).
async fn row_counts(pool: &sqlx::PgPool) -> BTreeMap<String, i64> {
    let tables: Vec<String> = sqlx::query_scalar(
        "SELECT tablename::text FROM pg_tables WHERE schemaname = 'public' \
         AND tablename NOT LIKE '\\_sqlx%' ORDER BY 1",
    )
    .fetch_all(pool)
    .await
    .unwrap();
    assert!(tables.len() >= 10, "{tables:?}");
    let mut counts = BTreeMap::new();
    for table in tables {
        let count: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "SELECT count(*) FROM \"{table}\""
        )))
        .fetch_one(pool)
        .await
        .unwrap();
        counts.insert(table, count);
    }
    counts
}

/// What changed between two counts, tables that did not change left out.
fn changes(before: &BTreeMap<String, i64>, after: &BTreeMap<String, i64>) -> BTreeMap<String, i64> {
    after
        .iter()
        .map(|(table, count)| {
            (
                table.clone(),
                count - before.get(table).copied().unwrap_or(0),
            )
        })
        .filter(|(_, delta)| *delta != 0)
        .collect()
}

fn expected(rows: &[(&str, i64)]) -> BTreeMap<String, i64> {
    rows.iter()
        .map(|(table, delta)| ((*table).to_owned(), *delta))
        .collect()
}

/// The calls, each paired with what it may leave: a name for the failure message, the call,
/// and the row changes it is allowed.
struct Probe<'a> {
    sandbox: &'a mut Sandbox,
    /// Every table's rows after the last call.
    counts: BTreeMap<String, i64>,
}

impl<'a> Probe<'a> {
    async fn new(sandbox: &'a mut Sandbox) -> Self {
        let counts = row_counts(&sandbox.pool).await;
        Self { sandbox, counts }
    }

    /// Asserts what the call just made changed, and moves the baseline on.
    async fn leaves(&mut self, call: &str, allowed: &[(&str, i64)]) {
        // The outbox relay and backfill are off in this sandbox, so nothing changes later.
        let now = row_counts(&self.sandbox.pool).await;
        assert_eq!(changes(&self.counts, &now), expected(allowed), "{call}");
        self.counts = now;
    }
}

/// The RPCs that carry content, called with what memory off or incognito must leave untouched.
async fn content_calls_leave_nothing(
    probe: &mut Probe<'_>,
    scope: &v1::Scope,
    conversation: &str,
    mode: &str,
) {
    let sandbox = &mut *probe.sandbox;
    let answer = sandbox
        .ingest
        .remember(v1::RememberRequest {
            conversation_id: conversation.to_owned(),
            ..remember(scope, "My bank PIN is 2468")
        })
        .await
        .unwrap()
        .into_inner();
    assert!(answer.memory.is_none(), "{mode}: {answer:?}");
    probe.leaves(&format!("{mode}: Remember"), &[]).await;

    for message in [
        "remember that my passport expires in May",
        "what do you remember about my passport?",
        "forget that",
        "pin this",
    ] {
        let answer = probe
            .sandbox
            .ingest
            .apply_command(v1::ApplyCommandRequest {
                scope: Some(scope.clone()),
                conversation_id: conversation.to_owned(),
                message: message.to_owned(),
            })
            .await
            .unwrap()
            .into_inner();
        if message.starts_with("what do you remember") {
            // The recall says why it has nothing, not "No relevant memories".
            let why = if mode == "incognito" {
                "incognito"
            } else {
                "Memory is off"
            };
            assert!(answer.reply.contains(why), "{mode}: {}", answer.reply);
        }
        probe
            .leaves(&format!("{mode}: ApplyCommand {message:?}"), &[])
            .await;
    }

    let retrieved = probe
        .sandbox
        .retrieval
        .retrieve_memory(v1::RetrieveMemoryRequest {
            scope: Some(scope.clone()),
            query: "what is my bank PIN".to_owned(),
            conversation_id: conversation.to_owned(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(
        retrieved.semantic.is_empty() && retrieved.episodic.is_empty(),
        "{mode}"
    );
    probe.leaves(&format!("{mode}: RetrieveMemory"), &[]).await;

    probe
        .sandbox
        .retrieval
        .context_pre_retrieve(v1::ContextPreRetrieveRequest {
            scope: Some(scope.clone()),
            query: "bank".to_owned(),
            conversation_id: conversation.to_owned(),
            ..Default::default()
        })
        .await
        .unwrap();
    probe
        .leaves(&format!("{mode}: ContextPreRetrieve"), &[])
        .await;

    // Memory off refuses an import outright; incognito skips its entries without a trace.
    let imported = probe
        .sandbox
        .ingest
        .import_memories(v1::ImportMemoriesRequest {
            scope: Some(scope.clone()),
            memories: vec![v1::ImportedMemory {
                client_id: "secret".to_owned(),
                kind: v1::MemoryKind::Semantic.into(),
                text: "My locker code is 7391".to_owned(),
                conversation_id: conversation.to_owned(),
                ..Default::default()
            }],
            context_turns: None,
        })
        .await;
    match imported {
        Ok(response) => assert_eq!(response.into_inner().skipped_incognito, 1, "{mode}"),
        Err(status) => assert_eq!(status.code(), tonic::Code::FailedPrecondition, "{mode}"),
    }
    probe.leaves(&format!("{mode}: ImportMemories"), &[]).await;

    // A conversation's turns: none is kept, and nothing is asked of segmentation.
    let appended = probe
        .sandbox
        .ingest
        .append_messages(v1::AppendMessagesRequest {
            scope: Some(scope.clone()),
            conversation_id: conversation.to_owned(),
            messages: vec![v1::ConversationMessage {
                role: v1::SpeakerRole::User.into(),
                content: "My bank PIN is 2468, and forget that".to_owned(),
                ..Default::default()
            }],
            close_segment: true,
        })
        .await
        .unwrap()
        .into_inner();
    assert_ne!(
        appended.turns[0].outcome(),
        v1::TurnOutcome::Stored,
        "{mode}"
    );
    probe.leaves(&format!("{mode}: AppendMessages"), &[]).await;
    // Nothing open to close. An incognito conversation is known by its switch; with memory off
    // nothing of it was stored, so it is unknown, as GetConversation says.
    let closed = probe
        .sandbox
        .ingest
        .close_segment(v1::CloseSegmentRequest {
            scope: Some(scope.clone()),
            conversation_id: conversation.to_owned(),
        })
        .await;
    match closed {
        Ok(closed) if mode == "incognito" => {
            assert!(
                !closed.into_inner().requested,
                "{mode}: nothing open to close"
            );
        }
        Err(status) if mode == "memory off" => {
            assert_eq!(status.code(), tonic::Code::NotFound, "{mode}: {status:?}");
        }
        other => panic!("{mode}: CloseSegment answered {other:?}"),
    }
    probe.leaves(&format!("{mode}: CloseSegment"), &[]).await;
}

/// The RPCs that read or manage what is stored: they behave as always in either mode.
async fn reads_and_controls(
    probe: &mut Probe<'_>,
    scope: &v1::Scope,
    stored: &v1::Memory,
    mode: &str,
) {
    let sandbox = &mut *probe.sandbox;
    sandbox
        .ingest
        .get_settings(v1::GetSettingsRequest {
            scope: Some(scope.clone()),
        })
        .await
        .unwrap();
    probe.leaves(&format!("{mode}: GetSettings"), &[]).await;
    let reads = &mut probe.sandbox.retrieval;
    reads
        .list_entries(v1::ListEntriesRequest {
            scope: Some(scope.clone()),
            ..Default::default()
        })
        .await
        .unwrap();
    reads
        .get_summary(v1::GetSummaryRequest {
            scope: Some(scope.clone()),
        })
        .await
        .unwrap();
    export_all(probe.sandbox, scope).await;
    probe
        .sandbox
        .ingest
        .list_audit(v1::ListAuditRequest {
            scope: Some(scope.clone()),
            ..Default::default()
        })
        .await
        .unwrap();
    let state = probe
        .sandbox
        .review
        .get_memory_state(v1::GetMemoryStateRequest {
            scope: Some(scope.clone()),
            memory_id: stored.id.clone(),
        })
        .await;
    assert_eq!(
        state.unwrap_err().code(),
        tonic::Code::FailedPrecondition,
        "a fact has no FSRS state"
    );
    probe
        .sandbox
        .review
        .get_review_stats(v1::GetReviewStatsRequest {
            scope: Some(scope.clone()),
            ..Default::default()
        })
        .await
        .unwrap();
    probe
        .sandbox
        .ingest
        .preview_retention(v1::PreviewRetentionRequest {
            scope: Some(scope.clone()),
            page_size: 0,
        })
        .await
        .unwrap();
    // A dry run records nothing in any mode (a real one in a memory-off space: its own test).
    let dry = grade(probe.sandbox, scope, stored, true).await;
    assert!(dry.iter().all(|graded| !graded.applied), "{dry:?}");
    probe
        .leaves(
            &format!(
                "{mode}: ListEntries, GetSummary, ExportSpace, ListAudit, GetMemoryState, \
                 GetReviewStats, PreviewRetention, GradeMemories dry run"
            ),
            &[],
        )
        .await;

    probe
        .sandbox
        .ingest
        .reembed(v1::ReembedRequest {
            scope: Some(scope.clone()),
            ..Default::default()
        })
        .await
        .unwrap();
    probe.leaves(&format!("{mode}: Reembed"), &[]).await;

    // The user's own controls are audited, without content.
    probe
        .sandbox
        .ingest
        .pin(v1::PinRequest {
            scope: Some(scope.clone()),
            memory_id: stored.id.clone(),
        })
        .await
        .unwrap();
    probe
        .leaves(&format!("{mode}: Pin"), &[("audit_events", 1)])
        .await;
    probe
        .sandbox
        .ingest
        .unpin(v1::UnpinRequest {
            scope: Some(scope.clone()),
            memory_id: stored.id.clone(),
        })
        .await
        .unwrap();
    probe
        .leaves(&format!("{mode}: Unpin"), &[("audit_events", 1)])
        .await;
    probe
        .sandbox
        .ingest
        .forget(v1::ForgetRequest {
            scope: Some(scope.clone()),
            memory_id: stored.id.clone(),
        })
        .await
        .unwrap();
    probe
        .leaves(
            &format!("{mode}: Forget"),
            &[
                ("audit_events", 1),
                ("memories", -1),
                ("memory_retention", -1),
                ("tombstones", 1),
            ],
        )
        .await;
}

/// GradeMemories of the stored memory against a turn that uses it.
async fn grade(
    sandbox: &mut Sandbox,
    scope: &v1::Scope,
    memory: &v1::Memory,
    dry_run: bool,
) -> Vec<v1::GradedMemory> {
    sandbox
        .review
        .grade_memories(v1::GradeMemoriesRequest {
            scope: Some(scope.clone()),
            context: vec![v1::Message {
                role: v1::SpeakerRole::Assistant.into(),
                content: format!("You told me: {}", memory.text),
            }],
            memories: vec![v1::MemoryToGrade {
                memory_id: memory.id.clone(),
                queries: vec!["when do I water the plants".into()],
            }],
            dry_run,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .graded
}

#[tokio::test]
async fn an_incognito_conversation_leaves_nothing_but_the_users_own_switches() {
    let mut sandbox = Sandbox::start().await;
    let scope = new_scope("private");
    let stored = remember_memory(&mut sandbox, &scope, "I water the plants on Sundays").await;
    let conversation = Uuid::new_v4().to_string();
    let mut probe = Probe::new(&mut sandbox).await;

    start_incognito(probe.sandbox, &scope, &conversation).await;
    probe
        .leaves(
            "StartIncognito",
            &[("audit_events", 1), ("conversations", 1)],
        )
        .await;
    content_calls_leave_nothing(&mut probe, &scope, &conversation, "incognito").await;
    reads_and_controls(&mut probe, &scope, &stored, "incognito").await;
    let state = probe
        .sandbox
        .ingest
        .get_conversation(v1::GetConversationRequest {
            scope: Some(scope.clone()),
            conversation_id: conversation.clone(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(state.incognito && state.turns.is_empty() && state.turn_count == 0);
    probe.leaves("incognito: GetConversation", &[]).await;
    // Forgetting it is the user's action (audited); the conversation stays incognito.
    probe
        .sandbox
        .ingest
        .forget_conversation(v1::ForgetConversationRequest {
            scope: Some(scope.clone()),
            conversation_id: conversation.clone(),
        })
        .await
        .unwrap();
    probe
        .leaves("incognito: ForgetConversation", &[("audit_events", 1)])
        .await;
    assert!(
        probe
            .sandbox
            .ingest
            .get_conversation(v1::GetConversationRequest {
                scope: Some(scope.clone()),
                conversation_id: conversation.clone(),
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner()
            .incognito
    );
    probe
        .sandbox
        .ingest
        .update_settings(v1::UpdateSettingsRequest {
            scope: Some(scope.clone()),
            soft_cap: Some(50),
            ..Default::default()
        })
        .await
        .unwrap();
    probe
        .leaves("incognito: UpdateSettings", &[("audit_events", 1)])
        .await;
    end_incognito(probe.sandbox, &scope, &conversation).await;
    probe.leaves("EndIncognito", &[("audit_events", 1)]).await;
}

#[tokio::test]
async fn a_space_with_memory_off_leaves_nothing_but_the_users_own_actions() {
    let mut sandbox = Sandbox::start().await;
    let scope = new_scope("paused");
    let stored = remember_memory(&mut sandbox, &scope, "I water the plants on Sundays").await;
    let conversation = Uuid::new_v4().to_string();
    let mut probe = Probe::new(&mut sandbox).await;

    update_setting(probe.sandbox, &scope, Setting::MemoryEnabled(false)).await;
    probe
        .leaves("UpdateSettings memory off", &[("audit_events", 1)])
        .await;
    content_calls_leave_nothing(&mut probe, &scope, &conversation, "memory off").await;
    // Grading is learning from what the user said: with memory off it records nothing, not even
    // the queries, though the caller asked for no dry run.
    let graded = grade(probe.sandbox, &scope, &stored, false).await;
    assert!(graded.iter().all(|graded| !graded.applied), "{graded:?}");
    probe.leaves("memory off: GradeMemories", &[]).await;
    reads_and_controls(&mut probe, &scope, &stored, "memory off").await;
    // Nothing of the conversation was ever stored: there is nothing to read or forget.
    let state = probe
        .sandbox
        .ingest
        .get_conversation(v1::GetConversationRequest {
            scope: Some(scope.clone()),
            conversation_id: conversation.clone(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(state.code(), tonic::Code::NotFound);
    let forgotten = probe
        .sandbox
        .ingest
        .forget_conversation(v1::ForgetConversationRequest {
            scope: Some(scope.clone()),
            conversation_id: conversation.clone(),
        })
        .await
        .unwrap_err();
    assert_eq!(forgotten.code(), tonic::Code::NotFound);
    probe
        .leaves("memory off: GetConversation, ForgetConversation", &[])
        .await;
    // Incognito switches are the user's own, and recorded as such.
    start_incognito(probe.sandbox, &scope, &conversation).await;
    probe
        .leaves(
            "memory off: StartIncognito",
            &[("audit_events", 1), ("conversations", 1)],
        )
        .await;
    end_incognito(probe.sandbox, &scope, &conversation).await;
    probe
        .leaves("memory off: EndIncognito", &[("audit_events", 1)])
        .await;
    // Remember once more, now in a conversation that is no longer incognito: memory is still off.
    let answer = probe
        .sandbox
        .ingest
        .remember(remember(&scope, "My bike is blue"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(answer.outcome(), v1::RememberOutcome::SkippedMemoryDisabled);
    probe.leaves("memory off: Remember", &[]).await;
}
