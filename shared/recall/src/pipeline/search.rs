//! The search legs of a retrieval (steps 2–4 of the crate documentation): the words and the
//! vectors of the space's facts and episodes, and of its stored turns, searched together; the
//! trigram fallback when no word matched; the relevance floor; and which path served the answer.

use std::sync::Arc;
use std::time::{Duration, Instant};

use engram_core::MemoryKind;
use engram_core::retrieval::markdown::Detail;
use engram_store::retrieval::{
    self as store, Bm25, DenseMethod, Hit, RetrievalContext, SearchFilter,
};
use engram_store::turn_search::{self, StoredTurn, TurnHit};
use uuid::Uuid;

use super::{Recall, RetrieveRequest, ServedBy, TurnVectors, elapsed_ms};
use crate::{RecallError, RecallSettings};

/// The longest wait for the query's turn vector (microseconds with the local token vectors; a
/// network call with an embedding endpoint). Lines are found by their words without it.
const TURN_VECTOR_TIMEOUT: Duration = Duration::from_millis(250);
/// Turns each turn leg brings for the lines (each is loaded with its neighbours), chosen on the
/// dialogs by what an assistant reads (`make eval-reads`; docs/eval/README.md).
const TURN_CANDIDATES: i64 = 60;

/// Candidates of one kind from both legs.
#[derive(Debug, Default)]
pub(super) struct Legs {
    pub(super) sparse: Vec<Hit>,
    pub(super) dense: Vec<Hit>,
}

/// The stored turns the legs found: those that share words with the query (BM25 scores), those
/// nearest it by their vectors (cosines), and those turns loaded with their neighbours.
#[derive(Debug, Default)]
pub(super) struct FoundTurns {
    pub(super) hits: Vec<TurnHit>,
    pub(super) nearest: Vec<TurnHit>,
    pub(super) stored: Vec<StoredTurn>,
}

/// What the search found, for the ranking.
pub(super) struct Found {
    /// The kind of each section, in the order of `legs`.
    pub(super) kinds: &'static [MemoryKind],
    pub(super) legs: Vec<Legs>,
    pub(super) query_embedding: Option<Arc<Vec<f32>>>,
    pub(super) turns: FoundTurns,
    pub(super) served_by: ServedBy,
    pub(super) latency_embed_ms: Option<f32>,
}

/// What a retrieval searches: the kinds of entries, each with its filter, and how many
/// candidates each leg brings.
struct SearchPlan<'a> {
    kinds: &'static [MemoryKind],
    filters: Vec<SearchFilter<'a>>,
    /// Each leg brings at least as many candidates as a section may return.
    limit: i64,
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
        let filters = kinds
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
        Self {
            kinds,
            filters,
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

/// What the first legs found, searched together: the entries' words, the query's embedding, the
/// stored turns' words and the query's turn vector.
struct FirstLegs {
    sparse: Vec<Vec<Hit>>,
    query_embedding: Option<Arc<Vec<f32>>>,
    latency_embed_ms: Option<f32>,
    turn_hits: Vec<TurnHit>,
    /// The turn vectors' model and the query's vector among them.
    turn_vector: Option<(String, Vec<f32>)>,
}

/// The query's vectors: its embedding (for the entries) and its turn vector (for the stored
/// turns), where there are.
#[derive(Clone, Copy)]
struct QueryVectors<'a> {
    embedding: Option<&'a Arc<Vec<f32>>>,
    /// The turn vectors' model and the query's vector among them.
    turn_vector: Option<&'a (String, Vec<f32>)>,
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
    ) -> Result<Found, RecallError> {
        let plan = SearchPlan::new(request, &self.settings);
        let mut fallback_reasons: Vec<String> = Vec::new();
        let FirstLegs {
            sparse,
            query_embedding,
            latency_embed_ms,
            turn_hits,
            turn_vector,
        } = self
            .first_legs(request, &plan, &mut fallback_reasons)
            .await?;
        *stage = "vector";
        let vectors = QueryVectors {
            embedding: query_embedding.as_ref(),
            turn_vector: turn_vector.as_ref(),
        };
        let (dense, turns) = self
            .vector_legs(
                request,
                context,
                &plan,
                vectors,
                turn_hits,
                &mut fallback_reasons,
            )
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
            for (legs, filter) in legs.iter_mut().zip(&plan.filters) {
                legs.sparse = store::trigram_search(
                    &self.pool,
                    filter,
                    &request.query,
                    self.settings.trigram_threshold,
                    plan.limit,
                )
                .await?;
                trigram_hits += legs.sparse.len();
            }
        }
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
            latency_embed_ms,
        })
    }

    /// The legs that need no query embedding, searched while the query is embedded (both for
    /// the entries' vectors and for the turn vectors).
    async fn first_legs(
        &self,
        request: &RetrieveRequest,
        plan: &SearchPlan<'_>,
        fallback_reasons: &mut Vec<String>,
    ) -> Result<FirstLegs, RecallError> {
        let embedding_started = Instant::now();
        let embedding = async {
            match &self.embedder {
                Some(embedder) if request.dense => Some(embedder.embed(&request.query).await),
                _ => None,
            }
        };
        let sparse = async {
            let searches = plan.filters.iter().map(|filter| {
                store::sparse_search(&self.pool, filter, &request.query, plan.bm25, plan.limit)
            });
            futures::future::try_join_all(searches).await
        };
        // The stored turns that share words with the query, whose lines the Markdown shows.
        let turn_hits = async {
            if plan.search_lines {
                turn_search::search_turns(
                    &self.pool,
                    &request.scope,
                    &request.query,
                    plan.bm25,
                    TURN_CANDIDATES,
                )
                .await
            } else {
                Ok(Vec::new())
            }
        };
        let turn_vector = self.query_turn_vector(request, plan);
        let (sparse, embedding, turn_hits, turn_vector) =
            tokio::join!(sparse, embedding, turn_hits, turn_vector);
        let latency_embed_ms = embedding.as_ref().map(|_| elapsed_ms(embedding_started));
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
            turn_hits: turn_hits?,
            turn_vector,
        })
    }

    /// The query among the turn vectors (a static-token-vector mean, no model pass per turn),
    /// bounded by [`TURN_VECTOR_TIMEOUT`]: with an embedding endpoint this is a network call.
    async fn query_turn_vector(
        &self,
        request: &RetrieveRequest,
        plan: &SearchPlan<'_>,
    ) -> Option<(String, Vec<f32>)> {
        let TurnVectors(embedder) = self
            .turn_vectors
            .as_ref()
            .filter(|_| plan.search_lines && request.dense)?;
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

    /// The vector legs: the entries nearest the query embedding (exact for small spaces, HNSW
    /// for large ones) and the turns nearest its turn vector; then the turns found by either
    /// turn leg, loaded with their neighbours. A failed vector search serves the sparse results.
    async fn vector_legs(
        &self,
        request: &RetrieveRequest,
        context: &RetrievalContext,
        plan: &SearchPlan<'_>,
        vectors: QueryVectors<'_>,
        turn_hits: Vec<TurnHit>,
        fallback_reasons: &mut Vec<String>,
    ) -> Result<(Vec<Vec<Hit>>, FoundTurns), RecallError> {
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
        let dense_search = async {
            let embedding = vectors.embedding?;
            let searches = plan.filters.iter().map(|filter| {
                store::dense_search(&self.pool, filter, embedding, method, plan.limit)
            });
            Some(futures::future::try_join_all(searches).await)
        };
        let nearest_turns = async {
            let Some((model, vector)) = vectors.turn_vector else {
                return Vec::new();
            };
            turn_search::nearest_turns(&self.pool, &request.scope, model, vector, TURN_CANDIDATES)
                .await
                .unwrap_or_else(|error| {
                    tracing::warn!(%error, "turn vector search failed; lines found by their words");
                    Vec::new()
                })
        };
        let (found, mut nearest) = tokio::join!(dense_search, nearest_turns);
        // Lines are found by their words: the turn vectors only add turns beside word matches
        // (without a floor of their own, a query nothing matches would get the nearest lines).
        if turn_hits.is_empty() {
            nearest.clear();
        }
        let mut hit_turns: Vec<_> = turn_hits.iter().map(|hit| hit.turn).collect();
        hit_turns.extend(nearest.iter().map(|hit| hit.turn));
        let stored = turn_search::turns_around(
            &self.pool,
            &request.scope,
            &hit_turns,
            1,
            request.include_inactive,
        )
        .await?;
        let dense = match found {
            Some(Ok(found)) => found,
            Some(Err(error)) => {
                tracing::warn!(error = %error, "vector search failed; serving sparse results only");
                fallback_reasons.push("vector search failed".to_owned());
                vec![Vec::new(); plan.kinds.len()]
            }
            None => vec![Vec::new(); plan.kinds.len()],
        };
        let turns = FoundTurns {
            hits: turn_hits,
            nearest,
            stored,
        };
        Ok((dense, turns))
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
