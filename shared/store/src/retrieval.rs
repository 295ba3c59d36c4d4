//! The statements of retrieval: the sparse leg (Okapi BM25 over `search_document`), the trigram
//! fallback, the dense leg (exact or HNSW), loading the candidates, a retrieval's pending review,
//! and what retrievals leave behind, written in batches. Every search is bound to one (user,
//! space); a batched write carries each row's.

use std::collections::btree_map::Entry;
use std::collections::{BTreeMap, HashMap};

use chrono::{DateTime, Utc};
use engram_core::capacity::Scores;
use engram_core::{ConversationId, MemoryKind, Scope};
use pgvector::Vector;
use sqlx::PgPool;
use uuid::Uuid;

use crate::StoreError;
use crate::memories::MemoryRecord;

/// Which entries a search considers: one kind of one space, optionally only one conversation's
/// entries and (semantic) one category. Invalidated facts are never searched.
#[derive(Debug, Clone, Copy)]
pub struct SearchFilter<'a> {
    pub scope: &'a Scope,
    /// `semantic` or `episodic`.
    pub kind: MemoryKind,
    pub conversation: Option<Uuid>,
    pub category: Option<&'a str>,
    /// Also entries retention found inactive (left out by default).
    pub include_inactive: bool,
}

/// BM25 parameters (k1, b).
#[derive(Debug, Clone, Copy)]
pub struct Bm25 {
    pub k1: f64,
    pub b: f64,
}

/// A ranked hit of one leg: the entry and the leg's score (best first).
pub type Hit = (Uuid, f64);

#[derive(sqlx::FromRow)]
struct HitRow {
    id: Uuid,
    score: f64,
}

/// A NaN score (cosine against a zero vector) ranks nothing: it is dropped.
fn hits(rows: Vec<HitRow>) -> Vec<Hit> {
    rows.into_iter()
        .filter(|row| row.score.is_finite())
        .map(|row| (row.id, row.score))
        .collect()
}

/// The kinds one retrieval searches in one space: each ranked on its own (its own corpus
/// statistics and hits), searched together in one statement per leg.
#[derive(Debug, Clone)]
pub struct SpaceFilter<'a> {
    pub scope: &'a Scope,
    /// Each kind searched, with the category its entries must have (`None`: any).
    pub kinds: Vec<(MemoryKind, Option<&'a str>)>,
    pub conversation: Option<Uuid>,
    /// Also entries retention found inactive (left out by default).
    pub include_inactive: bool,
}

impl<'a> SpaceFilter<'a> {
    /// The filter of each kind on its own.
    pub fn each(&self) -> impl Iterator<Item = SearchFilter<'a>> + '_ {
        self.kinds.iter().map(|&(kind, category)| SearchFilter {
            scope: self.scope,
            kind,
            conversation: self.conversation,
            category,
            include_inactive: self.include_inactive,
        })
    }

    fn kind_names(&self) -> Vec<&'static str> {
        self.kinds.iter().map(|(kind, _)| kind.as_str()).collect()
    }

    fn categories(&self) -> Vec<Option<&'a str>> {
        self.kinds.iter().map(|(_, category)| *category).collect()
    }
}

impl<'a> From<&SearchFilter<'a>> for SpaceFilter<'a> {
    fn from(filter: &SearchFilter<'a>) -> Self {
        Self {
            scope: filter.scope,
            kinds: vec![(filter.kind, filter.category)],
            conversation: filter.conversation,
            include_inactive: filter.include_inactive,
        }
    }
}

#[derive(sqlx::FromRow)]
struct KindHitRow {
    id: Uuid,
    kind: String,
    score: f64,
}

/// Each kind's hits (best first), in the order of `filter.kinds`.
fn hits_by_kind(filter: &SpaceFilter<'_>, rows: Vec<KindHitRow>) -> Vec<Vec<Hit>> {
    let mut by_kind = vec![Vec::new(); filter.kinds.len()];
    for row in rows.into_iter().filter(|row| row.score.is_finite()) {
        if let Some(at) = filter
            .kinds
            .iter()
            .position(|(kind, _)| kind.as_str() == row.kind)
        {
            by_kind[at].push((row.id, row.score));
        }
    }
    by_kind
}

/// Okapi BM25 of the entries holding any word of the query, for each kind of `filter` (up to
/// `limit` hits each). N, df and the average length come from the whole collection (the space's
/// active entries of the kind), whatever the conversation or category filter, so a score means
/// the same in both scopes.
pub async fn sparse_search_kinds(
    pool: &PgPool,
    filter: &SpaceFilter<'_>,
    query: &str,
    bm25: Bm25,
    limit: i64,
) -> Result<Vec<Vec<Hit>>, StoreError> {
    let sql = concat!(
        include_str!("retrieval/sparse_search.sql"),
        include_str!("retrieval/bm25_scores.sql"),
        "SELECT id, kind, score FROM words_found ORDER BY kind, score DESC, id"
    );
    let rows = sqlx::query_as::<_, KindHitRow>(sql)
        .bind(filter.scope.user_id.as_uuid())
        .bind(filter.scope.space.as_str())
        .bind(query)
        .bind(filter.kind_names())
        .bind(filter.conversation)
        .bind(filter.categories())
        .bind(bm25.k1)
        .bind(bm25.b)
        .bind(limit)
        .bind(filter.include_inactive)
        .fetch_all(pool)
        .await?;
    Ok(hits_by_kind(filter, rows))
}

/// [`sparse_search_kinds`] of one kind.
pub async fn sparse_search(
    pool: &PgPool,
    filter: &SearchFilter<'_>,
    query: &str,
    bm25: Bm25,
    limit: i64,
) -> Result<Vec<Hit>, StoreError> {
    let mut hits = sparse_search_kinds(pool, &filter.into(), query, bm25, limit).await?;
    Ok(hits.pop().unwrap_or_default())
}

/// How many of a space's newest entries the trigram fallback compares. There is no trigram index
/// (its upkeep cost every write far more than this fallback, which runs only when no word of a
/// query matches, saves): the fallback reads the newest entries through the scope index, all of
/// them in a space at the default cap, the newest 2,000 in larger spaces.
pub const TRIGRAM_FALLBACK_SCAN: i64 = 2_000;

/// Entries whose search text contains something close to the query (pg_trgm word similarity at
/// least `threshold`): the fallback when no word of the query matches, e.g. a misspelt word.
pub async fn trigram_search(
    pool: &PgPool,
    filter: &SearchFilter<'_>,
    query: &str,
    threshold: f64,
    limit: i64,
) -> Result<Vec<Hit>, StoreError> {
    let mut transaction = crate::begin(pool).await?;
    // `<%` compares with this threshold; it applies to this transaction only.
    sqlx::query("SELECT set_config('pg_trgm.word_similarity_threshold', $1, true)")
        .bind(threshold.to_string())
        .execute(&mut *transaction)
        .await?;
    let rows = sqlx::query_as::<_, HitRow>(
        "SELECT id, word_similarity($3, search_text)::float8 AS score \
         FROM (SELECT id, search_text FROM memories \
               WHERE user_id = $1 AND space = $2 AND kind = $4 AND invalid_at IS NULL \
                 AND ($5::uuid IS NULL OR conversation_id = $5) AND ($6::text IS NULL OR category = $6) \
                 AND ($9 OR inactive_since IS NULL) \
               ORDER BY created_at DESC, id DESC LIMIT $8) AS newest \
         WHERE $3 <% search_text \
         ORDER BY score DESC, id LIMIT $7",
    )
    .bind(filter.scope.user_id.as_uuid())
    .bind(filter.scope.space.as_str())
    .bind(query)
    .bind(filter.kind.as_str())
    .bind(filter.conversation)
    .bind(filter.category)
    .bind(limit)
    .bind(TRIGRAM_FALLBACK_SCAN)
    .bind(filter.include_inactive)
    .fetch_all(&mut *transaction)
    .await?;
    transaction.commit().await?;
    Ok(hits(rows))
}

/// How the dense leg finds neighbours.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum DenseMethod {
    /// Every vector of the collection is compared: the true nearest neighbours.
    Exact,
    /// The HNSW index with iterative scanning, searching `ef_search` candidates at a time.
    Approximate { ef_search: u32 },
}

/// Nearest entries of each kind of `filter` by cosine similarity to the query embedding (score =
/// cosine similarity), up to `limit` each, in the order of `filter.kinds`: exactly in one
/// statement, or through the HNSW index one kind at a time (at once).
pub async fn dense_search_kinds(
    pool: &PgPool,
    filter: &SpaceFilter<'_>,
    query_embedding: &[f32],
    method: DenseMethod,
    limit: i64,
) -> Result<Vec<Vec<Hit>>, StoreError> {
    match method {
        DenseMethod::Exact => {
            let found =
                exact_search_loading(pool, filter, query_embedding, None, limit, &[], &[]).await?;
            Ok(found.nearest)
        }
        DenseMethod::Approximate { ef_search } => {
            let query = Vector::from(query_embedding.to_vec());
            let searches = filter
                .each()
                .map(|one| approximate_dense_search(pool, one, &query, ef_search, limit));
            futures::future::try_join_all(searches).await
        }
    }
}

#[derive(sqlx::FromRow)]
struct NearestRow {
    #[sqlx(flatten)]
    candidate: LoadedCandidate,
    nearest_kind: Option<String>,
    nearest_score: Option<f64>,
    words_kind: Option<String>,
    words_score: Option<f64>,
}

/// What [`exact_search_loading`] found: each kind's word hits (none unless asked for) and
/// nearest entries, best first in the order of `filter.kinds`, and the rows a retrieval ranks.
#[derive(Debug)]
pub struct ExactSearch {
    pub words: Vec<Vec<Hit>>,
    pub nearest: Vec<Vec<Hit>>,
    pub loaded: Vec<LoadedCandidate>,
}

/// The word leg searched in the exact search's statement: the query's text and the BM25
/// parameters, as [`sparse_search_kinds`] takes them.
#[derive(Debug, Clone, Copy)]
pub struct WordsLeg<'a> {
    pub query: &'a str,
    pub bm25: Bm25,
}

/// The exact vector leg of every kind of `filter` (as [`dense_search_kinds`]), with `words`
/// the word leg too (as [`sparse_search_kinds`], the same hits and scores), and in the same
/// statement the rows a retrieval ranks: the hits' and `load`'s with their embeddings (MMR
/// compares them), `headings`' without (see [`load_candidates`]). One round trip after the
/// query embedding, and one pass over the space's entries for both legs.
pub async fn exact_search_loading(
    pool: &PgPool,
    filter: &SpaceFilter<'_>,
    query_embedding: &[f32],
    words: Option<WordsLeg<'_>>,
    limit: i64,
    load: &[Uuid],
    headings: &[Uuid],
) -> Result<ExactSearch, StoreError> {
    // The space's entries and its vectors are each read in one pass over their scope, and joined
    // by hashing: joined in the statement that reads them, the planner probed the vectors'
    // primary key once per entry and kind, four times the pages (issue 41). Each pass keeps where
    // its rows are (`ctid`), and the rows returned and the vectors MMR compares are fetched there
    // rather than through the primary keys again, an index descent each (about 600 buffers a
    // retrieval became 360 in a space of 100; at the exact-search limit of 20,000 the passes'
    // wider rows cost a few per cent more). The rows are fetched as one array of places: joined,
    // the planner read the whole space again. The statement's snapshot keeps the versions the
    // passes read in place. `row_at` comes back too; nothing reads it.
    // Only the similarities are kept, not the vectors (20,000 of them are 30 MB), and only
    // vectors of the kinds asked are compared and ranked (a vector of another kind is read for
    // `load` alone; unscored, it would sort first). Ordering by the similarity (not by the
    // distance operator) keeps the planner off the HNSW index. The rows come unordered: the hits
    // are put in rank order below, and the candidates are looked up by id.
    // The word leg is `bm25_scores.sql` over the same pass of the space's entries (its
    // parameters numbered as `sparse_search.sql` numbers them; $3 the query's text, null for
    // none): the word leg's own statement read the space's rows a second time, a hundred buffers
    // of a retrieval's five hundred (issue 41). `searched` is its corpus (every entry of the
    // kinds asked, whatever the conversation or category), and only a searched entry's words
    // are matched. $11 is the query embedding, $12 `load`, $13 `headings`.
    let sql = concat!(
        "WITH query AS ( \
             SELECT engram_any_word_query($3) AS words, \
                    ARRAY(SELECT lexeme FROM unnest(engram_search_words($3))) AS terms), \
         kind_filters AS ( \
             SELECT * FROM unnest($4::text[], $6::text[]) AS f(kind, category)), \
         space_entries AS MATERIALIZED ( \
             SELECT m.id, m.ctid AS row_at, m.kind, m.conversation_id, m.category, m.search_length, \
                    m.kind = ANY($4) AND m.invalid_at IS NULL \
                    AND ($10 OR m.inactive_since IS NULL) AS searched, \
                    m.kind = ANY($4) AND m.invalid_at IS NULL \
                    AND ($5::uuid IS NULL OR m.conversation_id = $5) \
                    AND (($6::text[])[array_position($4::text[], m.kind::text)] IS NULL \
                         OR m.category = ($6::text[])[array_position($4::text[], m.kind::text)]) \
                    AND ($10 OR m.inactive_since IS NULL) AS eligible, \
                    CASE WHEN m.kind = ANY($4) AND m.invalid_at IS NULL \
                              AND ($10 OR m.inactive_since IS NULL) \
                              AND m.search_document @@ query.words \
                         THEN m.search_document END AS matched_document \
             FROM memories m, query WHERE m.user_id = $1 AND m.space = $2),\n",
        include_str!("retrieval/bm25_scores.sql"),
        ", similarity AS MATERIALIZED ( \
             SELECT memory_id AS id, kind, ctid AS vector_at, \
                    CASE WHEN kind = ANY($4) THEN (1 - (embedding <=> $11))::float8 END AS score \
             FROM memory_embeddings WHERE user_id = $1 AND space = $2), \
         nearest AS MATERIALIZED ( \
             SELECT id, kind, score FROM ( \
                 SELECT s.id, s.kind, s.score, \
                        row_number() OVER (PARTITION BY s.kind ORDER BY s.score DESC, s.id) AS rank \
                 FROM similarity s JOIN space_entries e ON e.id = s.id AND e.eligible \
                 WHERE s.score IS NOT NULL) AS ranked \
             WHERE rank <= $9), \
         wanted AS MATERIALIZED ( \
             SELECT r.row_at, n.kind AS nearest_kind, n.score AS nearest_score, \
                    wf.kind AS words_kind, wf.score AS words_score, \
                    CASE WHEN n.id IS NOT NULL OR asked.loaded THEN s.vector_at END AS vector_at \
             FROM (SELECT id, bool_or(loaded) AS loaded \
                   FROM (SELECT id, false AS loaded FROM nearest \
                         UNION ALL SELECT id, true FROM words_found \
                         UNION ALL SELECT unnest($12::uuid[]), true \
                         UNION ALL SELECT unnest($13::uuid[]), false) AS each_asked \
                   GROUP BY id) AS asked \
             JOIN space_entries r ON r.id = asked.id \
             LEFT JOIN nearest n ON n.id = asked.id \
             LEFT JOIN words_found wf ON wf.id = asked.id \
             LEFT JOIN similarity s ON s.id = asked.id) \
         SELECT m.*, v.embedding, w.nearest_kind, w.nearest_score, w.words_kind, w.words_score \
         FROM (SELECT ctid AS row_at, ",
        memory_columns!(),
        " FROM memories WHERE ctid = ANY(ARRAY(SELECT row_at FROM wanted)) \
              AND user_id = $1 AND space = $2) m \
         JOIN wanted w ON w.row_at = m.row_at \
         LEFT JOIN memory_embeddings v ON v.ctid = w.vector_at AND v.user_id = $1"
    );
    let rows = sqlx::query_as::<_, NearestRow>(sql)
        .bind(filter.scope.user_id.as_uuid())
        .bind(filter.scope.space.as_str())
        .bind(words.map(|words| words.query))
        .bind(filter.kind_names())
        .bind(filter.conversation)
        .bind(filter.categories())
        .bind(words.map_or(0.0, |words| words.bm25.k1))
        .bind(words.map_or(0.0, |words| words.bm25.b))
        .bind(limit)
        .bind(filter.include_inactive)
        .bind(Vector::from(query_embedding.to_vec()))
        .bind(load)
        .bind(headings)
        .fetch_all(pool)
        .await?;
    let mut nearest = Vec::new();
    let mut word_hits = Vec::new();
    let mut loaded = Vec::with_capacity(rows.len());
    for row in rows {
        let id = row.candidate.record.id;
        if let (Some(kind), Some(score)) = (row.nearest_kind, row.nearest_score) {
            nearest.push(KindHitRow { id, kind, score });
        }
        if let (Some(kind), Some(score)) = (row.words_kind, row.words_score) {
            word_hits.push(KindHitRow { id, kind, score });
        }
        loaded.push(row.candidate);
    }
    // Each leg's rank order: the highest score first, ties by id, as the statements rank.
    let in_rank_order = |mut hits: Vec<Vec<Hit>>| {
        for kind in &mut hits {
            kind.sort_by(|(a_id, a), (b_id, b)| b.total_cmp(a).then_with(|| a_id.cmp(b_id)));
        }
        hits
    };
    Ok(ExactSearch {
        words: in_rank_order(hits_by_kind(filter, word_hits)),
        nearest: in_rank_order(hits_by_kind(filter, nearest)),
        loaded,
    })
}

/// [`dense_search_kinds`] of one kind.
pub async fn dense_search(
    pool: &PgPool,
    filter: &SearchFilter<'_>,
    query_embedding: &[f32],
    method: DenseMethod,
    limit: i64,
) -> Result<Vec<Hit>, StoreError> {
    let mut hits = dense_search_kinds(pool, &filter.into(), query_embedding, method, limit).await?;
    Ok(hits.pop().unwrap_or_default())
}

/// The HNSW search of one kind.
async fn approximate_dense_search(
    pool: &PgPool,
    filter: SearchFilter<'_>,
    query: &Vector,
    ef_search: u32,
    limit: i64,
) -> Result<Vec<Hit>, StoreError> {
    let mut transaction = crate::begin(pool).await?;
    // Iterative scans keep walking the graph until enough rows pass the space filter;
    // relaxed order is re-sorted below.
    sqlx::query(
        "SELECT set_config('hnsw.iterative_scan', 'relaxed_order', true), \
                set_config('hnsw.ef_search', $1, true)",
    )
    .bind(ef_search.to_string())
    .execute(&mut *transaction)
    .await?;
    // Every filter sits under the LIMIT, so the iterative scan keeps walking until
    // `limit` entries pass all of them (a rare category still fills its candidates).
    let rows = sqlx::query_as::<_, HitRow>(
        "SELECT c.id, (1 - c.distance)::float8 AS score FROM ( \
             SELECT e.memory_id AS id, e.embedding <=> $3 AS distance \
             FROM memory_embeddings e JOIN memories m ON m.user_id = e.user_id AND m.id = e.memory_id \
             WHERE e.user_id = $1 AND e.space = $2 AND e.kind = $4 AND m.invalid_at IS NULL \
               AND ($5::uuid IS NULL OR m.conversation_id = $5) AND ($6::text IS NULL OR m.category = $6) \
           AND ($8 OR m.inactive_since IS NULL) \
             ORDER BY e.embedding <=> $3 LIMIT $7) c \
         ORDER BY c.distance, c.id",
    )
    .bind(filter.scope.user_id.as_uuid())
    .bind(filter.scope.space.as_str())
    .bind(query)
    .bind(filter.kind.as_str())
    .bind(filter.conversation)
    .bind(filter.category)
    .bind(limit)
    .bind(filter.include_inactive)
    .fetch_all(&mut *transaction)
    .await?;
    transaction.commit().await?;
    Ok(hits(rows))
}

/// What decides whether and how a space is searched.
#[derive(Debug, Clone, Copy, PartialEq, sqlx::FromRow)]
pub struct RetrievalContext {
    pub memory_enabled: bool,
    /// The conversation is incognito (explicitly, or by the space's default).
    pub incognito: bool,
    pub memory_count: i64,
}

pub async fn context(
    pool: &PgPool,
    scope: &Scope,
    conversation: Option<ConversationId>,
) -> Result<RetrievalContext, StoreError> {
    let context = sqlx::query_as::<_, RetrievalContext>(
        "SELECT COALESCE(s.memory_enabled, true) AS memory_enabled, \
                CASE WHEN $3::uuid IS NULL THEN false ELSE COALESCE( \
                    (SELECT c.incognito FROM conversations c \
                      WHERE c.user_id = $1 AND c.space = $2 AND c.conversation_id = $3), \
                    s.incognito_default, false) END AS incognito, \
                COALESCE(s.memory_count, 0) AS memory_count \
         FROM (SELECT 1) AS one LEFT JOIN spaces s ON s.user_id = $1 AND s.space = $2",
    )
    .bind(scope.user_id.as_uuid())
    .bind(scope.space.as_str())
    .bind(conversation.map(|c| c.as_uuid()))
    .fetch_one(pool)
    .await?;
    Ok(context)
}

/// A candidate loaded for ranking: the entry and its embedding (MMR compares candidates by it).
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct LoadedCandidate {
    #[sqlx(flatten)]
    pub record: MemoryRecord,
    pub embedding: Option<Vector>,
}

/// Loads entries of the space (ids of other spaces are simply not found): `candidates` with
/// their embeddings (MMR compares them), `headings` without (entries wanted for their record
/// alone, such as the episode holding a line shown).
pub async fn load_candidates(
    pool: &PgPool,
    scope: &Scope,
    candidates: &[Uuid],
    headings: &[Uuid],
) -> Result<Vec<LoadedCandidate>, StoreError> {
    if candidates.is_empty() && headings.is_empty() {
        return Ok(Vec::new());
    }
    let sql = concat!(
        "SELECT m.*, e.embedding FROM (SELECT ",
        memory_columns!(),
        " FROM memories WHERE user_id = $1 AND space = $2 AND id = ANY($3::uuid[] || $4::uuid[])) m \
         LEFT JOIN memory_embeddings e ON e.user_id = $1 AND e.memory_id = m.id AND m.id = ANY($3)"
    );
    let candidates = sqlx::query_as::<_, LoadedCandidate>(sql)
        .bind(scope.user_id.as_uuid())
        .bind(scope.space.as_str())
        .bind(candidates)
        .bind(headings)
        .fetch_all(pool)
        .await?;
    Ok(candidates)
}

/// One row of `retrieval_metrics`.
#[derive(Debug, Clone, Default)]
pub struct RetrievalMetrics {
    pub query: String,
    pub sparse_hits: i32,
    pub dense_hits: i32,
    pub trigram_hits: i32,
    pub used_fallback: bool,
    pub retrieval_path: String,
    pub ranking_profile: String,
    pub scope_widened: bool,
    pub context_items: i32,
    pub estimated_tokens: i32,
    pub truncated: bool,
    pub latency_embed_ms: Option<f32>,
    pub latency_retrieval_ms: f32,
    pub error_stage: Option<String>,
}

/// Leaves the review of the episodes a retrieval returned pending for the conversation, appended
/// under the conversation's row lock so that concurrent retrievals never lose one. The review
/// service needs it when the segment closes: it is written before the response returns.
pub async fn record_pending_review(
    pool: &PgPool,
    scope: &Scope,
    conversation: Uuid,
    query: &str,
    memory_ids: &[Uuid],
    retrieved_at: DateTime<Utc>,
) -> Result<(), StoreError> {
    if memory_ids.is_empty() {
        return Ok(());
    }
    sqlx::query(
        "INSERT INTO conversations (user_id, space, conversation_id, pending_reviews) \
         SELECT $1, $2, $3, jsonb_build_array(jsonb_build_object( \
             'query', $4::text, 'memory_ids', to_jsonb($5::uuid[]), 'retrieved_at', $6::timestamptz)) \
         ON CONFLICT (user_id, space, conversation_id) DO UPDATE SET \
             pending_reviews = COALESCE(conversations.pending_reviews, '[]'::jsonb) || EXCLUDED.pending_reviews, \
             updated_at = now()",
    )
    .bind(scope.user_id.as_uuid())
    .bind(scope.space.as_str())
    .bind(conversation)
    .bind(query)
    .bind(memory_ids)
    .bind(retrieved_at)
    .execute(pool)
    .await?;
    Ok(())
}

/// What one retrieval leaves behind besides its pending review: the note that it returned these
/// entries (retention leaves entries in use alone), their new cached scores, and its metrics row.
/// Written in batches of many retrievals by [`write_read_traces`].
#[derive(Debug, Clone)]
pub struct ReadTrace {
    pub scope: Scope,
    pub retrieved_at: DateTime<Utc>,
    /// Every entry returned.
    pub returned: Vec<Uuid>,
    /// The new `last_scores` of the returned entries the ranking scored; the writer keeps those
    /// that replace missing, stale or lower cached ones.
    pub scores: Vec<(Uuid, Scores)>,
    /// The metrics row, with the conversation asked from (none for ContextPreRetrieve).
    pub metrics: Option<(Option<Uuid>, RetrievalMetrics)>,
}

/// Writes the traces of many retrievals: two statements whatever their number. None waits for
/// a row lock: a row another transaction holds is skipped (its holder is about as fresh), so the
/// writes never deadlock with each other or with the write path.
pub async fn write_read_traces(pool: &PgPool, traces: &[ReadTrace]) -> Result<(), StoreError> {
    write_retention_traces(pool, traces).await?;
    write_metrics_rows(pool, traces).await
}

/// What a batch leaves on one entry: when it was last returned, and the scores with the highest
/// total any of its retrievals gave it (none when none scored it).
struct EntryTrace {
    returned_at: DateTime<Utc>,
    scores: Option<Scores>,
}

impl EntryTrace {
    /// Two retrievals' traces of one entry as one: the later time, the higher total.
    fn merge(&mut self, other: Self) {
        self.returned_at = self.returned_at.max(other.returned_at);
        let higher = match (&self.scores, &other.scores) {
            (Some(kept), Some(new)) => new.total > kept.total,
            (None, Some(_)) => true,
            _ => false,
        };
        if higher {
            self.scores = other.scores;
        }
    }
}

/// The batch's notes that entries were returned and their new cached scores, in one update of
/// each entry's retention row (`write_retention_traces.sql` decides which of the two are due).
async fn write_retention_traces(pool: &PgPool, traces: &[ReadTrace]) -> Result<(), StoreError> {
    // In key order: the batch's index descents walk the primary key forwards, and concurrent
    // batches (another replica's) take their row locks in the same order. A B-tree also grows
    // without rehashing a whole table of a few hundred entries (fresh pages the kernel zeroed
    // showed in the profile).
    let mut entries: BTreeMap<(Uuid, Uuid), (&str, EntryTrace)> = BTreeMap::new();
    for trace in traces {
        let mut scores: HashMap<Uuid, &Scores> =
            trace.scores.iter().map(|(id, s)| (*id, s)).collect();
        for id in &trace.returned {
            let entry = EntryTrace {
                returned_at: trace.retrieved_at,
                scores: scores.remove(id).cloned(),
            };
            match entries.entry((trace.scope.user_id.as_uuid(), *id)) {
                Entry::Vacant(slot) => {
                    slot.insert((trace.scope.space.as_str(), entry));
                }
                Entry::Occupied(mut slot) => slot.get_mut().1.merge(entry),
            }
        }
    }
    if entries.is_empty() {
        return Ok(());
    }
    let mut columns = (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for ((user, id), (space, entry)) in entries {
        columns.0.push(user);
        columns.1.push(space);
        columns.2.push(id);
        columns.3.push(entry.returned_at);
        columns
            .4
            .push(entry.scores.and_then(|s| serde_json::to_value(s).ok()));
    }
    sqlx::query(include_str!("retrieval/write_retention_traces.sql"))
        .bind(&columns.0)
        .bind(&columns.1)
        .bind(&columns.2)
        .bind(&columns.3)
        .bind(&columns.4)
        .bind(crate::retention::RETURNED_REFRESH_SECS)
        .bind(engram_core::capacity::SCORES_REFRESH.as_secs_f64())
        .execute(pool)
        .await?;
    Ok(())
}

/// The batch's metrics rows, one per retrieval with side effects.
async fn write_metrics_rows(pool: &PgPool, traces: &[ReadTrace]) -> Result<(), StoreError> {
    let rows: Vec<(&ReadTrace, Option<Uuid>, &RetrievalMetrics)> = traces
        .iter()
        .filter_map(|trace| {
            let (conversation, metrics) = trace.metrics.as_ref()?;
            Some((trace, *conversation, metrics))
        })
        .collect();
    if rows.is_empty() {
        return Ok(());
    }
    // One array per column, in the statement's order.
    let metric = |field: fn(&RetrievalMetrics) -> i32| -> Vec<i32> {
        rows.iter().map(|(_, _, m)| field(m)).collect()
    };
    let flag = |field: fn(&RetrievalMetrics) -> bool| -> Vec<bool> {
        rows.iter().map(|(_, _, m)| field(m)).collect()
    };
    let text = |field: fn(&RetrievalMetrics) -> &str| -> Vec<&str> {
        rows.iter().map(|(_, _, m)| field(m)).collect()
    };
    let users: Vec<Uuid> = rows
        .iter()
        .map(|(t, _, _)| t.scope.user_id.as_uuid())
        .collect();
    let spaces: Vec<&str> = rows
        .iter()
        .map(|(t, _, _)| t.scope.space.as_str())
        .collect();
    let conversations: Vec<Option<Uuid>> = rows.iter().map(|(_, c, _)| *c).collect();
    let times: Vec<DateTime<Utc>> = rows.iter().map(|(t, _, _)| t.retrieved_at).collect();
    let embed_ms: Vec<Option<f32>> = rows.iter().map(|(_, _, m)| m.latency_embed_ms).collect();
    let retrieval_ms: Vec<f32> = rows
        .iter()
        .map(|(_, _, m)| m.latency_retrieval_ms)
        .collect();
    let error_stages: Vec<Option<&str>> = rows
        .iter()
        .map(|(_, _, m)| m.error_stage.as_deref())
        .collect();
    sqlx::query(include_str!("retrieval/write_metrics_rows.sql"))
        .bind(&users)
        .bind(&spaces)
        .bind(&conversations)
        .bind(&times)
        .bind(text(|m| &m.query))
        .bind(metric(|m| m.sparse_hits))
        .bind(metric(|m| m.dense_hits))
        .bind(metric(|m| m.trigram_hits))
        .bind(flag(|m| m.used_fallback))
        .bind(text(|m| &m.retrieval_path))
        .bind(text(|m| &m.ranking_profile))
        .bind(flag(|m| m.scope_widened))
        .bind(metric(|m| m.context_items))
        .bind(metric(|m| m.estimated_tokens))
        .bind(flag(|m| m.truncated))
        .bind(&embed_ms)
        .bind(&retrieval_ms)
        .bind(&error_stages)
        .execute(pool)
        .await?;
    Ok(())
}

/// The facts that these facts superseded (`superseded_by` one of them), newest first.
pub async fn superseded_by(
    pool: &PgPool,
    scope: &Scope,
    facts: &[Uuid],
) -> Result<Vec<MemoryRecord>, StoreError> {
    if facts.is_empty() {
        return Ok(Vec::new());
    }
    let records = sqlx::query_as(concat!(
        "SELECT ",
        memory_columns!(),
        " FROM memories WHERE user_id = $1 AND space = $2 AND kind = 'semantic' \
           AND superseded_by = ANY($3::uuid[]) \
         ORDER BY invalid_at DESC, id"
    ))
    .bind(scope.user_id.as_uuid())
    .bind(scope.space.as_str())
    .bind(facts)
    .fetch_all(pool)
    .await?;
    Ok(records)
}
