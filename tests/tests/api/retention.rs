//! Retention through the API: each space's rules (UpdateSettings / GetSettings), raw turns
//! deleted after their segment became an episode, entries past their maximum age, inactive
//! entries that leave default retrieval and are deleted after a grace period, PreviewRetention
//! matching what a run then deletes, and two runs started together deleting each row once.
//! Rows are backdated in the database, or a run is started with a later clock.

use std::collections::{HashMap, HashSet};

use chrono::{Duration, Utc};
use engram_e2e::Sandbox;
use engram_ingest::retention::RunReport;
use engram_proto::v1;
use engram_server::time::to_proto;
use tonic::Code;
use uuid::Uuid;

use crate::conversations::{Chat, assistant, user};
use crate::helpers::{assert_status, entries, import, new_scope, remember, remember_response};
use crate::retrieval::retrieve;

fn days(days: u32) -> Option<u32> {
    Some(days)
}

async fn set_retention(
    sandbox: &mut Sandbox,
    scope: &v1::Scope,
    retention: v1::RetentionPolicy,
) -> v1::SpaceSettings {
    sandbox
        .ingest
        .update_settings(v1::UpdateSettingsRequest {
            scope: Some(scope.clone()),
            retention: Some(retention),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .settings
        .unwrap()
}

/// A new space of a new user with these retention rules.
async fn space_with(sandbox: &mut Sandbox, space: &str, rules: v1::RetentionPolicy) -> v1::Scope {
    let scope = new_scope(space);
    set_retention(sandbox, &scope, rules).await;
    scope
}

async fn preview(sandbox: &mut Sandbox, scope: &v1::Scope) -> v1::PreviewRetentionResponse {
    sandbox
        .ingest
        .preview_retention(v1::PreviewRetentionRequest {
            scope: Some(scope.clone()),
            page_size: 0,
        })
        .await
        .unwrap()
        .into_inner()
}

async fn run(sandbox: &Sandbox, now: chrono::DateTime<Utc>) -> RunReport {
    sandbox
        .retention
        .run_once(now)
        .await
        .expect("the run succeeds")
        .expect("no other run holds the lock")
}

/// The audit events of the space with this action, newest first.
async fn audited(
    sandbox: &mut Sandbox,
    scope: &v1::Scope,
    action: v1::AuditAction,
) -> Vec<v1::AuditEvent> {
    let events = sandbox
        .ingest
        .list_audit(v1::ListAuditRequest {
            scope: Some(scope.clone()),
            page_size: 500,
            page_token: String::new(),
        })
        .await
        .unwrap()
        .into_inner()
        .events;
    events
        .into_iter()
        .filter(|event| event.action() == action)
        .collect()
}

fn detail(event: &v1::AuditEvent) -> serde_json::Value {
    serde_json::from_str(&event.detail_json).unwrap()
}

fn imported_fact(client_id: &str, text: &str, age_days: i64) -> v1::ImportedMemory {
    v1::ImportedMemory {
        client_id: client_id.to_owned(),
        kind: v1::MemoryKind::Semantic.into(),
        text: text.to_owned(),
        created_at: Some(to_proto(Utc::now() - Duration::days(age_days))),
        ..Default::default()
    }
}

/// An episode last reviewed `reviewed_days_ago`, with this stability.
fn imported_episode(
    client_id: &str,
    title: &str,
    stability: f64,
    reviewed_days_ago: i64,
) -> v1::ImportedMemory {
    let reviewed = Utc::now() - Duration::days(reviewed_days_ago);
    v1::ImportedMemory {
        client_id: client_id.to_owned(),
        kind: v1::MemoryKind::Episodic.into(),
        title: title.to_owned(),
        text: format!("The user talked about {title}."),
        conversation_id: Uuid::new_v4().to_string(),
        created_at: Some(to_proto(reviewed)),
        fsrs: Some(v1::FsrsState {
            stability,
            difficulty: 5.0,
            last_reviewed_at: Some(to_proto(reviewed)),
        }),
        ..Default::default()
    }
}

/// Backdates every entry of the space's last write by `days` (as if imported then).
async fn untouched_for(sandbox: &Sandbox, scope: &v1::Scope, days: i32) {
    sqlx::query(
        "UPDATE memories SET updated_at = now() - make_interval(days => $2) WHERE user_id = $1::uuid",
    )
    .bind(&scope.user_id)
    .bind(days)
    .execute(&sandbox.pool)
    .await
    .unwrap();
}

fn ids(memories: &[v1::Memory]) -> HashSet<String> {
    memories.iter().map(|memory| memory.id.clone()).collect()
}

#[tokio::test]
async fn settings_take_each_rule_and_reset_to_the_defaults() {
    let mut sandbox = Sandbox::start().await;
    let scope = new_scope("home");
    let settings = crate::helpers::space_settings(&mut sandbox, &scope).await;
    assert_eq!(
        settings.retention,
        Some(v1::RetentionPolicy {
            turn_retention_days: days(180),
            max_age_days: days(0),
            inactive_after_days: days(90),
            inactive_grace_days: days(90),
        }),
        "the service defaults"
    );
    assert_eq!(
        settings.retention_overrides,
        Some(v1::RetentionPolicy::default())
    );

    let settings = set_retention(
        &mut sandbox,
        &scope,
        v1::RetentionPolicy {
            max_age_days: days(180),
            inactive_after_days: days(0),
            ..Default::default()
        },
    )
    .await;
    let in_force = settings.retention.unwrap();
    assert_eq!(in_force.max_age_days, days(180));
    assert_eq!(in_force.inactive_after_days, days(0), "0 switches it off");
    assert_eq!(
        in_force.turn_retention_days,
        days(180),
        "unset: the default"
    );
    assert_eq!(
        settings.retention_overrides,
        Some(v1::RetentionPolicy {
            max_age_days: days(180),
            inactive_after_days: days(0),
            ..Default::default()
        })
    );
    let changes = audited(&mut sandbox, &scope, v1::AuditAction::SettingsChange).await;
    assert_eq!(changes.len(), 1);

    let status = sandbox
        .ingest
        .update_settings(v1::UpdateSettingsRequest {
            scope: Some(scope.clone()),
            retention: Some(v1::RetentionPolicy {
                inactive_grace_days: days(36_501),
                ..Default::default()
            }),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_status(
        status,
        Code::InvalidArgument,
        "retention.inactive_grace_days",
    );
    let status = sandbox
        .ingest
        .update_settings(v1::UpdateSettingsRequest {
            scope: Some(scope.clone()),
            retention: Some(v1::RetentionPolicy::default()),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_status(status, Code::InvalidArgument, "sets nothing");

    let reset = sandbox
        .ingest
        .update_settings(v1::UpdateSettingsRequest {
            scope: Some(scope.clone()),
            reset_retention: true,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .settings
        .unwrap();
    assert_eq!(
        reset.retention,
        crate::helpers::space_settings(&mut sandbox, &new_scope("x"))
            .await
            .retention
    );
    assert_eq!(
        reset.retention_overrides,
        Some(v1::RetentionPolicy::default())
    );

    let status = sandbox
        .ingest
        .preview_retention(v1::PreviewRetentionRequest {
            scope: Some(scope.clone()),
            page_size: 501,
        })
        .await
        .unwrap_err();
    assert_status(status, Code::InvalidArgument, "page_size");
}

/// Turns older than the window after summarization are gone and their episode stays; the open
/// segment's turns stay; GetConversation says how far turns were deleted; the preview said so.
#[tokio::test]
async fn summarized_turns_are_deleted_after_the_window_and_their_episode_stays() {
    let mut sandbox = Sandbox::start().await;
    let chat = Chat::new("travel");
    set_retention(
        &mut sandbox,
        &chat.scope,
        v1::RetentionPolicy {
            turn_retention_days: days(30),
            ..Default::default()
        },
    )
    .await;
    let start = Utc::now() - Duration::hours(2);
    let minute = |n: i64| start + Duration::minutes(n);
    chat.append(
        &mut sandbox,
        vec![
            user(
                "I'm planning a trip to Lisbon in May with my sister.",
                minute(0),
            ),
            assistant(
                "Lisbon in May is lovely. Do you want help with hotels?",
                minute(1),
            ),
            user("Yes, somewhere in Alfama, close to the river.", minute(2)),
            assistant(
                "I'll look for small hotels in Alfama near the river.",
                minute(3),
            ),
        ],
    )
    .await;
    chat.close(&mut sandbox).await;
    let episodes = chat.wait_for_episodes(&mut sandbox, 1).await;
    chat.append(
        &mut sandbox,
        vec![user("Also, my sister is vegetarian.", minute(30))],
    )
    .await;

    let nothing_yet = preview(&mut sandbox, &chat.scope).await;
    assert_eq!(nothing_yet.turns_to_delete, 0, "closed just now");

    // The segment closed 31 days ago.
    sqlx::query(
        "UPDATE summarized_segments SET closed_at = now() - interval '31 days' \
         WHERE user_id = $1::uuid",
    )
    .bind(&chat.scope.user_id)
    .execute(&sandbox.pool)
    .await
    .unwrap();
    let previewed = preview(&mut sandbox, &chat.scope).await;
    assert_eq!(previewed.turns_to_delete, 4);
    assert_eq!(previewed.conversations_with_turns_to_delete, 1);
    assert_eq!(previewed.policy.unwrap().turn_retention_days, days(30));

    let report = run(&sandbox, Utc::now()).await;
    assert_eq!(report.turns_deleted(), previewed.turns_to_delete);

    let state = chat.state(&mut sandbox).await;
    assert_eq!(state.turns_deleted_through, 3);
    assert_eq!(state.turn_count, 5);
    let kept: Vec<u32> = state.turns.iter().map(|turn| turn.turn_index).collect();
    assert_eq!(kept, vec![4], "the open segment's turn stays");
    assert!(
        !episodes[0].messages.is_empty(),
        "the episode kept an excerpt of its turns"
    );
    let listed = entries(&mut sandbox, &chat.scope).await;
    let episode = listed
        .iter()
        .find(|m| m.id == episodes[0].id)
        .expect("the episode stays");
    assert_eq!(episode.title, episodes[0].title);
    assert_eq!(episode.text, episodes[0].text);
    assert!(
        episode.messages.is_empty(),
        "its verbatim excerpt of the deleted turns goes with them"
    );
    let deleted = audited(&mut sandbox, &chat.scope, v1::AuditAction::RetentionDelete).await;
    assert_eq!(deleted.len(), 1);
    assert_eq!(deleted[0].conversation_id, chat.id);
    assert_eq!(detail(&deleted[0])["reason"], "TURNS_SUMMARIZED");
    assert_eq!(detail(&deleted[0])["turns"], 4);
    assert_eq!(detail(&deleted[0])["episode_excerpts_cleared"], 1);
    let runs = audited(&mut sandbox, &chat.scope, v1::AuditAction::RetentionRun).await;
    assert_eq!(runs.len(), 1);
    assert_eq!(detail(&runs[0])["deleted"]["TURNS_SUMMARIZED"], 4);
    assert_eq!(sandbox.ingest_metrics.retention_counts().deleted_turns, 4);

    // Nothing is left to do, and the conversation goes on.
    assert_eq!(preview(&mut sandbox, &chat.scope).await.turns_to_delete, 0);
    assert!(run(&sandbox, Utc::now()).await.spaces.is_empty());
    let appended = chat
        .append(&mut sandbox, vec![user("And she loves fado.", minute(40))])
        .await;
    assert_eq!(appended.turns[0].turn_index, 5);
}

/// An unpinned fact past the maximum age is deleted with a tombstone and an audit event; a
/// pinned and a saved one of the same age, and a young one, stay. The preview named it first.
#[tokio::test]
async fn entries_past_the_maximum_age_are_deleted_unless_pinned_or_saved() {
    let mut sandbox = Sandbox::start().await;
    let scope = space_with(
        &mut sandbox,
        "home",
        v1::RetentionPolicy {
            max_age_days: days(180),
            ..Default::default()
        },
    )
    .await;
    let old_text = "The user's locker code at the gym is 4417";
    import(
        &mut sandbox,
        &scope,
        vec![
            imported_fact("old", old_text, 200),
            v1::ImportedMemory {
                pinned: true,
                ..imported_fact("pinned", "The user's blood type is O negative", 200)
            },
            v1::ImportedMemory {
                manually_saved: true,
                ..imported_fact("saved", "The user's passport expires in 2031", 200)
            },
            imported_fact("young", "The user parks on level 3 at work", 10),
        ],
    )
    .await;
    let before = entries(&mut sandbox, &scope).await;
    let old = before.iter().find(|m| m.text == old_text).unwrap().clone();

    let previewed = preview(&mut sandbox, &scope).await;
    assert_eq!(previewed.entries_past_max_age, 1);
    assert_eq!(previewed.inactive_entries_past_grace, 0);
    let listed: Vec<(String, v1::RetentionReason)> = previewed
        .entries
        .iter()
        .map(|entry| (entry.memory_id.clone(), entry.reason()))
        .collect();
    assert_eq!(listed, vec![(old.id.clone(), v1::RetentionReason::Age)]);
    assert_eq!(previewed.entries[0].text, old_text);

    let report = run(&sandbox, Utc::now()).await;
    assert_eq!(report.entries_deleted(), 1);
    let after = entries(&mut sandbox, &scope).await;
    assert_eq!(after.len(), 3);
    assert!(!ids(&after).contains(&old.id));

    let deleted = audited(&mut sandbox, &scope, v1::AuditAction::RetentionDelete).await;
    assert_eq!(deleted.len(), 1);
    assert_eq!(deleted[0].memory_id, old.id);
    assert_eq!(detail(&deleted[0])["reason"], "AGE");
    let runs = audited(&mut sandbox, &scope, v1::AuditAction::RetentionRun).await;
    assert_eq!(detail(&runs[0])["deleted"]["AGE"], 1);
    assert_eq!(sandbox.ingest_metrics.retention_counts().deleted_entries, 1);

    // The tombstone: the same text said again is not stored at once.
    let again = remember_response(&mut sandbox, remember(&scope, old_text)).await;
    assert_eq!(again.outcome(), v1::RememberOutcome::SuppressedByTombstone);
}

/// An episode whose retrievability stayed low and that nothing returned becomes inactive, leaves
/// default retrieval, comes back with the flag (and in the export), and is deleted after the
/// grace period; one reviewed meanwhile is active again and stays. Facts: a plain one unused
/// fades, an important one does not.
#[tokio::test]
async fn unused_entries_become_inactive_and_are_deleted_after_the_grace_period() {
    let mut sandbox = Sandbox::start().await;
    let scope = space_with(
        &mut sandbox,
        "travel",
        v1::RetentionPolicy {
            inactive_after_days: days(30),
            inactive_grace_days: days(30),
            ..Default::default()
        },
    )
    .await;
    import(
        &mut sandbox,
        &scope,
        vec![
            // Stability 1 day, last reviewed 200 days ago: below 0.5 for about 110 days.
            imported_episode("faded", "the Lisbon trip of 2025", 1.0, 200),
            imported_episode("reviewed", "the Lisbon flat viewing", 1.0, 200),
            v1::ImportedMemory {
                pinned: true,
                ..imported_episode("pinned", "the Lisbon wedding", 1.0, 200)
            },
            // Stable: still likely recalled.
            imported_episode("stable", "the Lisbon conference", 5_000.0, 200),
            // Faded, but a retrieval returns it below: in use.
            imported_episode("returned", "the Porto ferry ride", 1.0, 200),
            v1::ImportedMemory {
                importance: Some(0.2),
                ..imported_fact("plain", "The user once tried a Lisbon custard tart", 200)
            },
            v1::ImportedMemory {
                importance: Some(0.9),
                ..imported_fact("important", "The user is allergic to Lisbon's pollen", 200)
            },
        ],
    )
    .await;
    // Imported 60 days ago, and nothing returned them since.
    untouched_for(&sandbox, &scope, 60).await;
    let by_title: HashMap<String, v1::Memory> = entries(&mut sandbox, &scope)
        .await
        .into_iter()
        .map(|m| {
            let key = if m.title.is_empty() {
                m.text.clone()
            } else {
                m.title.clone()
            };
            (key, m)
        })
        .collect();
    let id = |key: &str| by_title[key].id.clone();
    let ferry = retrieve(
        &mut sandbox,
        v1::RetrieveMemoryRequest {
            scope: Some(scope.clone()),
            query: "Porto ferry".into(),
            ..Default::default()
        },
    )
    .await;
    assert_eq!(
        ferry.episodic[0].memory.as_ref().unwrap().id,
        id("the Porto ferry ride")
    );
    // Its note that the ferry ride was returned is written.
    sandbox.write_read_traces().await;

    let previewed = preview(&mut sandbox, &scope).await;
    assert_eq!(previewed.entries_becoming_inactive, 3);
    let becoming: HashSet<String> = previewed
        .entries
        .iter()
        .map(|e| e.memory_id.clone())
        .collect();
    assert_eq!(
        becoming,
        HashSet::from([
            id("the Lisbon trip of 2025"),
            id("the Lisbon flat viewing"),
            id("The user once tried a Lisbon custard tart"),
        ])
    );

    let report = run(&sandbox, Utc::now()).await;
    assert_eq!(report.spaces[0].1.marked_inactive, 3);
    assert_eq!(report.entries_deleted(), 0, "inactive first, deleted later");
    let listed = entries(&mut sandbox, &scope).await;
    let inactive: HashSet<String> = listed
        .iter()
        .filter(|m| m.inactive_since.is_some())
        .map(|m| m.id.clone())
        .collect();
    assert_eq!(inactive, becoming);

    let lisbon = |include_inactive: bool| v1::RetrieveMemoryRequest {
        scope: Some(scope.clone()),
        query: "Lisbon".into(),
        episodic_limit: Some(10),
        include_inactive,
        ..Default::default()
    };
    let answer = retrieve(&mut sandbox, lisbon(false)).await;
    let found: HashSet<String> = answer
        .episodic
        .iter()
        .chain(&answer.semantic)
        .map(|r| r.memory.as_ref().unwrap().id.clone())
        .collect();
    assert!(
        found.is_disjoint(&inactive),
        "left out by default: {found:?}"
    );
    assert!(found.contains(&id("the Lisbon wedding")));
    assert!(found.contains(&id("the Lisbon conference")));
    let answer = retrieve(&mut sandbox, lisbon(true)).await;
    let found: HashSet<String> = answer
        .episodic
        .iter()
        .chain(&answer.semantic)
        .map(|r| r.memory.as_ref().unwrap().id.clone())
        .collect();
    assert!(
        found.is_superset(&inactive),
        "back with the flag: {found:?}"
    );
    let exported: HashSet<String> = {
        use futures::StreamExt;
        let mut stream = sandbox
            .retrieval
            .export_space(v1::ExportSpaceRequest {
                scope: Some(scope.clone()),
                include_embeddings: false,
                page_size: 100,
            })
            .await
            .unwrap()
            .into_inner();
        let mut exported = HashSet::new();
        while let Some(page) = stream.next().await {
            for memory in page.unwrap().memories {
                let memory = memory.memory.unwrap();
                if memory.inactive_since.is_some() {
                    exported.insert(memory.id);
                }
            }
        }
        exported
    };
    assert_eq!(exported, inactive, "the export keeps inactive entries");

    // A review of one makes it active again.
    let graded = sandbox
        .review
        .grade_memories(v1::GradeMemoriesRequest {
            scope: Some(scope.clone()),
            context: vec![v1::Message {
                role: v1::SpeakerRole::Assistant.into(),
                content: "You viewed a flat in Lisbon: the Lisbon flat viewing.".into(),
            }],
            memories: vec![v1::MemoryToGrade {
                memory_id: id("the Lisbon flat viewing"),
                queries: vec!["Lisbon flat".into()],
            }],
            dry_run: false,
            grader: v1::Grader::Local.into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(graded.graded[0].applied, "{:?}", graded.graded[0]);

    // After the grace period: the two still inactive are deleted, for INACTIVE.
    let later = Utc::now() + Duration::days(31);
    let report = run(&sandbox, later).await;
    assert_eq!(report.entries_deleted(), 2);
    let left = ids(&entries(&mut sandbox, &scope).await);
    assert!(!left.contains(&id("the Lisbon trip of 2025")));
    assert!(!left.contains(&id("The user once tried a Lisbon custard tart")));
    for kept in [
        "the Lisbon flat viewing",
        "the Lisbon wedding",
        "the Lisbon conference",
        "the Porto ferry ride",
        "The user is allergic to Lisbon's pollen",
    ] {
        assert!(left.contains(&id(kept)), "{kept} stays");
    }
    let deleted = audited(&mut sandbox, &scope, v1::AuditAction::RetentionDelete).await;
    assert_eq!(deleted.len(), 2);
    assert!(
        deleted
            .iter()
            .all(|event| detail(event)["reason"] == "INACTIVE")
    );
}

/// Two runs started together (two replicas): every due row is deleted and audited once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_runs_started_together_delete_each_row_once() {
    let mut sandbox = Sandbox::start().await;
    let scope = space_with(
        &mut sandbox,
        "work",
        v1::RetentionPolicy {
            max_age_days: days(30),
            ..Default::default()
        },
    )
    .await;
    for chunk in 0..3 {
        let facts = (0..400)
            .map(|n| {
                imported_fact(
                    &format!("{chunk}-{n}"),
                    &format!(
                        "Old note number {n} of batch {chunk} about project {}",
                        n * 7 + chunk
                    ),
                    40,
                )
            })
            .collect();
        import(&mut sandbox, &scope, facts).await;
    }
    let previewed = preview(&mut sandbox, &scope).await;
    assert_eq!(previewed.entries_past_max_age, 1_200);

    // While another session holds the run's lock (another replica mid-run), a run skips.
    let mut other_replica = sandbox.pool.acquire().await.unwrap();
    let held: bool = sqlx::query_scalar("SELECT pg_try_advisory_lock($1, 1)")
        .bind(0x656e_6772_i32)
        .fetch_one(&mut *other_replica)
        .await
        .unwrap();
    assert!(held);
    assert!(
        sandbox
            .retention
            .run_once(Utc::now())
            .await
            .unwrap()
            .is_none()
    );
    assert_eq!(
        preview(&mut sandbox, &scope).await.entries_past_max_age,
        1_200
    );
    sqlx::query("SELECT pg_advisory_unlock($1, 1)")
        .bind(0x656e_6772_i32)
        .execute(&mut *other_replica)
        .await
        .unwrap();
    drop(other_replica);

    let (first, second) = (sandbox.retention.clone(), sandbox.retention.clone());
    let now = Utc::now();
    let (first, second) = tokio::join!(
        tokio::spawn(async move { first.run_once(now).await }),
        tokio::spawn(async move { second.run_once(now).await }),
    );
    let reports: Vec<RunReport> = [first, second]
        .into_iter()
        .filter_map(|joined| joined.unwrap().unwrap())
        .collect();
    let deleted: u64 = reports.iter().map(RunReport::entries_deleted).sum();
    assert_eq!(deleted, 1_200);

    let audited_ids: Vec<String> = sqlx::query_scalar(
        "SELECT memory_id::text FROM audit_events WHERE user_id = $1::uuid AND action = 'retention_delete'",
    )
    .bind(&scope.user_id)
    .fetch_all(&sandbox.pool)
    .await
    .unwrap();
    assert_eq!(audited_ids.len(), 1_200);
    assert_eq!(audited_ids.iter().collect::<HashSet<_>>().len(), 1_200);
    let tombstones: i64 =
        sqlx::query_scalar("SELECT count(*) FROM tombstones WHERE user_id = $1::uuid")
            .bind(&scope.user_id)
            .fetch_one(&sandbox.pool)
            .await
            .unwrap();
    assert_eq!(tombstones, 1_200);
    assert!(entries(&mut sandbox, &scope).await.is_empty());
    let count = crate::helpers::space_settings(&mut sandbox, &scope)
        .await
        .memory_count;
    assert_eq!(count, 0);
}

/// A conversation whose episode retention deleted: forgetting the conversation still deletes
/// the facts derived only from it.
#[tokio::test]
async fn forgetting_a_conversation_reaches_facts_of_episodes_retention_deleted() {
    let mut sandbox = Sandbox::start().await;
    let chat = Chat::new("work");
    let start = Utc::now() - Duration::hours(3);
    let minute = |n: i64| start + Duration::minutes(n);
    chat.append(
        &mut sandbox,
        vec![
            user(
                "My manager is Priya Raman and I report to her weekly.",
                minute(0),
            ),
            assistant("Noted: your manager is Priya Raman.", minute(1)),
            user("I prefer meetings before noon.", minute(2)),
            assistant("Got it, mornings for meetings.", minute(3)),
        ],
    )
    .await;
    chat.close(&mut sandbox).await;
    let episodes = chat.wait_for_episodes(&mut sandbox, 1).await;
    let facts = chat.wait_for_consolidation(&mut sandbox).await;
    assert!(!facts.is_empty(), "consolidation derived facts");

    set_retention(
        &mut sandbox,
        &chat.scope,
        v1::RetentionPolicy {
            max_age_days: days(30),
            ..Default::default()
        },
    )
    .await;
    sqlx::query("UPDATE memories SET created_at = now() - interval '40 days' WHERE id = $1::uuid")
        .bind(&episodes[0].id)
        .execute(&sandbox.pool)
        .await
        .unwrap();
    let report = run(&sandbox, Utc::now()).await;
    assert_eq!(
        report.entries_deleted(),
        1,
        "the episode, not the young facts"
    );
    assert_eq!(entries(&mut sandbox, &chat.scope).await.len(), facts.len());

    let receipt = sandbox
        .ingest
        .forget_conversation(v1::ForgetConversationRequest {
            scope: Some(chat.scope.clone()),
            conversation_id: chat.id.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(receipt.facts_deleted as usize, facts.len());
    assert!(entries(&mut sandbox, &chat.scope).await.is_empty());
    let state = chat.state(&mut sandbox).await;
    assert_eq!(state.turns_deleted_through, 3);
}

/// A space that switches its inactivity rule off has nothing inactive any more.
#[tokio::test]
async fn switching_the_inactivity_rule_off_makes_entries_active_again() {
    let mut sandbox = Sandbox::start().await;
    let scope = new_scope("home");
    import(
        &mut sandbox,
        &scope,
        vec![v1::ImportedMemory {
            importance: Some(0.2),
            ..imported_fact("plain", "The user once bought a blue umbrella", 200)
        }],
    )
    .await;
    untouched_for(&sandbox, &scope, 120).await;
    let report = run(&sandbox, Utc::now()).await;
    assert_eq!(
        report.spaces[0].1.marked_inactive, 1,
        "the default rule: 90 days"
    );
    assert!(
        entries(&mut sandbox, &scope).await[0]
            .inactive_since
            .is_some()
    );

    set_retention(
        &mut sandbox,
        &scope,
        v1::RetentionPolicy {
            inactive_after_days: days(0),
            ..Default::default()
        },
    )
    .await;
    assert_eq!(
        preview(&mut sandbox, &scope)
            .await
            .inactive_entries_past_grace,
        0
    );
    let report = run(&sandbox, Utc::now() + Duration::days(365)).await;
    assert_eq!(report.spaces[0].1.reactivated, 1);
    assert_eq!(report.entries_deleted(), 0);
    let listed = entries(&mut sandbox, &scope).await;
    assert_eq!(listed.len(), 1);
    assert!(listed[0].inactive_since.is_none());
}
