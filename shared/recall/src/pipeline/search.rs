//! The search legs of a retrieval (steps 2–4 of the crate documentation): the words and the
//! vectors of the space's facts and episodes, and of its stored turns, searched together; the
//! trigram fallback when no word matched; the relevance floor; and which path served the answer.

use std::sync::Arc;
use std::time::{Duration, Instant};

use engram_core::MemoryKind;
use engram_core::retrieval::markdown::Detail;
use engram_store::retrieval::{
    self as store, Bm25, DenseMethod, Hit, LoadedCandidate, RetrievalContext, SpaceFilter,
};
use engram_store::turn_search::{self, FoundTurns, TurnSearch};
use tracing::Instrument as _;
use uuid::Uuid;

use super::{Recall, RetrieveRequest, ServedBy, StageTimes, TurnVectors, duration_ms, timed};
use crate::{RecallError, RecallSettings};

/// The longest wait for the query's turn vector (microseconds with the local token vectors; a
/// network call with an embedding endpoint). Lines are found by their words without it.
const TURN_VECTOR_TIMEOUT: Duration = Duration::from_millis(250);

/// Candidates of one kind from both legs.
#[derive(Debug, Default)]
pub(super) struct Legs {
    pub(super) sparse: Vec<Hit>,
    pub(super) dense: Vec<Hit>,
}

/// What the search found, for the ranking.
pub(super) struct Found {
    /// The kind of each section, in the order of `legs`.
    pub(super) kinds: &'static [MemoryKind],
    pub(super) legs: Vec<Legs>,
    pub(super) query_embedding: Option<Arc<Vec<f32>>>,
    pub(super) turns: FoundTurns,
    /// The episodes holding the turns found, each once: whichever holds a line shown needs its
    /// heading, found by a leg or not.
    pub(super) holding_episodes: Vec<Uuid>,
    /// The rows loaded with the vector leg (exact search): its hits', the word leg's and
    /// `holding_episodes`'. The ranking loads whatever else it needs.
    pub(super) loaded: Vec<LoadedCandidate>,
    pub(super) served_by: ServedBy,
    pub(super) latency_embed_ms: Option<f32>,
}

/// What a retrieval searches: the kinds of entries, each with its filter, and how many
/// candidates each leg brings.
struct SearchPlan<'a> {
    kinds: &'static [MemoryKind],
    filter: SpaceFilter<'a>,
    /// Each leg brings at least as many candidates as a section may return.
    limit: i64,
    /// The HNSW search's breadth at least (`ef_search`), in large spaces.
    candidates_per_leg: u32,
    bm25: Bm25,
    /// Whether the stored turns are searched for the lines that answer (episodes are asked for,
    /// and a detail level that shows lines).
    search_lines: bool,
}

impl<'a> SearchPlan<'a> {
    fn new(request: &'a RetrieveRequest, settings: &RecallSettings) -> Self {
        let kinds: &'static [MemoryKind] = if request.episodic_limit > 0 {
            &[MemoryKind::Semantic, MemoryKind::Episodic]
        } else {
            &[MemoryKind::Semantic]
        };
        let category = request.category.map(engram_core::Category::as_str);
        // The whole space, always: the entries of the request's conversation are preferred in
        // the ranking (`REQUEST_CONVERSATION_BOOST`), never the only ones searched (an episode of
        // another session may hold the answer).
        let filter = SpaceFilter {
            scope: &request.scope,
            kinds: kinds
                .iter()
                .map(|kind| {
                    let category = category.filter(|_| *kind == MemoryKind::Semantic);
                    (*kind, category)
                })
                .collect(),
            conversation: None,
            include_inactive: request.include_inactive,
        };
        Self {
            kinds,
            filter,
            candidates_per_leg: request.ranking.candidates_per_leg,
            limit: i64::from(request.ranking.candidates_per_leg)
                .max(request.semantic_limit as i64)
                .max(request.episodic_limit as i64),
            bm25: Bm25 {
                k1: settings.bm25_k1,
                b: settings.bm25_b,
            },
            search_lines: request.episodic_limit > 0 && request.detail != Detail::None,
        }
    }
}

/// What the first legs found, searched together: the entries' words (unless the exact vector
/// leg's statement searches them, [`Recall::words_with_vectors`]), the query's embedding and the
/// stored turns that answer (both turn legs and the turns around them).
struct FirstLegs {
    sparse: Option<Vec<Vec<Hit>>>,
    query_embedding: Option<Arc<Vec<f32>>>,
    latency_embed_ms: Option<f32>,
    turns: FoundTurns,
}

/// What each search counted, for the path that served the retrieval.
struct Counts {
    sparse_hits: usize,
    trigram_hits: usize,
    /// Vector-only candidates the relevance floor left out.
    below_floor: usize,
    /// Some stored turn shares words with the query.
    turns_matched: bool,
}

impl Recall {
    /// Runs the search legs of `request`: both legs over the facts and episodes and over the
    /// stored turns, then the trigram fallback if no word matched, then the relevance floor.
    pub(super) async fn search(
        &self,
        request: &RetrieveRequest,
        context: &RetrievalContext,
        stage: &mut &'static str,
        times: &mut StageTimes,
    ) -> Result<Found, RecallError> {
        let plan = SearchPlan::new(request, &self.settings);
        let mut fallback_reasons: Vec<String> = Vec::new();
        let FirstLegs {
            sparse,
            query_embedding,
            latency_embed_ms,
            turns,
        } = self
            .first_legs(request, context, &plan, &mut fallback_reasons, times)
            .await?;
        *stage = "vector";
        let vector_started = Instant::now();
        let holding_episodes = turns.holding_episodes();
        let (sparse, dense, loaded) = self
            .vector_legs(
                request,
                context,
                &plan,
                query_embedding.as_ref(),
                (sparse, &holding_episodes),
                &mut fallback_reasons,
            )
            .instrument(tracing::info_span!("retrieval.vector"))
            .await?;
        let sparse_hits = sparse.iter().map(Vec::len).sum();
        let mut legs: Vec<Legs> = sparse
            .into_iter()
            .zip(dense)
            .map(|(sparse, dense)| Legs { sparse, dense })
            .collect();
        // Words that matched a stored turn count as matched: its lines answer, and the fallback
        // would only pad them with entries that share nothing with the query.
        let turns_matched = !turns.stored.is_empty();
        let mut trigram_hits = 0;
        if sparse_hits == 0 && !turns_matched {
            *stage = "trigram";
            fallback_reasons.push("no word of the query matched".to_owned());
            for (legs, filter) in legs.iter_mut().zip(plan.filter.each()) {
                legs.sparse = store::trigram_search(
                    &self.reads,
                    &filter,
                    &request.query,
                    self.settings.trigram_threshold,
                    plan.limit,
                )
                .await?;
                trigram_hits += legs.sparse.len();
            }
        }
        times.vector = vector_started.elapsed();
        let below_floor = leave_out_below_floor(&mut legs, request.ranking.min_similarity);
        let counts = Counts {
            sparse_hits,
            trigram_hits,
            below_floor,
            turns_matched,
        };
        Ok(Found {
            kinds: plan.kinds,
            served_by: served_by(&legs, &counts, fallback_reasons),
            legs,
            query_embedding,
            turns,
            holding_episodes,
            loaded,
            latency_embed_ms,
        })
    }

    /// The legs that need no query embedding, searched while the query is embedded for the
    /// entries' vectors: the entries' words, and the stored turns (by their words and their turn
    /// vectors, whose query vector costs microseconds, with the turns around them).
    async fn first_legs(
        &self,
        request: &RetrieveRequest,
        context: &RetrievalContext,
        plan: &SearchPlan<'_>,
        fallback_reasons: &mut Vec<String>,
        times: &mut StageTimes,
    ) -> Result<FirstLegs, RecallError> {
        let embedding = async {
            match &self.embedder {
                Some(embedder) if request.dense => Some(embedder.embed(&request.query).await),
                _ => None,
            }
        };
        let words_with_vectors = self.words_with_vectors(request, context);
        let sparse = async {
            if words_with_vectors {
                return Ok(None);
            }
            self.words_alone(request, plan).await.map(Some)
        };
        // The stored turns that answer, whose lines the Markdown shows.
        let turns = async {
            if !plan.search_lines {
                return Ok(FoundTurns::default());
            }
            let turn_vector = self.query_turn_vector(request, plan).await;
            let search = TurnSearch {
                bm25: plan.bm25,
                turn_vector: turn_vector
                    .as_ref()
                    .map(|(model, vector)| (model.as_str(), vector.as_slice())),
                limit: i64::from(self.settings.turn_candidates),
                nearest_limit: i64::from(self.settings.turn_vector_candidates),
                radius: 1,
                include_inactive: request.include_inactive,
            };
            turn_search::find_turns(&self.reads, &request.scope, &request.query, search).await
        };
        let (sparse, embedding, turns) = tokio::join!(
            timed(
                &mut times.words,
                sparse.instrument(tracing::info_span!("retrieval.words"))
            ),
            timed(
                &mut times.embed,
                embedding.instrument(tracing::info_span!("retrieval.embed"))
            ),
            timed(
                &mut times.turns,
                turns.instrument(tracing::info_span!("retrieval.turns"))
            ),
        );
        // The embedding's own time (its clock stopped with it, not with the slowest of the three).
        let latency_embed_ms = embedding.as_ref().map(|_| duration_ms(times.embed));
        let query_embedding = match embedding {
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
        Ok(FirstLegs {
            sparse: sparse?,
            query_embedding,
            latency_embed_ms,
            turns: turns?,
        })
    }

    /// The query among the turn vectors (a static-token-vector mean, no model pass per turn),
    /// bounded by [`TURN_VECTOR_TIMEOUT`]: with an embedding endpoint this is a network call.
    async fn query_turn_vector(
        &self,
        request: &RetrieveRequest,
        plan: &SearchPlan<'_>,
    ) -> Option<(String, Vec<f32>)> {
        let TurnVectors(embedder) = self.turn_vectors.as_ref().filter(|_| {
            plan.search_lines && request.dense && self.settings.turn_vector_candidates > 0
        })?;
        let texts = [request.query.clone()];
        match tokio::time::timeout(TURN_VECTOR_TIMEOUT, embedder.embed(&texts)).await {
            Ok(Ok(mut vectors)) => vectors
                .pop()
                .map(|vector| (embedder.model_id().to_owned(), vector)),
            Ok(Err(error)) => {
                tracing::warn!(%error, "no turn vector for the query; lines found by their words");
                None
            }
            Err(_) => {
                tracing::warn!("no turn vector for the query in time; lines found by their words");
                None
            }
        }
    }

    /// The entries' words (BM25) in a statement of their own.
    async fn words_alone(
        &self,
        request: &RetrieveRequest,
        plan: &SearchPlan<'_>,
    ) -> Result<Vec<Vec<Hit>>, RecallError> {
        let hits = store::sparse_search_kinds(
            &self.reads,
            &plan.filter,
            &request.query,
            plan.bm25,
            plan.limit,
        )
        .await?;
        Ok(hits)
    }

    /// Whether the entries' words are searched in the exact vector leg's statement, which reads
    /// the space's entries anyway, rather than in a statement of their own beside the query's
    /// model pass: the space is small enough to be searched exactly and an embedding is on its
    /// way. The words then wait for the embedding (a statement of about a millisecond after
    /// it), and the space's entries are read once instead of twice (issue 41).
    fn words_with_vectors(&self, request: &RetrieveRequest, context: &RetrievalContext) -> bool {
        request.dense
            && self.embedder.is_some()
            && context.memory_count <= self.settings.exact_search_max_entries
    }

    /// The word leg, if the first legs left it to this statement, and the vector leg: the
    /// entries nearest the query embedding (exact for small spaces, HNSW for large ones), and
    /// with the exact search, in the same statement, the rows of their hits and of `headings`
    /// (see `store::exact_search_loading`). A failed vector search serves the word hits.
    async fn vector_legs(
        &self,
        request: &RetrieveRequest,
        context: &RetrievalContext,
        plan: &SearchPlan<'_>,
        embedding: Option<&Arc<Vec<f32>>>,
        (sparse, headings): (Option<Vec<Vec<Hit>>>, &[Uuid]),
        fallback_reasons: &mut Vec<String>,
    ) -> Result<(Vec<Vec<Hit>>, Vec<Vec<Hit>>, Vec<LoadedCandidate>), RecallError> {
        let no_hits = || vec![Vec::new(); plan.kinds.len()];
        let Some(embedding) = embedding else {
            let sparse = match sparse {
                Some(sparse) => sparse,
                None => self.words_alone(request, plan).await?,
            };
            return Ok((sparse, no_hits(), Vec::new()));
        };
        let searched = if context.memory_count <= self.settings.exact_search_max_entries {
            let words = sparse.is_none().then_some(store::WordsLeg {
                query: &request.query,
                bm25: plan.bm25,
            });
            let word_hits: Vec<Uuid> = sparse
                .iter()
                .flatten()
                .flatten()
                .map(|(id, _)| *id)
                .collect();
            store::exact_search_loading(
                &self.reads,
                &plan.filter,
                embedding,
                words,
                plan.limit,
                &word_hits,
                headings,
            )
            .await
        } else {
            let method = DenseMethod::Approximate {
                ef_search: self.settings.hnsw_ef_search.max(plan.candidates_per_leg),
            };
            store::dense_search_kinds(&self.reads, &plan.filter, embedding, method, plan.limit)
                .await
                .map(|nearest| store::ExactSearch {
                    words: no_hits(),
                    nearest,
                    loaded: Vec::new(),
                })
        };
        match searched {
            Ok(found) => {
                let sparse = sparse.unwrap_or(found.words);
                Ok((sparse, found.nearest, found.loaded))
            }
            Err(error) => {
                tracing::warn!(error = %error, "vector search failed; serving sparse results only");
                fallback_reasons.push("vector search failed".to_owned());
                let sparse = match sparse {
                    Some(sparse) => sparse,
                    None => self.words_alone(request, plan).await?,
                };
                Ok((sparse, no_hits(), Vec::new()))
            }
        }
    }
}

/// The relevance floor: what only the vector leg found, with a cosine below `floor`, is left
/// out. Returns how many candidates it left out.
fn leave_out_below_floor(legs: &mut [Legs], floor: f64) -> usize {
    if floor <= 0.0 {
        return 0;
    }
    let mut below_floor = 0;
    for legs in legs {
        let matched: std::collections::HashSet<Uuid> =
            legs.sparse.iter().map(|(id, _)| *id).collect();
        let found = legs.dense.len();
        legs.dense
            .retain(|(id, cosine)| *cosine >= floor || matched.contains(id));
        below_floor += found - legs.dense.len();
    }
    below_floor
}

/// Which path served a retrieval, from what each search found, and why a fallback answered.
fn served_by(legs: &[Legs], counts: &Counts, mut fallback_reasons: Vec<String>) -> ServedBy {
    let dense_hits: usize = legs.iter().map(|l| l.dense.len()).sum();
    // Nothing found answers nothing: entries that share nothing with the query (the most recent,
    // say) would only fill the assistant's budget with noise (issue 38).
    let nothing_left = !counts.turns_matched
        && legs
            .iter()
            .all(|l| l.sparse.is_empty() && l.dense.is_empty());
    if nothing_left && counts.below_floor > 0 {
        fallback_reasons.push("nothing above the relevance floor".to_owned());
    } else if nothing_left {
        fallback_reasons.push("nothing matched the query".to_owned());
    }
    let path = if nothing_left {
        "none".to_owned()
    } else {
        let sparse_leg = if counts.trigram_hits > 0 {
            Some("trigram")
        } else if counts.sparse_hits > 0 || counts.turns_matched {
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
    ServedBy {
        path,
        searched: "space".to_owned(),
        sparse_hits: counts.sparse_hits,
        dense_hits,
        trigram_hits: counts.trigram_hits,
        used_fallback: !fallback_reasons.is_empty(),
        fallback_reason: (!fallback_reasons.is_empty()).then(|| fallback_reasons.join("; ")),
    }
}
