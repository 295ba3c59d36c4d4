//! One retrieval, from request to Markdown (see the crate documentation for the steps).

use std::collections::HashMap;
use std::time::Instant;

use chrono::{DateTime, Utc};
use engram_core::retrieval::budget::{self, EpisodePart};
use engram_core::retrieval::lines;
use engram_core::retrieval::markdown::{self, Detail, Earlier, EpisodeView, Provenance, Turn};
use engram_core::retrieval::mmr::{self, MmrItem};
use engram_core::retrieval::ranking::{
    CandidateFacts, LegEvidence, LegScale, TimeWindow, is_question, relevance, score,
};
use engram_core::retrieval::{Fused, LegHit, RankingParams, ScoreParts, fuse};
use engram_core::speaker::NamedSpeakers;
use engram_core::{Category, ConversationId, MemoryKind, Scope};
use engram_store::memories::MemoryRecord;
use engram_store::retrieval::{
    self as store, Bm25, DenseMethod, Hit, LoadedCandidate, RetrievalMetrics, RetrievalRecord,
    SearchFilter,
};
use engram_store::turn_search::{self, StoredTurn, TurnHit};
use sqlx::PgPool;
use uuid::Uuid;

use crate::{QueryEmbedder, RecallError, RecallSettings};

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
    /// Pending review, last scores and metrics (RetrieveMemory); none for ContextPreRetrieve.
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
    pool: PgPool,
    embedder: Option<QueryEmbedder>,
    settings: RecallSettings,
    /// The configured ranking, checked once at construction.
    default_ranking: RankingParams,
    /// The embedder of the stored turn vectors (segmentation's), whose nearest turns to the
    /// query join the lines' search.
    turn_vectors: Option<TurnVectors>,
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

/// Candidates of one kind from both legs.
#[derive(Debug, Default)]
struct Legs {
    sparse: Vec<Hit>,
    dense: Vec<Hit>,
}

impl Recall {
    /// Fails when the configured ranking is out of bounds (a bad configuration stops start-up).
    pub fn new(
        pool: PgPool,
        embedder: Option<QueryEmbedder>,
        settings: RecallSettings,
    ) -> Result<Self, engram_core::ValidationError> {
        let default_ranking = settings.default_ranking()?;
        Ok(Self {
            pool,
            embedder,
            settings,
            default_ranking,
            turn_vectors: None,
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
            let record = RetrievalRecord {
                conversation: None,
                reviewed_memory_ids: Vec::new(),
                scores: Vec::new(),
                metrics,
            };
            if let Err(record_error) =
                store::record(&self.pool, &request.scope, &record, Utc::now()).await
            {
                tracing::warn!(error = %record_error, failed = %error, stage, "could not record the failed retrieval's metrics");
            }
        }
        result
    }

    async fn retrieve_stages(
        &self,
        request: &RetrieveRequest,
        started: Instant,
        stage: &mut &'static str,
    ) -> Result<Retrieval, RecallError> {
        let now = Utc::now();
        let context = store::context(&self.pool, &request.scope, request.conversation).await?;
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

        let kinds: &[MemoryKind] = if request.episodic_limit > 0 {
            &[MemoryKind::Semantic, MemoryKind::Episodic]
        } else {
            &[MemoryKind::Semantic]
        };
        let category = request.category.map(Category::as_str);
        // Each leg brings at least as many candidates as a section may return.
        let limit = i64::from(request.ranking.candidates_per_leg)
            .max(request.semantic_limit as i64)
            .max(request.episodic_limit as i64);
        let bm25 = Bm25 {
            k1: self.settings.bm25_k1,
            b: self.settings.bm25_b,
        };

        // The query embedding is computed while the sparse leg searches.
        let embedding_started = Instant::now();
        let embedding = async {
            match &self.embedder {
                Some(embedder) if request.dense => Some(embedder.embed(&request.query).await),
                _ => None,
            }
        };
        // The whole space, always: the entries of the request's conversation are preferred in
        // the ranking (`REQUEST_CONVERSATION_BOOST`), never the only ones searched (an episode of
        // another session may hold the answer).
        let filters: Vec<SearchFilter<'_>> = kinds
            .iter()
            .map(|kind| SearchFilter {
                scope: &request.scope,
                kind: *kind,
                conversation: None,
                category: if *kind == MemoryKind::Semantic {
                    category
                } else {
                    None
                },
                include_inactive: request.include_inactive,
            })
            .collect();
        let sparse = async {
            let searches = filters.iter().map(|filter| {
                store::sparse_search(&self.pool, filter, &request.query, bm25, limit)
            });
            futures::future::try_join_all(searches).await
        };
        // The stored turns that share words with the query, whose lines the Markdown shows.
        let search_lines = request.episodic_limit > 0 && request.detail != Detail::None;
        let turn_hits = async {
            if search_lines {
                turn_search::search_turns(
                    &self.pool,
                    &request.scope,
                    &request.query,
                    bm25,
                    TURN_CANDIDATES,
                )
                .await
            } else {
                Ok(Vec::new())
            }
        };
        // The query among the turn vectors: a static-token-vector mean, no model pass per turn.
        let turn_vector = async {
            let TurnVectors(embedder) = self
                .turn_vectors
                .as_ref()
                .filter(|_| search_lines && request.dense)?;
            let texts = [request.query.clone()];
            // Bounded: with an embedding endpoint this is a network call, and lines are found by
            // their words without it.
            match tokio::time::timeout(TURN_VECTOR_TIMEOUT, embedder.embed(&texts)).await {
                Ok(Ok(mut vectors)) => vectors
                    .pop()
                    .map(|vector| (embedder.model_id().to_owned(), vector)),
                Ok(Err(error)) => {
                    tracing::warn!(%error, "no turn vector for the query; lines found by their words");
                    None
                }
                Err(_) => {
                    tracing::warn!(
                        "no turn vector for the query in time; lines found by their words"
                    );
                    None
                }
            }
        };
        let (sparse, embedding, turn_hits, turn_vector) =
            tokio::join!(sparse, embedding, turn_hits, turn_vector);
        let sparse = sparse?;
        let turn_hits = turn_hits?;
        let latency_embed_ms = embedding.as_ref().map(|_| elapsed_ms(embedding_started));

        let mut fallback_reasons: Vec<String> = Vec::new();
        let query_embedding: Option<std::sync::Arc<Vec<f32>>> = match embedding {
            Some(Ok(embedding)) => Some(embedding),
            Some(Err(reason)) => {
                // The reason may carry an endpoint's error text: logged, not returned.
                tracing::warn!(reason = %reason, "no query embedding; serving sparse results only");
                fallback_reasons.push("embedder unavailable".to_owned());
                None
            }
            None if request.dense => {
                fallback_reasons.push("no embedder configured".to_owned());
                None
            }
            None => None,
        };

        // Dense leg: exact for small spaces, HNSW for large spaces.
        let method = if context.memory_count <= self.settings.exact_search_max_entries {
            DenseMethod::Exact
        } else {
            DenseMethod::Approximate {
                ef_search: self
                    .settings
                    .hnsw_ef_search
                    .max(request.ranking.candidates_per_leg),
            }
        };
        *stage = "vector";
        let mut dense: Vec<Vec<Hit>> = vec![Vec::new(); kinds.len()];
        let dense_search = async {
            match &query_embedding {
                Some(embedding) => {
                    let searches = filters.iter().map(|filter| {
                        store::dense_search(&self.pool, filter, embedding, method, limit)
                    });
                    Some(futures::future::try_join_all(searches).await)
                }
                None => None,
            }
        };
        // The turns nearest the query by their vectors, while the vector leg searches.
        let nearest_turns = async {
            match &turn_vector {
                Some((model, vector)) => turn_search::nearest_turns(
                    &self.pool,
                    &request.scope,
                    model,
                    vector,
                    TURN_CANDIDATES,
                )
                .await
                .unwrap_or_else(|error| {
                    tracing::warn!(%error, "turn vector search failed; lines found by their words");
                    Vec::new()
                }),
                None => Vec::new(),
            }
        };
        let (found, mut turn_nearest) = tokio::join!(dense_search, nearest_turns);
        // Lines are found by their words: the turn vectors only add turns beside word matches
        // (without a floor of their own, a query nothing matches would get the nearest lines).
        if turn_hits.is_empty() {
            turn_nearest.clear();
        }
        // The lines found by either leg, each with its neighbours.
        let mut hit_turns: Vec<_> = turn_hits.iter().map(|hit| hit.turn).collect();
        hit_turns.extend(turn_nearest.iter().map(|hit| hit.turn));
        let stored_turns = turn_search::turns_around(
            &self.pool,
            &request.scope,
            &hit_turns,
            1,
            request.include_inactive,
        )
        .await?;
        match found {
            Some(Ok(found)) => dense = found,
            Some(Err(error)) => {
                tracing::warn!(error = %error, "vector search failed; serving sparse results only");
                fallback_reasons.push("vector search failed".to_owned());
            }
            None => {}
        }

        let sparse_hits: usize = sparse.iter().map(Vec::len).sum();
        let mut legs: Vec<Legs> = sparse
            .into_iter()
            .zip(dense)
            .map(|(sparse, dense)| Legs { sparse, dense })
            .collect();
        let mut trigram_hits = 0;
        // Words that matched a stored turn count as matched: its lines answer, and the fallbacks
        // would only pad them with entries that share nothing with the query.
        let turns_matched = !stored_turns.is_empty();
        if sparse_hits == 0 && !turns_matched {
            *stage = "trigram";
            fallback_reasons.push("no word of the query matched".to_owned());
            for (legs, filter) in legs.iter_mut().zip(&filters) {
                legs.sparse = store::trigram_search(
                    &self.pool,
                    filter,
                    &request.query,
                    self.settings.trigram_threshold,
                    limit,
                )
                .await?;
                trigram_hits += legs.sparse.len();
            }
        }
        // The relevance floor: what only the vector leg found, below the floor, is left out.
        let floor = request.ranking.min_similarity;
        let mut below_floor = 0;
        if floor > 0.0 {
            for legs in &mut legs {
                let matched: std::collections::HashSet<Uuid> =
                    legs.sparse.iter().map(|(id, _)| *id).collect();
                let found = legs.dense.len();
                legs.dense
                    .retain(|(id, cosine)| *cosine >= floor || matched.contains(id));
                below_floor += found - legs.dense.len();
            }
        }
        let dense_hits: usize = legs.iter().map(|l| l.dense.len()).sum();
        // Nothing found answers nothing: entries that share nothing with the query (the most
        // recent, say) would only fill the assistant's budget with noise (issue 38).
        let nothing_left = !turns_matched
            && legs
                .iter()
                .all(|l| l.sparse.is_empty() && l.dense.is_empty());
        if nothing_left && below_floor > 0 {
            fallback_reasons.push("nothing above the relevance floor".to_owned());
        } else if nothing_left {
            fallback_reasons.push("nothing matched the query".to_owned());
        }

        let path = if nothing_left {
            "none".to_owned()
        } else {
            let sparse_leg = if trigram_hits > 0 {
                Some("trigram")
            } else if sparse_hits > 0 || turns_matched {
                Some("bm25")
            } else {
                None
            };
            match (sparse_leg, dense_hits > 0) {
                (Some(leg), true) => format!("{leg}+vector"),
                (Some(leg), false) => leg.to_owned(),
                (None, _) => "vector".to_owned(),
            }
        };
        let served_by = ServedBy {
            path,
            searched: "space".to_owned(),
            sparse_hits,
            dense_hits,
            trigram_hits,
            used_fallback: !fallback_reasons.is_empty(),
            fallback_reason: (!fallback_reasons.is_empty()).then(|| fallback_reasons.join("; ")),
        };

        // Fuse each kind, load every candidate once, rank.
        let fused: Vec<Vec<Fused>> = legs
            .iter()
            .map(|l| fuse(&l.sparse, &l.dense, request.ranking.rrf_k))
            .collect();
        *stage = "load";
        let ids: Vec<Uuid> = fused.iter().flatten().map(|f| f.id).collect();
        let loaded = store::load_candidates(&self.pool, &request.scope, &ids).await?;
        let ranking = SectionsToRank {
            fused,
            loaded,
            query_embedding,
            kinds,
            turn_hits,
            turn_nearest,
            stored_turns,
            request: request.clone(),
            now,
        };
        let Ranked {
            mut sections,
            line_groups,
            mut episode_candidates,
        } = cpu_bound(move || ranking.rank()).await;
        let ranked_episodes = if sections.len() > 1 {
            sections.pop().unwrap_or_default()
        } else {
            Vec::new()
        };
        let mut semantic = sections.pop().unwrap_or_default();
        if request.include_history {
            self.attach_history(&request.scope, &mut semantic).await?;
        }
        // An episode whose lines answer but that no leg found is loaded for its heading.
        let unloaded: Vec<Uuid> = line_groups
            .iter()
            .filter_map(|group| group.episode)
            .filter(|id| !episode_candidates.contains_key(id))
            .collect();
        for candidate in store::load_candidates(&self.pool, &request.scope, &unloaded).await? {
            episode_candidates.insert(
                candidate.record.id,
                (ScoreParts::default(), candidate.record),
            );
        }
        let episodic = episodes_to_show(ranked_episodes, line_groups, episode_candidates);

        let rendering = request.clone();
        let retrieval =
            cpu_bound(move || render(semantic, episodic, &rendering, served_by, now)).await;
        // What a retrieval returns is in use: retention's inactivity rule leaves it alone. Its
        // own statement, never waiting on a lock (see `note_returned`), so it cannot deadlock
        // with the recording statement.
        let returned: Vec<Uuid> = retrieval
            .semantic
            .iter()
            .chain(&retrieval.episodic)
            .map(|m| m.record.id)
            .collect();
        let note =
            engram_store::retention::note_returned(&self.pool, &request.scope, &returned, now);
        if request.side_effects {
            let metrics = RetrievalMetrics {
                query: request.query.clone(),
                sparse_hits: retrieval.served_by.sparse_hits as i32,
                dense_hits: retrieval.served_by.dense_hits as i32,
                trigram_hits: retrieval.served_by.trigram_hits as i32,
                used_fallback: retrieval.served_by.used_fallback,
                retrieval_path: retrieval.served_by.path.clone(),
                ranking_profile: request.ranking.profile.as_str().to_owned(),
                // Searches no longer start in the conversation and widen.
                scope_widened: false,
                context_items: (retrieval.semantic.len() + retrieval.episodic.len()) as i32,
                estimated_tokens: retrieval.tokens as i32,
                truncated: retrieval.truncated,
                latency_embed_ms,
                latency_retrieval_ms: elapsed_ms(started),
                error_stage: None,
            };
            // An inactive episode shown because the request asked for inactive entries is not
            // put up for review: browsing them is not using them, and a review would make it
            // active again.
            let reviewed: Vec<Uuid> = retrieval
                .episodic
                .iter()
                .filter(|m| m.record.inactive_since.is_none())
                .map(|m| m.record.id)
                .collect();
            *stage = "record";
            self.record(request, &retrieval, metrics, reviewed, now)
                .await?;
            // After the record committed, not beside it: its score updates lock the same
            // retention rows (through a trigger), and the note would skip them.
            log_failed_note(note.await);
        } else {
            log_failed_note(note.await);
        }
        Ok(retrieval)
    }

    /// Attaches to each fact the older facts it superseded (one level: what it replaced).
    async fn attach_history(
        &self,
        scope: &Scope,
        facts: &mut [RankedMemory],
    ) -> Result<(), RecallError> {
        let ids: Vec<Uuid> = facts.iter().map(|m| m.record.id).collect();
        for earlier in store::superseded_by(&self.pool, scope, &ids).await? {
            if let Some(fact) = facts
                .iter_mut()
                .find(|m| Some(m.record.id) == earlier.superseded_by)
            {
                fact.history.push(earlier);
            }
        }
        Ok(())
    }

    async fn record(
        &self,
        request: &RetrieveRequest,
        retrieval: &Retrieval,
        metrics: RetrievalMetrics,
        reviewed_memory_ids: Vec<Uuid>,
        now: DateTime<Utc>,
    ) -> Result<(), RecallError> {
        // An episode shown only for its lines was never scored (no leg found it): no cached score
        // (a zero would make it retention's first candidate).
        let scores = retrieval
            .semantic
            .iter()
            .chain(&retrieval.episodic)
            .filter(|m| m.scores != ScoreParts::default())
            .map(|m| {
                let cached = m.scores.cached(now);
                let value = serde_json::to_value(cached).unwrap_or(serde_json::Value::Null);
                (m.record.id, value)
            })
            .collect();
        let record = RetrievalRecord {
            conversation: request.conversation.map(|c| c.as_uuid()),
            reviewed_memory_ids,
            scores,
            metrics,
        };
        store::record(&self.pool, &request.scope, &record, now).await?;
        Ok(())
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
    since.elapsed().as_secs_f32() * 1000.0
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

/// Everything the ranking of a retrieval's sections needs, owned, to run off the runtime.
struct SectionsToRank {
    fused: Vec<Vec<Fused>>,
    loaded: Vec<LoadedCandidate>,
    query_embedding: Option<std::sync::Arc<Vec<f32>>>,
    /// The kind of each section, in the order of `fused`.
    kinds: &'static [MemoryKind],
    /// The stored turns the sparse leg found (BM25 scores), those nearest the query by their
    /// vectors (cosines), and those turns with their neighbours.
    turn_hits: Vec<TurnHit>,
    turn_nearest: Vec<TurnHit>,
    stored_turns: Vec<StoredTurn>,
    request: RetrieveRequest,
    now: DateTime<Utc>,
}

/// What the ranking decided.
struct Ranked {
    /// The facts, then the episodes when they were asked for.
    sections: Vec<Vec<RankedMemory>>,
    /// The lines that answer, by episode, best first.
    line_groups: Vec<LineGroup>,
    /// The score and record of each episode candidate that holds a shown line.
    episode_candidates: HashMap<Uuid, (ScoreParts, MemoryRecord)>,
}

impl SectionsToRank {
    fn rank(self) -> Ranked {
        let Self {
            fused,
            loaded,
            query_embedding,
            kinds,
            turn_hits,
            turn_nearest,
            stored_turns,
            request,
            now,
        } = self;
        let mut loaded: HashMap<Uuid, LoadedCandidate> =
            loaded.into_iter().map(|c| (c.record.id, c)).collect();
        // The days the query names, if any ("what did I decide in March?").
        let window = engram_core::when::query_window(&request.query, now)
            .map(|(first, last)| TimeWindow::of_days(first, last));
        // Both sections are weighed on one scale, so that a fact and an episode with the same
        // relevance score alike and an answer interleaving them (Markdown, a merged list) puts
        // the better match first whichever section it is in.
        let query_embedding = query_embedding.as_deref().map(Vec::as_slice);
        let evidence: Vec<Vec<Evidenced>> = fused
            .into_iter()
            .map(|fused| weigh_legs(fused, &mut loaded, query_embedding))
            .collect();
        let scale = LegScale::of(evidence.iter().flatten().map(|(_, _, legs)| legs));
        // The speakers the query names, among those whose lines are candidates ("What breed is
        // Jonas's dog?"): the other speakers' lines count less.
        let speakers = NamedSpeakers::in_query(
            &request.query,
            evidence
                .iter()
                .flatten()
                .filter(|(_, candidate, _)| candidate.record.memory_kind() == MemoryKind::Semantic)
                .map(|(_, candidate, _)| candidate.record.text.as_str()),
        );
        let context = RankingContext {
            scale: &scale,
            params: &request.ranking,
            now,
            window: window.as_ref(),
            speakers: &speakers,
            conversation: request.conversation.map(|c| c.as_uuid()),
        };
        let mut sections = Vec::with_capacity(kinds.len());
        let mut line_groups = Vec::new();
        let mut episode_candidates = HashMap::new();
        for (candidates, kind) in evidence.into_iter().zip(kinds) {
            let scored = score_section(candidates, &context);
            if *kind == MemoryKind::Semantic {
                sections.push(select(
                    scored,
                    request.semantic_limit,
                    request.ranking.mmr_lambda,
                ));
                continue;
            }
            let episode_scores: HashMap<Uuid, ScoreParts> = scored
                .iter()
                .map(|(_, parts, candidate)| (candidate.record.id, *parts))
                .collect();
            line_groups = answering_lines(
                &request.query,
                &turn_hits,
                &turn_nearest,
                &stored_turns,
                &episode_scores,
                &context,
            );
            // The records of the episodes whose lines are shown, kept before MMR drops the rest.
            let holding_lines: std::collections::HashSet<Uuid> = line_groups
                .iter()
                .filter_map(|group| group.episode)
                .collect();
            episode_candidates = scored
                .iter()
                .filter(|(_, _, candidate)| holding_lines.contains(&candidate.record.id))
                .map(|(_, parts, candidate)| {
                    (candidate.record.id, (*parts, candidate.record.clone()))
                })
                .collect();
            sections.push(select(
                scored,
                request.episodic_limit,
                request.ranking.mmr_lambda,
            ));
        }
        Ranked {
            sections,
            line_groups,
            episode_candidates,
        }
    }
}

/// A fused candidate, loaded, with what each leg says of it.
type Evidenced = (Fused, LoadedCandidate, LegEvidence);

/// Loads each fused candidate of one kind and takes both legs' evidence for it: a candidate only
/// the sparse leg found gets its cosine from its stored embedding and `query_embedding`, so that
/// triscore's relevance weighs both legs for every candidate. An id the legs found but that is
/// gone now (forgotten meanwhile) is skipped.
fn weigh_legs(
    fused: Vec<Fused>,
    loaded: &mut HashMap<Uuid, LoadedCandidate>,
    query_embedding: Option<&[f32]>,
) -> Vec<Evidenced> {
    fused
        .into_iter()
        .filter_map(|f| {
            let candidate = loaded.remove(&f.id)?;
            let cosine = f.dense.map(|hit| hit.score).or_else(|| {
                let stored = candidate.embedding.as_ref()?.as_slice();
                let query = query_embedding?;
                (stored.len() == query.len())
                    .then(|| f64::from(engram_embed::cosine(stored, query)))
            });
            let evidence = LegEvidence {
                sparse: f.sparse.map(|hit| hit.score),
                cosine,
            };
            Some((f, candidate, evidence))
        })
        .collect()
}

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

/// A candidate with its score.
type Scored = (Fused, ScoreParts, LoadedCandidate);

/// Scores the candidates of one kind on the context's scale, best first.
fn score_section(candidates: Vec<Evidenced>, context: &RankingContext<'_>) -> Vec<Scored> {
    let RankingContext {
        scale,
        params,
        now,
        window,
        speakers,
        conversation,
    } = *context;
    let mut scored: Vec<(Fused, ScoreParts, LoadedCandidate)> = candidates
        .into_iter()
        .map(|(f, candidate, evidence)| {
            let record = &candidate.record;
            let fsrs = match (record.stability, record.difficulty, record.last_reviewed_at) {
                (Some(s), Some(d), Some(at)) if record.memory_kind() == MemoryKind::Episodic => {
                    Some((s, d, at))
                }
                _ => None,
            };
            // An episode took place over its turns; a fact when it became valid (consolidated
            // facts carry their episode's time); a turn or memory when it was said.
            let took_place = match (record.start_at, record.end_at) {
                (Some(start), Some(end)) => (start, end),
                _ => {
                    let at = record.valid_at.unwrap_or(record.created_at);
                    (at, at)
                }
            };
            let facts = CandidateFacts {
                created_at: record.created_at,
                took_place,
                importance: record.importance,
                fsrs,
                // An episode's summary may end on a question it quotes; it still stands for the
                // whole segment, answers included.
                is_question: record.memory_kind() == MemoryKind::Semantic
                    && is_question(&record.text),
                // An episode holds every speaker's lines.
                spoken_by_another: record.memory_kind() == MemoryKind::Semantic
                    && speakers.spoken_by_another(&record.text),
                from_request_conversation: conversation.is_some()
                    && record.conversation_id == conversation,
            };
            let relevance = relevance(&evidence, scale, params.sparse_weight);
            let parts = score(f.rrf, relevance, &facts, params, now, window);
            (f, parts, candidate)
        })
        .collect();
    scored.sort_by(|a, b| b.1.total.total_cmp(&a.1.total).then(a.0.id.cmp(&b.0.id)));
    scored
}

/// Lets MMR pick `limit` of the scored candidates (best first), in order.
fn select(mut scored: Vec<Scored>, limit: usize, mmr_lambda: f64) -> Vec<RankedMemory> {
    if limit == 0 {
        return Vec::new();
    }
    // MMR only needs to look a little past the limit: entries far down cannot climb above the
    // diverse picks.
    scored.truncate(limit.saturating_mul(4).max(limit));
    let best_total = scored.first().map(|s| s.1.total).unwrap_or(0.0);
    let items: Vec<MmrItem<'_>> = scored
        .iter()
        .map(|s| MmrItem {
            value: if best_total > 0.0 {
                s.1.total / best_total
            } else {
                0.0
            },
            embedding: s.2.embedding.as_ref().map(|v| v.as_slice()),
            tags: &s.2.record.tags,
        })
        .collect();
    let order = mmr::select(&items, mmr_lambda, limit);
    drop(items);
    let mut slots: Vec<Option<Scored>> = scored.into_iter().map(Some).collect();
    order
        .into_iter()
        .enumerate()
        .filter_map(|(position, index)| {
            let (fused, scores, candidate) = slots[index].take()?;
            Some(RankedMemory {
                record: candidate.record,
                rank: position + 1,
                scores,
                sparse: fused.sparse,
                dense: fused.dense,
                details_shown: false,
                lines_shown: Vec::new(),
                history: Vec::new(),
            })
        })
        .collect()
}

fn turns_of(record: &MemoryRecord) -> Vec<Turn> {
    record
        .messages
        .as_ref()
        .and_then(|messages| messages.as_array())
        .map(|messages| {
            messages
                .iter()
                .filter_map(|message| {
                    Some(Turn {
                        role: message.get("role")?.as_str()?.to_owned(),
                        content: message.get("content")?.as_str()?.to_owned(),
                    })
                })
                .collect()
        })
        .unwrap_or_default()
}

/// What the fact line may truthfully say of an entry: the conversation it came from, the other
/// references the client gave, whether the user saved or pinned it.
fn provenance(record: &MemoryRecord) -> Provenance {
    Provenance {
        conversations: usize::from(record.conversation_id.is_some()),
        references: record.source_ids.len(),
        saved_by_user: record.manually_saved,
        pinned: record.pinned,
        said_at: Some(record.valid_at.unwrap_or(record.created_at)),
    }
}

// The defaults of the lines' search, each chosen on the dialogs by what an assistant reads
// (`make eval-reads`; docs/eval/README.md says how).
/// The longest wait for the query's turn vector (microseconds with the local token vectors; a
/// network call with an embedding endpoint).
const TURN_VECTOR_TIMEOUT: std::time::Duration = std::time::Duration::from_millis(250);
/// Turns each turn leg brings for the lines (each is loaded with its neighbours).
const TURN_CANDIDATES: i64 = 60;
/// Lines chosen for what they say, at most, over all episodes (each may bring a neighbour): 40
/// over 30 and 20 (the budget, not this, then decides how many an assistant reads).
const LINES_PER_RETRIEVAL: usize = 40;
/// The share of a line's evidence that is its episode's ranking score (relative to the best
/// episode's): a line of an episode that ranks well on its whole says more. 0.5 over 1.
const EPISODE_SHARE: f64 = 0.5;
/// BM25's weight against the turn vectors' in a line's relevance (the rest is the cosine's).
/// The static token vectors are coarser than the model's sentence embeddings the facts'
/// `sparse_weight` (0.3) weighs: 0.85 over 0.7, 0.5 and 0.3.
const TURN_SPARSE_WEIGHT: f64 = 0.85;

/// The lines of one episode (or, while its segment is open, of one conversation) that answer
/// the query, in the order they were said.
#[derive(Debug, Clone)]
struct LineGroup {
    /// None: the turns are not in an episode yet.
    episode: Option<Uuid>,
    lines: Vec<StoredTurn>,
}

/// Chooses the lines that answer the query among the stored turns found (with their
/// neighbours, in conversation order) and groups them by episode, best group first.
fn answering_lines(
    query: &str,
    hits: &[TurnHit],
    nearest: &[TurnHit],
    turns: &[StoredTurn],
    episodes: &HashMap<Uuid, ScoreParts>,
    context: &RankingContext<'_>,
) -> Vec<LineGroup> {
    if turns.is_empty() {
        return Vec::new();
    }
    let offered = weigh_turns(query, hits, nearest, turns, episodes, context);
    let chosen = lines::choose_lines(&offered, LINES_PER_RETRIEVAL);
    group_by_episode(chosen, turns)
}

/// Each turn's evidence as a line that answers: both turn legs' scores on one scale, as facts'
/// relevance is (BM25 weighing [`TURN_SPARSE_WEIGHT`]), weighed as a fact's is (a question,
/// another speaker's line, the days the query names, the request's conversation), plus
/// [`EPISODE_SHARE`] of its episode's score over the best episode's. A turn no leg found (a
/// neighbour) has none of its own.
fn weigh_turns<'a>(
    query: &str,
    hits: &[TurnHit],
    nearest: &[TurnHit],
    turns: &'a [StoredTurn],
    episodes: &HashMap<Uuid, ScoreParts>,
    context: &RankingContext<'_>,
) -> Vec<lines::OfferedLine<'a>> {
    let sparse: HashMap<_, f64> = hits.iter().map(|hit| (hit.turn, hit.score)).collect();
    let cosine: HashMap<_, f64> = nearest.iter().map(|hit| (hit.turn, hit.score)).collect();
    let legs: Vec<Option<LegEvidence>> = turns
        .iter()
        .map(|turn| {
            let key = turn.key();
            (sparse.contains_key(&key) || cosine.contains_key(&key)).then(|| LegEvidence {
                sparse: sparse.get(&key).copied(),
                cosine: cosine.get(&key).copied(),
            })
        })
        .collect();
    let scale = LegScale::of(legs.iter().flatten());
    let best_episode = episodes
        .values()
        .map(|parts| parts.total)
        .fold(0.0, f64::max);
    let speakers = NamedSpeakers::in_query(query, turns.iter().map(|turn| turn.content.as_str()));
    let params = context.params;
    let factor = |applies: bool, factor: f64| if applies { factor } else { 1.0 };
    turns
        .iter()
        .zip(&legs)
        .enumerate()
        .map(|(position, (turn, legs))| {
            let follows_previous = position > 0 && {
                let previous = &turns[position - 1];
                previous.conversation_id == turn.conversation_id
                    && previous.turn_index + 1 == turn.turn_index
            };
            let evidence = legs.as_ref().map_or(0.0, |legs| {
                let in_window = context
                    .window
                    .is_some_and(|window| window.overlaps(turn.spoken_at, turn.spoken_at));
                let own = relevance(legs, &scale, TURN_SPARSE_WEIGHT)
                    * factor(
                        is_question(&turn.content),
                        params.question_weight.clamp(0.0, 1.0),
                    )
                    * factor(
                        speakers.spoken_by_another(&turn.content),
                        params.other_speaker_weight.clamp(0.0, 1.0),
                    )
                    * factor(in_window, 1.0 + params.time_match_boost)
                    * factor(
                        context.conversation == Some(turn.conversation_id),
                        1.0 + engram_core::retrieval::ranking::REQUEST_CONVERSATION_BOOST,
                    );
                let episode = turn
                    .episode_id
                    .and_then(|id| episodes.get(&id))
                    .filter(|_| best_episode > 0.0)
                    .map_or(0.0, |parts| parts.total / best_episode);
                own + EPISODE_SHARE * episode
            });
            lines::OfferedLine {
                text: &turn.content,
                evidence,
                follows_previous,
            }
        })
        .collect()
}

/// The chosen lines (best first) grouped by the episode that holds each (a conversation's turns
/// not yet in an episode by conversation), best group first; within a group, in the order they
/// were said. A line is shown once, in the group of the first line that shows it (a neighbour
/// shown with a line goes with that line, whatever episode holds it).
fn group_by_episode(chosen: Vec<lines::ChosenLine>, turns: &[StoredTurn]) -> Vec<LineGroup> {
    let mut groups: Vec<(Option<Uuid>, Uuid, Vec<usize>)> = Vec::new();
    let mut shown_already = std::collections::HashSet::new();
    for line in chosen {
        let shown: Vec<usize> = line
            .shown
            .into_iter()
            .filter(|&index| shown_already.insert(index))
            .collect();
        if shown.is_empty() {
            continue;
        }
        let turn = &turns[line.line];
        let same = |(episode, conversation, _): &(Option<Uuid>, Uuid, Vec<usize>)| {
            *episode == turn.episode_id && *conversation == turn.conversation_id
        };
        match groups.iter_mut().find(|group| same(group)) {
            Some(group) => group.2.extend(shown),
            None => groups.push((turn.episode_id, turn.conversation_id, shown)),
        }
    }
    groups
        .into_iter()
        .map(|(episode, _, mut shown)| {
            shown.sort_unstable();
            LineGroup {
                episode,
                lines: shown
                    .into_iter()
                    .map(|index| turns[index].clone())
                    .collect(),
            }
        })
        .collect()
}

/// An entry of the episodes' section: an episode, with the lines that answer if any, or the
/// lines of a conversation whose segment is still open.
struct EpisodeEntry {
    memory: Option<RankedMemory>,
    lines: Vec<StoredTurn>,
}

/// The episodes' section: the episodes whose lines answer, best line first, then the ranked
/// episodes without such lines, numbered in that order.
fn episodes_to_show(
    ranked: Vec<RankedMemory>,
    line_groups: Vec<LineGroup>,
    mut candidates: HashMap<Uuid, (ScoreParts, MemoryRecord)>,
) -> Vec<EpisodeEntry> {
    let mut ranked: Vec<Option<RankedMemory>> = ranked.into_iter().map(Some).collect();
    let mut entries: Vec<EpisodeEntry> = Vec::new();
    for group in line_groups {
        let memory = group.episode.and_then(|id| {
            ranked
                .iter_mut()
                .find(|m| m.as_ref().is_some_and(|m| m.record.id == id))
                .and_then(Option::take)
                .or_else(|| {
                    let (scores, record) = candidates.remove(&id)?;
                    Some(RankedMemory {
                        record,
                        rank: 0,
                        scores,
                        sparse: None,
                        dense: None,
                        details_shown: false,
                        lines_shown: Vec::new(),
                        history: Vec::new(),
                    })
                })
        });
        // An episode forgotten meanwhile: its lines are not shown.
        if group.episode.is_some() && memory.is_none() {
            continue;
        }
        entries.push(EpisodeEntry {
            memory,
            lines: group.lines,
        });
    }
    entries.extend(ranked.into_iter().flatten().map(|memory| EpisodeEntry {
        memory: Some(memory),
        lines: Vec::new(),
    }));
    for (position, memory) in entries
        .iter_mut()
        .filter_map(|entry| entry.memory.as_mut())
        .enumerate()
    {
        memory.rank = position + 1;
    }
    entries
}

/// What a rendering of an episode shows of it.
#[derive(Clone, Copy)]
enum EpisodeShown {
    /// Its whole conversation excerpt (the detail level asked for it).
    Excerpt,
    /// The lines of its conversation that answer the query.
    Lines,
    /// Its title and summary alone.
    Summary,
}

/// Lines of an episode's excerpt shown at most when they answer the query, where its turns are
/// not stored (5 over 3 on the dialogs: docs/eval/README.md).
const LINES_PER_EXCERPT: usize = 5;

/// Where each stored turn shown sits in the episode's excerpt (`memory.messages`), for
/// `lines_shown`: matched by role and content, in order. A turn the excerpt does not hold (past
/// its size limit, or the neighbour of a line from the next segment) is left out.
fn positions_in_excerpt(turns: &[StoredTurn], excerpt: &[Turn]) -> Vec<usize> {
    let mut positions = Vec::with_capacity(turns.len());
    let mut from = 0;
    for turn in turns {
        let found = excerpt[from..]
            .iter()
            .position(|line| line.role == turn.role && line.content == turn.content);
        if let Some(offset) = found {
            positions.push(from + offset);
            from += offset + 1;
        }
    }
    positions
}

/// The lines each entry shows, and where they sit in its episode's excerpt (`lines_shown`): the
/// stored turns that answer (found by the turn search), else, for an episode whose turns are not
/// stored (imported with its excerpt), the excerpt's lines that answer (none at detail NONE).
fn lines_to_show(
    episodic: &[EpisodeEntry],
    excerpts: &[Vec<Turn>],
    request: &RetrieveRequest,
) -> Vec<(Vec<Turn>, Vec<usize>)> {
    let within_excerpts = if request.detail == Detail::None {
        vec![Vec::new(); episodic.len()]
    } else {
        let texts: Vec<Vec<&str>> = episodic
            .iter()
            .zip(excerpts)
            .map(|(entry, turns)| {
                if entry.lines.is_empty() {
                    turns.iter().map(|turn| turn.content.as_str()).collect()
                } else {
                    Vec::new()
                }
            })
            .collect();
        lines::lines_within_excerpts(&request.query, &texts, LINES_PER_EXCERPT)
    };
    episodic
        .iter()
        .zip(excerpts)
        .zip(within_excerpts)
        .map(|((entry, excerpt), within)| {
            if entry.lines.is_empty() {
                let lines = within.iter().map(|&index| excerpt[index].clone()).collect();
                (lines, within)
            } else {
                let lines = entry
                    .lines
                    .iter()
                    .map(|turn| Turn {
                        role: turn.role.clone(),
                        content: turn.content.clone(),
                    })
                    .collect();
                (lines, positions_in_excerpt(&entry.lines, excerpt))
            }
        })
        .collect()
}

/// Renders both sections, fits them into the budget, and keeps what fit.
fn render(
    semantic: Vec<RankedMemory>,
    episodic: Vec<EpisodeEntry>,
    request: &RetrieveRequest,
    served_by: ServedBy,
    now: DateTime<Utc>,
) -> Retrieval {
    let fact_lines: Vec<String> = semantic
        .iter()
        .map(|m| {
            let history: Vec<Earlier> = m
                .history
                .iter()
                .map(|earlier| Earlier {
                    text: earlier.text.clone(),
                    until: earlier.invalid_at.unwrap_or(earlier.updated_at),
                })
                .collect();
            markdown::fact_line_with_history(
                m.record.category.as_deref().unwrap_or("fact"),
                &m.record.text,
                provenance(&m.record),
                &history,
            )
        })
        .collect();
    let excerpts: Vec<Vec<Turn>> = episodic
        .iter()
        .map(|entry| {
            entry
                .memory
                .as_ref()
                .map(|m| turns_of(&m.record))
                .unwrap_or_default()
        })
        .collect();
    let shown_lines = lines_to_show(&episodic, &excerpts, request);
    // Each entry's renderings, the fullest first, and what each shows: an episode's whole
    // excerpt, the lines that answer, or its summary.
    let mut shown: Vec<Vec<EpisodeShown>> = Vec::with_capacity(episodic.len());
    let episode_parts: Vec<EpisodePart> = episodic
        .iter()
        .zip(&excerpts)
        .zip(&shown_lines)
        .map(|((entry, turns), (lines, _))| {
            let mut renderings = Vec::new();
            let mut shows = Vec::new();
            let Some(m) = &entry.memory else {
                // The lines of a segment still open: under the day they were said.
                let said_at = entry.lines.last().map_or(now, |turn| turn.spoken_at);
                renderings.push(markdown::open_segment_lines_block(said_at, lines, now));
                shows.push(EpisodeShown::Lines);
                shown.push(shows);
                return EpisodePart { renderings };
            };
            let surprise = m.record.surprise.unwrap_or(0.0);
            let view = |turns| EpisodeView {
                title: m.record.title.as_deref().unwrap_or(""),
                rank: m.rank,
                score: m.scores.total,
                surprise,
                end_at: m.record.end_at.unwrap_or(m.record.created_at),
                summary: &m.record.text,
                turns,
            };
            if !turns.is_empty() && request.detail.shows_details(m.rank, surprise) {
                renderings.push(markdown::episode_block(&view(turns), true, now));
                shows.push(EpisodeShown::Excerpt);
            }
            if !lines.is_empty() {
                renderings.push(markdown::episode_lines_block(&view(lines), now));
                shows.push(EpisodeShown::Lines);
            }
            renderings.push(markdown::episode_block(&view(turns), false, now));
            shows.push(EpisodeShown::Summary);
            shown.push(shows);
            EpisodePart { renderings }
        })
        .collect();
    let fitted = budget::fit(&fact_lines, &episode_parts, request.token_budget);
    let mut semantic: Vec<Option<RankedMemory>> = semantic.into_iter().map(Some).collect();
    let mut episodic: Vec<Option<EpisodeEntry>> = episodic.into_iter().map(Some).collect();
    let semantic = fitted
        .facts
        .iter()
        .filter_map(|&i| semantic[i].take())
        .collect();
    let episodic = fitted
        .episodes
        .iter()
        .filter_map(|&(i, rendering)| {
            let entry = episodic[i].take()?;
            let mut memory = entry.memory?;
            match shown[i][rendering] {
                EpisodeShown::Excerpt => {
                    memory.details_shown = true;
                    memory.lines_shown = (0..excerpts[i].len()).collect();
                }
                EpisodeShown::Lines => memory.lines_shown = shown_lines[i].1.clone(),
                EpisodeShown::Summary => {}
            }
            Some(memory)
        })
        .collect();
    Retrieval {
        markdown: fitted.markdown,
        semantic,
        episodic,
        served_by,
        tokens: fitted.tokens,
        truncated: fitted.truncated,
    }
}

/// The note that entries were returned keeps them from turning inactive; the next retrieval
/// that returns them writes it again, so a failure is logged, not answered.
fn log_failed_note(noted: Result<(), engram_store::StoreError>) {
    if let Err(error) = noted {
        tracing::warn!(%error, "cannot note the returned entries as in use");
    }
}
