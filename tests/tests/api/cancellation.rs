//! Requests cancelled at random points never cost an acknowledged write (issue 37).
//!
//! Requests cut short by their deadline, or by a client that hangs up, are dropped wherever they
//! are: waiting for a lock inside `BEGIN`, between statements, inside `COMMIT`. Once, such a
//! request left its pooled connection inside an open transaction; the next request's
//! autocommit append ran inside it, was answered STORED, and was later rolled back with it.
//! Here a storm of such requests runs beside writers with ample deadlines, and every write
//! answered as stored must be in the database when answered, after the storm, and after the
//! services have closed every connection (when whatever a leaked transaction held is gone).

use std::collections::HashSet;
use std::time::{Duration, Instant};

use engram_e2e::{Sandbox, SandboxOptions};
use engram_proto::v1;
use engram_proto::v1::ingest_service_client::IngestServiceClient;
use rand::rngs::StdRng;
use rand::{Rng as _, SeedableRng as _};
use sqlx::PgPool;
use tonic::Code;
use tonic::transport::Channel;
use uuid::Uuid;

use crate::conversations::Chat;
use crate::helpers::remember;

/// Requests of the storm that must end cut short (by a deadline or a hang-up) before it stops.
const CANCELLED_REQUESTS: usize = 1_000;
/// Turns the writers with ample deadlines must have had acknowledged by then.
const ACKNOWLEDGED_TURNS: usize = 150;

/// A write a service acknowledged.
#[derive(Debug, Clone)]
enum Acknowledged {
    Turn {
        chat: usize,
        turn_index: i32,
        content: String,
    },
    Memory {
        id: Uuid,
        text: String,
    },
}

/// What a storm request ended as.
enum Ended {
    /// Past its deadline, hung up, or refused while the service was busy.
    CutShort,
    /// Engram answered DEADLINE_EXCEEDED ("nothing ... was written"): none of these texts may
    /// ever be stored.
    NothingWritten(Vec<String>),
    /// Answered in time; what it stored counts as acknowledged too.
    Answered(Vec<Acknowledged>),
}

fn text(rng: &mut StdRng, label: &str) -> String {
    format!(
        "{label} {} about the {} project, said at step {}",
        Uuid::new_v4().simple(),
        ["Lisbon", "Porto", "Berlin", "Osaka"][rng.random_range(0..4)],
        rng.random_range(0..1_000_000)
    )
}

fn with_deadline<T>(message: T, deadline: Duration) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    request.set_timeout(deadline);
    request
}

/// Whether a status is one a cut-short request may end with.
fn cut_short(status: &tonic::Status) -> bool {
    matches!(
        status.code(),
        Code::DeadlineExceeded | Code::Unknown | Code::Cancelled | Code::Unavailable
    )
}

/// One storm request: a write of one of the transactional paths, cut short at a random point
/// by a deadline the server enforces (grpc-timeout, 26-150 ms, so the server's own timer runs
/// 1-125 ms), or by the client hanging up (dropping the call at 1-120 ms).
async fn storm_request(
    client: &mut IngestServiceClient<Channel>,
    rng: &mut StdRng,
    chats: &[Chat],
) -> Ended {
    let chat_index = rng.random_range(0..chats.len());
    let chat = &chats[chat_index];
    let deadline = Duration::from_millis(rng.random_range(26..150));
    let hang_up_after = rng
        .random_bool(0.3)
        .then(|| Duration::from_millis(rng.random_range(1..120)));
    let kind = rng.random_range(0..6);
    // The texts the request asks to store, unique to it.
    let mut texts: Vec<String> = Vec::new();
    let call = async {
        match kind {
            0 => {
                let count = rng.random_range(5..200);
                let memories: Vec<v1::ImportedMemory> = (0..count)
                    .map(|_| v1::ImportedMemory {
                        client_id: Uuid::new_v4().to_string(),
                        kind: v1::MemoryKind::Semantic.into(),
                        text: text(rng, "imported"),
                        ..Default::default()
                    })
                    .collect();
                texts.extend(memories.iter().map(|m| m.text.clone()));
                let request = v1::ImportMemoriesRequest {
                    scope: Some(chat.scope.clone()),
                    memories,
                    ..Default::default()
                };
                client
                    .import_memories(with_deadline(request, deadline))
                    .await
                    .map(|answer| {
                        answer
                            .into_inner()
                            .entries
                            .into_iter()
                            .filter(|entry| entry.created)
                            .map(|entry| Acknowledged::Memory {
                                id: entry.id.parse().unwrap(),
                                // Checked by id only: the response does not echo the text.
                                text: String::new(),
                            })
                            .collect()
                    })
            }
            1 => {
                let messages: Vec<v1::ConversationMessage> = (0..60)
                    .map(|position| v1::ConversationMessage {
                        role: if position % 2 == 0 {
                            v1::SpeakerRole::User
                        } else {
                            v1::SpeakerRole::Assistant
                        }
                        .into(),
                        content: text(rng, "storm turn"),
                        ..Default::default()
                    })
                    .collect();
                let contents: Vec<String> = messages.iter().map(|m| m.content.clone()).collect();
                texts.extend(contents.iter().cloned());
                let request = v1::AppendMessagesRequest {
                    scope: Some(chat.scope.clone()),
                    conversation_id: chat.id.clone(),
                    messages,
                    close_segment: false,
                };
                client
                    .append_messages(with_deadline(request, deadline))
                    .await
                    .map(|answer| stored_turns(chat_index, &answer.into_inner(), &contents))
            }
            2 => {
                let said = text(rng, "remembered");
                texts.push(said.clone());
                client
                    .remember(with_deadline(remember(&chat.scope, &said), deadline))
                    .await
                    .map(|answer| remembered(&answer.into_inner(), &said))
            }
            3 => client
                .close_segment(with_deadline(
                    v1::CloseSegmentRequest {
                        scope: Some(chat.scope.clone()),
                        conversation_id: chat.id.clone(),
                    },
                    deadline,
                ))
                .await
                .map(|_| Vec::new()),
            4 => {
                // A privacy switch of another conversation of the space: both space locks,
                // exclusively, for a moment.
                let request = v1::StartIncognitoRequest {
                    scope: Some(chat.scope.clone()),
                    conversation_id: Uuid::new_v4().to_string(),
                };
                client
                    .start_incognito(with_deadline(request, deadline))
                    .await
                    .map(|_| Vec::new())
            }
            _ => {
                let request = v1::ApplyCommandRequest {
                    scope: Some(chat.scope.clone()),
                    conversation_id: chat.id.clone(),
                    message: format!("Remember that {}", text(rng, "my note")),
                };
                client
                    .apply_command(with_deadline(request, deadline))
                    .await
                    .map(|_| Vec::new())
            }
        }
    };
    let outcome = match hang_up_after {
        Some(after) => match tokio::time::timeout(after, call).await {
            Ok(outcome) => outcome,
            Err(_) => return Ended::CutShort,
        },
        None => call.await,
    };
    match outcome {
        Ok(stored) => Ended::Answered(stored),
        Err(status)
            if status.code() == Code::DeadlineExceeded && status.message().contains("nothing") =>
        {
            Ended::NothingWritten(texts)
        }
        Err(status) if cut_short(&status) => Ended::CutShort,
        Err(status) => panic!("a storm request failed otherwise: {status:?}"),
    }
}

fn stored_turns(
    chat: usize,
    answer: &v1::AppendMessagesResponse,
    contents: &[String],
) -> Vec<Acknowledged> {
    answer
        .turns
        .iter()
        .zip(contents)
        .filter(|(turn, _)| turn.outcome() == v1::TurnOutcome::Stored)
        .map(|(turn, content)| Acknowledged::Turn {
            chat,
            turn_index: turn.turn_index as i32,
            content: content.clone(),
        })
        .collect()
}

fn remembered(answer: &v1::RememberResponse, said: &str) -> Vec<Acknowledged> {
    match answer.outcome() {
        v1::RememberOutcome::Created => vec![Acknowledged::Memory {
            id: answer.memory.as_ref().unwrap().id.parse().unwrap(),
            text: said.to_owned(),
        }],
        _ => Vec::new(),
    }
}

/// Why an acknowledged write is not in the database as acknowledged, if it is not. `pool` is the
/// test's own, never the services'.
async fn missing(pool: &PgPool, chats: &[Chat], write: &Acknowledged) -> Option<String> {
    match write {
        Acknowledged::Turn {
            chat,
            turn_index,
            content,
        } => {
            let chat = &chats[*chat];
            let stored: Option<String> = sqlx::query_scalar(
                "SELECT content FROM conversation_turns \
                 WHERE user_id = $1 AND space = $2 AND conversation_id = $3 AND turn_index = $4",
            )
            .bind(chat.scope.user_id.parse::<Uuid>().unwrap())
            .bind(&chat.scope.space)
            .bind(chat.id.parse::<Uuid>().unwrap())
            .bind(turn_index)
            .fetch_optional(pool)
            .await
            .unwrap();
            (stored.as_deref() != Some(content.as_str())).then(|| {
                format!(
                    "turn {turn_index} of chat {}: {stored:?}, acknowledged {content:?}",
                    chat.id
                )
            })
        }
        Acknowledged::Memory { id, text } => {
            let stored: Option<String> =
                sqlx::query_scalar("SELECT text FROM memories WHERE id = $1")
                    .bind(id)
                    .fetch_optional(pool)
                    .await
                    .unwrap();
            let present = match &stored {
                Some(stored) => text.is_empty() || stored == text,
                None => false,
            };
            (!present).then(|| format!("memory {id}: {stored:?}, acknowledged {text:?}"))
        }
    }
}

async fn all_missing(pool: &PgPool, chats: &[Chat], writes: &[Acknowledged]) -> Vec<String> {
    let mut missing_writes = Vec::new();
    for write in writes {
        if let Some(why) = missing(pool, chats, write).await {
            missing_writes.push(why);
        }
    }
    missing_writes
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_acknowledged_write_is_lost_when_requests_are_cancelled_at_random_points() {
    // No soft cap: the capacity policy deleting what the storm imports is not a loss.
    let mut sandbox = Sandbox::start_with(SandboxOptions {
        soft_cap: Some(1_000_000),
        ..Default::default()
    })
    .await;
    // The test's own connections: what they see is committed, whatever the services' hold.
    let own_pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(4)
        .connect(sandbox.database.url())
        .await
        .unwrap();
    // Two users, each with two conversations in one space: appends, imports, switches and
    // segmentation all meet on the same locks.
    let chats: Vec<Chat> = {
        let first = Chat::new("work");
        let second = Chat::new("home");
        let mut chats = Vec::new();
        for owner in [&first, &second] {
            for _ in 0..2 {
                chats.push(Chat {
                    scope: owner.scope.clone(),
                    id: Uuid::new_v4().to_string(),
                });
            }
        }
        chats
    };
    // Each conversation exists before the storm (CloseSegment of an unknown one is NotFound).
    for chat in &chats {
        chat.append(
            &mut sandbox,
            vec![crate::conversations::user(
                "Hello there",
                chrono::Utc::now(),
            )],
        )
        .await;
    }
    let chats = std::sync::Arc::new(chats);
    let channel = sandbox.ingest_service().channel().await;
    let seed: u64 = rand::rng().random();
    eprintln!("storm seed {seed}");
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let cut_short_so_far = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let started = Instant::now();

    // Writers with ample deadlines: one turn at a time, each read back the moment it is
    // acknowledged.
    let writers: Vec<_> = (0..4u64)
        .map(|writer| {
            let mut client = IngestServiceClient::new(channel.clone());
            let chats = chats.clone();
            let stop = stop.clone();
            let pool = own_pool.clone();
            tokio::spawn(async move {
                let mut rng = StdRng::seed_from_u64(seed ^ (writer + 1));
                let mut acknowledged = Vec::new();
                let mut invisible_when_answered = Vec::new();
                let mut step = 0;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    step += 1;
                    let chat_index = rng.random_range(0..chats.len());
                    let chat = &chats[chat_index];
                    let content =
                        format!("writer {writer} turn {step}: {}", text(&mut rng, "kept"));
                    let request = v1::AppendMessagesRequest {
                        scope: Some(chat.scope.clone()),
                        conversation_id: chat.id.clone(),
                        messages: vec![v1::ConversationMessage {
                            role: v1::SpeakerRole::User.into(),
                            content: content.clone(),
                            client_message_id: format!("writer-{writer}-{step}"),
                            ..Default::default()
                        }],
                        close_segment: false,
                    };
                    let answer = client
                        .append_messages(with_deadline(request, Duration::from_secs(5)))
                        .await
                        .expect("an append with an ample deadline succeeds")
                        .into_inner();
                    for write in stored_turns(chat_index, &answer, &[content]) {
                        if let Some(why) = missing(&pool, &chats, &write).await {
                            invisible_when_answered.push(why);
                        }
                        acknowledged.push(write);
                    }
                    if step % 5 == 0 {
                        let said = text(&mut rng, "remembered with time to spare");
                        let answer = client
                            .remember(with_deadline(
                                remember(&chat.scope, &said),
                                Duration::from_secs(5),
                            ))
                            .await
                            .expect("a Remember with an ample deadline succeeds")
                            .into_inner();
                        acknowledged.extend(remembered(&answer, &said));
                    }
                }
                (acknowledged, invisible_when_answered)
            })
        })
        .collect();

    // The storm.
    let storm: Vec<_> = (0..10u64)
        .map(|worker| {
            let mut client = IngestServiceClient::new(channel.clone());
            let chats = chats.clone();
            let stop = stop.clone();
            let cut_short_so_far = cut_short_so_far.clone();
            tokio::spawn(async move {
                let mut rng = StdRng::seed_from_u64(seed ^ (100 + worker));
                let mut acknowledged = Vec::new();
                let mut never_written = Vec::new();
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    match storm_request(&mut client, &mut rng, &chats).await {
                        Ended::CutShort => {
                            cut_short_so_far.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        }
                        Ended::NothingWritten(texts) => {
                            cut_short_so_far.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                            never_written.extend(texts);
                        }
                        Ended::Answered(stored) => acknowledged.extend(stored),
                    }
                }
                (acknowledged, never_written)
            })
        })
        .collect();

    // Until enough requests were cut short and enough turns acknowledged (or 90 s passed).
    let mut watch = IngestServiceClient::new(channel.clone());
    loop {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let stored: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM conversation_turns WHERE content LIKE 'writer %'",
        )
        .fetch_one(&own_pool)
        .await
        .unwrap();
        let cut_short = cut_short_so_far.load(std::sync::atomic::Ordering::Relaxed);
        if (stored as usize >= ACKNOWLEDGED_TURNS && cut_short >= CANCELLED_REQUESTS)
            || started.elapsed() > Duration::from_secs(90)
        {
            break;
        }
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut acknowledged: Vec<Acknowledged> = Vec::new();
    let mut never_written: Vec<String> = Vec::new();
    for task in storm {
        let (stored, unwritten) = task.await.unwrap();
        acknowledged.extend(stored);
        never_written.extend(unwritten);
    }
    let cut_short = cut_short_so_far.load(std::sync::atomic::Ordering::Relaxed);
    let mut invisible = Vec::new();
    let mut acknowledged_turns = 0;
    for task in writers {
        let (stored, not_visible) = task.await.unwrap();
        acknowledged_turns += stored
            .iter()
            .filter(|write| matches!(write, Acknowledged::Turn { .. }))
            .count();
        acknowledged.extend(stored);
        invisible.extend(not_visible);
    }
    eprintln!(
        "{cut_short} requests cut short, {} writes acknowledged ({acknowledged_turns} single turns) in {:?}",
        acknowledged.len(),
        started.elapsed()
    );
    assert!(
        cut_short >= CANCELLED_REQUESTS,
        "only {cut_short} requests were cut short (seed {seed})"
    );
    assert!(
        acknowledged_turns >= ACKNOWLEDGED_TURNS,
        "only {acknowledged_turns} turns acknowledged (seed {seed})"
    );
    assert!(
        invisible.is_empty(),
        "acknowledged but not stored when answered (seed {seed}): {invisible:#?}"
    );

    // Ordinary traffic afterwards uses every pooled connection again: one left inside a
    // transaction would now be committed or rolled back by it.
    for step in 0..200 {
        let chat = &chats[step % chats.len()];
        watch
            .get_settings(v1::GetSettingsRequest {
                scope: Some(chat.scope.clone()),
            })
            .await
            .unwrap();
    }
    let lost = all_missing(&own_pool, &chats, &acknowledged).await;
    assert!(
        lost.is_empty(),
        "acknowledged writes lost (seed {seed}): {lost:#?}"
    );

    // No connection of the services is left inside a transaction. One that is working through
    // a transaction right now (segmentation and the backfill go on after the storm) is idle in
    // it for a moment between two statements; one left behind has been idle in it since the
    // storm, seconds ago.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let left_in_transaction: Vec<(i32, String, String)> = sqlx::query_as(
        "SELECT pid, (now() - state_change)::text, query FROM pg_stat_activity \
         WHERE datname = current_database() AND pid <> pg_backend_pid() \
           AND state LIKE 'idle in transaction%' AND state_change < now() - interval '2 seconds'",
    )
    .fetch_all(&own_pool)
    .await
    .unwrap();
    assert!(
        left_in_transaction.is_empty(),
        "connections left inside a transaction (pid, idle for, last statement), seed {seed}: \
         {left_in_transaction:#?}"
    );

    // Forever: once the services have stopped and closed every connection, whatever an open
    // transaction held is gone; every acknowledged write must still be there.
    for service in std::mem::take(&mut sandbox.services) {
        service.stop().await.unwrap();
    }
    let lost = all_missing(&own_pool, &chats, &acknowledged).await;
    assert!(
        lost.is_empty(),
        "acknowledged writes gone once the services stopped (seed {seed}): {lost:#?}"
    );
    // And nothing of a request Engram answered DEADLINE_EXCEEDED was written, then or later.
    let written: Vec<String> = sqlx::query_scalar(
        "SELECT content FROM conversation_turns WHERE content = ANY($1) \
         UNION ALL SELECT text FROM memories WHERE text = ANY($1)",
    )
    .bind(&never_written)
    .fetch_all(&own_pool)
    .await
    .unwrap();
    eprintln!(
        "{} texts of requests answered DEADLINE_EXCEEDED checked",
        never_written.len()
    );
    assert!(
        written.is_empty(),
        "written although Engram answered DEADLINE_EXCEEDED (seed {seed}): {written:#?}"
    );
    let mut seen = HashSet::new();
    for write in &acknowledged {
        if let Acknowledged::Turn {
            chat, turn_index, ..
        } = write
        {
            assert!(
                seen.insert((*chat, *turn_index)),
                "turn {turn_index} of chat {chat} acknowledged twice"
            );
        }
    }
}
