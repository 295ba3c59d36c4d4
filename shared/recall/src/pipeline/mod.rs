//! One retrieval, from request to Markdown (the crate documentation lists the steps). Each stage
//! has its module: `search` (the legs, the fallbacks, the relevance floor), `rank` (fusion,
//! scores, MMR), `turn_lines` (the stored lines that answer, grouped by episode) and `render`
//! (the Markdown within the token budget); this one runs them and keeps track of what a
//! retrieval returned.

mod rank;
mod render;
mod search;
mod turn_lines;

use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use engram_core::capacity::Scores;
use engram_core::retrieval::budget;
use engram_core::retrieval::markdown::{self, Detail};
use engram_core::retrieval::ranking::{LegScale, TimeWindow};
use engram_core::retrieval::{LegHit, RankingParams, ScoreParts};
use engram_core::speaker::NamedSpeakers;
use engram_core::{Category, ConversationId, Scope};
use engram_store::memories::MemoryRecord;
use engram_store::retrieval::{self as store, ReadTrace, RetrievalMetrics};
use sqlx::PgPool;
use tracing::Instrument as _;
use uuid::Uuid;

use crate::read_traces::ReadTraces;
use crate::{QueryEmbedder, RecallError, RecallSettings};

/// What scores every candidate of a retrieval alike, whatever its section.
#[derive(Clone, Copy)]
struct RankingContext<'a> {
    /// Both sections' best leg scores.
    scale: &'a LegScale,
    params: &'a RankingParams,
    now: DateTime<Utc>,
    /// The days the query names.
    window: Option<&'a TimeWindow>,
    /// The speakers the query names.
    speakers: &'a NamedSpeakers,
    /// The request's conversation, whose entries are preferred.
    conversation: Option<Uuid>,
}

/// How long each stage of one retrieval took, logged at debug under the target
/// `engram_recall::stages` (each stage also opens a span of its own, `retrieval.*`, for a trace
/// exporter): where a slow retrieval spent its time, without a profiler.
#[derive(Debug, Default, Clone, Copy)]
struct StageTimes {
    /// Whether memory is on, and the space's size.
    context: Duration,
    /// The first legs, which run together: the entries' words (BM25; zero where the vector
    /// leg's statement searches them), the query's embedding and the stored turns' search, each
    /// from the start of the three to its own end.
    words: Duration,
    embed: Duration,
    turns: Duration,
    /// The entries' vector leg, which waits for the embedding (with their words in a space
    /// searched exactly), and the trigram fallback.
    vector: Duration,
    /// Fusion, loading what the legs did not, scores, MMR and the lines that answer.
    rank: Duration,
    /// The part of `rank` that loads what the legs did not.
    load: Duration,
    /// The Markdown within the token budget.
    render: Duration,
    /// The pending review, and handing the trace to its writer.
    record: Duration,
}

impl StageTimes {
    fn log(&self, total: Duration) {
        // Milliseconds to the microsecond: 95.161, not 95.16135200000001.
        let ms = |time: Duration| (time.as_secs_f64() * 1e6).round() / 1e3;
        tracing::debug!(
            target: "engram_recall::stages",
            total_ms = ms(total),
            context_ms = ms(self.context),
            words_ms = ms(self.words),
            embed_ms = ms(self.embed),
            turns_ms = ms(self.turns),
            vector_ms = ms(self.vector),
            rank_ms = ms(self.rank),
            load_ms = ms(self.load),
            render_ms = ms(self.render),
            record_ms = ms(self.record),
            "retrieval stages"
        );
    }
}

/// Awaits `work`, adding the time it took to `time`.
async fn timed<T>(time: &mut Duration, work: impl std::future::Future<Output = T>) -> T {
    let started = Instant::now();
    let value = work.await;
    *time += started.elapsed();
    value
}

pub const DEFAULT_EPISODIC_LIMIT: usize = 5;
pub const DEFAULT_SEMANTIC_LIMIT: usize = 20;

/// A validated retrieval request.
#[derive(Debug, Clone)]
pub struct RetrieveRequest {
    pub scope: Scope,
    pub conversation: Option<ConversationId>,
    pub query: String,
    /// 0 skips episodes (ContextPreRetrieve).
    pub episodic_limit: usize,
    pub semantic_limit: usize,
    pub detail: Detail,
    pub category: Option<Category>,
    pub token_budget: usize,
    pub ranking: RankingParams,
    /// Whether to run the vector leg (false: BM25 and its fallbacks only, for comparisons).
    pub dense: bool,
    /// Pending review, cached scores and metrics (RetrieveMemory); none for ContextPreRetrieve.
    pub side_effects: bool,
    /// Show the older facts each fact superseded.
    pub include_history: bool,
    /// Also search entries retention found inactive.
    pub include_inactive: bool,
}

/// An entry returned, with why it ranked where it did.
#[derive(Debug, Clone)]
pub struct RankedMemory {
    pub record: MemoryRecord,
    /// 1-based position within its section.
    pub rank: usize,
    pub scores: ScoreParts,
    /// Whether the ranking scored it: an episode shown only for its lines, which no leg found,
    /// was not (its scores are zeros, and no cached score is written for it).
    pub scored: bool,
    pub sparse: Option<LegHit>,
    pub dense: Option<LegHit>,
    /// Whether the Markdown shows the episode's conversation excerpt.
    pub details_shown: bool,
    /// The lines of the episode's excerpt (indexes into its messages) the Markdown shows.
    pub lines_shown: Vec<usize>,
    /// With `include_history`: the facts this one superseded, newest first.
    pub history: Vec<MemoryRecord>,
}

/// Which path served a retrieval.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ServedBy {
    /// `bm25+vector`, `bm25`, `trigram+vector`, `trigram`, `vector`, `none`,
    /// `memory_off` or `incognito`.
    pub path: String,
    /// Where the results came from: `space` (every search covers it), or `none` for an empty answer.
    pub searched: String,
    pub sparse_hits: usize,
    pub dense_hits: usize,
    pub trigram_hits: usize,
    pub used_fallback: bool,
    /// Why a fallback was used (the embedder failed, no word matched, ...).
    pub fallback_reason: Option<String>,
}

#[derive(Debug, Clone)]
pub struct Retrieval {
    pub markdown: String,
    pub semantic: Vec<RankedMemory>,
    pub episodic: Vec<RankedMemory>,
    pub served_by: ServedBy,
    pub tokens: usize,
    pub truncated: bool,
}

/// The retrieval pipeline.
#[derive(Debug, Clone)]
pub struct Recall {
    /// For what a retrieval writes: the pending reviews, and the traces' writer.
    pool: PgPool,
    /// For everything a retrieval reads: in the retrieval service, sessions that cannot write,
    /// beside `pool` and as large (`engram_store::read_only_pool_beside`), whose connections come
    /// back unchecked.
    reads: PgPool,
    embedder: Option<QueryEmbedder>,
    settings: RecallSettings,
    /// The configured ranking, checked once at construction.
    default_ranking: RankingParams,
    /// The embedder of the stored turn vectors (segmentation's), whose nearest turns to the
    /// query join the lines' search.
    turn_vectors: Option<TurnVectors>,
    /// Where retrievals leave what they returned, their scores and metrics, written in batches.
    traces: ReadTraces,
}

/// The embedder of the stored turn vectors.
#[derive(Clone)]
struct TurnVectors(std::sync::Arc<dyn engram_embed::Embedder>);

impl std::fmt::Debug for TurnVectors {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("TurnVectors")
            .field(&self.0.model_id())
            .finish()
    }
}

impl Recall {
    /// Fails when the configured ranking is out of bounds (a bad configuration stops start-up).
    /// Starts the task that writes retrievals' traces, on the current Tokio runtime.
    pub fn new(
        pool: PgPool,
        reads: PgPool,
        embedder: Option<QueryEmbedder>,
        settings: RecallSettings,
    ) -> Result<Self, engram_core::ValidationError> {
        let default_ranking = settings.default_ranking()?;
        let traces = ReadTraces::start(pool.clone(), settings.trace_flush_interval());
        Ok(Self {
            pool,
            reads,
            embedder,
            settings,
            default_ranking,
            turn_vectors: None,
            traces,
        })
    }

    /// Searches the stored turns by their vectors too, embedding the query with `turn_vectors`
    /// (the embedder whose vectors segmentation stores beside the turns).
    pub fn with_turn_vectors(
        mut self,
        turn_vectors: Option<std::sync::Arc<dyn engram_embed::Embedder>>,
    ) -> Self {
        self.turn_vectors = turn_vectors.map(TurnVectors);
        self
    }

    pub fn settings(&self) -> &RecallSettings {
        &self.settings
    }

    /// Writes what the retrievals so far left behind (cached scores, notes that entries were
    /// returned, metrics rows), which is otherwise written within `recall.trace_flush_ms`: for a
    /// graceful shutdown, and for a caller that reads them at once.
    pub async fn flush_traces(&self) {
        self.traces.flush().await;
    }

    /// A request with the configured defaults (five episodes, twenty facts, auto detail, the
    /// configured budget and ranking, both legs, side effects on); callers override what their
    /// request asks for.
    pub fn default_request(
        &self,
        scope: Scope,
        conversation: Option<ConversationId>,
        query: String,
    ) -> RetrieveRequest {
        RetrieveRequest {
            scope,
            conversation,
            query,
            episodic_limit: DEFAULT_EPISODIC_LIMIT,
            semantic_limit: DEFAULT_SEMANTIC_LIMIT,
            detail: Detail::Auto,
            category: None,
            token_budget: self.settings.token_budget as usize,
            ranking: self.default_ranking,
            dense: true,
            side_effects: true,
            include_history: false,
            include_inactive: false,
        }
    }

    /// Runs a retrieval. A request with side effects that fails still leaves a metrics row
    /// naming the stage that failed, so `make report` counts errors too.
    pub async fn retrieve(&self, request: &RetrieveRequest) -> Result<Retrieval, RecallError> {
        let started = Instant::now();
        let mut stage = "context";
        let result = self.retrieve_stages(request, started, &mut stage).await;
        record_path(&result);
        if let Err(error) = &result
            && request.side_effects
            && stage != "record"
        {
            tracing::debug!(%error, stage, "retrieval failed");
            let metrics = RetrievalMetrics {
                // Before the context is read, whether the conversation is incognito is unknown.
                query: if stage == "context" {
                    String::new()
                } else {
                    request.query.clone()
                },
                retrieval_path: "error".to_owned(),
                ranking_profile: request.ranking.profile.as_str().to_owned(),
                latency_retrieval_ms: elapsed_ms(started),
                error_stage: Some(stage.to_owned()),
                ..RetrievalMetrics::default()
            };
            self.traces
                .send(ReadTrace {
                    scope: request.scope.clone(),
                    retrieved_at: Utc::now(),
                    returned: Vec::new(),
                    scores: Vec::new(),
                    metrics: Some((None, metrics)),
                })
                .await;
        }
        result
    }

    /// The stages of one retrieval, in order; `stage` names the one running, for the metrics row
    /// of a failure.
    async fn retrieve_stages(
        &self,
        request: &RetrieveRequest,
        started: Instant,
        stage: &mut &'static str,
    ) -> Result<Retrieval, RecallError> {
        let now = Utc::now();
        let mut times = StageTimes::default();
        let context = timed(
            &mut times.context,
            store::context(&self.reads, &request.scope, request.conversation)
                .instrument(tracing::info_span!("retrieval.context")),
        )
        .await?;
        *stage = "sparse";
        if !context.memory_enabled || context.incognito {
            let path = if context.incognito {
                "incognito"
            } else {
                "memory_off"
            };
            // Memory off or incognito leaves no trace: no metrics row, no pending review, no
            // cached score in the database.
            return Ok(empty_retrieval(path));
        }
        let found = self
            .search(request, &context, stage, &mut times)
            .instrument(tracing::info_span!("retrieval.search"))
            .await?;
        let latency_embed_ms = found.latency_embed_ms;
        let served_by = found.served_by.clone();
        *stage = "load";
        let (semantic, episodic) = timed(
            &mut times.rank,
            self.rank(request, found, now, &mut times.load)
                .instrument(tracing::info_span!("retrieval.rank")),
        )
        .await?;
        let rendering = request.clone();
        let mut retrieval = timed(
            &mut times.render,
            cpu_bound(move || render::render(semantic, episodic, &rendering, served_by, now))
                .instrument(tracing::info_span!("retrieval.render")),
        )
        .await;
        timed(
            &mut times.record,
            self.keep_track(
                request,
                &mut retrieval,
                latency_embed_ms,
                started,
                now,
                stage,
            )
            .instrument(tracing::info_span!("retrieval.record")),
        )
        .await?;
        times.log(started.elapsed());
        Ok(retrieval)
    }

    /// What a retrieval leaves behind. With side effects, the review of its episodes is left
    /// pending for the conversation before the response returns; the rest goes to the trace
    /// writer: the note that its entries were returned (retention's inactivity rule leaves
    /// entries in use alone) and, with side effects, the scores to cache (the writer keeps those
    /// due; the response shows them) and its metrics row.
    async fn keep_track(
        &self,
        request: &RetrieveRequest,
        retrieval: &mut Retrieval,
        latency_embed_ms: Option<f32>,
        started: Instant,
        now: DateTime<Utc>,
        stage: &mut &'static str,
    ) -> Result<(), RecallError> {
        let returned: Vec<Uuid> = retrieval
            .semantic
            .iter()
            .chain(&retrieval.episodic)
            .map(|m| m.record.id)
            .collect();
        let mut trace = ReadTrace {
            scope: request.scope.clone(),
            retrieved_at: now,
            returned,
            scores: Vec::new(),
            metrics: None,
        };
        if request.side_effects {
            *stage = "record";
            self.record_pending_review(request, retrieval, now).await?;
            trace.scores = scores_to_cache(retrieval, now);
            trace.metrics = Some((
                request.conversation.map(|c| c.as_uuid()),
                metrics_row(request, retrieval, latency_embed_ms, started),
            ));
        }
        if !trace.returned.is_empty() || trace.metrics.is_some() {
            self.traces.send(trace).await;
        }
        Ok(())
    }

    async fn attach_history(
        &self,
        scope: &Scope,
        facts: &mut [RankedMemory],
    ) -> Result<(), RecallError> {
        let ids: Vec<Uuid> = facts.iter().map(|m| m.record.id).collect();
        for earlier in store::superseded_by(&self.reads, scope, &ids).await? {
            if let Some(fact) = facts
                .iter_mut()
                .find(|m| Some(m.record.id) == earlier.superseded_by)
            {
                fact.history.push(earlier);
            }
        }
        Ok(())
    }

    /// The review of the episodes returned, pending for the conversation asked from. An inactive
    /// episode shown because the request asked for inactive entries is not put up for review:
    /// browsing them is not using them, and a review would make it active again.
    async fn record_pending_review(
        &self,
        request: &RetrieveRequest,
        retrieval: &Retrieval,
        now: DateTime<Utc>,
    ) -> Result<(), RecallError> {
        let Some(conversation) = request.conversation else {
            return Ok(());
        };
        let reviewed: Vec<Uuid> = retrieval
            .episodic
            .iter()
            .filter(|m| m.record.inactive_since.is_none())
            .map(|m| m.record.id)
            .collect();
        store::record_pending_review(
            &self.pool,
            &request.scope,
            conversation.as_uuid(),
            &request.query,
            &reviewed,
            now,
        )
        .await?;
        Ok(())
    }
}

/// The scores of the returned entries the ranking scored, to cache: the trace writer keeps
/// those that replace missing, stale or lower cached ones (the request never reads the cache).
/// The response shows them as those entries' cached scores: the rows were loaded with their
/// writer's scores, which a reader of the response would take for stale ones. An episode shown
/// only for its lines was never scored (no leg found it): no cached score (a zero would make it
/// retention's first candidate).
fn scores_to_cache(retrieval: &mut Retrieval, now: DateTime<Utc>) -> Vec<(Uuid, Scores)> {
    retrieval
        .semantic
        .iter_mut()
        .chain(retrieval.episodic.iter_mut())
        .filter(|m| m.scored)
        .map(|m| {
            let scores = m.scores.cached(now);
            m.record.last_scores = serde_json::to_value(scores).ok();
            (m.record.id, scores)
        })
        .collect()
}

fn metrics_row(
    request: &RetrieveRequest,
    retrieval: &Retrieval,
    latency_embed_ms: Option<f32>,
    started: Instant,
) -> RetrievalMetrics {
    let served_by = &retrieval.served_by;
    RetrievalMetrics {
        query: request.query.clone(),
        sparse_hits: served_by.sparse_hits as i32,
        dense_hits: served_by.dense_hits as i32,
        trigram_hits: served_by.trigram_hits as i32,
        used_fallback: served_by.used_fallback,
        retrieval_path: served_by.path.clone(),
        ranking_profile: request.ranking.profile.as_str().to_owned(),
        // Searches no longer start in the conversation and widen.
        scope_widened: false,
        context_items: (retrieval.semantic.len() + retrieval.episodic.len()) as i32,
        estimated_tokens: retrieval.tokens as i32,
        truncated: retrieval.truncated,
        latency_embed_ms,
        latency_retrieval_ms: elapsed_ms(started),
        error_stage: None,
    }
}

/// Retrievals by the path that served them (`bm25+vector`, `bm25`, `trigram`,
/// `none`, `memory_off`, `incognito`, `error`) and whether a fallback answered
/// (`engram.retrieval.requests`).
fn record_path(result: &Result<Retrieval, RecallError>) {
    static REQUESTS: std::sync::OnceLock<opentelemetry::metrics::Counter<u64>> =
        std::sync::OnceLock::new();
    let requests = REQUESTS.get_or_init(|| {
        opentelemetry::global::meter("engram-recall")
            .u64_counter("engram.retrieval.requests")
            .with_description(
                "retrievals by the path that served them and whether a fallback answered",
            )
            .build()
    });
    let (path, fallback) = match result {
        Ok(retrieval) => (
            retrieval.served_by.path.clone(),
            retrieval.served_by.used_fallback,
        ),
        Err(_) => ("error".to_owned(), false),
    };
    requests.add(
        1,
        &[
            opentelemetry::KeyValue::new("path", path),
            opentelemetry::KeyValue::new("fallback", fallback),
        ],
    );
}

fn elapsed_ms(since: Instant) -> f32 {
    duration_ms(since.elapsed())
}

/// A duration in milliseconds, as `retrieval_metrics` keeps latencies.
fn duration_ms(time: Duration) -> f32 {
    time.as_secs_f32() * 1000.0
}

fn empty_retrieval(path: &str) -> Retrieval {
    let markdown = markdown::assemble(&[], &[]);
    Retrieval {
        tokens: budget::count_tokens(&markdown),
        markdown,
        semantic: Vec::new(),
        episodic: Vec::new(),
        served_by: ServedBy {
            path: path.to_owned(),
            searched: "none".to_owned(),
            ..ServedBy::default()
        },
        truncated: false,
    }
}

/// Runs CPU-bound work (ranking, rendering, token counting) on a blocking thread, so that a
/// request over many long texts does not hold up the async runtime and every request beside it
/// (issue 37: one retrieval over 200 long facts stalled the service for 20 s).
pub async fn cpu_bound<T: Send + 'static>(work: impl FnOnce() -> T + Send + 'static) -> T {
    match tokio::task::spawn_blocking(work).await {
        Ok(value) => value,
        Err(error) => std::panic::resume_unwind(error.into_panic()),
    }
}

/// Text work over this many bytes (cleaning, token counting) goes to a blocking thread; up to it,
/// it costs the runtime well under a millisecond, less than the hand-off would.
pub(crate) const INLINE_TEXT_BYTES: usize = 8 * 1024;

/// Runs work over `text_bytes` bytes of text where [`INLINE_TEXT_BYTES`] says it belongs.
pub async fn cpu_bound_over<T: Send + 'static>(
    text_bytes: usize,
    work: impl FnOnce() -> T + Send + 'static,
) -> T {
    if text_bytes <= INLINE_TEXT_BYTES {
        work()
    } else {
        cpu_bound(work).await
    }
}
