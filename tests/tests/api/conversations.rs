//! Conversations in: turns kept in order, segments closed into episodes, facts consolidated, a
//! newer fact superseding an older one, pending reviews taken by the segment that answers them.

use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use engram_e2e::{Sandbox, SandboxOptions, TestBus};
use engram_proto::v1;
use tonic::Code;
use uuid::Uuid;

use crate::helpers::{assert_status, entries, hold_space_lock, new_scope, start_incognito};

/// One conversation of a test, with turns said at given times.
pub(crate) struct Chat {
    pub(crate) scope: v1::Scope,
    pub(crate) id: String,
}

pub(crate) fn message(
    role: v1::SpeakerRole,
    content: &str,
    at: DateTime<Utc>,
) -> v1::ConversationMessage {
    v1::ConversationMessage {
        role: role.into(),
        content: content.to_owned(),
        at: Some(engram_server::time::to_proto(at)),
        client_message_id: String::new(),
    }
}

pub(crate) fn user(content: &str, at: DateTime<Utc>) -> v1::ConversationMessage {
    message(v1::SpeakerRole::User, content, at)
}

pub(crate) fn assistant(content: &str, at: DateTime<Utc>) -> v1::ConversationMessage {
    message(v1::SpeakerRole::Assistant, content, at)
}

impl Chat {
    pub(crate) fn new(space: &str) -> Self {
        Self {
            scope: new_scope(space),
            id: Uuid::new_v4().to_string(),
        }
    }

    pub(crate) async fn append(
        &self,
        sandbox: &mut Sandbox,
        messages: Vec<v1::ConversationMessage>,
    ) -> v1::AppendMessagesResponse {
        sandbox
            .ingest
            .append_messages(v1::AppendMessagesRequest {
                scope: Some(self.scope.clone()),
                conversation_id: self.id.clone(),
                messages,
                close_segment: false,
            })
            .await
            .unwrap()
            .into_inner()
    }

    pub(crate) async fn close(&self, sandbox: &mut Sandbox) -> v1::CloseSegmentResponse {
        sandbox
            .ingest
            .close_segment(v1::CloseSegmentRequest {
                scope: Some(self.scope.clone()),
                conversation_id: self.id.clone(),
            })
            .await
            .unwrap()
            .into_inner()
    }

    pub(crate) async fn state(&self, sandbox: &mut Sandbox) -> v1::GetConversationResponse {
        sandbox
            .ingest
            .get_conversation(v1::GetConversationRequest {
                scope: Some(self.scope.clone()),
                conversation_id: self.id.clone(),
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner()
    }

    /// Waits until the space holds `count` episodes (segmentation runs in the background).
    pub(crate) async fn wait_for_episodes(
        &self,
        sandbox: &mut Sandbox,
        count: usize,
    ) -> Vec<v1::Memory> {
        let deadline = Instant::now() + Duration::from_secs(40);
        loop {
            let episodes: Vec<v1::Memory> = entries(sandbox, &self.scope)
                .await
                .into_iter()
                .filter(|m| m.kind() == v1::MemoryKind::Episodic)
                .collect();
            if episodes.len() >= count {
                assert_eq!(episodes.len(), count, "more episodes than segments");
                return episodes;
            }
            assert!(
                Instant::now() < deadline,
                "{} of {count} episodes after 40 s",
                episodes.len()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Waits until every episode of the space is consolidated; returns the valid facts.
    pub(crate) async fn wait_for_consolidation(&self, sandbox: &mut Sandbox) -> Vec<v1::Memory> {
        let deadline = Instant::now() + Duration::from_secs(40);
        loop {
            let pending: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM memories WHERE user_id = $1::uuid AND kind = 'episodic' \
                 AND consolidated_at IS NULL",
            )
            .bind(&self.scope.user_id)
            .fetch_one(&sandbox.pool)
            .await
            .unwrap();
            if pending == 0 {
                return entries(sandbox, &self.scope)
                    .await
                    .into_iter()
                    .filter(|m| m.kind() == v1::MemoryKind::Semantic && m.invalid_at.is_none())
                    .collect();
            }
            assert!(
                Instant::now() < deadline,
                "{pending} episodes unconsolidated"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Appends one session, closes its segment and waits until the space holds `episodes`
    /// episodes, all consolidated; returns the valid facts.
    pub(crate) async fn say_session(
        &self,
        sandbox: &mut Sandbox,
        messages: Vec<v1::ConversationMessage>,
        episodes: usize,
    ) -> Vec<v1::Memory> {
        self.append(sandbox, messages).await;
        self.close(sandbox).await;
        self.wait_for_episodes(sandbox, episodes).await;
        self.wait_for_consolidation(sandbox).await
    }
}

/// The Markdown block (from its `### ` heading on) that shows `text`.
fn block_holding<'a>(markdown: &'a str, text: &str) -> &'a str {
    markdown
        .split("### ")
        .find(|block| block.contains(text))
        .unwrap_or_else(|| panic!("no block shows {text:?}:\n{markdown}"))
}

/// Appends each session (said `days` ago, a line a minute, the first speaker as the user and the
/// second as the assistant, as the dev dialogs send two people) and closes it.
pub(crate) async fn append_sessions(
    sandbox: &mut Sandbox,
    chat: &Chat,
    sessions: &[(i64, &[&str])],
) {
    for &(days, lines) in sessions {
        let messages = lines
            .iter()
            .enumerate()
            .map(|(position, line)| {
                let at = days_ago(days, position as i64);
                if position % 2 == 0 {
                    user(line, at)
                } else {
                    assistant(line, at)
                }
            })
            .collect();
        chat.append(sandbox, messages).await;
        chat.close(sandbox).await;
    }
}

/// Waits until every turn up to `last_turn` is segmented (the rules may split a session), then
/// until what was segmented is consolidated.
pub(crate) async fn wait_until_segmented(sandbox: &mut Sandbox, chat: &Chat, last_turn: i32) {
    let deadline = Instant::now() + Duration::from_secs(40);
    while chat.state(sandbox).await.segmented_through < last_turn {
        assert!(Instant::now() < deadline, "not segmented after 40 s");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    chat.wait_for_consolidation(sandbox).await;
}

fn days_ago(days: i64, minutes: i64) -> DateTime<Utc> {
    Utc::now() - chrono::Duration::days(days) + chrono::Duration::minutes(minutes)
}

/// The first session of the test conversation: a new job, a manager, a preference.
fn first_session() -> Vec<v1::ConversationMessage> {
    vec![
        user(
            "I started a new job at Acme Robotics this week.",
            days_ago(3, 0),
        ),
        assistant("Congratulations! Is it going well so far?", days_ago(3, 1)),
        // The fact follows a reply ("Yes, and …"): the conflict rules still see "my manager is".
        user(
            "Yes, and my manager is Alice Chen and she runs the perception team.",
            days_ago(3, 2),
        ),
        assistant("Sounds like a great team to learn from.", days_ago(3, 3)),
        user(
            "I prefer tea over coffee, so the office tea corner is a relief.",
            days_ago(3, 4),
        ),
        assistant(
            "Nice perk. Anything you want to prepare for next week?",
            days_ago(3, 5),
        ),
        user(
            "I need to finish the onboarding safety course by Friday.",
            days_ago(3, 6),
        ),
    ]
}

/// A later session: the manager changed.
fn second_session() -> Vec<v1::ConversationMessage> {
    vec![
        user("Big reorganisation at work today.", days_ago(1, 0)),
        assistant("Oh? What changed for you?", days_ago(1, 1)),
        user(
            "My manager is now Bob Smith, Alice moved to the Berlin office.",
            days_ago(1, 2),
        ),
        assistant(
            "That is a big change. How do you feel about it?",
            days_ago(1, 3),
        ),
        user(
            "Fine, Bob was my mentor during onboarding anyway.",
            days_ago(1, 4),
        ),
    ]
}

#[tokio::test]
async fn a_conversation_becomes_episodes_and_facts_and_a_newer_fact_supersedes_an_older_one() {
    let mut sandbox = Sandbox::start().await;
    let chat = Chat::new("life");
    let session = first_session();
    let appended = chat.append(&mut sandbox, session.clone()).await;
    let indexes: Vec<u32> = appended.turns.iter().map(|t| t.turn_index).collect();
    assert_eq!(indexes, (0..7).collect::<Vec<_>>());
    assert!(
        appended
            .turns
            .iter()
            .all(|t| t.outcome() == v1::TurnOutcome::Stored)
    );

    // Two days later a new session starts: the hour-long gap closes the first one.
    chat.append(&mut sandbox, second_session()).await;
    let episodes = chat.wait_for_episodes(&mut sandbox, 1).await;
    let first = &episodes[0];
    assert!(
        !first.title.is_empty() && !first.text.is_empty(),
        "{first:?}"
    );
    assert_eq!(first.messages.len(), 7);
    assert_eq!(first.conversation_id, chat.id);
    let fsrs = first.fsrs.as_ref().expect("an episode has FSRS state");
    assert!(
        fsrs.stability >= 2.3 && fsrs.stability <= 2.3065 * 1.5 + 1e-6,
        "{fsrs:?}"
    );
    assert!((0.0..=1.0).contains(&first.surprise));
    // Postgres keeps microseconds.
    let micros =
        |t: &Option<prost_types::Timestamp>| t.as_ref().map(|t| (t.seconds, t.nanos / 1_000));
    assert_eq!(micros(&first.start_at), micros(&session[0].at));
    assert_eq!(micros(&first.end_at), micros(&session[6].at));

    // The open second session closes on request.
    let closing = chat.close(&mut sandbox).await;
    assert!(closing.requested);
    assert_eq!((closing.first_turn_index, closing.last_turn_index), (7, 11));
    chat.wait_for_episodes(&mut sandbox, 2).await;
    let facts = chat.wait_for_consolidation(&mut sandbox).await;
    let texts: Vec<&str> = facts.iter().map(|f| f.text.as_str()).collect();
    assert!(
        texts.iter().any(|t| t.contains("Bob Smith")),
        "the new manager is a valid fact: {texts:?}"
    );
    assert!(
        !texts.iter().any(|t| t.contains("Alice Chen and she runs")),
        "the old manager is no longer valid: {texts:?}"
    );
    assert!(
        texts.iter().any(|t| t.contains("tea over coffee")),
        "{texts:?}"
    );
    let tea = facts
        .iter()
        .find(|f| f.text.contains("tea over coffee"))
        .unwrap();
    assert_eq!(tea.category(), v1::Category::Preference);
    assert_eq!(tea.source_episode_ids, vec![first.id.clone()]);

    // The older fact is kept as history, superseded by the newer one.
    let all = entries(&mut sandbox, &chat.scope).await;
    let alice = all
        .iter()
        .find(|m| m.text.contains("Alice Chen and she runs"))
        .expect("the superseded fact stays");
    assert!(alice.invalid_at.is_some());
    let bob = all.iter().find(|m| m.text.contains("Bob Smith")).unwrap();
    assert_eq!(alice.superseded_by, bob.id);
    // It stopped being true when the newer statement was said (a day ago), not when consolidation
    // wrote the newer fact.
    assert_eq!(micros(&alice.invalid_at), micros(&bob.valid_at));
    let said = engram_server::time::from_proto("valid_at", bob.valid_at.as_ref().unwrap()).unwrap();
    assert!(said < Utc::now() - chrono::Duration::hours(12), "{said}");

    let answer = sandbox
        .retrieval
        .retrieve_memory(v1::RetrieveMemoryRequest {
            scope: Some(chat.scope.clone()),
            query: "who is my manager?".into(),
            ranking: Some(v1::RankingOptions {
                sparse_only: true,
                ..Default::default()
            }),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let top = answer.semantic.first().expect("a fact answers");
    assert!(
        top.memory.as_ref().unwrap().text.contains("Bob Smith"),
        "{}",
        answer.markdown
    );
    assert!(
        answer.semantic.iter().all(|m| !m
            .memory
            .as_ref()
            .unwrap()
            .text
            .contains("Alice Chen and she runs")),
        "a superseded fact is not served: {}",
        answer.markdown
    );
    assert_eq!(answer.episodic.len(), 2, "{}", answer.markdown);

    // On request, a fact shows what it replaced; facts only, no episodes.
    let history = sandbox
        .retrieval
        .retrieve_memory(v1::RetrieveMemoryRequest {
            scope: Some(chat.scope.clone()),
            query: "who is my manager?".into(),
            episodic_limit: Some(0),
            include_history: true,
            ranking: Some(v1::RankingOptions {
                sparse_only: true,
                ..Default::default()
            }),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(history.episodic.is_empty());
    let current = &history.semantic[0];
    assert_eq!(current.history.len(), 1, "{}", history.markdown);
    assert!(current.history[0].text.contains("Alice Chen"));
    assert!(
        history.markdown.contains("  - earlier (until ") && history.markdown.contains("Alice Chen"),
        "{}",
        history.markdown
    );

    // The space's summary carries each recent episode's structured summary.
    let summary = sandbox
        .retrieval
        .get_summary(v1::GetSummaryRequest {
            scope: Some(chat.scope.clone()),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(summary.recent_episodes.len(), 2);
    let established = summary.recent_episodes[1]
        .structured_summary
        .as_ref()
        .unwrap();
    assert!(
        established
            .todos
            .iter()
            .any(|t| t.contains("safety course")),
        "{established:?}"
    );
    assert!(
        summary.summary.contains("  - to do: "),
        "{}",
        summary.summary
    );

    let state = chat.state(&mut sandbox).await;
    assert_eq!(state.turn_count, 12);
    assert_eq!(state.segmented_through, 11);
    assert_eq!(state.turns.len(), 12);
    assert_eq!(state.turns[2].content, session[2].content);
}

#[tokio::test]
async fn turns_are_idempotent_ordered_and_checked() {
    let mut sandbox = Sandbox::start().await;
    let chat = Chat::new("work");
    let now = Utc::now();
    let mut first = user(
        "Let us plan the release.",
        now - chrono::Duration::minutes(5),
    );
    first.client_message_id = "m-1".into();
    let mut second = assistant("Sure, which date?", now - chrono::Duration::minutes(4));
    second.client_message_id = "m-2".into();
    chat.append(&mut sandbox, vec![first.clone(), second.clone()])
        .await;
    // A client's retry of the same messages appends nothing.
    let again = chat.append(&mut sandbox, vec![first, second]).await;
    let outcomes: Vec<(v1::TurnOutcome, u32)> = again
        .turns
        .iter()
        .map(|t| (t.outcome(), t.turn_index))
        .collect();
    assert_eq!(
        outcomes,
        [
            (v1::TurnOutcome::Duplicate, 0),
            (v1::TurnOutcome::Duplicate, 1)
        ]
    );
    // A turn said before the last one is refused, and changes nothing.
    let status = sandbox
        .ingest
        .append_messages(v1::AppendMessagesRequest {
            scope: Some(chat.scope.clone()),
            conversation_id: chat.id.clone(),
            messages: vec![user("Too early", now - chrono::Duration::hours(2))],
            close_segment: false,
        })
        .await
        .unwrap_err();
    assert_status(status, Code::FailedPrecondition, "messages[0].at");
    // Out of order within one request, in a new conversation: refused, and nothing is created.
    let fresh = Uuid::new_v4().to_string();
    let status = sandbox
        .ingest
        .append_messages(v1::AppendMessagesRequest {
            scope: Some(chat.scope.clone()),
            conversation_id: fresh.clone(),
            messages: vec![
                user("Second thought first", now - chrono::Duration::hours(1)),
                user("First thought second", now - chrono::Duration::hours(2)),
            ],
            close_segment: false,
        })
        .await
        .unwrap_err();
    assert_status(status, Code::FailedPrecondition, "messages[1].at");
    let never_created = sandbox
        .ingest
        .get_conversation(v1::GetConversationRequest {
            scope: Some(chat.scope.clone()),
            conversation_id: fresh,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(never_created.code(), Code::NotFound);
    for (request, needle) in [
        (
            v1::AppendMessagesRequest {
                scope: Some(chat.scope.clone()),
                conversation_id: chat.id.clone(),
                messages: vec![],
                close_segment: false,
            },
            "messages: must hold at least one turn",
        ),
        (
            v1::AppendMessagesRequest {
                scope: Some(chat.scope.clone()),
                conversation_id: "nope".into(),
                messages: vec![user("hi", now)],
                close_segment: false,
            },
            "conversation_id: must be a UUID",
        ),
        (
            v1::AppendMessagesRequest {
                scope: Some(chat.scope.clone()),
                conversation_id: chat.id.clone(),
                messages: vec![user("  \u{200b} ", now)],
                close_segment: false,
            },
            "messages[0].content: must not be empty",
        ),
        (
            v1::AppendMessagesRequest {
                scope: Some(chat.scope.clone()),
                conversation_id: chat.id.clone(),
                messages: vec![user("from the future", now + chrono::Duration::days(1))],
                close_segment: false,
            },
            "messages[0].at: must not be in the future",
        ),
    ] {
        let status = sandbox.ingest.append_messages(request).await.unwrap_err();
        assert_status(status, Code::InvalidArgument, needle);
    }
    assert_eq!(chat.state(&mut sandbox).await.turn_count, 2);
    let missing = sandbox
        .ingest
        .get_conversation(v1::GetConversationRequest {
            scope: Some(chat.scope.clone()),
            conversation_id: Uuid::new_v4().to_string(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(missing.code(), Code::NotFound);
}

/// Many clients appending to one conversation at once: every turn lands exactly once, with
/// distinct indexes 0..n, and each client's own turns keep their order.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_appenders_never_lose_duplicate_or_reorder_turns() {
    let sandbox = Sandbox::start().await;
    let chat = Chat::new("busy");
    const CLIENTS: usize = 12;
    const TURNS: usize = 15;
    let mut tasks = Vec::new();
    for client in 0..CLIENTS {
        let mut ingest = sandbox.ingest.clone();
        let scope = chat.scope.clone();
        let id = chat.id.clone();
        tasks.push(tokio::spawn(async move {
            for turn in 0..TURNS {
                let mut said = user(&format!("client {client} turn {turn}"), Utc::now());
                said.at = None;
                said.client_message_id = format!("{client}-{turn}");
                ingest
                    .append_messages(v1::AppendMessagesRequest {
                        scope: Some(scope.clone()),
                        conversation_id: id.clone(),
                        messages: vec![said],
                        close_segment: false,
                    })
                    .await
                    .unwrap();
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    let turns: Vec<(i32, String, DateTime<Utc>)> = sqlx::query_as(
        "SELECT turn_index, content, spoken_at FROM conversation_turns \
         WHERE user_id = $1::uuid AND conversation_id = $2::uuid ORDER BY turn_index",
    )
    .bind(&chat.scope.user_id)
    .bind(&chat.id)
    .fetch_all(&sandbox.pool)
    .await
    .unwrap();
    assert_eq!(turns.len(), CLIENTS * TURNS);
    let indexes: Vec<i32> = turns.iter().map(|(index, _, _)| *index).collect();
    assert_eq!(indexes, (0..(CLIENTS * TURNS) as i32).collect::<Vec<_>>());
    assert!(
        turns.windows(2).all(|w| w[0].2 <= w[1].2),
        "times follow turn order"
    );
    for client in 0..CLIENTS {
        let own: Vec<usize> = turns
            .iter()
            .filter_map(|(_, content, _)| {
                content
                    .strip_prefix(&format!("client {client} turn "))
                    .map(|n| n.parse().unwrap())
            })
            .collect();
        assert_eq!(own, (0..TURNS).collect::<Vec<_>>(), "client {client}");
    }
}

/// An append takes its space's privacy lock shared: it goes on while entries of the space are
/// being written (an episode, a Remember), and it waits for a privacy switch, whose outcome it
/// then honours.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_append_passes_entry_writes_of_its_space_but_waits_for_a_privacy_switch() {
    let mut sandbox = Sandbox::start().await;
    let chat = Chat::new("locks");
    let core_scope =
        engram_core::Scope::parse("scope", &chat.scope.user_id, &chat.scope.space).unwrap();
    let own_pool = sqlx::PgPool::connect(sandbox.database.url()).await.unwrap();

    // Entries of the space being written on another connection: the append is not held up.
    let entry_writer = hold_space_lock(
        &own_pool,
        engram_store::SpaceAccess::WriteEntries,
        &chat.scope,
    )
    .await;
    let mut said = user("I booked the dentist for Friday", Utc::now());
    said.at = None;
    let appended = tokio::time::timeout(
        Duration::from_secs(30),
        chat.append(&mut sandbox, vec![said]),
    )
    .await
    .expect("the append waited for the space's entry writer");
    assert_eq!(appended.turns[0].outcome(), v1::TurnOutcome::Stored);
    entry_writer.rollback().await.unwrap();

    // Memory being switched off on another connection: the append waits, then stores nothing.
    let mut switch =
        hold_space_lock(&own_pool, engram_store::SpaceAccess::Exclusive, &chat.scope).await;
    let mut ingest = sandbox.ingest.clone();
    let request = v1::AppendMessagesRequest {
        scope: Some(chat.scope.clone()),
        conversation_id: chat.id.clone(),
        messages: vec![{
            let mut said = user("My PIN is 4321", Utc::now());
            said.at = None;
            said
        }],
        close_segment: false,
    };
    let waiting = tokio::spawn(async move { ingest.append_messages(request).await });
    let started = Instant::now();
    loop {
        let blocked: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted \
             AND database = (SELECT oid FROM pg_database WHERE datname = current_database())",
        )
        .fetch_one(&sandbox.pool)
        .await
        .unwrap();
        if blocked >= 1 {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "the append never waited for the privacy switch"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(!waiting.is_finished());
    engram_store::spaces::update(
        &mut switch,
        &core_scope,
        &engram_store::spaces::SettingsPatch {
            memory_enabled: Some(false),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    switch.commit().await.unwrap();
    let appended = waiting.await.unwrap().unwrap().into_inner();
    assert_eq!(
        appended.turns[0].outcome(),
        v1::TurnOutcome::SkippedMemoryDisabled
    );
    let contents: Vec<String> = sqlx::query_scalar(
        "SELECT content FROM conversation_turns WHERE user_id = $1::uuid ORDER BY turn_index",
    )
    .bind(&chat.scope.user_id)
    .fetch_all(&sandbox.pool)
    .await
    .unwrap();
    assert_eq!(contents, vec!["I booked the dentist for Friday".to_owned()]);
}

/// An append whose space stays locked (a privacy switch that takes long) until the request's
/// deadline gives up waiting in time to say so: DEADLINE_EXCEEDED, and nothing stored, even once
/// the lock is released.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_append_locked_out_until_its_deadline_stores_nothing() {
    let sandbox = Sandbox::start().await;
    let chat = Chat::new("deadline");
    let own_pool = sqlx::PgPool::connect(sandbox.database.url()).await.unwrap();
    let switch =
        hold_space_lock(&own_pool, engram_store::SpaceAccess::Exclusive, &chat.scope).await;
    let mut said = user("Remember my new address", Utc::now());
    said.at = None;
    let mut request = tonic::Request::new(v1::AppendMessagesRequest {
        scope: Some(chat.scope.clone()),
        conversation_id: chat.id.clone(),
        messages: vec![said],
        close_segment: false,
    });
    request.set_timeout(Duration::from_millis(800));
    let status = sandbox
        .ingest
        .clone()
        .append_messages(request)
        .await
        .unwrap_err();
    assert_status(status, Code::DeadlineExceeded, "nothing was stored");
    switch.rollback().await.unwrap();
    // Nothing is left waiting to write it once the lock is free.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let stored: i64 =
        sqlx::query_scalar("SELECT count(*) FROM conversation_turns WHERE user_id = $1::uuid")
            .bind(&chat.scope.user_id)
            .fetch_one(&sandbox.pool)
            .await
            .unwrap();
    assert_eq!(stored, 0);
}

#[tokio::test]
async fn incognito_conversations_and_memory_off_store_no_turn() {
    let mut sandbox = Sandbox::start().await;
    let chat = Chat::new("private");
    start_incognito(&mut sandbox, &chat.scope, &chat.id).await;
    let appended = chat
        .append(
            &mut sandbox,
            vec![user("My passport number is X123", Utc::now())],
        )
        .await;
    assert_eq!(
        appended.turns[0].outcome(),
        v1::TurnOutcome::SkippedIncognito
    );
    let turns: i64 = sqlx::query_scalar("SELECT count(*) FROM conversation_turns")
        .fetch_one(&sandbox.pool)
        .await
        .unwrap();
    assert_eq!(turns, 0);
    // "stop incognito" in the chat: what follows it is kept, what preceded it is not.
    let mut said = user("end incognito for this chat", Utc::now());
    said.at = None;
    let mut after = user("Now remember my bike is blue", Utc::now());
    after.at = None;
    let appended = chat.append(&mut sandbox, vec![said, after]).await;
    assert_eq!(
        appended.turns[0].outcome(),
        v1::TurnOutcome::SkippedIncognito
    );
    let command = appended.turns[0].command.as_ref().expect("the command ran");
    assert_eq!(command.action(), v1::CommandAction::IncognitoEnd);
    assert_eq!(appended.turns[1].outcome(), v1::TurnOutcome::Stored);
}

/// The whole flow over the bus: segmentation requested through the outbox, the segment closed
/// by the consumer, and SegmentClosed carrying the pending reviews of a retrieval made during
/// the segment (consumed here from the review service's queue).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closed_segment_takes_its_pending_reviews_and_announces_them() {
    let bus = TestBus::local();
    let mut sandbox = Sandbox::start_with(SandboxOptions {
        bus: Some(bus.clone()),
        // The test reads the review service's queue itself.
        review_consumer_off: true,
        ..Default::default()
    })
    .await;
    let chat = Chat::new("reviews");
    // Something to retrieve: an imported episode about the same topic.
    crate::helpers::import(
        &mut sandbox,
        &chat.scope,
        vec![v1::ImportedMemory {
            client_id: "old-trip".into(),
            kind: v1::MemoryKind::Episodic.into(),
            title: "Lisbon trip planning".into(),
            text: "The user planned a week in Lisbon with trams and pastries".into(),
            conversation_id: Uuid::new_v4().to_string(),
            ..Default::default()
        }],
    )
    .await;
    let start = Utc::now() - chrono::Duration::minutes(10);
    chat.append(
        &mut sandbox,
        vec![
            user("I want to go back to Lisbon in spring.", start),
            assistant(
                "Lovely! Last time you enjoyed the trams.",
                start + chrono::Duration::minutes(1),
            ),
        ],
    )
    .await;
    let answer = sandbox
        .retrieval
        .retrieve_memory(v1::RetrieveMemoryRequest {
            scope: Some(chat.scope.clone()),
            query: "Lisbon trip".into(),
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
    let retrieved = answer.episodic[0].memory.as_ref().unwrap().id.clone();
    assert_eq!(chat.state(&mut sandbox).await.pending_reviews, 1);
    chat.append(
        &mut sandbox,
        vec![
            user(
                "Yes, the trams and the pastries were the best part.",
                start + chrono::Duration::minutes(2),
            ),
            assistant("Then spring it is!", start + chrono::Duration::minutes(3)),
        ],
    )
    .await;
    chat.close(&mut sandbox).await;
    chat.wait_for_episodes(&mut sandbox, 2).await;
    assert_eq!(
        chat.state(&mut sandbox).await.pending_reviews,
        0,
        "taken by the segment"
    );

    let closed = crate::helpers::next_event(&bus, "review.segment-closed").await;
    let event = <v1::SegmentClosed as prost::Message>::decode(closed.as_slice()).unwrap();
    assert_eq!(event.conversation_id, chat.id);
    assert_eq!((event.first_turn_index, event.last_turn_index), (0, 3));
    assert_eq!(event.reason, "explicit");
    assert_eq!(event.context.len(), 4);
    assert_eq!(event.pending_reviews.len(), 1);
    assert_eq!(event.pending_reviews[0].query, "Lisbon trip");
    assert_eq!(event.pending_reviews[0].memory_ids, vec![retrieved]);
    assert!(event.reviewed_at.is_some() && !event.episode_id.is_empty());
    assert_eq!(event.segment_id, event.episode_id);
}

/// A "remember" said inside AppendMessages became true when it was said, and its relative dates
/// count from then, not from when the service wrote it.
#[tokio::test]
async fn a_memory_command_in_a_conversation_is_dated_by_its_turn() {
    let mut sandbox = Sandbox::start().await;
    let chat = Chat::new("dentist");
    // Postgres keeps microseconds.
    let said_at = chrono::SubsecRound::trunc_subsecs(days_ago(26, 0), 6);
    let appended = chat
        .append(
            &mut sandbox,
            vec![user("Remember that the dentist is next Wednesday", said_at)],
        )
        .await;
    let command = appended.turns[0].command.as_ref().expect("a command");
    assert!(command.applied, "{command:?}");
    let saved = entries(&mut sandbox, &chat.scope)
        .await
        .into_iter()
        .find(|m| m.text.contains("dentist"))
        .expect("the saved memory");
    let micros =
        |t: &Option<prost_types::Timestamp>| t.as_ref().map(|t| (t.seconds, t.nanos / 1_000));
    assert_eq!(
        micros(&saved.valid_at),
        micros(&Some(engram_server::time::to_proto(said_at)))
    );
    let answer = sandbox
        .retrieval
        .retrieve_memory(v1::RetrieveMemoryRequest {
            scope: Some(chat.scope.clone()),
            query: "when is the dentist?".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let meant = engram_core::when::resolve("the dentist is next Wednesday", said_at);
    let label = format!("\"{}\" = {}", meant[0].phrase, meant[0].describe());
    assert!(
        answer.markdown.contains(&label),
        "{label} in:\n{}",
        answer.markdown
    );
}

#[tokio::test]
async fn forgetting_a_conversation_deletes_what_only_it_supports() {
    let mut sandbox = Sandbox::start().await;
    let chat = Chat::new("forget");
    // The user also saved something explicitly in this conversation: that stays.
    let said = || {
        let mut turns = first_session();
        turns.push(user("Remember that my locker code is 4812", days_ago(3, 7)));
        turns
    };
    chat.append(&mut sandbox, said()).await;
    chat.close(&mut sandbox).await;
    chat.wait_for_episodes(&mut sandbox, 1).await;
    chat.wait_for_consolidation(&mut sandbox).await;
    // Another conversation of the space says the same about tea.
    let other = Chat {
        scope: chat.scope.clone(),
        id: Uuid::new_v4().to_string(),
    };
    other
        .append(
            &mut sandbox,
            vec![
                user(
                    "I prefer tea over coffee, so the office tea corner is a relief.",
                    days_ago(2, 0),
                ),
                assistant("Good to know!", days_ago(2, 1)),
            ],
        )
        .await;
    other.close(&mut sandbox).await;
    chat.wait_for_episodes(&mut sandbox, 2).await;
    let facts = chat.wait_for_consolidation(&mut sandbox).await;
    let tea = facts
        .iter()
        .find(|f| f.text.contains("tea over coffee"))
        .unwrap();
    assert_eq!(tea.source_episode_ids.len(), 2, "{tea:?}");

    let receipt = sandbox
        .ingest
        .forget_conversation(v1::ForgetConversationRequest {
            scope: Some(chat.scope.clone()),
            conversation_id: chat.id.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(receipt.turns_deleted, 8);
    assert_eq!(receipt.episodes_deleted, 1);
    assert!(receipt.facts_deleted >= 2, "{receipt:?}");
    assert_eq!(
        receipt.facts_kept, 1,
        "the tea fact other episodes support: {receipt:?}"
    );
    let left = entries(&mut sandbox, &chat.scope).await;
    assert!(
        left.iter().any(|m| m.text.contains("locker code")),
        "explicit saves stay"
    );
    assert!(
        !left.iter().any(|m| m.text.contains("Alice Chen")),
        "derived facts go"
    );
    let teas: Vec<&v1::Memory> = left
        .iter()
        .filter(|m| m.kind() == v1::MemoryKind::Semantic && m.text.contains("tea over coffee"))
        .collect();
    assert_eq!(teas.len(), 1, "{teas:#?}");
    assert_eq!(teas[0].source_episode_ids.len(), 1, "{teas:#?}");
    let turns: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM conversation_turns WHERE conversation_id = $1::uuid",
    )
    .bind(&chat.id)
    .fetch_one(&sandbox.pool)
    .await
    .unwrap();
    assert_eq!(turns, 0);
    let audit = crate::helpers::audit(&mut sandbox, &chat.scope).await;
    assert_eq!(audit[0].action(), v1::AuditAction::ForgetConversation);

    // The same session appended again: the tombstones keep its episode from coming back.
    chat.append(&mut sandbox, said()).await;
    chat.close(&mut sandbox).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while chat.state(&mut sandbox).await.segmented_through < 7 {
        assert!(Instant::now() < deadline, "the segment never closed");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let episodes = entries(&mut sandbox, &chat.scope)
        .await
        .into_iter()
        .filter(|m| m.kind() == v1::MemoryKind::Episodic)
        .count();
    assert_eq!(episodes, 1, "only the other conversation's episode");
    let missing = sandbox
        .ingest
        .forget_conversation(v1::ForgetConversationRequest {
            scope: Some(chat.scope.clone()),
            conversation_id: Uuid::new_v4().to_string(),
        })
        .await
        .unwrap_err();
    assert_eq!(missing.code(), Code::NotFound);
}

/// With an LLM configured, segments are described by it: the request carries our prompt, the
/// segment as Markdown and a strict JSON schema; the answer's title, summary, surprise and
/// established facts become the episode and its facts.
#[tokio::test]
async fn an_llm_describes_segments_and_a_bad_answer_falls_back_to_the_local_rules() {
    let llm = engram_testkit::FakeLlm::start().await;
    let mut sandbox = Sandbox::start_with(SandboxOptions {
        llm_base_url: Some(llm.base_url()),
        ..Default::default()
    })
    .await;
    llm.push_json(serde_json::json!({
        "title": "New job at Acme Robotics",
        "summary": "The user started at Acme Robotics; Alice Chen is their manager.",
        "surprise": 0.9,
        "established": {
            "facts": ["The user works at Acme Robotics.", "My manager is Alice Chen."],
            "preferences": ["The user prefers tea over coffee."],
            "decisions": [],
            "todos": ["Finish the onboarding safety course by Friday."],
            "goals": [],
            "entities": ["Acme Robotics", "Alice Chen"]
        }
    }));
    let chat = Chat::new("llm");
    chat.append(&mut sandbox, first_session()).await;
    chat.close(&mut sandbox).await;
    let episode = chat.wait_for_episodes(&mut sandbox, 1).await.remove(0);
    assert_eq!(episode.title, "New job at Acme Robotics");
    assert_eq!(episode.surprise, 0.9);
    let structured = episode.structured_summary.as_ref().unwrap();
    assert_eq!(structured.entities, ["Acme Robotics", "Alice Chen"]);
    let facts = chat.wait_for_consolidation(&mut sandbox).await;
    let mut texts: Vec<&str> = facts.iter().map(|f| f.text.as_str()).collect();
    texts.sort_unstable();
    assert_eq!(
        texts,
        [
            "Finish the onboarding safety course by Friday.",
            "My manager is Alice Chen.",
            "The user prefers tea over coffee.",
            "The user works at Acme Robotics."
        ]
    );

    let requests = llm.requests();
    assert_eq!(requests.len(), 1);
    let request = &requests[0];
    assert_eq!(request["model"], "fake-model");
    let format = &request["response_format"];
    assert_eq!(format["type"], "json_schema");
    assert_eq!(format["json_schema"]["name"], "segment_episode");
    assert_eq!(format["json_schema"]["strict"], true);
    assert_eq!(
        format["json_schema"]["schema"]["required"],
        serde_json::json!(["title", "summary", "surprise", "established"])
    );
    let system = request["messages"][0]["content"].as_str().unwrap();
    assert!(
        system.contains("long-term memory") && system.contains("Never invent"),
        "{system}"
    );
    let segment = request["messages"][1]["content"].as_str().unwrap();
    assert!(segment.starts_with("## Conversation segment"), "{segment}");
    // The turns are numbered: the items cite them.
    assert!(
        segment.contains("- [1] user (") && segment.contains("Yes, and my manager is Alice Chen")
    );

    // A malformed answer (twice: the client retries once): the episode is still written, by the
    // extractive rules, and the fallback is counted and audited.
    llm.push_raw_content("{\"title\": \"cut off");
    llm.push_raw_content("not json at all");
    let later = Chat {
        scope: chat.scope.clone(),
        id: Uuid::new_v4().to_string(),
    };
    later.append(&mut sandbox, second_session()).await;
    later.close(&mut sandbox).await;
    chat.wait_for_episodes(&mut sandbox, 2).await;
    chat.wait_for_consolidation(&mut sandbox).await;
    // One fallback, the episode's description. (Its facts need no conflict check: the subject
    // rules already superseded the old manager, and no other earlier fact shares their words.)
    assert_eq!(
        sandbox.ingest_metrics.conversation_counts().llm_fallbacks,
        1
    );
    let audit = crate::helpers::audit(&mut sandbox, &chat.scope).await;
    let described: Vec<String> = audit
        .iter()
        .filter(|e| e.action() == v1::AuditAction::Create && e.detail_json.contains("described_by"))
        .map(|e| e.detail_json.clone())
        .collect();
    assert!(
        described[0].contains("\"described_by\":\"extractive\""),
        "{described:?}"
    );
    assert!(
        described[1].contains("\"described_by\":\"llm\""),
        "{described:?}"
    );
}

/// The broker goes away mid-conversation: appends still answer, their segmentation requests and
/// the closed segments' events wait in the outbox; when it returns, everything is delivered, and
/// the late requests find the segments already closed: no turn lost, no episode written twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_outage_mid_conversation_loses_no_turn_and_doubles_no_episode() {
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
    let session = first_session();
    chat.append(&mut sandbox, session[..4].to_vec()).await;

    proxy.cut();
    let cut_at: chrono::DateTime<Utc> = sqlx::query_scalar("SELECT clock_timestamp()")
        .fetch_one(&sandbox.pool)
        .await
        .unwrap();
    // Turns keep arriving; the second session's first turn closes the first by the gap, and an
    // explicit close ends the second.
    chat.append(&mut sandbox, session[4..].to_vec()).await;
    chat.append(&mut sandbox, second_session()).await;
    chat.close(&mut sandbox).await;
    // With the broker away, the sweep still closes what was asked to close.
    chat.wait_for_episodes(&mut sandbox, 2).await;
    let unpublished: i64 =
        sqlx::query_scalar("SELECT count(*) FROM outbox_events WHERE published_at IS NULL")
            .fetch_one(&sandbox.pool)
            .await
            .unwrap();
    assert!(unpublished >= 1, "events wait in the outbox: {unpublished}");
    // One segmentation request per conversation while one is pending: the three calls during
    // the cut asked at most once (none when the request from before the cut was still pending).
    let requested: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM outbox_events \
         WHERE type_name = 'engram.v1.SegmentationRequested' AND created_at >= $1",
    )
    .bind(cut_at)
    .fetch_one(&sandbox.pool)
    .await
    .unwrap();
    assert!(requested <= 1, "{requested} requests for one conversation");

    proxy.restore().await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let unpublished: i64 =
            sqlx::query_scalar("SELECT count(*) FROM outbox_events WHERE published_at IS NULL")
                .fetch_one(&sandbox.pool)
                .await
                .unwrap();
        if unpublished == 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{unpublished} events never published"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // The late segmentation requests are consumed and change nothing.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let state = chat.state(&mut sandbox).await;
    assert_eq!(state.turn_count, 12, "no turn lost");
    assert_eq!(state.segmented_through, 11);
    let turns: Vec<i32> = sqlx::query_scalar(
        "SELECT turn_index FROM conversation_turns WHERE conversation_id = $1::uuid ORDER BY 1",
    )
    .bind(&chat.id)
    .fetch_all(&sandbox.pool)
    .await
    .unwrap();
    assert_eq!(turns, (0..12).collect::<Vec<_>>());
    chat.wait_for_episodes(&mut sandbox, 2).await;
    let segments: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM audit_events WHERE action = 'segment' AND conversation_id = $1::uuid",
    )
    .bind(&chat.id)
    .fetch_one(&sandbox.pool)
    .await
    .unwrap();
    assert_eq!(segments, 2, "each segment closed once");
    drop(sandbox);
    crate::helpers::delete_topology(&bus).await;
}

/// With an LLM, consolidation asks it which earlier facts the new ones make no longer true —
/// here a move the subject rules cannot see ("The user relocated to Lisbon" against "The user
/// lives in Paris") — and a label it invents is ignored, never guessed at.
#[tokio::test]
async fn an_llm_judges_conflicts_the_rules_cannot_see() {
    let llm = engram_testkit::FakeLlm::start().await;
    llm.set_responder(|request| {
        let task = request["response_format"]["json_schema"]["name"]
            .as_str()
            .unwrap_or("");
        let user = request["messages"][1]["content"]
            .as_str()
            .unwrap_or("")
            .to_owned();
        match task {
            "segment_episode" => {
                let fact = if user.contains("Lisbon") {
                    "The user relocated to Lisbon for the new role."
                } else {
                    "The user lives in Paris."
                };
                engram_testkit::FakeAnswer::Json(serde_json::json!({
                    "title": "Where the user lives",
                    "summary": fact,
                    "surprise": 0.4,
                    "established": {"facts": [fact], "preferences": [], "decisions": [],
                                    "todos": [], "goals": [], "entities": []}
                }))
            }
            _ => {
                // The label of the earlier fact about Paris, and one that was never given.
                let paris = user
                    .lines()
                    .find(|line| line.contains("Paris"))
                    .and_then(|line| line.trim_start_matches("- ").split(':').next())
                    .unwrap_or("E1")
                    .to_owned();
                engram_testkit::FakeAnswer::Json(serde_json::json!({
                    "superseded": [{"new": "N1", "earlier": [paris, "E99"]}]
                }))
            }
        }
    });
    let mut sandbox = Sandbox::start_with(SandboxOptions {
        llm_base_url: Some(llm.base_url()),
        ..Default::default()
    })
    .await;
    let chat = Chat::new("moves");
    chat.append(
        &mut sandbox,
        vec![user(
            "I love living in Paris, the bakeries here are great.",
            days_ago(20, 0),
        )],
    )
    .await;
    chat.close(&mut sandbox).await;
    chat.wait_for_episodes(&mut sandbox, 1).await;
    chat.wait_for_consolidation(&mut sandbox).await;
    chat.append(
        &mut sandbox,
        vec![user(
            "Big news: I took the job and I'm in Lisbon now.",
            days_ago(2, 0),
        )],
    )
    .await;
    chat.close(&mut sandbox).await;
    chat.wait_for_episodes(&mut sandbox, 2).await;
    let valid = chat.wait_for_consolidation(&mut sandbox).await;
    let texts: Vec<&str> = valid.iter().map(|f| f.text.as_str()).collect();
    assert_eq!(texts, ["The user relocated to Lisbon for the new role."]);
    let all = entries(&mut sandbox, &chat.scope).await;
    let paris = all
        .iter()
        .find(|m| m.text == "The user lives in Paris.")
        .unwrap();
    assert!(paris.invalid_at.is_some());
    let audit = crate::helpers::audit(&mut sandbox, &chat.scope).await;
    let superseded = audit
        .iter()
        .find(|e| e.action() == v1::AuditAction::Supersede)
        .expect("audited");
    assert!(
        superseded.detail_json.contains("\"judged_by\":\"llm\""),
        "{}",
        superseded.detail_json
    );
    let asked: Vec<serde_json::Value> = llm
        .requests()
        .into_iter()
        .filter(|r| r["response_format"]["json_schema"]["name"] == "fact_conflicts")
        .collect();
    assert_eq!(
        asked.len(),
        1,
        "asked once, for the episode with an earlier fact to compare"
    );
    let question = asked[0]["messages"][1]["content"].as_str().unwrap();
    assert!(question.contains("## New facts") && question.contains("N1: The user relocated"));
}

/// A segment of nothing but greetings and thanks closes without an episode.
#[tokio::test]
async fn greetings_alone_make_no_episode() {
    let mut sandbox = Sandbox::start().await;
    let chat = Chat::new("smalltalk");
    let now = Utc::now();
    chat.append(
        &mut sandbox,
        vec![
            user("hi!", now - chrono::Duration::minutes(3)),
            assistant("Hello!", now - chrono::Duration::minutes(2)),
            user("thanks, bye", now - chrono::Duration::minutes(1)),
        ],
    )
    .await;
    chat.close(&mut sandbox).await;
    let deadline = Instant::now() + Duration::from_secs(20);
    while chat.state(&mut sandbox).await.segmented_through < 2 {
        assert!(Instant::now() < deadline, "the segment never closed");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(entries(&mut sandbox, &chat.scope).await.is_empty());
    let audit = crate::helpers::audit(&mut sandbox, &chat.scope).await;
    assert_eq!(audit[0].action(), v1::AuditAction::Segment);
    assert!(
        audit[0].detail_json.contains("greetings and thanks only"),
        "{}",
        audit[0].detail_json
    );
}

/// Requests for many conversations are segmented together (their turns embedded in one model
/// call): every conversation still gets its own episodes, covering its turns once,
/// its turns' embeddings, and its episodes embedded with their surprise measured.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conversations_segmented_together_each_get_their_own_episodes() {
    let bus = TestBus::local();
    let mut sandbox = Sandbox::start_with(SandboxOptions {
        bus: Some(bus.clone()),
        embedder: engram_e2e::TestEmbedder::Local,
        ..Default::default()
    })
    .await;
    let chats: Vec<Chat> = (0..6).map(|_| Chat::new("together")).collect();
    for chat in &chats {
        chat.append(&mut sandbox, first_session()).await;
    }
    // Six close requests in a burst: the consumer gathers them into batches.
    for chat in &chats {
        chat.close(&mut sandbox).await;
    }
    for chat in &chats {
        // The closed session may make more than one episode (the topic rules see embeddings
        // here); together they hold its seven turns. The deadlines are generous: the real model
        // (a debug build) shares two cores with three other tests, and this asserts what
        // happens, not how fast (make bench-conversations measures that).
        let deadline = Instant::now() + Duration::from_secs(120);
        let episodes = loop {
            let episodes: Vec<v1::Memory> = entries(&mut sandbox, &chat.scope)
                .await
                .into_iter()
                .filter(|m| m.kind() == v1::MemoryKind::Episodic)
                .collect();
            if episodes.iter().map(|e| e.messages.len()).sum::<usize>() >= 7 {
                break episodes;
            }
            assert!(Instant::now() < deadline, "{episodes:?}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        assert_eq!(
            episodes.iter().map(|e| e.messages.len()).sum::<usize>(),
            7,
            "every turn in one episode"
        );
        for episode in &episodes {
            assert_eq!(episode.conversation_id, chat.id);
            assert!((0.0..=1.0).contains(&episode.surprise));
            // Embedded by the embedding consumer, which measures its surprise in passing.
            let deadline = Instant::now() + Duration::from_secs(120);
            loop {
                let settled: bool = sqlx::query_scalar(
                    "SELECT EXISTS (SELECT 1 FROM memory_embeddings WHERE memory_id = $1) \
                         AND NOT (SELECT surprise_pending FROM memories WHERE id = $1)",
                )
                .bind(Uuid::parse_str(&episode.id).unwrap())
                .fetch_one(&sandbox.pool)
                .await
                .unwrap();
                if settled {
                    break;
                }
                assert!(
                    Instant::now() < deadline,
                    "episode {} never embedded",
                    episode.id
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        let turn_embeddings: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM conversation_turn_embeddings WHERE conversation_id = $1",
        )
        .bind(Uuid::parse_str(&chat.id).unwrap())
        .fetch_one(&sandbox.pool)
        .await
        .unwrap();
        assert_eq!(turn_embeddings, 7, "every turn embedded once");
    }
    drop(sandbox);
    crate::helpers::delete_topology(&bus).await;
}

/// CloseSegment answers as GetConversation does: NotFound, naming the conversation, for one the
/// space does not hold (another user's included); nothing to close in a known conversation is an
/// empty answer, not an error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closing_a_segment_of_an_unknown_conversation_is_not_found() {
    let mut sandbox = Sandbox::start().await;
    let chat = Chat::new("closing");
    let close = |scope: &v1::Scope, conversation: &str| v1::CloseSegmentRequest {
        scope: Some(scope.clone()),
        conversation_id: conversation.to_owned(),
    };

    let unknown = Uuid::new_v4().to_string();
    let status = sandbox
        .ingest
        .close_segment(close(&chat.scope, &unknown))
        .await
        .unwrap_err();
    assert_status(
        status,
        Code::NotFound,
        &format!("no conversation {unknown}"),
    );

    chat.append(&mut sandbox, vec![user("I moved to Porto", Utc::now())])
        .await;
    let elsewhere = new_scope("closing");
    let status = sandbox
        .ingest
        .close_segment(close(&elsewhere, &chat.id))
        .await
        .unwrap_err();
    assert_status(status, Code::NotFound, &chat.id);
    let closed = chat.close(&mut sandbox).await;
    assert!(closed.requested, "{closed:?}");
    assert_eq!((closed.first_turn_index, closed.last_turn_index), (0, 0));

    // A conversation known only by its incognito switch holds no turn to close.
    let quiet = Uuid::new_v4().to_string();
    start_incognito(&mut sandbox, &chat.scope, &quiet).await;
    let nothing = sandbox
        .ingest
        .close_segment(close(&chat.scope, &quiet))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(nothing, v1::CloseSegmentResponse::default());
}

/// The turn legs' vector search brings as many turns as `recall.turn_vector_candidates` says
/// (`TurnSearch::nearest_limit`), none with 0; the word search is unchanged by it.
#[tokio::test]
async fn the_turn_vector_leg_brings_the_turns_it_is_set_to_and_none_with_zero() {
    use engram_store::retrieval::Bm25;
    use engram_store::turn_search::{TurnSearch, find_turns};

    let mut sandbox = Sandbox::start().await;
    let chat = Chat::new("vectors");
    let said = |minutes| days_ago(1, minutes);
    chat.append(
        &mut sandbox,
        vec![
            user("The plumber comes on Friday morning.", said(0)),
            assistant("Good to know, I will remind you.", said(1)),
            user("My sister lives in Lyon now.", said(2)),
            assistant("Lyon is lovely in spring.", said(3)),
            user("I bought a red bicycle yesterday.", said(4)),
        ],
    )
    .await;
    // Turn vectors of a model of the test's own: turn n is the n-th unit vector, so the query's
    // vector, the last one's, is nearest turn 4 (the word "plumber" finds turn 0).
    let conversation: Uuid = chat.id.parse().unwrap();
    let unit = |n: usize| {
        let mut vector = vec![0.0f32; 384];
        vector[n] = 1.0;
        vector
    };
    for turn in 0..5 {
        sqlx::query(
            "INSERT INTO conversation_turn_embeddings \
                 (user_id, space, conversation_id, turn_index, model, embedding) \
             VALUES ($1::uuid, $2, $3, $4, 'test-vectors', $5)",
        )
        .bind(&chat.scope.user_id)
        .bind(&chat.scope.space)
        .bind(conversation)
        .bind(turn as i32)
        .bind(pgvector::Vector::from(unit(turn)))
        .execute(&sandbox.pool)
        .await
        .unwrap();
    }
    let scope = engram_core::Scope::parse("scope", &chat.scope.user_id, &chat.scope.space).unwrap();
    let query_vector = unit(4);
    let found = |nearest_limit| {
        let (pool, scope, query_vector) =
            (sandbox.pool.clone(), scope.clone(), query_vector.clone());
        async move {
            let search = TurnSearch {
                bm25: Bm25 { k1: 1.2, b: 0.75 },
                turn_vector: Some(("test-vectors", &query_vector)),
                limit: 10,
                nearest_limit,
                radius: 0,
                include_inactive: false,
            };
            let found = find_turns(&pool, &scope, "When does the plumber come?", search)
                .await
                .unwrap();
            let indexes = |hits: &[engram_store::turn_search::TurnHit]| {
                hits.iter()
                    .map(|hit| hit.turn.turn_index)
                    .collect::<Vec<_>>()
            };
            let stored: Vec<i32> = found.stored.iter().map(|turn| turn.turn_index).collect();
            (indexes(&found.hits), indexes(&found.nearest), stored)
        }
    };
    assert_eq!(found(1).await, (vec![0], vec![4], vec![0, 4]));
    assert_eq!(found(0).await, (vec![0], vec![], vec![0]));
}

/// What an assistant reads (issue 38): a conversation of several sessions appended, then a
/// question whose answer is one line of a long episode. Within 1,000 tokens the Markdown holds
/// that line as it was said, with its speaker, under its episode with the date it took place;
/// the structured results say which lines were shown.
#[tokio::test]
async fn the_line_that_answers_reaches_the_assistant_verbatim_within_1000_tokens() {
    let mut sandbox = Sandbox::start().await;
    let chat = Chat::new("dialog");
    // Two people, three dated sessions; the answer is one line in the middle of the second.
    let sessions: [(i64, &[&str]); 3] = [
        (
            30,
            &[
                "Joanna: Hey Nate! How was the tournament last weekend?",
                "Nate: Hey Joanna! We made it to the semifinals, which was fun.",
                "Joanna: Nice! Are you still streaming the games on weekends?",
                "Nate: Yes, every Saturday evening, and my turtles watch from their tank.",
                "Joanna: Ha, I love that. I started writing my screenplay again.",
                "Nate: That's great, what is it about?",
                "Joanna: A woman who moves to a lighthouse and finds old letters.",
                "Nate: Sounds moving. Send me a draft when you can.",
            ],
        ),
        (
            20,
            &[
                "Joanna: Hi Nate! I tried baking this weekend, it went badly.",
                "Nate: Oh no, what happened?",
                "Joanna: The cake collapsed in the oven, I think the oven is too hot.",
                "Nate: I have been making desserts too, mostly dairy-free ones.",
                "Joanna: Really? Which flavors do you like best?",
                "Nate: I love coconut milk, but I also enjoy chocolate and mixed berry flavors.",
                "Joanna: Yum. I should try a coconut one next time.",
                "Nate: Definitely, it is easier than it sounds.",
                "Joanna: By the way, my screenplay got a reading at the local theater.",
                "Nate: Congratulations! That's a big step.",
                "Joanna: Thanks! I was nervous the whole evening.",
                "Nate: I bet it went better than you think.",
            ],
        ),
        (
            10,
            &[
                "Joanna: Hey Nate, how are the turtles?",
                "Nate: They are fine, I bought them a bigger tank last week.",
                "Joanna: They must love it. I am reading a book about old lighthouses.",
                "Nate: Research for the screenplay?",
                "Joanna: Exactly, the second act needs more detail.",
                "Nate: Good luck with it, tell me how it goes.",
            ],
        ),
    ];
    append_sessions(&mut sandbox, &chat, &sessions).await;
    wait_until_segmented(&mut sandbox, &chat, 25).await;

    let answer = sandbox
        .retrieval
        .retrieve_memory(v1::RetrieveMemoryRequest {
            scope: Some(chat.scope.clone()),
            query: "Which dairy-free dessert flavors does Nate enjoy?".to_owned(),
            token_budget: Some(1_000),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(answer.tokens <= 1_000);
    let line = "I love coconut milk, but I also enjoy chocolate and mixed berry flavors.";
    assert!(
        answer.markdown.contains(&format!("- Nate: \"{line}\"")),
        "the answering line, verbatim under its speaker:\n{}",
        answer.markdown
    );
    // Under its episode, with the date the session took place (the line quoted: the fact
    // consolidation wrote from it may be shown too, in the facts' section).
    let said_on = days_ago(20, 0).format("%-d %b %Y").to_string();
    let block = block_holding(&answer.markdown, &format!("Nate: \"{line}\""));
    assert!(block.contains(&said_on), "the episode's date: {block}");
    // The structured results say which of the episode's lines were shown.
    let evidence = format!("Nate: {line}");
    assert!(
        answer.episodic.iter().any(|m| {
            let messages = &m.memory.as_ref().unwrap().messages;
            m.lines_shown
                .iter()
                .any(|&index| messages[index as usize].content == evidence)
        }),
        "lines_shown names the answering line: {:?}",
        answer
            .episodic
            .iter()
            .map(|m| &m.lines_shown)
            .collect::<Vec<_>>()
    );
}

/// A line shown for context is of the same session as the line it goes with: the first line of
/// a later session ("Mira: We fly on the 16th now.", short, so shown with the line before it)
/// does not bring the last line of a session days earlier under its own episode's heading and
/// date (seen by hand: "Thanks for telling me, have a great trip!" read as said 18 days later).
#[tokio::test]
async fn a_line_of_an_earlier_session_is_not_shown_as_a_later_lines_context() {
    let mut sandbox = Sandbox::start().await;
    let chat = Chat::new("sessions");
    let sessions: [(i64, &[&str]); 2] = [
        (
            10,
            &[
                "Mira: I booked the trip to Reykjavik with my sister Ines.",
                "Tomas: Lovely, the northern lights should be out in December.",
                "Mira: I hope so, Ines has never seen them.",
                "Tomas: Have a lovely evening, talk soon!",
            ],
        ),
        (
            2,
            &[
                "Mira: We fly on the 16th now.",
                "Tomas: Because of Ines's work?",
                "Mira: Yes, her project deadline moved to the 15th.",
                "Tomas: Makes sense, pack warm socks.",
            ],
        ),
    ];
    append_sessions(&mut sandbox, &chat, &sessions).await;
    wait_until_segmented(&mut sandbox, &chat, 7).await;

    let answer = sandbox
        .retrieval
        .retrieve_memory(v1::RetrieveMemoryRequest {
            scope: Some(chat.scope.clone()),
            query: "Which day do we fly now?".to_owned(),
            token_budget: Some(1_000),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let block = block_holding(&answer.markdown, "Mira: \"We fly on the 16th now.\"");
    assert!(
        block.contains(&days_ago(2, 0).format("%-d %b %Y").to_string()),
        "under the later session's episode: {block}"
    );
    assert!(
        !block.contains("Have a lovely evening"),
        "the earlier session's last line is not this line's context:\n{}",
        answer.markdown
    );
}

/// The stored turns are searched as soon as AppendMessages acknowledged them (issue 38): before
/// any segment closes, the line that answers is shown under "Conversation in progress" with the
/// day it was said; once the segment closes, under its episode. Forgetting the episode (its
/// turns stay) takes its lines out of every answer, as does forgetting the conversation.
#[tokio::test]
async fn the_lines_of_a_conversation_answer_at_once_and_go_when_forgotten() {
    let mut sandbox = Sandbox::start().await;
    let chat = Chat::new("open");
    let said = days_ago(2, 0);
    let lines = [
        "Did you book the flights for the Lisbon offsite?",
        "Yes, we fly out on the 14th and the hotel is near the river.",
        "Great, I will tell the team tonight.",
    ];
    let messages = lines
        .iter()
        .enumerate()
        .map(|(position, line)| {
            let at = said + chrono::Duration::minutes(position as i64);
            if position % 2 == 0 {
                user(line, at)
            } else {
                assistant(line, at)
            }
        })
        .collect();
    chat.append(&mut sandbox, messages).await;
    let ask = |sandbox: &mut Sandbox| {
        let mut retrieval = sandbox.retrieval.clone();
        let scope = chat.scope.clone();
        async move {
            retrieval
                .retrieve_memory(v1::RetrieveMemoryRequest {
                    scope: Some(scope),
                    query: "When do we fly to Lisbon?".to_owned(),
                    token_budget: Some(1_000),
                    ..Default::default()
                })
                .await
                .unwrap()
                .into_inner()
        }
    };
    let answer = ask(&mut sandbox).await;
    assert!(
        answer
            .markdown
            .contains(&format!("- assistant: \"{}\"", lines[1])),
        "the answering line of the open segment, under its speaker:\n{}",
        answer.markdown
    );
    let block = block_holding(&answer.markdown, lines[1]);
    assert!(block.starts_with("Conversation in progress"), "{block}");
    assert!(
        block.contains(&said.format("%-d %b %Y").to_string()),
        "{block}"
    );

    // Closed: the same line, under the episode that now holds it.
    chat.close(&mut sandbox).await;
    let episode = chat.wait_for_episodes(&mut sandbox, 1).await.remove(0);
    chat.wait_for_consolidation(&mut sandbox).await;
    let answer = ask(&mut sandbox).await;
    let block = block_holding(&answer.markdown, lines[1]);
    assert!(!block.starts_with("Conversation in progress"), "{block}");
    assert!(
        answer
            .episodic
            .iter()
            .any(|m| m.memory.as_ref().unwrap().id == episode.id),
        "the episode is in the structured results"
    );

    // The episode forgotten, its turns kept: none of its lines is shown any more.
    sandbox
        .ingest
        .forget(v1::ForgetRequest {
            scope: Some(chat.scope.clone()),
            memory_id: episode.id.clone(),
        })
        .await
        .unwrap();
    let answer = ask(&mut sandbox).await;
    assert!(
        !answer.markdown.contains(lines[0]) && answer.episodic.is_empty(),
        "a forgotten episode's lines come back through its turns:\n{}",
        answer.markdown
    );

    sandbox
        .ingest
        .forget_conversation(v1::ForgetConversationRequest {
            scope: Some(chat.scope.clone()),
            conversation_id: chat.id.clone(),
        })
        .await
        .unwrap();
    let answer = ask(&mut sandbox).await;
    assert!(
        !answer.markdown.contains("Lisbon"),
        "a forgotten conversation's lines are gone:\n{}",
        answer.markdown
    );
}

/// Issue 39, facts that stand alone: in a dialog of named people, each speaker's statements are
/// facts about them, stored with their name, whichever role the client sent them as (the
/// second speaker as the assistant here); reactions and compliments to the other speaker are no
/// facts. In a chat, the user's preference said after other words is kept, and the assistant's
/// own sentences are not facts about the user.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn facts_say_whom_they_are_about_and_reactions_are_no_facts() {
    let mut sandbox = Sandbox::start().await;
    let now = Utc::now();
    let minutes = |n: i64| now - chrono::Duration::minutes(n);

    let dialog = Chat::new("dialog");
    dialog
        .append(
            &mut sandbox,
            vec![
                user(
                    "Clara: Did you try the ice cream place on Hanover Street?",
                    minutes(6),
                ),
                assistant(
                    "Jonas: I did! I love coconut milk, but I also enjoy chocolate and mixed berry \
                     flavors.",
                    minutes(5),
                ),
                user(
                    "Clara: I love this quote you sent me, by the way.",
                    minutes(4),
                ),
                assistant(
                    "Jonas: I'm allergic to peanuts, so I always ask first.",
                    minutes(3),
                ),
                user("Clara: I'll have to check it out sometime.", minutes(2)),
            ],
        )
        .await;
    dialog.close(&mut sandbox).await;
    dialog.wait_for_episodes(&mut sandbox, 1).await;
    let facts: Vec<String> = dialog
        .wait_for_consolidation(&mut sandbox)
        .await
        .into_iter()
        .map(|m| m.text)
        .collect();
    assert!(
        facts
            .iter()
            .any(|f| f.starts_with("Jonas: I love coconut milk")),
        "{facts:?}"
    );
    assert!(
        facts
            .iter()
            .any(|f| f.starts_with("Jonas: I'm allergic to peanuts")),
        "{facts:?}"
    );
    assert!(
        facts
            .iter()
            .all(|f| !f.contains("this quote") && !f.contains("sometime")),
        "reactions and vague plans are no facts: {facts:?}"
    );

    let chat = Chat::new("chat");
    chat.append(
        &mut sandbox,
        vec![
            user("How long have you been a nurse?", minutes(4)),
            assistant(
                "You mentioned you work nights. I prefer to keep answers short.",
                minutes(3),
            ),
            user(
                "Six years now. I also prefer green tea over coffee, always.",
                minutes(2),
            ),
        ],
    )
    .await;
    chat.close(&mut sandbox).await;
    chat.wait_for_episodes(&mut sandbox, 1).await;
    let facts = chat.wait_for_consolidation(&mut sandbox).await;
    let green_tea = facts
        .iter()
        .find(|m| m.text.contains("green tea"))
        .unwrap_or_else(|| panic!("the user's preference is kept: {facts:?}"));
    assert_eq!(green_tea.category(), v1::Category::Preference);
    assert!(
        facts.iter().all(|m| !m.text.contains("keep answers short")),
        "the assistant's sentences are not the user's facts: {facts:?}"
    );
}

/// Issue 39 part 5: without an LLM, an episode's title is a short phrase naming its topic (not a
/// list of keywords or the speakers' names), and its summary leaves greetings, thanks and
/// congratulations out.
#[tokio::test]
async fn an_episode_is_titled_by_its_topic_and_summarised_without_courtesies() {
    let mut sandbox = Sandbox::start().await;
    let chat = Chat::new("titles");
    let session = vec![
        user(
            "Hey! Big news: we moved to Lisbon last month, boxes everywhere.",
            days_ago(2, 0),
        ),
        assistant(
            "Congratulations! How are you finding Lisbon so far?",
            days_ago(2, 1),
        ),
        user(
            "Lisbon is lovely, the light is amazing and the flat is near the river.",
            days_ago(2, 2),
        ),
        user(
            "We still need a bigger sofa for the Lisbon flat.",
            days_ago(2, 3),
        ),
        user("Thanks so much, talk soon!", days_ago(2, 4)),
    ];
    chat.say_session(&mut sandbox, session, 1).await;
    let episodes = chat.wait_for_episodes(&mut sandbox, 1).await;
    let episode = &episodes[0];
    assert_eq!(episode.title, "Moved to Lisbon last month");
    assert!(episode.text.contains("bigger sofa"), "{}", episode.text);
    for courtesy in ["Hey", "Thanks", "Congratulations", "talk soon"] {
        assert!(
            !episode.text.contains(courtesy),
            "{courtesy}: {}",
            episode.text
        );
    }
}

/// The fact (valid or not) whose text holds `needle`.
fn fact_holding<'a>(all: &'a [v1::Memory], needle: &str) -> &'a v1::Memory {
    all.iter()
        .find(|m| m.kind() == v1::MemoryKind::Semantic && m.text.contains(needle))
        .unwrap_or_else(|| panic!("a fact holding {needle:?}: {all:?}"))
}

/// Issue 39 parts 3 and 4: a move said in the plural and a new manager said in the third person
/// supersede the older facts, each from the turn it was said in (not the episode's end).
#[tokio::test]
async fn a_move_and_a_new_manager_in_other_words_supersede_from_their_turn() {
    let mut sandbox = Sandbox::start().await;
    let chat = Chat::new("updates");
    let first = vec![
        user("I live in Paris, near the canal.", days_ago(20, 0)),
        user("My manager is Alice Chen.", days_ago(20, 1)),
        user(
            "I'm learning the cello on Tuesday evenings.",
            days_ago(20, 2),
        ),
    ];
    chat.say_session(&mut sandbox, first, 1).await;

    let moved_at = days_ago(3, 0);
    let new_manager_at = days_ago(3, 2);
    let gave_up_at = days_ago(3, 3);
    let second = vec![
        user(
            "Big news: we moved to Lisbon last month, boxes everywhere.",
            moved_at,
        ),
        assistant("That's wonderful, congratulations!", days_ago(3, 1)),
        user(
            "Also, Bob is my manager now, Alice moved to the data team.",
            new_manager_at,
        ),
        user("I gave up the cello, it just wasn't clicking.", gave_up_at),
        user("Anyway, what should I cook tonight?", days_ago(3, 30)),
    ];
    let valid = chat.say_session(&mut sandbox, second, 2).await;
    let texts: Vec<&str> = valid.iter().map(|f| f.text.as_str()).collect();
    assert!(!texts.iter().any(|t| t.contains("Paris")), "{texts:?}");
    assert!(!texts.iter().any(|t| t.contains("Alice Chen")), "{texts:?}");

    let all = entries(&mut sandbox, &chat.scope).await;
    let find = |needle: &str| fact_holding(&all, needle);
    let micros = |t: &Option<prost_types::Timestamp>| {
        t.as_ref()
            .map(|t| (t.seconds, t.nanos / 1_000))
            .expect("a time")
    };
    let at = |t: DateTime<Utc>| (t.timestamp(), (t.timestamp_subsec_nanos() / 1_000) as i32);
    let (paris, lisbon) = (find("Paris"), find("Lisbon"));
    assert_eq!(paris.superseded_by, lisbon.id);
    assert_eq!(micros(&lisbon.valid_at), at(moved_at), "from its turn");
    assert_eq!(
        micros(&paris.invalid_at),
        at(moved_at),
        "until the move was said"
    );
    let (alice, bob) = (find("Alice Chen"), find("Bob is my manager"));
    assert_eq!(alice.superseded_by, bob.id);
    assert_eq!(micros(&alice.invalid_at), at(new_manager_at));
    // Something said to be over ends the older fact naming it.
    let (learning, gave_up) = (find("learning the cello"), find("gave up the cello"));
    assert_eq!(learning.superseded_by, gave_up.id);
    assert_eq!(micros(&learning.invalid_at), at(gave_up_at));
}

/// Issue 39 part 3: which of two facts of a subject (or a fact and the one saying it is over) is
/// current follows when each was said, not the order they were written in. A later session consolidated first (here another
/// conversation of the space, appended first) leaves the earlier session's fact superseded
/// from the moment the later one was said.
#[tokio::test]
async fn a_fact_written_after_a_newer_one_of_its_subject_is_written_superseded() {
    let mut sandbox = Sandbox::start().await;
    let later = Chat::new("order");
    let moved_at = days_ago(3, 0);
    let gave_up_at = days_ago(3, 1);
    let moved = vec![
        user("We moved to Lisbon last month, boxes everywhere.", moved_at),
        user("I gave up the cello, it just wasn't clicking.", gave_up_at),
    ];
    later.say_session(&mut sandbox, moved, 1).await;
    let earlier = Chat {
        scope: later.scope.clone(),
        id: Uuid::new_v4().to_string(),
    };
    let lived = vec![
        user("I live in Paris, near the canal.", days_ago(40, 0)),
        user(
            "I'm learning the cello on Tuesday evenings.",
            days_ago(40, 1),
        ),
    ];
    let valid = earlier.say_session(&mut sandbox, lived, 2).await;
    let texts: Vec<&str> = valid.iter().map(|f| f.text.as_str()).collect();
    assert!(!texts.iter().any(|t| t.contains("Paris")), "{texts:?}");

    let all = entries(&mut sandbox, &later.scope).await;
    let find = |needle: &str| fact_holding(&all, needle);
    let (paris, lisbon) = (find("Paris"), find("Lisbon"));
    assert_eq!(paris.superseded_by, lisbon.id);
    assert_eq!(paris.invalid_at, lisbon.valid_at, "until the move was said");
    assert!(lisbon.invalid_at.is_none());
    // The same for something said to be over.
    let (learning, gave_up) = (find("learning the cello"), find("gave up the cello"));
    assert_eq!(learning.superseded_by, gave_up.id);
    assert_eq!(learning.invalid_at, gave_up.valid_at);
}

/// Issue 39 part 3: the things one has one of at a time (a bank, a phone, a shift), replaced
/// in words that name no attribute ("moved my accounts over to", "I'm on … now"), supersede the
/// older facts; another phone said as an addition does not.
#[tokio::test]
async fn a_bank_a_phone_and_a_shift_replaced_in_other_words_supersede_the_older_facts() {
    let mut sandbox = Sandbox::start().await;
    let chat = Chat::new("replacements");
    let first = vec![
        user("I bank with Barclays, always have.", days_ago(30, 0)),
        user("I'm on an iPhone 11, it still works fine.", days_ago(30, 1)),
        user("I work nights at the sorting office.", days_ago(30, 2)),
        user("My sister has a Honda Jazz.", days_ago(30, 3)),
    ];
    chat.say_session(&mut sandbox, first, 1).await;
    let second = vec![
        user(
            "I moved all my accounts over to Monzo last week.",
            days_ago(2, 0),
        ),
        user("Got a new phone, I'm on a Galaxy S23 now.", days_ago(2, 1)),
        user("I'm on days now, seven till three.", days_ago(2, 2)),
        user("I drive a Skoda Fabia.", days_ago(2, 3)),
    ];
    chat.say_session(&mut sandbox, second, 2).await;

    let all = entries(&mut sandbox, &chat.scope).await;
    let find = |needle: &str| fact_holding(&all, needle);
    for (older, newer) in [
        ("Barclays", "Monzo"),
        ("iPhone 11", "Galaxy S23"),
        ("work nights", "on days"),
    ] {
        assert_eq!(
            find(older).superseded_by,
            find(newer).id,
            "{older} superseded by {newer}"
        );
    }
    // The sister's car is hers: the user's car does not supersede it.
    assert!(find("Honda Jazz").superseded_by.is_empty(), "{all:?}");
}

/// Rows of any table of the database whose text holds `needle` in any case (every column, JSON
/// and search documents included), by table.
async fn tables_holding(sandbox: &Sandbox, needle: &str) -> Vec<(String, i64)> {
    let tables: Vec<String> = sqlx::query_scalar(
        "SELECT table_name::text FROM information_schema.tables \
         WHERE table_schema = 'public' AND table_type = 'BASE TABLE' ORDER BY 1",
    )
    .fetch_all(&sandbox.pool)
    .await
    .unwrap();
    let mut holding = Vec::new();
    for table in tables {
        // The table names come from the catalogue, not from input.
        let rows: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "SELECT count(*) FROM \"{table}\" t WHERE t::text ILIKE '%' || $1 || '%'"
        )))
        .bind(needle)
        .fetch_one(&sandbox.pool)
        .await
        .unwrap();
        if rows > 0 {
            holding.push((table, rows));
        }
    }
    holding
}

/// Issue 39 part 6: forgetting a fact reaches every copy (the episode's summary, excerpt,
/// structured summary and tags, and the stored turns), whether it is forgotten by id after its
/// episode was written or taken back in the conversation before ("Actually, forget that.").
#[tokio::test]
async fn forgetting_a_fact_leaves_no_copy_in_any_table() {
    let mut sandbox = Sandbox::start().await;
    // Codes no other test writes, with letters no hexadecimal id holds.
    let nonce = (Uuid::new_v4().as_u128() % 900_000 + 100_000) as u32;
    let (locker, bike) = (format!("KX{nonce}"), format!("ZW{nonce}"));

    let chat = Chat::new("forgetting");
    let now = Utc::now();
    let minutes = |n: i64| now - chrono::Duration::minutes(n);
    chat.append(
        &mut sandbox,
        vec![
            user(
                "We sorted out the Monday rota for the team today.",
                minutes(10),
            ),
            user(
                &format!("Remember that my locker code at the office is {locker}."),
                minutes(9),
            ),
            assistant("Done, I'll keep that in mind.", minutes(8)),
            user("I also prefer the early shift on Mondays.", minutes(7)),
        ],
    )
    .await;
    chat.close(&mut sandbox).await;
    chat.wait_for_episodes(&mut sandbox, 1).await;
    let facts = chat.wait_for_consolidation(&mut sandbox).await;
    let code = facts
        .iter()
        .find(|f| f.text.contains(&locker))
        .unwrap_or_else(|| panic!("the locker code is a fact: {facts:?}"));
    assert!(
        !tables_holding(&sandbox, &locker).await.is_empty(),
        "the code is stored before it is forgotten"
    );
    sandbox
        .ingest
        .forget(v1::ForgetRequest {
            scope: Some(chat.scope.clone()),
            memory_id: code.id.clone(),
        })
        .await
        .unwrap();
    assert_eq!(
        tables_holding(&sandbox, &locker).await,
        Vec::<(String, i64)>::new(),
        "no table holds the forgotten code"
    );
    // The rest of the episode and the other facts stay.
    let left = entries(&mut sandbox, &chat.scope).await;
    let episode = left
        .iter()
        .find(|m| m.kind() == v1::MemoryKind::Episodic)
        .expect("the episode stays");
    assert!(
        episode
            .messages
            .iter()
            .any(|m| m.content.contains("Monday rota")),
        "{episode:?}"
    );
    assert!(
        left.iter().any(|m| m.text.contains("early shift")),
        "{left:?}"
    );

    // Taken back in the conversation, before its segment closed.
    let retracting = Chat::new("retracting");
    retracting
        .append(
            &mut sandbox,
            vec![
                user(
                    &format!("Remember that my bike lock code is {bike}."),
                    minutes(5),
                ),
                user("Actually, forget that.", minutes(4)),
                user(
                    "What should I cook tonight, something with leeks?",
                    minutes(3),
                ),
            ],
        )
        .await;
    retracting.close(&mut sandbox).await;
    retracting.wait_for_episodes(&mut sandbox, 1).await;
    retracting.wait_for_consolidation(&mut sandbox).await;
    assert_eq!(
        tables_holding(&sandbox, &bike).await,
        Vec::<(String, i64)>::new(),
        "a retraction leaves no copy either"
    );
}
