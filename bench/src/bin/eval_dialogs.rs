//! Dialog retrieval evaluation of `make eval` (docs/eval/dialogs.md).
//!
//! Loads the multi-session dialogs of `tests/eval/dialogs` as a client would, each in two spaces
//! of the evaluation user:
//! - **turns**: every turn one fact through ImportMemories (`"<Speaker>: <text>"`, created at
//!   the session's date plus a minute per turn), the protocol of the held-out benchmark;
//! - **conversation**: the dialog appended through AppendMessages session by session (the first
//!   speaker as USER, the second as ASSISTANT), then CloseSegment; the ingest service segments it
//!   into episodes and consolidates them into facts by its default rules.
//!
//! Then asks every question through RetrieveMemory under each configuration (profiles, storage
//! ways, with large limits and within token budgets) and scores what came back against the
//! question's evidence turns: which turns each returned item covers is known from the load (a
//! turn memory its turn, an episode its segment's turns, a fact the turn it was copied from).
//!
//! The conversation is appended one session at a time, and the next session waits until the
//! ingest service has nothing left to do with the last one: every open turn embedded, no segment
//! the rules would close still open (the rules are `engram_core::segmentation`'s, with the
//! settings the ingest service reads from the same `ENGRAM_*` environment), every episode
//! consolidated. So every run segments and consolidates the same way, however the service's
//! passes happen to be timed.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt::Write as _;
use std::io::Write as _;
use std::ops::RangeInclusive;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context as _, anyhow, bail};
use chrono::{DateTime, Utc};
use clap::Parser;
use engram_bench::eval::{
    eval_scope, export_space, merge_by_heads, ndcg_at, wait_for_embeddings, write_report,
};
use engram_core::segmentation::{SegmentationRules, TurnView, close_segments};
use engram_core::{ConversationId, SpeakerRole};
use engram_proto::v1;
use engram_proto::v1::ingest_service_client::IngestServiceClient;
use engram_proto::v1::retrieval_service_client::RetrievalServiceClient;
use engram_server::time::to_proto;
use futures::{StreamExt as _, TryStreamExt as _};
use serde::Deserialize;
use sqlx::PgPool;
use tonic::transport::Channel;
use uuid::Uuid;

/// Namespace of the dialogs' conversation ids (UUIDv5 of the dialog id).
const CONVERSATION_NAMESPACE: Uuid = Uuid::from_u128(0x0e5a_1e00_c0de_4000_8000_0000_0000_0003);
/// The per-space soft cap set before loading: above any dialog's turns, episodes and facts, so
/// that nothing is trimmed (the default, 200, would trim the longer dialogs' turns).
const SOFT_CAP: u32 = 10_000;
/// The neighbours on each side the turns are also loaded with, besides the service's default,
/// to show how that default was chosen (0: each turn alone, the protocol before Engram chose a
/// context for dialogs).
const CONTEXT_CHOICES: [u32; 4] = [0, 1, 2, 3];
/// Results asked for per section with large limits (RetrieveMemory's maximum), and a budget
/// that cuts nothing.
const DEEP_LIMIT: u32 = 100;
const DEEP_BUDGET: u32 = 32_000;
/// The Markdown budgets of the token-budget comparison.
const BUDGETS: [u32; 2] = [1_000, 2_000];
/// RetrieveMemory's default budget.
const DEFAULT_BUDGET: u32 = 2_000;
const RECALL_KS: [usize; 4] = [5, 10, 25, 50];
/// The answerable categories, in report order; adversarial questions have no evidence.
const CATEGORIES: [&str; 4] = ["single_hop", "multi_hop", "temporal", "preference_change"];
const ADVERSARIAL: &str = "adversarial";
/// RetrieveMemory calls in flight at once.
const IN_FLIGHT: usize = 4;

#[derive(Parser)]
#[command(about = "Engram retrieval evaluation on the multi-session dialogs")]
struct Cli {
    #[arg(long, default_value = "tests/eval/dialogs")]
    dialogs: PathBuf,
    #[arg(long, default_value = "http://127.0.0.1:50071")]
    ingest: String,
    #[arg(long, default_value = "http://127.0.0.1:50072")]
    retrieval: String,
    /// The database the ingest service writes: segmentation progress and consolidation are
    /// watched there.
    #[arg(long)]
    database_url: String,
    #[arg(long)]
    report: PathBuf,
    /// The command line to record in the report.
    #[arg(long, default_value = "make eval")]
    command_line: String,
    /// Longest wait for segmentation, consolidation and the embedding backfill.
    #[arg(long, default_value_t = 900)]
    load_timeout_secs: u64,
    /// Measure only what an assistant reads (the turns with the service's default context and
    /// the appended conversation, the default profile) and print that table instead of writing
    /// the report: a few minutes instead of ten, for trying a change to retrieval.
    #[arg(long)]
    reads_only: bool,
    /// Write every assistant read (storage way, budget, question, evidence, share read verbatim,
    /// Markdown) to this file as JSON lines, to see what a way misses.
    #[arg(long)]
    dump_reads: Option<PathBuf>,
}

#[derive(Deserialize)]
struct Dialog {
    id: String,
    speakers: Vec<String>,
    relationship: String,
    sessions: Vec<Session>,
    questions: Vec<Question>,
}

#[derive(Deserialize)]
struct Session {
    date: DateTime<Utc>,
    turns: Vec<DialogTurn>,
}

#[derive(Deserialize)]
struct DialogTurn {
    id: String,
    speaker: String,
    text: String,
}

#[derive(Deserialize)]
struct Question {
    category: String,
    question: String,
    evidence: Vec<String>,
}

/// A dialog's turn as Engram stores it.
struct Turn {
    id: String,
    /// Index of its session in the dialog.
    session: usize,
    /// 0 for the first speaker (USER), 1 for the second (ASSISTANT).
    speaker: usize,
    /// `"<Speaker>: <text>"`.
    content: String,
    /// The session's date plus a minute per turn before it in the session.
    at: DateTime<Utc>,
}

/// A dialog with its turns in order (a turn's index is its turn index in the conversation).
struct Prepared {
    dialog: Dialog,
    turns: Vec<Turn>,
    /// Each question's evidence as turn indexes.
    evidence: Vec<BTreeSet<usize>>,
}

impl Prepared {
    fn new(dialog: Dialog) -> anyhow::Result<Self> {
        if dialog.speakers.len() != 2 {
            bail!("dialog {}: two speakers expected", dialog.id);
        }
        let mut turns = Vec::new();
        for (session_index, session) in dialog.sessions.iter().enumerate() {
            for (position, turn) in session.turns.iter().enumerate() {
                let speaker = dialog
                    .speakers
                    .iter()
                    .position(|name| *name == turn.speaker)
                    .with_context(|| format!("turn {}: unknown speaker", turn.id))?;
                turns.push(Turn {
                    id: turn.id.clone(),
                    session: session_index,
                    speaker,
                    content: format!("{}: {}", turn.speaker, turn.text),
                    at: session.date + chrono::Duration::minutes(position as i64),
                });
            }
        }
        let index_of: HashMap<&str, usize> = turns
            .iter()
            .enumerate()
            .map(|(index, turn)| (turn.id.as_str(), index))
            .collect();
        let evidence = dialog
            .questions
            .iter()
            .map(|question| {
                question
                    .evidence
                    .iter()
                    .map(|id| {
                        index_of
                            .get(id.as_str())
                            .copied()
                            .with_context(|| format!("evidence {id}: no such turn"))
                    })
                    .collect::<anyhow::Result<BTreeSet<usize>>>()
            })
            .collect::<anyhow::Result<_>>()?;
        Ok(Self {
            dialog,
            turns,
            evidence,
        })
    }

    fn turns_scope(&self) -> v1::Scope {
        eval_scope(format!("dialogs/turns/{}", self.dialog.id))
    }

    /// The same turns, imported with `context_turns` set to `turns`.
    fn turns_with_context_scope(&self, turns: u32) -> v1::Scope {
        eval_scope(format!("dialogs/turns-context-{turns}/{}", self.dialog.id))
    }

    fn conversation_scope(&self) -> v1::Scope {
        eval_scope(format!("dialogs/conversation/{}", self.dialog.id))
    }

    fn conversation_id(&self) -> Uuid {
        Uuid::new_v5(&CONVERSATION_NAMESPACE, self.dialog.id.as_bytes())
    }
}

fn read_dialogs(directory: &Path) -> anyhow::Result<Vec<Prepared>> {
    let mut paths: Vec<PathBuf> = std::fs::read_dir(directory)
        .with_context(|| format!("reading {}", directory.display()))?
        .map(|entry| entry.map(|entry| entry.path()))
        .collect::<Result<_, _>>()?;
    paths.retain(|path| {
        path.extension().is_some_and(|ext| ext == "json")
            && path
                .file_name()
                .and_then(|name| name.to_str())
                .is_some_and(|name| name.starts_with('d'))
    });
    paths.sort();
    paths
        .iter()
        .map(|path| {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("reading {}", path.display()))?;
            let dialog: Dialog = serde_json::from_str(&text)
                .with_context(|| format!("parsing {}", path.display()))?;
            Prepared::new(dialog).with_context(|| format!("{}", path.display()))
        })
        .collect()
}

/// The dialog turns each stored item (by memory id) covers.
type Coverage = HashMap<String, Vec<usize>>;

/// What segmentation and consolidation made of a conversation.
#[derive(Default, Clone)]
struct ConversationStats {
    segments: usize,
    reasons: BTreeMap<String, usize>,
    /// Segments with turns of more than one session, and segments that are exactly a session.
    spanning_sessions: usize,
    exact_sessions: usize,
    episodes: usize,
    /// Segments whose episode was a near-duplicate of an earlier one (repeated, not written).
    repeated: usize,
    /// Segments of greetings and thanks only (no episode).
    trivial: usize,
    /// Episodes whose excerpt is not the turns of their segment.
    excerpt_mismatches: usize,
    facts: usize,
    superseded_facts: usize,
    /// Valid facts whose sentence is in no turn of their speaker.
    unmapped_facts: usize,
    /// Turns that were memory commands ("remember that ...") and did something.
    commands: usize,
}

impl ConversationStats {
    fn add(&mut self, other: &ConversationStats) {
        self.segments += other.segments;
        for (reason, n) in &other.reasons {
            *self.reasons.entry(reason.clone()).or_default() += n;
        }
        self.spanning_sessions += other.spanning_sessions;
        self.exact_sessions += other.exact_sessions;
        self.episodes += other.episodes;
        self.repeated += other.repeated;
        self.trivial += other.trivial;
        self.excerpt_mismatches += other.excerpt_mismatches;
        self.facts += other.facts;
        self.superseded_facts += other.superseded_facts;
        self.unmapped_facts += other.unmapped_facts;
        self.commands += other.commands;
    }
}

/// A dialog as loaded: what each stored item covers, in each space.
struct Loaded {
    prepared: Prepared,
    /// The turns imported with the service's defaults.
    turn_memories: Coverage,
    /// The turns imported with each other `context_turns`.
    turns_with_context: BTreeMap<u32, Coverage>,
    episodes: Coverage,
    facts: Coverage,
    stats: ConversationStats,
}

async fn set_soft_cap(
    ingest: &mut IngestServiceClient<Channel>,
    scope: &v1::Scope,
) -> anyhow::Result<()> {
    ingest
        .update_settings(v1::UpdateSettingsRequest {
            scope: Some(scope.clone()),
            soft_cap: Some(SOFT_CAP),
            ..Default::default()
        })
        .await
        .with_context(|| format!("setting the soft cap of {}", scope.space))?;
    Ok(())
}

/// Every turn one fact through ImportMemories into `scope`, each searched with `context_turns`
/// neighbours on either side (`None`: as the service decides); returns what each memory covers
/// (its turn) and the context the service applied.
async fn load_turns(
    ingest: &mut IngestServiceClient<Channel>,
    prepared: &Prepared,
    scope: v1::Scope,
    context_turns: Option<u32>,
) -> anyhow::Result<(Coverage, u32)> {
    set_soft_cap(ingest, &scope).await?;
    let index_of: HashMap<&str, usize> = prepared
        .turns
        .iter()
        .enumerate()
        .map(|(index, turn)| (turn.id.as_str(), index))
        .collect();
    let memories: Vec<v1::ImportedMemory> = prepared
        .turns
        .iter()
        .map(|turn| v1::ImportedMemory {
            client_id: turn.id.clone(),
            kind: v1::MemoryKind::Semantic.into(),
            text: turn.content.clone(),
            created_at: Some(to_proto(turn.at)),
            ..Default::default()
        })
        .collect();
    let mut coverage = Coverage::new();
    let mut applied = BTreeSet::new();
    for batch in memories.chunks(500) {
        let response = ingest
            .import_memories(v1::ImportMemoriesRequest {
                scope: Some(scope.clone()),
                memories: batch.to_vec(),
                context_turns,
            })
            .await
            .with_context(|| format!("importing the turns of {}", prepared.dialog.id))?
            .into_inner();
        applied.insert(response.context_turns);
        for entry in response.entries {
            if entry.suppressed_by_tombstone || entry.skipped_incognito {
                bail!("turn {} was not stored", entry.client_id);
            }
            let index = index_of
                .get(entry.client_id.as_str())
                .copied()
                .with_context(|| format!("unknown client id {}", entry.client_id))?;
            coverage.entry(entry.id).or_default().push(index);
        }
    }
    // A long dialog goes in several requests, each decided alone: they must agree.
    match applied.into_iter().collect::<Vec<_>>()[..] {
        [one] => Ok((coverage, one)),
        ref several => bail!(
            "the requests of {} were given different contexts: {several:?}",
            prepared.dialog.id
        ),
    }
}

/// The service's view of the conversation: the rules, and where to watch its progress.
#[derive(Clone)]
struct Segmentation {
    pool: PgPool,
    rules: SegmentationRules,
    timeout: Duration,
}

impl Segmentation {
    /// Waits until the ingest service has nothing left to do for the conversation: every open
    /// turn embedded (a segmentation pass read them), nothing the rules would close left open,
    /// every episode of the space consolidated.
    async fn settle(&self, prepared: &Prepared) -> anyhow::Result<()> {
        let scope = prepared.conversation_scope();
        let core_scope = engram_core::Scope::parse("scope", &scope.user_id, &scope.space)?;
        let conversation = ConversationId::from_uuid(prepared.conversation_id());
        let deadline = Instant::now() + self.timeout;
        loop {
            // The open tail first: an episode committed after this read is still seen
            // unconsolidated below.
            if self.segmented(&core_scope, conversation).await?
                && self.unconsolidated(&scope).await? == 0
            {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!(
                    "dialog {}: segmentation or consolidation did not finish within {} s (see the ingest log)",
                    prepared.dialog.id,
                    self.timeout.as_secs()
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Whether every open turn has its embedding and no segment of the open tail is due.
    async fn segmented(
        &self,
        scope: &engram_core::Scope,
        conversation: ConversationId,
    ) -> anyhow::Result<bool> {
        let tail = engram_store::segments::open_tail(
            &self.pool,
            scope,
            conversation,
            Some(engram_embed::TOKEN_VECTORS_MODEL_ID),
        )
        .await?
        .context("the conversation is not stored")?;
        let mut views = Vec::with_capacity(tail.turns.len());
        for turn in &tail.turns {
            let Some(embedding) = tail.embeddings.get(&turn.turn_index) else {
                return Ok(false);
            };
            views.push(TurnView {
                index: turn.turn_index,
                role: SpeakerRole::from_stored(&turn.role).unwrap_or_default(),
                spoken_at: turn.spoken_at,
                received_at: turn.created_at,
                tokens: u32::try_from(turn.tokens).unwrap_or(0),
                embedding: Some(embedding.clone()),
            });
        }
        Ok(close_segments(
            &views,
            &self.rules,
            tail.close_requested_through,
            Utc::now(),
        )
        .is_empty())
    }

    async fn unconsolidated(&self, scope: &v1::Scope) -> anyhow::Result<i64> {
        let user = Uuid::parse_str(&scope.user_id)?;
        let (count,): (i64,) = sqlx::query_as(
            "SELECT count(*) FROM memories WHERE user_id = $1 AND space = $2 \
             AND kind = 'episodic' AND consolidated_at IS NULL",
        )
        .bind(user)
        .bind(&scope.space)
        .fetch_one(&self.pool)
        .await?;
        Ok(count)
    }
}

/// Appends the dialog session by session, closes the last segment and waits for segmentation
/// and consolidation; returns the number of memory commands the turns ran.
async fn append_conversation(
    ingest: &mut IngestServiceClient<Channel>,
    segmentation: &Segmentation,
    prepared: &Prepared,
) -> anyhow::Result<usize> {
    let scope = prepared.conversation_scope();
    let conversation_id = prepared.conversation_id().to_string();
    set_soft_cap(ingest, &scope).await?;
    let mut commands = 0;
    let mut next_index = 0usize;
    for session in 0..prepared.dialog.sessions.len() {
        let turns: Vec<(usize, &Turn)> = prepared
            .turns
            .iter()
            .enumerate()
            .filter(|(_, turn)| turn.session == session)
            .collect();
        let response = ingest
            .append_messages(v1::AppendMessagesRequest {
                scope: Some(scope.clone()),
                conversation_id: conversation_id.clone(),
                messages: turns
                    .iter()
                    .map(|(_, turn)| v1::ConversationMessage {
                        role: if turn.speaker == 0 {
                            v1::SpeakerRole::User
                        } else {
                            v1::SpeakerRole::Assistant
                        }
                        .into(),
                        content: turn.content.clone(),
                        at: Some(to_proto(turn.at)),
                        client_message_id: turn.id.clone(),
                    })
                    .collect(),
                close_segment: false,
            })
            .await
            .with_context(|| {
                format!(
                    "appending session {} of {}",
                    session + 1,
                    prepared.dialog.id
                )
            })?
            .into_inner();
        if response.turns.len() != turns.len() {
            bail!(
                "session {} of {}: {} turns sent, {} answered",
                session + 1,
                prepared.dialog.id,
                turns.len(),
                response.turns.len()
            );
        }
        for ((index, turn), appended) in turns.iter().zip(&response.turns) {
            let stored = appended.outcome == i32::from(v1::TurnOutcome::Stored)
                || appended.outcome == i32::from(v1::TurnOutcome::Duplicate);
            if !stored || appended.turn_index as usize != *index || *index != next_index {
                bail!(
                    "turn {}: outcome {}, turn index {} (expected {index})",
                    turn.id,
                    appended.outcome,
                    appended.turn_index
                );
            }
            next_index += 1;
            if appended.command.as_ref().is_some_and(|command| {
                command.action != i32::from(v1::CommandAction::NoCommand) && command.applied
            }) {
                commands += 1;
            }
        }
        segmentation.settle(prepared).await?;
    }
    ingest
        .close_segment(v1::CloseSegmentRequest {
            scope: Some(scope.clone()),
            conversation_id: conversation_id.clone(),
        })
        .await
        .context("closing the last segment")?;
    segmentation.settle(prepared).await?;
    let state = ingest
        .get_conversation(v1::GetConversationRequest {
            scope: Some(scope),
            conversation_id,
            page_size: 1,
            page_token: String::new(),
        })
        .await?
        .into_inner();
    let last = prepared.turns.len() as i32 - 1;
    if state.segmented_through != last {
        bail!(
            "dialog {}: segmented through turn {} of {last}",
            prepared.dialog.id,
            state.segmented_through
        );
    }
    Ok(commands)
}

/// A closed segment, from the audit trail.
struct SegmentEvent {
    turns: RangeInclusive<usize>,
    reason: String,
    episode: Option<String>,
    outcome: String,
}

async fn segment_events(
    ingest: &mut IngestServiceClient<Channel>,
    scope: &v1::Scope,
) -> anyhow::Result<Vec<SegmentEvent>> {
    let mut events = Vec::new();
    let mut page_token = String::new();
    loop {
        let page = ingest
            .list_audit(v1::ListAuditRequest {
                scope: Some(scope.clone()),
                page_size: 500,
                page_token,
            })
            .await?
            .into_inner();
        for event in page.events {
            if event.action != i32::from(v1::AuditAction::Segment) {
                continue;
            }
            let detail: serde_json::Value = serde_json::from_str(&event.detail_json)?;
            let bound = |i: usize| {
                detail["segment"][i]
                    .as_u64()
                    .map(|v| v as usize)
                    .ok_or_else(|| anyhow!("segment event without its turns: {detail}"))
            };
            events.push(SegmentEvent {
                turns: bound(0)?..=bound(1)?,
                reason: detail["reason"].as_str().unwrap_or("?").to_owned(),
                episode: (!event.memory_id.is_empty()).then_some(event.memory_id),
                outcome: detail["episode"].as_str().unwrap_or("?").to_owned(),
            });
        }
        if page.next_page_token.is_empty() {
            break;
        }
        page_token = page.next_page_token;
    }
    events.sort_by_key(|event| *event.turns.start());
    Ok(events)
}

/// A sentence as compared: lowercase, single spaces, no closing punctuation.
fn normalise_sentence(text: &str) -> String {
    let words: Vec<String> = text.split_whitespace().map(str::to_lowercase).collect();
    words
        .join(" ")
        .trim_end_matches(|c: char| ".!?。！？…;；,，:：".contains(c) || c.is_whitespace())
        .to_owned()
}

/// The turns a fact was copied from: turns of the fact's speaker whose text holds the fact's
/// sentence, those of its source episodes first.
fn fact_turns(
    fact: &v1::Memory,
    turns: &[Turn],
    normalised_turns: &[String],
    episode_turns: &HashMap<String, RangeInclusive<usize>>,
) -> Vec<usize> {
    // A fact of a named speaker is stored with the name ("Jonas: I love ..."): it is that
    // speaker's, whichever role their turns were sent as.
    let named = engram_core::speaker::split_speaker(&fact.text);
    let needle = normalise_sentence(named.map_or(fact.text.as_str(), |(_, said)| said));
    if needle.is_empty() {
        return Vec::new();
    }
    let speaker = usize::from(fact.role == i32::from(v1::SpeakerRole::Assistant));
    let spoken_by = |turn: &Turn| match named {
        Some((name, _)) => engram_core::speaker::speaker_label(&turn.content) == Some(name),
        None => turn.speaker == speaker,
    };
    let holds =
        |index: &usize| spoken_by(&turns[*index]) && normalised_turns[*index].contains(&needle);
    let mut within: Vec<usize> = fact
        .source_episode_ids
        .iter()
        .filter_map(|episode| episode_turns.get(episode))
        .flat_map(|range| range.clone())
        .filter(holds)
        .collect();
    within.sort_unstable();
    within.dedup();
    if !within.is_empty() {
        return within;
    }
    (0..turns.len()).filter(holds).collect()
}

/// What segmentation and consolidation stored for the conversation, mapped to the dialog's turns.
async fn map_conversation(
    ingest: &mut IngestServiceClient<Channel>,
    retrieval: &mut RetrievalServiceClient<Channel>,
    prepared: &Prepared,
    stats: &mut ConversationStats,
) -> anyhow::Result<(Coverage, Coverage)> {
    let scope = prepared.conversation_scope();
    let events = segment_events(ingest, &scope).await?;
    let memories = export_space(retrieval, &scope).await?;
    let by_id: HashMap<&str, &v1::Memory> = memories.iter().map(|m| (m.id.as_str(), m)).collect();
    let turns = &prepared.turns;
    let is_session_start = |i: usize| i == 0 || turns[i - 1].session != turns[i].session;
    let is_session_end =
        |i: usize| i + 1 == turns.len() || turns[i + 1].session != turns[i].session;

    let mut episode_turns: HashMap<String, RangeInclusive<usize>> = HashMap::new();
    for event in &events {
        let (first, last) = (*event.turns.start(), *event.turns.end());
        if last >= turns.len() {
            bail!("a segment ends at turn {last}, past the dialog's end");
        }
        stats.segments += 1;
        *stats.reasons.entry(event.reason.clone()).or_default() += 1;
        if turns[first].session != turns[last].session {
            stats.spanning_sessions += 1;
        } else if is_session_start(first) && is_session_end(last) {
            stats.exact_sessions += 1;
        }
        match (event.outcome.as_str(), &event.episode) {
            ("created", Some(id)) => {
                stats.episodes += 1;
                let excerpt: Vec<&str> = by_id
                    .get(id.as_str())
                    .map(|m| m.messages.iter().map(|m| m.content.as_str()).collect())
                    .unwrap_or_default();
                let expected: Vec<&str> = turns[first..=last]
                    .iter()
                    .map(|t| t.content.as_str())
                    .collect();
                if excerpt != expected {
                    stats.excerpt_mismatches += 1;
                }
                episode_turns.insert(id.clone(), event.turns.clone());
            }
            ("repeated", _) => stats.repeated += 1,
            _ if event.outcome.starts_with("none") => stats.trivial += 1,
            _ => {}
        }
    }
    let episodes: Coverage = episode_turns
        .iter()
        .map(|(id, range)| (id.clone(), range.clone().collect()))
        .collect();

    let normalised: Vec<String> = turns
        .iter()
        .map(|t| normalise_sentence(&t.content))
        .collect();
    let mut facts = Coverage::new();
    for memory in memories
        .iter()
        .filter(|m| m.kind == i32::from(v1::MemoryKind::Semantic))
    {
        if memory.invalid_at.is_some() {
            stats.superseded_facts += 1;
            continue;
        }
        stats.facts += 1;
        let covered = fact_turns(memory, turns, &normalised, &episode_turns);
        if covered.is_empty() {
            stats.unmapped_facts += 1;
        } else {
            facts.insert(memory.id.clone(), covered);
        }
    }
    Ok((episodes, facts))
}

/// How a dialog is stored in the space a configuration asks.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Storage {
    /// Every turn one fact, imported with the service's defaults (the held-out protocol).
    Turns,
    /// The same turns imported with this `context_turns` (0: each turn searched alone).
    TurnsWithContext(u32),
    Episodes,
    Facts,
    Both,
}

impl Storage {
    fn name(self) -> String {
        match self {
            Self::Turns => "turns".into(),
            Self::TurnsWithContext(0) => "turns alone (context_turns 0)".into(),
            Self::TurnsWithContext(turns) => format!("turns, context_turns {turns}"),
            Self::Episodes => "episodes only".into(),
            Self::Facts => "facts only".into(),
            Self::Both => "episodes + facts".into(),
        }
    }

    /// (episodes, facts) asked for.
    fn sections(self) -> (bool, bool) {
        match self {
            Self::Turns | Self::TurnsWithContext(_) | Self::Facts => (false, true),
            Self::Episodes => (true, false),
            Self::Both => (true, true),
        }
    }
}

#[derive(Clone)]
struct Config {
    storage: Storage,
    label: String,
    ranking: v1::RankingOptions,
}

fn profile_name(profile: v1::RankingProfile) -> &'static str {
    match profile {
        v1::RankingProfile::Fsrs => "fsrs",
        v1::RankingProfile::Triscore => "triscore",
        v1::RankingProfile::Unspecified => "default",
    }
}

/// The configurations, the service's default profile first: both profiles on the turns as
/// imported by default, and on each turn alone together with BM25 alone; the default profile on
/// the turns imported with each other context in `other_contexts`; each storage way of the
/// conversation with both profiles.
fn configurations(default_profile: &str, other_contexts: &[u32]) -> Vec<Config> {
    let with_profile = |profile: v1::RankingProfile| v1::RankingOptions {
        profile: profile.into(),
        ..Default::default()
    };
    let label = |profile: v1::RankingProfile| {
        let name = profile_name(profile);
        if name == default_profile {
            format!("{name} (default)")
        } else {
            name.to_owned()
        }
    };
    let mut profiles = [v1::RankingProfile::Triscore, v1::RankingProfile::Fsrs];
    profiles.sort_by_key(|profile| profile_name(*profile) != default_profile);
    let mut configs = Vec::new();
    for storage in [Storage::Turns, Storage::TurnsWithContext(0)] {
        for profile in profiles {
            configs.push(Config {
                storage,
                label: format!("{}, {}", storage.name(), label(profile)),
                ranking: with_profile(profile),
            });
        }
    }
    // Plain BM25 over the turns, as issue 23 measured it outside Engram.
    configs.push(Config {
        storage: Storage::TurnsWithContext(0),
        label: "turns alone, BM25 alone (fsrs, sparse only, MMR off)".into(),
        ranking: v1::RankingOptions {
            sparse_only: true,
            mmr_lambda: Some(1.0),
            ..with_profile(v1::RankingProfile::Fsrs)
        },
    });
    for &turns in other_contexts.iter().filter(|&&turns| turns != 0) {
        let storage = Storage::TurnsWithContext(turns);
        configs.push(Config {
            storage,
            label: format!("{}, {}", storage.name(), label(profiles[0])),
            ranking: with_profile(profiles[0]),
        });
    }
    for storage in [Storage::Episodes, Storage::Facts, Storage::Both] {
        for profile in profiles {
            configs.push(Config {
                storage,
                label: format!("{}, {}", storage.name(), label(profile)),
                ranking: with_profile(profile),
            });
        }
    }
    configs
}

/// How a question is asked: with the largest limits and a budget that cuts nothing, or within
/// a Markdown budget, with the default limits or the largest.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Ask {
    Deep,
    Budget {
        tokens: u32,
        limits: Limits,
    },
    /// As an assistant asks: the query and a budget, everything else the service's defaults
    /// (limits, detail AUTO, ranking).
    Assistant {
        tokens: u32,
    },
}

#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Limits {
    /// The service's defaults (5 episodes, 20 facts).
    Default,
    /// 100 of each: the budget alone decides what fits.
    Largest,
}

fn retrieve_request(
    config: &Config,
    ask: Ask,
    scope: v1::Scope,
    query: &str,
) -> v1::RetrieveMemoryRequest {
    if let Ask::Assistant { tokens } = ask {
        return v1::RetrieveMemoryRequest {
            scope: Some(scope),
            query: query.to_owned(),
            token_budget: Some(tokens),
            ..Default::default()
        };
    }
    let (episodes, facts) = config.storage.sections();
    // The section a storage way does not use is switched off.
    let limit = |wanted: bool| match ask {
        Ask::Deep
        | Ask::Budget {
            limits: Limits::Largest,
            ..
        } => Some(if wanted { DEEP_LIMIT } else { 0 }),
        Ask::Budget {
            limits: Limits::Default,
            ..
        }
        | Ask::Assistant { .. } => (!wanted).then_some(0),
    };
    v1::RetrieveMemoryRequest {
        scope: Some(scope),
        query: query.to_owned(),
        episodic_limit: limit(episodes),
        semantic_limit: limit(facts),
        // Within a budget every episode offers its excerpt: the budget decides what fits.
        detail: match ask {
            Ask::Deep => v1::DetailLevel::None,
            Ask::Budget { .. } | Ask::Assistant { .. } => v1::DetailLevel::High,
        }
        .into(),
        token_budget: Some(match ask {
            Ask::Deep => DEEP_BUDGET,
            Ask::Budget { tokens, .. } | Ask::Assistant { tokens } => tokens,
        }),
        ranking: Some(config.ranking),
        ..Default::default()
    }
}

/// One returned item, in the merged order.
struct Hit {
    id: String,
    score: f64,
    cosine: f64,
    episode: bool,
    details_shown: bool,
}

/// A response, as scored.
struct Answered {
    hits: Vec<Hit>,
    tokens: u32,
    truncated: bool,
    path: String,
    markdown: String,
}

async fn ask(
    mut retrieval: RetrievalServiceClient<Channel>,
    request: v1::RetrieveMemoryRequest,
) -> anyhow::Result<Answered> {
    let query = request.query.clone();
    let response = retrieval
        .retrieve_memory(request)
        .await
        .with_context(|| format!("asking {query:?}"))?
        .into_inner();
    let section = |results: Vec<v1::RetrievedMemory>, episode: bool| -> Vec<(f64, Hit)> {
        results
            .into_iter()
            .map(|result| {
                let score = result.score.unwrap_or_default();
                let hit = Hit {
                    id: result.memory.map(|m| m.id).unwrap_or_default(),
                    score: score.total,
                    cosine: score.dense_score,
                    episode,
                    details_shown: result.details_shown,
                };
                (score.total, hit)
            })
            .collect()
    };
    Ok(Answered {
        hits: merge_by_heads(
            section(response.semantic, false),
            section(response.episodic, true),
        ),
        tokens: response.tokens,
        truncated: response.truncated,
        path: response.served_by.map(|s| s.path).unwrap_or_default(),
        markdown: response.markdown,
    })
}

/// A running mean.
#[derive(Default, Clone, Copy)]
struct Mean {
    sum: f64,
    n: u32,
}

impl Mean {
    fn add(&mut self, value: f64) {
        self.sum += value;
        self.n += 1;
    }

    fn value(&self) -> f64 {
        if self.n == 0 {
            0.0
        } else {
            self.sum / f64::from(self.n)
        }
    }
}

/// Ranking quality of one group of questions.
#[derive(Default, Clone, Copy)]
struct Ranked {
    recall: [Mean; 4],
    ndcg_10: Mean,
    /// Dialog turns behind the first 10 items: what an LLM would read to use them.
    turns_10: Mean,
}

/// Recall within a budget (strict: an episode counts with its excerpt in the Markdown; listed:
/// with its title and summary alone), and the Markdown's size.
#[derive(Default, Clone, Copy)]
struct Budgeted {
    strict: Mean,
    listed: Mean,
    tokens: Mean,
    items: Mean,
}

/// What an assistant reads: the share of evidence turns whose text is in the Markdown verbatim
/// (case, spacing and punctuation aside), or whose words mostly are, and the Markdown's size.
#[derive(Default, Clone, Copy)]
struct Read {
    verbatim: Mean,
    words: Mean,
    tokens: Mean,
}

/// Lowercased words (runs of letters and digits) of a text, in order.
fn words_of(text: &str) -> Vec<String> {
    text.split(|c: char| !c.is_alphanumeric())
        .filter(|word| !word.is_empty())
        .map(str::to_lowercase)
        .collect()
}

/// Share of a turn's words (at least 3 characters long) a Markdown holds for the turn to count as
/// read in its words.
const WORDS_READ: f64 = 0.8;

/// (verbatim, in its words) shares of the `evidence` turns whose text `markdown` holds. A turn's
/// text is its content without the `"<Speaker>: "` it was stored with.
fn read_shares(markdown: &str, turns: &[Turn], evidence: &BTreeSet<usize>) -> (f64, f64) {
    let markdown_words = words_of(markdown);
    let joined = format!(" {} ", markdown_words.join(" "));
    let vocabulary: BTreeSet<&str> = markdown_words.iter().map(String::as_str).collect();
    let (mut verbatim, mut in_words) = (0usize, 0usize);
    for &index in evidence {
        let content = &turns[index].content;
        let text = content
            .split_once(": ")
            .map_or(content.as_str(), |(_, t)| t);
        let words = words_of(text);
        if words.is_empty() {
            continue;
        }
        if joined.contains(&format!(" {} ", words.join(" "))) {
            verbatim += 1;
        }
        let long: Vec<&String> = words.iter().filter(|w| w.chars().count() >= 3).collect();
        let held = long
            .iter()
            .filter(|w| vocabulary.contains(w.as_str()))
            .count();
        if long.is_empty() || held as f64 >= WORDS_READ * long.len() as f64 {
            in_words += 1;
        }
    }
    let n = evidence.len().max(1) as f64;
    (verbatim as f64 / n, in_words as f64 / n)
}

/// The ways an assistant asks, at each budget.
fn assistant_asks() -> Vec<Ask> {
    BUDGETS
        .into_iter()
        .map(|tokens| Ask::Assistant { tokens })
        .collect()
}

/// Results and scores, for adversarial and for answerable questions.
#[derive(Default, Clone, Copy)]
struct Noise {
    results: Mean,
    top_score: Mean,
    top_cosine: Mean,
}

struct ConfigResult {
    config: Config,
    /// By category, and "all" for every answerable question.
    ranked: BTreeMap<String, Ranked>,
    by_dialog: BTreeMap<String, Ranked>,
    budget: BTreeMap<(Limits, u32), BTreeMap<String, Budgeted>>,
    /// By budget, then category ("all" too): what an assistant asking with the defaults reads.
    read: BTreeMap<u32, BTreeMap<String, Read>>,
    adversarial: Noise,
    answerable: Noise,
    paths: BTreeMap<String, u32>,
    truncated_deep: u32,
}

/// Share of `evidence` covered by the items of `hits` that `counts` keeps (`maps`: what each
/// item of the space covers).
fn covered_share(
    hits: &[Hit],
    maps: &[&Coverage],
    evidence: &BTreeSet<usize>,
    counts: impl Fn(&Hit) -> bool,
) -> f64 {
    let covered: BTreeSet<usize> = hits
        .iter()
        .filter(|hit| counts(hit))
        .filter_map(|hit| maps.iter().find_map(|map| map.get(&hit.id)))
        .flatten()
        .copied()
        .filter(|turn| evidence.contains(turn))
        .collect();
    covered.len() as f64 / evidence.len().max(1) as f64
}

/// Every way a configuration is asked: deep, then within each budget with either limits.
fn every_ask() -> Vec<Ask> {
    std::iter::once(Ask::Deep)
        .chain(
            [Limits::Default, Limits::Largest]
                .into_iter()
                .flat_map(|limits| BUDGETS.map(|tokens| Ask::Budget { tokens, limits })),
        )
        .collect()
}

async fn evaluate(
    retrieval: &RetrievalServiceClient<Channel>,
    loaded: &[Loaded],
    config: Config,
    asks: &[Ask],
    dump: &mut Option<std::io::BufWriter<std::fs::File>>,
) -> anyhow::Result<ConfigResult> {
    let mut result = ConfigResult {
        config: config.clone(),
        ranked: BTreeMap::new(),
        by_dialog: BTreeMap::new(),
        budget: BTreeMap::new(),
        read: BTreeMap::new(),
        adversarial: Noise::default(),
        answerable: Noise::default(),
        paths: BTreeMap::new(),
        truncated_deep: 0,
    };
    for dialog in loaded {
        let scope = match config.storage {
            Storage::Turns => dialog.prepared.turns_scope(),
            Storage::TurnsWithContext(turns) => dialog.prepared.turns_with_context_scope(turns),
            _ => dialog.prepared.conversation_scope(),
        };
        let maps: Vec<&Coverage> = match config.storage {
            Storage::Turns => vec![&dialog.turn_memories],
            Storage::TurnsWithContext(turns) => dialog
                .turns_with_context
                .get(&turns)
                .map(|coverage| vec![coverage])
                .with_context(|| format!("no turns loaded with context_turns {turns}"))?,
            Storage::Episodes => vec![&dialog.episodes],
            Storage::Facts => vec![&dialog.facts],
            Storage::Both => vec![&dialog.episodes, &dialog.facts],
        };
        let questions = &dialog.prepared.dialog.questions;
        let jobs: Vec<(usize, Ask)> = (0..questions.len())
            .flat_map(|q| asks.iter().map(move |ask| (q, *ask)))
            .collect();
        let answers: Vec<Answered> = futures::stream::iter(jobs.iter().map(|&(q, how)| {
            ask(
                retrieval.clone(),
                retrieve_request(&config, how, scope.clone(), &questions[q].question),
            )
        }))
        .buffered(IN_FLIGHT)
        .try_collect()
        .await?;
        for ((q, how), answered) in jobs.iter().zip(answers) {
            let question = &questions[*q];
            let evidence = &dialog.prepared.evidence[*q];
            let adversarial = question.category == ADVERSARIAL;
            match how {
                Ask::Deep => {
                    *result.paths.entry(answered.path.clone()).or_default() += 1;
                    result.truncated_deep += u32::from(answered.truncated);
                    let noise = if adversarial {
                        &mut result.adversarial
                    } else {
                        &mut result.answerable
                    };
                    if let Some(top) = answered.hits.first() {
                        noise.top_score.add(top.score);
                    }
                    noise.top_cosine.add(
                        answered
                            .hits
                            .iter()
                            .map(|hit| hit.cosine)
                            .fold(0.0, f64::max),
                    );
                    if adversarial {
                        continue;
                    }
                    let recall = RECALL_KS.map(|k| {
                        covered_share(
                            &answered.hits[..k.min(answered.hits.len())],
                            &maps,
                            evidence,
                            |_| true,
                        )
                    });
                    // Binary relevance: an item is relevant when it covers an evidence turn.
                    let relevant: BTreeMap<String, u32> = maps
                        .iter()
                        .flat_map(|map| map.iter())
                        .filter(|(_, turns)| turns.iter().any(|t| evidence.contains(t)))
                        .map(|(id, _)| (id.clone(), 1))
                        .collect();
                    let ids: Vec<String> = answered.hits.iter().map(|hit| hit.id.clone()).collect();
                    let ndcg = ndcg_at(&ids, &relevant, 10);
                    let turns_10 = answered
                        .hits
                        .iter()
                        .take(10)
                        .filter_map(|hit| maps.iter().find_map(|map| map.get(&hit.id)))
                        .flatten()
                        .collect::<BTreeSet<_>>()
                        .len();
                    for key in [question.category.as_str(), "all"] {
                        add_ranked(
                            result.ranked.entry(key.to_owned()).or_default(),
                            &recall,
                            ndcg,
                            turns_10,
                        );
                    }
                    add_ranked(
                        result
                            .by_dialog
                            .entry(dialog.prepared.dialog.id.clone())
                            .or_default(),
                        &recall,
                        ndcg,
                        turns_10,
                    );
                }
                Ask::Assistant { tokens } => {
                    if adversarial {
                        continue;
                    }
                    let (verbatim, in_words) =
                        read_shares(&answered.markdown, &dialog.prepared.turns, evidence);
                    if let Some(dump) = dump.as_mut() {
                        let line = serde_json::json!({
                            "storage": config.label,
                            "tokens": tokens,
                            "dialog": dialog.prepared.dialog.id,
                            "question_index": q,
                            "question": question.question,
                            "category": question.category,
                            "evidence": evidence
                                .iter()
                                .map(|&t| dialog.prepared.turns[t].content.clone())
                                .collect::<Vec<_>>(),
                            "verbatim": verbatim,
                            "markdown": answered.markdown,
                        });
                        writeln!(dump, "{line}")?;
                    }
                    let groups = result.read.entry(*tokens).or_default();
                    for key in [question.category.as_str(), "all"] {
                        let group = groups.entry(key.to_owned()).or_default();
                        group.verbatim.add(verbatim);
                        group.words.add(in_words);
                        group.tokens.add(f64::from(answered.tokens));
                    }
                }
                Ask::Budget { tokens, limits } => {
                    // What an assistant gets by default: the default limits and budget.
                    if *limits == Limits::Default && *tokens == DEFAULT_BUDGET {
                        let noise = if adversarial {
                            &mut result.adversarial
                        } else {
                            &mut result.answerable
                        };
                        noise.results.add(answered.hits.len() as f64);
                    }
                    if adversarial {
                        continue;
                    }
                    let strict = covered_share(&answered.hits, &maps, evidence, |hit| {
                        !hit.episode || hit.details_shown
                    });
                    let listed = covered_share(&answered.hits, &maps, evidence, |_| true);
                    let groups = result.budget.entry((*limits, *tokens)).or_default();
                    for key in [question.category.as_str(), "all"] {
                        let group = groups.entry(key.to_owned()).or_default();
                        group.strict.add(strict);
                        group.listed.add(listed);
                        group.tokens.add(f64::from(answered.tokens));
                        group.items.add(answered.hits.len() as f64);
                    }
                }
            }
        }
    }
    Ok(result)
}

/// One parameter of the search for the ranking defaults and the values tried for it.
struct SweepStep {
    /// The setting, as `ENGRAM_RECALL__*` names it.
    setting: &'static str,
    what: &'static str,
    values: &'static [f64],
    get: fn(&v1::RankingOptions) -> f64,
    set: fn(&mut v1::RankingOptions, f64),
    /// Keep the highest value whose objective is within [`SWEEP_MIN_GAIN`] of the best, instead
    /// of the best: for the relevance floor, whose gain (less noise) recall does not count.
    highest_within_noise: bool,
}

/// The parameters searched, in order, each at the best values of the steps before it. Recency (β,
/// τ) is not among them: every turn of the development set is months old when it is asked about,
/// so recency is below 10⁻⁸ for all of them and cannot be chosen here. Nor is the candidates per
/// leg: each leg takes at least as many as the request's limit, 100 for the deep questions. Nor is
/// the RRF constant: triscore's relevance weighs the legs' scores, so k orders only the fsrs
/// profile (it stays at 1, where its last search on the dialogs left it).
const SWEEP: [SweepStep; 7] = [
    SweepStep {
        setting: "SPARSE_WEIGHT",
        what: "the sparse leg's share of triscore's relevance (BM25 over the best BM25; the cosine \
               over the best cosine has the rest)",
        values: &[0.2, 0.3, 0.4, 0.5, 0.7],
        get: |o| o.sparse_weight.unwrap_or_default(),
        set: |o, v| o.sparse_weight = Some(v),
        highest_within_noise: false,
    },
    SweepStep {
        setting: "QUESTION_WEIGHT",
        what: "the factor on the relevance of a fact that is itself a question (1: none)",
        values: &[0.6, 0.7, 0.8, 0.9, 1.0],
        get: |o| o.question_weight.unwrap_or_default(),
        set: |o, v| o.question_weight = Some(v),
        highest_within_noise: false,
    },
    SweepStep {
        setting: "OTHER_SPEAKER_WEIGHT",
        what: "the factor on the relevance of a line of a speaker the question does not name, \
               when it names one (\"What breed is Jonas's dog?\": Clara's lines; 1: none)",
        values: &[0.3, 0.5, 0.7, 0.85, 1.0],
        get: |o| o.other_speaker_weight.unwrap_or_default(),
        set: |o, v| o.other_speaker_weight = Some(v),
        highest_within_noise: false,
    },
    SweepStep {
        setting: "GAMMA",
        what: "γ, the weight of importance (α, the weight of relevance, stays 4)",
        values: &[0.0, 0.25, 0.5, 1.0, 2.0],
        get: |o| o.gamma.unwrap_or_default(),
        set: |o, v| o.gamma = Some(v),
        highest_within_noise: false,
    },
    SweepStep {
        setting: "MMR_LAMBDA",
        what: "MMR's λ (1: by score alone)",
        values: &[0.5, 0.7, 0.85, 1.0],
        get: |o| o.mmr_lambda.unwrap_or_default(),
        set: |o, v| o.mmr_lambda = Some(v),
        highest_within_noise: false,
    },
    SweepStep {
        setting: "MIN_SIMILARITY",
        what: "the relevance floor: the least cosine of an entry no query word matched (the highest \
               value within 0.2 points of the best is kept: a floor leaves noise out, which recall \
               does not reward; at most 0.25, since a paraphrase sharing no word with its question, \
               \"I am allergic to peanuts\" for \"which foods should be avoided?\", has a cosine \
               near 0.3 and must still be found)",
        values: &[0.0, 0.1, 0.15, 0.2, 0.25],
        get: |o| o.min_similarity.unwrap_or_default(),
        set: |o, v| o.min_similarity = Some(v),
        highest_within_noise: true,
    },
    SweepStep {
        setting: "TIME_MATCH_BOOST",
        what: "the boost of an entry from the days a question names (\"in March\", \"last week\"): it scores (1 + this) times as much",
        values: &[0.0, 0.25, 0.5, 1.0, 2.0],
        get: |o| o.time_match_boost.unwrap_or_default(),
        set: |o, v| o.time_match_boost = Some(v),
        highest_within_noise: false,
    },
];

/// A value replaces the one chosen so far only when it adds at least this much to the objective
/// (about a question's worth of the 435: smaller differences are luck, not a better default).
const SWEEP_MIN_GAIN: f64 = 0.002;

/// The ranking the retrieval service uses when a request says nothing, read from the same
/// `ENGRAM_*` environment it reads, every parameter explicit.
fn service_ranking() -> anyhow::Result<v1::RankingOptions> {
    let settings = engram_retrieval::RetrievalSettings::load()
        .map_err(|error| anyhow!("reading the retrieval settings: {error}"))?;
    let params = settings
        .recall
        .default_ranking()
        .map_err(|error| anyhow!("the retrieval settings: {error}"))?;
    Ok(v1::RankingOptions {
        profile: match params.profile {
            engram_core::retrieval::RankingProfile::Fsrs => v1::RankingProfile::Fsrs,
            engram_core::retrieval::RankingProfile::Triscore => v1::RankingProfile::Triscore,
        }
        .into(),
        candidates_per_leg: Some(params.candidates_per_leg),
        rrf_k: Some(params.rrf_k),
        mmr_lambda: Some(params.mmr_lambda),
        alpha: Some(params.alpha),
        beta: Some(params.beta),
        gamma: Some(params.gamma),
        recency_tau_days: Some(params.recency_tau_days),
        min_similarity: Some(params.min_similarity),
        time_match_boost: Some(params.time_match_boost),
        sparse_weight: Some(params.sparse_weight),
        question_weight: Some(params.question_weight),
        other_speaker_weight: Some(params.other_speaker_weight),
        ..Default::default()
    })
}

/// What one value of a step scored (deep, on the turns).
#[derive(Clone)]
struct Tried {
    value: f64,
    /// On the turns, by category.
    ranked: BTreeMap<String, Ranked>,
    /// On the conversation's episodes and facts together, over all answerable questions.
    conversation: Ranked,
}

impl Tried {
    /// What the search maximises: recall@10 on the turns and on the conversation, alike.
    fn objective(&self) -> f64 {
        (recall_10(&self.ranked) + self.conversation.recall[1].value()) / 2.0
    }
}

struct SweepResult {
    /// Per step: every value tried and the index of the one kept.
    steps: Vec<(Vec<Tried>, usize)>,
    start: v1::RankingOptions,
    best: v1::RankingOptions,
}

fn recall_10(ranked: &BTreeMap<String, Ranked>) -> f64 {
    ranked.get("all").map_or(0.0, |all| all.recall[1].value())
}

/// Searches the ranking parameters one at a time (deep questions), on the turns and on the
/// conversation's episodes and facts, starting from the service's defaults: each step tries its
/// values with the best of the steps before it.
async fn sweep(
    retrieval: &RetrievalServiceClient<Channel>,
    loaded: &[Loaded],
    start: v1::RankingOptions,
) -> anyhow::Result<SweepResult> {
    let mut best = start;
    let mut steps = Vec::new();
    for step in &SWEEP {
        let mut tried = Vec::new();
        for &value in step.values {
            let mut ranking = best;
            (step.set)(&mut ranking, value);
            // The ranking the previous step kept: its scores are known already.
            if let Some(known) = steps
                .last()
                .map(|(tried, kept): &(Vec<Tried>, usize)| &tried[*kept])
                .filter(|_| ranking == best)
            {
                tried.push(Tried {
                    value,
                    ..known.clone()
                });
                continue;
            }
            let config = |storage| Config {
                storage,
                label: format!("sweep {} = {value}", step.setting),
                ranking,
            };
            let turns = evaluate(
                retrieval,
                loaded,
                config(Storage::Turns),
                &[Ask::Deep],
                &mut None,
            )
            .await?;
            let conversation = evaluate(
                retrieval,
                loaded,
                config(Storage::Both),
                &[Ask::Deep],
                &mut None,
            )
            .await?;
            let t = Tried {
                value,
                ranked: turns.ranked,
                conversation: conversation.ranked.get("all").copied().unwrap_or_default(),
            };
            eprintln!(
                "dialogs: sweep {:<20} {:>6} recall@10 turns {} episodes + facts {}",
                step.setting,
                value,
                pct(recall_10(&t.ranked)),
                pct(t.conversation.recall[1].value())
            );
            tried.push(t);
        }
        // The best value, unless it beats the current one by less than a question's worth.
        let current = (step.get)(&best);
        let mut kept = tried
            .iter()
            .position(|t| (t.value - current).abs() < 1e-9)
            .unwrap_or(0);
        let top = (0..tried.len())
            .max_by(|&a, &b| tried[a].objective().total_cmp(&tried[b].objective()))
            .unwrap_or(kept);
        if step.highest_within_noise {
            let floor = tried[top].objective() - SWEEP_MIN_GAIN;
            kept = (0..tried.len())
                .filter(|&index| tried[index].objective() >= floor)
                .max_by(|&a, &b| tried[a].value.total_cmp(&tried[b].value))
                .unwrap_or(top);
        } else if tried[top].objective() >= tried[kept].objective() + SWEEP_MIN_GAIN {
            kept = top;
        }
        (step.set)(&mut best, tried[kept].value);
        steps.push((tried, kept));
    }
    Ok(SweepResult { steps, start, best })
}

/// How the import's default context for dialogs was chosen: the default ranking on the turns
/// imported with each `context_turns`.
fn context_report(results: &[ConfigResult], default_context: u32) -> String {
    let mut out = format!(
        "\n## How the import's context was chosen\n\n\
         ImportMemories searches each fact of an import that reads as a dialog with its \
         neighbours, {default_context} on each side, when the request does not say \
         (`context_turns`). The turns imported with each value, asked deep with the default \
         ranking; the default is the value with the highest recall@10, and another value replaces \
         it only when it adds at least {gain:.1} points (as in the ranking search above).\n\n\
         | context_turns | recall@5 | recall@10 | recall@25 | recall@50 | nDCG@10 | multi_hop @10 |\n\
         |---|---|---|---|---|---|---|\n",
        gain = SWEEP_MIN_GAIN * 100.0
    );
    let default_profile_first = results.first().map(|r| r.config.ranking.profile);
    let mut rows: Vec<(u32, &ConfigResult)> = results
        .iter()
        .filter(|r| Some(r.config.ranking.profile) == default_profile_first)
        .filter(|r| !r.config.ranking.sparse_only)
        .filter_map(|r| match r.config.storage {
            Storage::Turns => Some((default_context, r)),
            Storage::TurnsWithContext(turns) if turns != default_context => Some((turns, r)),
            _ => None,
        })
        .collect();
    rows.sort_by_key(|(turns, _)| *turns);
    let recall_10 = |result: &ConfigResult| {
        result
            .ranked
            .get("all")
            .map_or(0.0, |r| r.recall[1].value())
    };
    let of_default = rows
        .iter()
        .find(|(turns, _)| *turns == default_context)
        .map_or(0.0, |(_, result)| recall_10(result));
    let better: Vec<String> = rows
        .iter()
        .filter(|(_, result)| recall_10(result) >= of_default + SWEEP_MIN_GAIN)
        .map(|(turns, result)| format!("{turns} ({} %)", pct(recall_10(result))))
        .collect();
    for (turns, result) in rows {
        let all = result.ranked.get("all").copied().unwrap_or_default();
        let multi = result
            .ranked
            .get("multi_hop")
            .map_or(0.0, |r| r.recall[1].value());
        let value = if turns == default_context {
            format!("**{turns}** (default)")
        } else {
            turns.to_string()
        };
        let _ = writeln!(
            out,
            "| {value} | {} | {} | {} | {} | {:.3} | {} |",
            pct(all.recall[0].value()),
            pct(all.recall[1].value()),
            pct(all.recall[2].value()),
            pct(all.recall[3].value()),
            all.ndcg_10.value(),
            pct(multi)
        );
    }
    if better.is_empty() {
        out.push_str("\nThe default context is the best of these.\n");
    } else {
        let _ = writeln!(
            out,
            "\n**More evidence in the first 10 with**: {}. Set `DIALOG_CONTEXT_TURNS` in \
             services/ingest/src/import.rs and run `make eval` again.",
            better.join(", ")
        );
    }
    out
}

fn sweep_report(sweep: &SweepResult) -> String {
    let mut out = String::from(
        "\n## How the ranking defaults were chosen\n\n\
         Deep questions, one parameter at a time in the order below, starting from the service's \
         defaults; each step tries its values with the values kept so far. The objective is the \
         mean of recall@10 over all answerable questions on the turns (every turn one memory, \
         imported with the service's defaults) and \
         on the conversation's episodes and facts together (what a client that appends its \
         conversations gets): a default must serve both. The best value of a step replaces the \
         one kept only when it adds at least 0.2 points to it (about one question of the 435). The recall, nDCG and \
         category columns are the turns'; the last two the conversation's. β and τ (recency) are not searched: every turn is months \
         old when it is asked about, so recency is below 10⁻⁸ for every one of them and the \
         development set cannot tell their values apart. They stay at the values `make eval`'s \
         task set chose (docs/eval/retrieval.md). Nor are the candidates per leg \
         (`ENGRAM_RECALL__CANDIDATES_PER_LEG`, 20): each leg takes at least as many candidates \
         as the request's limit, 100 here.\n",
    );
    for (step, (tried, kept)) in SWEEP.iter().zip(&sweep.steps) {
        let _ = write!(
            out,
            "\n**`ENGRAM_RECALL__{}`**: {}.\n\n\
             | value | objective | recall@5 | recall@10 | recall@25 | recall@50 | nDCG@10 | {} | episodes + facts recall@10 | episodes + facts nDCG@10 |\n\
             |---|---|---|---|---|---|---|{}---|---|\n",
            step.setting,
            step.what,
            CATEGORIES
                .iter()
                .map(|c| format!("{c} @10"))
                .collect::<Vec<_>>()
                .join(" | "),
            "---|".repeat(CATEGORIES.len()),
        );
        for (index, t) in tried.iter().enumerate() {
            let all = t.ranked.get("all").copied().unwrap_or_default();
            let value = if index == *kept {
                format!("**{}** (kept)", t.value)
            } else {
                t.value.to_string()
            };
            let categories: Vec<String> = CATEGORIES
                .iter()
                .map(|c| {
                    t.ranked
                        .get(*c)
                        .map_or_else(|| "—".to_owned(), |r| pct(r.recall[1].value()))
                })
                .collect();
            let _ = writeln!(
                out,
                "| {value} | {} | {} | {} | {} | {} | {:.3} | {} | {} | {:.3} |",
                pct(t.objective()),
                pct(all.recall[0].value()),
                pct(all.recall[1].value()),
                pct(all.recall[2].value()),
                pct(all.recall[3].value()),
                all.ndcg_10.value(),
                categories.join(" | "),
                pct(t.conversation.recall[1].value()),
                t.conversation.ndcg_10.value()
            );
        }
    }
    let differ: Vec<String> = SWEEP
        .iter()
        .filter(|step| ((step.get)(&sweep.start) - (step.get)(&sweep.best)).abs() > 1e-9)
        .map(|step| {
            format!(
                "`ENGRAM_RECALL__{}` {} (the service has {})",
                step.setting,
                (step.get)(&sweep.best),
                (step.get)(&sweep.start)
            )
        })
        .collect();
    if differ.is_empty() {
        out.push_str(
            "\nThe search kept every default the service runs with: they are the best it found.\n",
        );
    } else {
        let _ = writeln!(
            out,
            "\n**The search found better values than the service's defaults**: {}. Set them in \
             `shared/recall/src/settings.rs` and run `make eval` again.",
            differ.join(", ")
        );
    }
    out
}

fn add_ranked(group: &mut Ranked, recall: &[f64; 4], ndcg: f64, turns_10: usize) {
    for (mean, value) in group.recall.iter_mut().zip(recall) {
        mean.add(*value);
    }
    group.ndcg_10.add(ndcg);
    group.turns_10.add(turns_10 as f64);
}

/// Seconds each step took (and one setting the report states).
struct Timings {
    turns_import: f64,
    turns_embedded: f64,
    conversations_segmented: f64,
    conversations_embedded: f64,
    questions: f64,
    total: f64,
    /// The ingest service's idle close, as the report states it.
    idle_close_secs: i64,
}

/// The context the service gave the turns by default, and the others they are loaded with.
struct TurnContexts {
    default: u32,
    others: Vec<u32>,
}

fn pct(value: f64) -> String {
    format!("{:.1}", value * 100.0)
}

fn report(
    results: &[ConfigResult],
    searched: &SweepResult,
    loaded: &[Loaded],
    default_profile: &str,
    contexts: &TurnContexts,
    command_line: &str,
    timings: &Timings,
) -> String {
    let default_context = contexts.default;
    let questions: Vec<&Question> = loaded
        .iter()
        .flat_map(|d| d.prepared.dialog.questions.iter())
        .collect();
    let count = |category: &str| questions.iter().filter(|q| q.category == category).count();
    let answerable = questions.len() - count(ADVERSARIAL);
    let turns: usize = loaded.iter().map(|d| d.prepared.turns.len()).sum();
    let sessions: usize = loaded
        .iter()
        .map(|d| d.prepared.dialog.sessions.len())
        .sum();
    let all = |result: &ConfigResult| result.ranked.get("all").copied().unwrap_or_default();
    let mut out = String::new();
    let _ = write!(
        out,
        "# Retrieval on multi-session dialogs\n\n\
         Produced by `{command_line}` on {date} in {total:.0} s: loading the turns {ti:.0} s (import) + \
         {te:.0} s (embedding backfill), loading the conversations {cs:.0} s (appending, segmentation, \
         consolidation) + {ce:.0} s (embedding backfill), asking {q:.0} s. The services: a release \
         ingest with the local embedder (all-MiniLM-L6-v2), no LLM, the bus off \
         (`ENGRAM_AMQP__ENABLED=false`) and `ENGRAM_SEGMENTATION__IDLE_CLOSE_SECS={idle}`, and a \
         release retrieval, both otherwise at their defaults (`deploy/eval/run.sh`).\n\n\
         The development set of [`tests/eval/dialogs`](../../tests/eval/dialogs/README.md): {dialogs} \
         conversations between two people, {sessions} dated sessions, {turns} turns, {nq} questions \
         ({answerable} with evidence turns, {adv} adversarial). Every dialog is loaded {ways} times, each \
         in its own space of one evaluation user (a per-space soft cap of {SOFT_CAP} is set with \
         UpdateSettings first: the default cap, 200, would trim the longer dialogs):\n\n\
         - **turns**: every turn one fact through ImportMemories, text `\"<Speaker>: <text>\"`, \
         created at the session's date plus one minute per turn before it in the session, client id \
         the turn id, and nothing else set (the protocol of the held-out benchmark of issue 23). \
         The turns read as a dialog, so the service searches each one with {default_context} turns \
         before and after it (within an hour) as well, and shows it as said;\n\
         - **turns alone** and **turns, context_turns n**: the same, imported with `context_turns` \
         set to each of {choices:?} (0: each turn searched alone; plain BM25 over the turns is \
         measured there), to show how the default was chosen;\n\
         - **conversation**: the dialog appended through AppendMessages session by session (content \
         `\"<Speaker>: <text>\"`, `at` the same times, client message id the turn id; the first \
         speaker as USER and the second as ASSISTANT, although both are people here), then \
         CloseSegment. The ingest service (bus off: its local worker segments) closes segments by \
         its default rules and writes an episode per segment, consolidated into facts by the local \
         extractive rules (no LLM). The next session is appended once the service has segmented \
         and consolidated what it could of the last one, so every run segments alike.\n\n\
         Every question is asked through RetrieveMemory without a conversation id. **Deep**: the \
         largest limits (100 facts and/or 100 episodes, the section a storage way does not use set \
         to 0), detail NONE, a 32,000-token budget; **within a budget**: a budget of 1,000 or 2,000 \
         tokens, detail HIGH (every episode offers its excerpt; one that does not fit is shown \
         without it, or left out), with the default limits (20 facts, 5 episodes) or the largest \
         (100 each: the budget alone decides). The service's default profile is \
         {default_profile}.\n\n\
         Scoring, per answerable question with evidence turns E:\n\n\
         - An item *covers* turns: a turn memory its turn; an episode the turns `first..=last` of \
         the segment it was written from (the audit trail's SEGMENT event; each excerpt is compared \
         with those turns, and a mismatch counted below); a fact the turns of its speaker whose text contains the \
         fact's sentence (lowercased, whitespace collapsed, closing punctuation dropped), within \
         its source episodes first. The local consolidation copies user sentences, so facts map; \
         facts written by an LLM would not.\n\
         - One ranked list per response: facts and episodes each keep their order and are merged \
         by comparing the scores at their heads.\n\
         - **recall@k** = |E ∩ turns covered by the first k items| / |E|, averaged over questions.\n\
         - **nDCG@10**: binary; an item is relevant when it covers a turn of E, and the ideal \
         ranking puts every relevant item of the space first (for turns: the usual nDCG over \
         evidence turns).\n\
         - **Recall within a budget** = |E ∩ turns covered by what the Markdown holds| / |E|: the \
         structured results are exactly what fit the budget; an episode counts only when its \
         excerpt is in the Markdown (`details_shown`). The *listed* figure also counts episodes \
         that fit with their title and summary alone.\n\
         - Averages over all answerable questions weigh every question alike.\n",
        date = Utc::now().format("%Y-%m-%d %H:%M UTC"),
        total = timings.total,
        ti = timings.turns_import,
        te = timings.turns_embedded,
        cs = timings.conversations_segmented,
        ce = timings.conversations_embedded,
        q = timings.questions,
        idle = timings.idle_close_secs,
        dialogs = loaded.len(),
        nq = questions.len(),
        adv = count(ADVERSARIAL),
        ways = contexts.others.len() + 2,
        choices = contexts.others,
    );

    out.push_str("\n## What this says\n\n");
    out.push_str(&summary(results, loaded));
    read_table(&mut out, results);
    out.push_str(&sweep_report(searched));
    out.push_str(&context_report(results, default_context));

    out.push_str(
        "\n## Ranking quality (deep)\n\n\
         | configuration | recall@5 | recall@10 | recall@25 | recall@50 | nDCG@10 | turns behind the first 10 |\n\
         |---|---|---|---|---|---|---|\n",
    );
    for result in results {
        let scores = all(result);
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {:.3} | {:.0} |",
            result.config.label,
            pct(scores.recall[0].value()),
            pct(scores.recall[1].value()),
            pct(scores.recall[2].value()),
            pct(scores.recall[3].value()),
            scores.ndcg_10.value(),
            scores.turns_10.value()
        );
    }
    let _ = write!(
        out,
        "\nRecall in percent. *Turns behind the first 10*: the distinct dialog turns the first 10 \
         items cover, on average (what reading them costs). A dialog has {} episodes or fewer, so \
         from k = 10 on episodes return most of the dialog; the budget tables below compare the \
         storage ways at equal cost.\n",
        loaded.iter().map(|d| d.stats.episodes).max().unwrap_or(0)
    );

    out.push_str("\n## Recall@10 by category (deep)\n\n| configuration |");
    for category in CATEGORIES {
        let _ = write!(out, " {category} ({}) |", count(category));
    }
    out.push_str(" all |\n|---|");
    out.push_str(&"---|".repeat(CATEGORIES.len() + 1));
    out.push('\n');
    for result in results {
        let _ = write!(out, "| {} |", result.config.label);
        for category in CATEGORIES.iter().copied().chain(["all"]) {
            let value = result
                .ranked
                .get(category)
                .map_or(0.0, |r| r.recall[1].value());
            let _ = write!(out, " {} |", pct(value));
        }
        out.push('\n');
    }

    for (limits, title) in [
        (
            Limits::Largest,
            "largest limits: the budget decides what fits",
        ),
        (Limits::Default, "default limits (20 facts, 5 episodes)"),
    ] {
        budget_table(&mut out, results, limits, title);
    }

    out.push_str("\n## Recall@10 by dialog (deep)\n\n| configuration |");
    for dialog in loaded {
        let _ = write!(out, " {} |", dialog.prepared.dialog.id);
    }
    out.push_str("\n|---|");
    out.push_str(&"---|".repeat(loaded.len()));
    out.push('\n');
    for result in results {
        let _ = write!(out, "| {} |", result.config.label);
        for dialog in loaded {
            let value = result
                .by_dialog
                .get(&dialog.prepared.dialog.id)
                .map_or(0.0, |r| r.recall[1].value());
            let _ = write!(out, " {} |", pct(value));
        }
        out.push('\n');
    }
    out.push_str("\nd07 is the Chinese dialog; the local embedding model is English-only.\n");

    let _ = write!(
        out,
        "\n## Adversarial questions (no evidence) against answerable ones\n\n\
         What a relevance floor (issue 23) would have to tell apart: the results returned with the \
         default limits (2,000 tokens), the top item's score and the highest cosine of the query to \
         a returned item (deep), averaged over the {} adversarial and the {answerable} answerable \
         questions.\n\n\
         | configuration | results, adversarial | results, answerable | top score, adversarial | top score, answerable | top cosine, adversarial | top cosine, answerable |\n\
         |---|---|---|---|---|---|---|\n",
        count(ADVERSARIAL)
    );
    for result in results {
        let (a, b) = (&result.adversarial, &result.answerable);
        let cosine = |noise: &Noise| {
            if result.config.ranking.sparse_only {
                "—".to_owned()
            } else {
                format!("{:.3}", noise.top_cosine.value())
            }
        };
        let _ = writeln!(
            out,
            "| {} | {:.1} | {:.1} | {:.3} | {:.3} | {} | {} |",
            result.config.label,
            a.results.value(),
            b.results.value(),
            a.top_score.value(),
            b.top_score.value(),
            cosine(a),
            cosine(b)
        );
    }

    out.push_str(
        "\n## What was stored\n\n\
         | dialog | relationship | sessions | turns | segments | segments by reason | spanning sessions | exactly a session | episodes | facts | facts superseded | facts not mapped |\n\
         |---|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    let mut total = ConversationStats::default();
    for dialog in loaded {
        let d = &dialog.prepared.dialog;
        stats_row(
            &mut out,
            [&d.id, &d.relationship],
            [d.sessions.len(), dialog.prepared.turns.len()],
            &dialog.stats,
        );
        total.add(&dialog.stats);
    }
    stats_row(&mut out, ["all", ""], [sessions, turns], &total);
    let _ = write!(
        out,
        "\nSegments whose episode repeated an earlier one: {}; segments of greetings and thanks \
         alone (no episode): {}; episodes whose excerpt is not their segment's turns: {}; turns \
         that ran a memory command: {}. The turns spaces hold one fact per turn ({turns} in all).\n",
        total.repeated, total.trivial, total.excerpt_mismatches, total.commands
    );

    out.push_str("\n| category | questions |\n|---|---|\n");
    for category in CATEGORIES.iter().copied().chain([ADVERSARIAL]) {
        let _ = writeln!(out, "| {category} | {} |", count(category));
    }
    let _ = writeln!(out, "| all | {} |", questions.len());

    out.push_str("\n## Which path served the deep questions\n\n| configuration | paths | truncated |\n|---|---|---|\n");
    for result in results {
        let paths = result
            .paths
            .iter()
            .map(|(path, n)| format!("{path}: {n}"))
            .collect::<Vec<_>>()
            .join(", ");
        let _ = writeln!(
            out,
            "| {} | {paths} | {} |",
            result.config.label, result.truncated_deep
        );
    }
    out
}

/// A row of the "what was stored" table: dialog and relationship, sessions and turns, and what
/// segmentation and consolidation made of them.
fn stats_row(out: &mut String, names: [&str; 2], sizes: [usize; 2], s: &ConversationStats) {
    let reasons = s
        .reasons
        .iter()
        .map(|(reason, n)| format!("{reason} {n}"))
        .collect::<Vec<_>>()
        .join(", ");
    let _ = writeln!(
        out,
        "| {} | {} | {} | {} | {} | {reasons} | {} | {} | {} | {} | {} | {} |",
        names[0],
        names[1],
        sizes[0],
        sizes[1],
        s.segments,
        s.spanning_sessions,
        s.exact_sessions,
        s.episodes,
        s.facts,
        s.superseded_facts,
        s.unmapped_facts
    );
}

/// Recall within each budget, with the given limits.
/// What an assistant reads: each answerable question asked with the query and a budget alone
/// (the service's limits, detail and ranking), and its evidence turns looked for in the Markdown.
fn read_table(out: &mut String, results: &[ConfigResult]) {
    let _ = write!(
        out,
        "\n## What an assistant reads\n\n\
         Each answerable question asked as an assistant asks: the query and a token budget, every \
         other field left to the service's defaults (5 episodes, 20 facts, detail AUTO, the default \
         ranking), on the conversation appended through AppendMessages and on the same turns \
         imported as facts. An evidence turn is **read verbatim** when its text (without the \
         speaker's name it was stored with) is in the Markdown word for word, case, spacing and \
         punctuation aside; **read in its words** when the Markdown holds at least {words} % of its \
         words of three or more characters. Tokens: the Markdown's mean size.\n\n\
         | stored as | budget | read verbatim | read in its words | single_hop | multi_hop | temporal | preference_change | tokens |\n\
         |---|---|---|---|---|---|---|---|---|\n",
        words = (WORDS_READ * 100.0).round()
    );
    for result in results.iter().filter(|r| !r.read.is_empty()) {
        for (tokens, groups) in &result.read {
            let at = |group: &str| groups.get(group).copied().unwrap_or_default();
            let _ = write!(
                out,
                "| {} | {tokens} | {} | {} |",
                result.config.label,
                pct(at("all").verbatim.value()),
                pct(at("all").words.value()),
            );
            for category in CATEGORIES {
                let _ = write!(out, " {} |", pct(at(category).verbatim.value()));
            }
            let _ = writeln!(out, " {:.0} |", at("all").tokens.value());
        }
    }
}

fn budget_table(out: &mut String, results: &[ConfigResult], limits: Limits, title: &str) {
    let _ = write!(
        out,
        "\n## Recall within a token budget, {title}\n\n\
         | configuration | 1,000 tokens | 2,000 tokens | 1,000, episodes listed | 2,000, episodes listed | multi_hop at 1,000 | multi_hop at 2,000 | tokens used at 2,000 | items at 2,000 |\n\
         |---|---|---|---|---|---|---|---|---|\n",
    );
    for result in results {
        let at = |tokens: u32, group: &str| {
            result
                .budget
                .get(&(limits, tokens))
                .and_then(|groups| groups.get(group))
                .copied()
                .unwrap_or_default()
        };
        let has_episodes = result.config.storage.sections().0;
        let listed = |tokens: u32| {
            if has_episodes {
                pct(at(tokens, "all").listed.value())
            } else {
                "—".into()
            }
        };
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | {} | {:.0} | {:.1} |",
            result.config.label,
            pct(at(BUDGETS[0], "all").strict.value()),
            pct(at(BUDGETS[1], "all").strict.value()),
            listed(BUDGETS[0]),
            listed(BUDGETS[1]),
            pct(at(BUDGETS[0], "multi_hop").strict.value()),
            pct(at(BUDGETS[1], "multi_hop").strict.value()),
            at(BUDGETS[1], "all").tokens.value(),
            at(BUDGETS[1], "all").items.value(),
        );
    }
}

/// The "what this says" list, from the figures (the discussion is in docs/eval/README.md).
fn summary(results: &[ConfigResult], loaded: &[Loaded]) -> String {
    let recall_10 = |r: &ConfigResult| r.ranked.get("all").map_or(0.0, |s| s.recall[1].value());
    let multi_10 = |r: &ConfigResult| {
        r.ranked
            .get("multi_hop")
            .map_or(0.0, |s| s.recall[1].value())
    };
    let budget = |r: &ConfigResult, tokens: u32| {
        r.budget
            .get(&(Limits::Largest, tokens))
            .and_then(|g| g.get("all"))
            .map_or(0.0, |s| s.strict.value())
    };
    let best_of = |storage: Storage, metric: &dyn Fn(&ConfigResult) -> f64| {
        results
            .iter()
            .filter(|r| r.config.storage == storage)
            .max_by(|a, b| metric(a).total_cmp(&metric(b)))
    };
    let turns: Vec<String> = results
        .iter()
        .filter(|r| r.config.storage == Storage::Turns)
        .map(|r| {
            format!(
                "{} {} % (multi_hop {} %)",
                r.config.label.trim_start_matches("turns, "),
                pct(recall_10(r)),
                pct(multi_10(r))
            )
        })
        .collect();
    let mut text = String::new();
    let read = |storage: Storage, tokens: u32| {
        results
            .iter()
            .find(|r| r.config.storage == storage && !r.read.is_empty())
            .and_then(|r| r.read.get(&tokens))
            .and_then(|groups| groups.get("all"))
            .map_or(0.0, |read| read.verbatim.value())
    };
    let _ = writeln!(
        text,
        "- What an assistant reads, asking with the query and a budget alone: the evidence turn verbatim \
         in the Markdown at 1,000 / 2,000 tokens, the conversation appended {} % / {} %, its turns \
         imported as facts {} % / {} % (below).",
        pct(read(Storage::Both, BUDGETS[0])),
        pct(read(Storage::Both, BUDGETS[1])),
        pct(read(Storage::Turns, BUDGETS[0])),
        pct(read(Storage::Turns, BUDGETS[1])),
    );
    let _ = writeln!(text, "- Turns, recall@10: {}.", turns.join("; "));
    // Issue 23's bar: the default ranking is not worse than plain BM25 in any category.
    let default_turns = results.iter().find(|r| r.config.storage == Storage::Turns);
    let bm25 = results.iter().find(|r| r.config.ranking.sparse_only);
    if let (Some(default_turns), Some(bm25)) = (default_turns, bm25) {
        let at_10 = |r: &ConfigResult, category: &str| {
            r.ranked.get(category).map_or(0.0, |s| s.recall[1].value())
        };
        let behind: Vec<&str> = CATEGORIES
            .iter()
            .copied()
            .filter(|c| at_10(default_turns, c) < at_10(bm25, c))
            .collect();
        let compared: Vec<String> = CATEGORIES
            .iter()
            .map(|c| {
                format!(
                    "{c} {} against {} ({:+.1})",
                    pct(at_10(default_turns, c)),
                    pct(at_10(bm25, c)),
                    (at_10(default_turns, c) - at_10(bm25, c)) * 100.0
                )
            })
            .collect();
        let verdict = if behind.is_empty() {
            "ahead of BM25 alone in every category".to_owned()
        } else {
            format!("**behind BM25 alone in {}**", behind.join(", "))
        };
        let _ = writeln!(
            text,
            "- The default ranking ({}) on the turns, recall@10 per category against BM25 alone: \
             {}: {verdict}.",
            default_turns.config.label.trim_start_matches("turns, "),
            compared.join("; ")
        );
    }
    // What searching each turn with its neighbours adds, with the default ranking.
    let alone = results
        .iter()
        .find(|r| r.config.storage == Storage::TurnsWithContext(0));
    if let (Some(in_context), Some(alone)) = (default_turns, alone) {
        let at =
            |r: &ConfigResult, k: usize| r.ranked.get("all").map_or(0.0, |s| s.recall[k].value());
        let _ = writeln!(
            text,
            "- Turns as imported by default, each searched with its neighbours ({}): recall@5 {} %, \
             @10 {} %, @25 {} % (multi_hop @10 {} %) against {} %, {} %, {} % ({} %) for each turn \
             alone.",
            in_context.config.label.trim_start_matches("turns, "),
            pct(at(in_context, 0)),
            pct(at(in_context, 1)),
            pct(at(in_context, 2)),
            pct(multi_10(in_context)),
            pct(at(alone, 0)),
            pct(at(alone, 1)),
            pct(at(alone, 2)),
            pct(multi_10(alone)),
        );
    }
    for tokens in BUDGETS {
        let ways: Vec<String> = [
            Storage::Turns,
            Storage::TurnsWithContext(0),
            Storage::Episodes,
            Storage::Facts,
            Storage::Both,
        ]
        .into_iter()
        .filter_map(|storage| best_of(storage, &|r| budget(r, tokens)))
        .map(|r| format!("{} {} %", r.config.label, pct(budget(r, tokens))))
        .collect();
        let _ = writeln!(
            text,
            "- At equal cost, {tokens} tokens of Markdown (largest limits), the best of each storage \
             way: {}.",
            ways.join("; ")
        );
    }
    let turns_per_dialog = loaded.iter().map(|d| d.prepared.turns.len()).sum::<usize>() as f64
        / loaded.len().max(1) as f64;
    if let Some(episodes) = best_of(Storage::Episodes, &recall_10) {
        let _ = writeln!(
            text,
            "- Episodes are long: the first 10 ({}) cover {:.0} of a dialog's {turns_per_dialog:.0} \
             turns on average, hence their recall@10 of {} %.",
            episodes.config.label,
            episodes
                .ranked
                .get("all")
                .map_or(0.0, |s| s.turns_10.value()),
            pct(recall_10(episodes))
        );
    }
    let facts: usize = loaded.iter().map(|d| d.stats.facts).sum();
    let total_turns: usize = loaded.iter().map(|d| d.prepared.turns.len()).sum();
    let _ = writeln!(
        text,
        "- The local consolidation kept {facts} facts from {total_turns} turns."
    );
    if let Some(default) = results.first() {
        let _ = writeln!(
            text,
            "- Adversarial questions ({}): top score {:.3} against {:.3} for answerable ones, top \
             cosine {:.3} against {:.3}.",
            default.config.label,
            default.adversarial.top_score.value(),
            default.answerable.top_score.value(),
            default.adversarial.top_cosine.value(),
            default.answerable.top_cosine.value()
        );
    }
    text.push_str("\nDiscussed in [README.md](README.md#dialogs).\n");
    text
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let started = Instant::now();
    let dialogs = read_dialogs(&cli.dialogs)?;
    if dialogs.is_empty() {
        bail!("no dialogs in {}", cli.dialogs.display());
    }
    // The segmentation rules the ingest service runs with (the same ENGRAM_* environment).
    let settings = engram_ingest::IngestSettings::load()
        .map_err(|error| anyhow!("reading the ingest settings: {error}"))?;
    let segmentation = Segmentation {
        pool: sqlx::postgres::PgPoolOptions::new()
            .max_connections(4)
            .connect(&cli.database_url)
            .await
            .context("connecting to the evaluation database")?,
        rules: settings.segmentation.rules(),
        timeout: Duration::from_secs(cli.load_timeout_secs),
    };
    let mut ingest = IngestServiceClient::connect(cli.ingest.clone()).await?;
    let mut retrieval = RetrievalServiceClient::connect(cli.retrieval.clone()).await?;
    let timeout = Duration::from_secs(cli.load_timeout_secs);

    eprintln!("dialogs: importing the turns of {} dialogs", dialogs.len());
    let step = Instant::now();
    let mut turn_memories = Vec::new();
    let mut default_contexts = BTreeSet::new();
    for prepared in &dialogs {
        let (coverage, applied) =
            load_turns(&mut ingest, prepared, prepared.turns_scope(), None).await?;
        turn_memories.push(coverage);
        default_contexts.insert(applied);
    }
    // What the service chose for the turns; the same for every dialog, or the report cannot say
    // which context the default is.
    let default_context = match default_contexts.into_iter().collect::<Vec<_>>()[..] {
        [one] => one,
        ref several => bail!("the service chose different contexts for the dialogs: {several:?}"),
    };
    // Each turn alone (0) is always loaded: plain BM25 is measured there.
    let contexts = TurnContexts {
        default: default_context,
        others: if cli.reads_only {
            Vec::new()
        } else {
            CONTEXT_CHOICES
                .into_iter()
                .filter(|&turns| turns != default_context || turns == 0)
                .collect()
        },
    };
    let other_contexts = &contexts.others;
    let mut turns_with_context = Vec::new();
    for prepared in &dialogs {
        let mut loaded = BTreeMap::new();
        for &turns in other_contexts {
            let scope = prepared.turns_with_context_scope(turns);
            let (coverage, _) = load_turns(&mut ingest, prepared, scope, Some(turns)).await?;
            loaded.insert(turns, coverage);
        }
        turns_with_context.push(loaded);
    }
    let turns_import = step.elapsed().as_secs_f64();
    let step = Instant::now();
    let turn_spaces: Vec<(v1::Scope, Option<usize>)> = dialogs
        .iter()
        .flat_map(|d| {
            std::iter::once(d.turns_scope())
                .chain(
                    other_contexts
                        .iter()
                        .map(|&turns| d.turns_with_context_scope(turns)),
                )
                .map(|scope| (scope, Some(d.turns.len())))
        })
        .collect();
    wait_for_embeddings(&mut retrieval, &turn_spaces, timeout).await?;
    let turns_embedded = step.elapsed().as_secs_f64();

    eprintln!("dialogs: appending the conversations (segmentation and consolidation follow)");
    let step = Instant::now();
    let appended: Vec<usize> = futures::future::try_join_all(dialogs.iter().map(|prepared| {
        let mut ingest = ingest.clone();
        let segmentation = segmentation.clone();
        async move {
            let step = Instant::now();
            let commands = append_conversation(&mut ingest, &segmentation, prepared).await?;
            eprintln!(
                "dialogs: {} segmented and consolidated in {:.0} s",
                prepared.dialog.id,
                step.elapsed().as_secs_f64()
            );
            anyhow::Ok(commands)
        }
    }))
    .await?;
    let conversations_segmented = step.elapsed().as_secs_f64();
    let step = Instant::now();
    let conversation_spaces: Vec<(v1::Scope, Option<usize>)> = dialogs
        .iter()
        .map(|d| (d.conversation_scope(), None))
        .collect();
    wait_for_embeddings(&mut retrieval, &conversation_spaces, timeout).await?;
    let conversations_embedded = step.elapsed().as_secs_f64();

    let mut loaded = Vec::new();
    for (((prepared, turn_memories), turns_with_context), commands) in dialogs
        .into_iter()
        .zip(turn_memories)
        .zip(turns_with_context)
        .zip(appended)
    {
        let mut stats = ConversationStats {
            commands,
            ..Default::default()
        };
        let (episodes, facts) =
            map_conversation(&mut ingest, &mut retrieval, &prepared, &mut stats).await?;
        eprintln!(
            "dialogs: {}: {} turns, {} segments, {} episodes, {} facts ({} not mapped to a turn)",
            prepared.dialog.id,
            prepared.turns.len(),
            stats.segments,
            stats.episodes,
            stats.facts,
            stats.unmapped_facts
        );
        loaded.push(Loaded {
            prepared,
            turn_memories,
            turns_with_context,
            episodes,
            facts,
            stats,
        });
    }

    // The service's default profile, as it reports it.
    let default_profile = retrieval
        .retrieve_memory(v1::RetrieveMemoryRequest {
            scope: Some(loaded[0].prepared.turns_scope()),
            query: "which profile ranks by default?".into(),
            ..Default::default()
        })
        .await?
        .into_inner()
        .served_by
        .map(|served| served.ranking_profile)
        .unwrap_or_default();

    let mut dump = cli
        .dump_reads
        .as_ref()
        .map(|path| {
            std::fs::File::create(path)
                .map(std::io::BufWriter::new)
                .with_context(|| format!("creating {}", path.display()))
        })
        .transpose()?;
    let step = Instant::now();
    let mut results = Vec::new();
    for config in configurations(&default_profile, other_contexts) {
        // What an assistant reads is measured for the ways a client stores a dialog by default:
        // its turns imported as facts, and the conversation appended.
        let read = config.label.contains("(default)")
            && matches!(config.storage, Storage::Turns | Storage::Both);
        let mut asks = if cli.reads_only {
            Vec::new()
        } else {
            every_ask()
        };
        if read {
            asks.extend(assistant_asks());
        } else if cli.reads_only {
            continue;
        }
        let result = evaluate(&retrieval, &loaded, config, &asks, &mut dump).await?;
        let all = result.ranked.get("all").copied().unwrap_or_default();
        eprintln!(
            "dialogs: {:<48} recall@10 {} nDCG@10 {:.3}",
            result.config.label,
            pct(all.recall[1].value()),
            all.ndcg_10.value()
        );
        results.push(result);
    }
    if let Some(dump) = dump.as_mut() {
        dump.flush()?;
    }
    if cli.reads_only {
        let mut table = String::new();
        read_table(&mut table, &results);
        println!("{table}");
        return Ok(());
    }
    let searched = sweep(&retrieval, &loaded, service_ranking()?).await?;
    let timings = Timings {
        turns_import,
        turns_embedded,
        conversations_segmented,
        conversations_embedded,
        questions: step.elapsed().as_secs_f64(),
        total: started.elapsed().as_secs_f64(),
        idle_close_secs: settings.segmentation.idle_close_secs,
    };
    let text = report(
        &results,
        &searched,
        &loaded,
        &default_profile,
        &contexts,
        &cli.command_line,
        &timings,
    );
    write_report(&cli.report, &text)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn turn(speaker: usize, content: &str) -> Turn {
        Turn {
            id: String::new(),
            session: 0,
            speaker,
            content: content.into(),
            at: Utc::now(),
        }
    }

    #[test]
    fn an_evidence_turn_is_read_verbatim_or_in_its_words() {
        let turns = [
            turn(
                0,
                "Nate: I love coconut milk, but I also enjoy chocolate and mixed berry flavors.",
            ),
            turn(1, "Joanna: Wow, that sounds great!"),
            turn(0, "Nate: My dog Max is three years old."),
        ];
        let markdown = "## Episodic Memories\n\n### Desserts\n- user: \"Nate: I love COCONUT milk,  \
                        but I also enjoy chocolate and mixed-berry flavors\"\n\
                        - [fact] Max, my dog, is three years old";
        let evidence = |indexes: &[usize]| indexes.iter().copied().collect::<BTreeSet<usize>>();
        assert_eq!(read_shares(markdown, &turns, &evidence(&[0])), (1.0, 1.0));
        // Words present, not as said.
        assert_eq!(read_shares(markdown, &turns, &evidence(&[2])), (0.0, 1.0));
        assert_eq!(read_shares(markdown, &turns, &evidence(&[1])), (0.0, 0.0));
        assert_eq!(
            read_shares(markdown, &turns, &evidence(&[0, 1])),
            (0.5, 0.5)
        );
    }

    #[test]
    fn sentences_compare_without_case_spacing_or_closing_punctuation() {
        assert_eq!(
            normalise_sentence("  I'm going   Vegetarian!  "),
            "i'm going vegetarian"
        );
        assert_eq!(normalise_sentence("我要考研了。"), "我要考研了");
        assert_eq!(normalise_sentence("..."), "");
    }

    #[test]
    fn a_fact_covers_the_turns_of_its_speaker_that_hold_its_sentence() {
        let turns = vec![
            turn(
                0,
                "Clara: Also, while I have you: I'm going vegetarian! Not a January thing.",
            ),
            turn(1, "Jonas: You? I'm going vegetarian too."),
            turn(0, "Clara: Fine."),
        ];
        let normalised: Vec<String> = turns
            .iter()
            .map(|t| normalise_sentence(&t.content))
            .collect();
        let fact = v1::Memory {
            text: "I'm going vegetarian.".into(),
            role: v1::SpeakerRole::User.into(),
            ..Default::default()
        };
        assert_eq!(fact_turns(&fact, &turns, &normalised, &HashMap::new()), [0]);
        let unknown = v1::Memory {
            text: "The user likes tea.".into(),
            ..Default::default()
        };
        assert!(fact_turns(&unknown, &turns, &normalised, &HashMap::new()).is_empty());
    }

    #[test]
    fn a_facts_source_episodes_come_first() {
        let turns = vec![
            turn(0, "A: I know."),
            turn(1, "B: ok"),
            turn(0, "A: I know."),
        ];
        let normalised: Vec<String> = turns
            .iter()
            .map(|t| normalise_sentence(&t.content))
            .collect();
        let episodes = HashMap::from([("e2".to_owned(), 2..=2)]);
        let fact = v1::Memory {
            text: "A: I know.".into(),
            source_episode_ids: vec!["e2".into()],
            ..Default::default()
        };
        assert_eq!(fact_turns(&fact, &turns, &normalised, &episodes), [2]);
        let orphan = v1::Memory {
            text: "A: I know.".into(),
            ..Default::default()
        };
        assert_eq!(fact_turns(&orphan, &turns, &normalised, &episodes), [0, 2]);
    }

    #[test]
    fn recall_counts_evidence_covered_by_the_items_kept() {
        let hits = vec![
            Hit {
                id: "episode".into(),
                score: 1.0,
                cosine: 0.5,
                episode: true,
                details_shown: false,
            },
            Hit {
                id: "fact".into(),
                score: 0.5,
                cosine: 0.4,
                episode: false,
                details_shown: false,
            },
        ];
        let coverage = Coverage::from([
            ("episode".to_owned(), vec![1, 2, 3]),
            ("fact".to_owned(), vec![7]),
        ]);
        let evidence = BTreeSet::from([2, 7, 9]);
        let all = covered_share(&hits, &[&coverage], &evidence, |_| true);
        assert!((all - 2.0 / 3.0).abs() < 1e-9);
        let shown_only = covered_share(&hits, &[&coverage], &evidence, |hit| {
            !hit.episode || hit.details_shown
        });
        assert!((shown_only - 1.0 / 3.0).abs() < 1e-9);
    }
}
