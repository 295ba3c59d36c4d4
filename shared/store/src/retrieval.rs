//! The statements of retrieval: the sparse leg (Okapi BM25 over `search_document`), the trigram
//! fallback, the dense leg (exact or HNSW), loading the candidates, and the
//! side effects of a retrieval in one statement. Every statement is bound to one (user, space).

use chrono::{DateTime, Utc};
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

/// Okapi BM25 of the entries holding any word of the query. N, df and the average length come
/// from the whole collection (the space's active entries of the kind), whatever the conversation
/// or category filter, so a score means the same in both scopes.
pub async fn sparse_search(
    pool: &PgPool,
    filter: &SearchFilter<'_>,
    query: &str,
    bm25: Bm25,
    limit: i64,
) -> Result<Vec<Hit>, StoreError> {
    let rows = sqlx::query_as::<_, HitRow>(
        "WITH query AS ( \
             SELECT engram_any_word_query($3) AS words, \
                    ARRAY(SELECT lexeme FROM unnest(engram_search_words($3))) AS terms), \
         corpus AS MATERIALIZED ( \
             SELECT count(*)::float8 AS documents, coalesce(avg(search_length), 0)::float8 AS average_length \
             FROM memories WHERE user_id = $1 AND space = $2 AND kind = $4 AND invalid_at IS NULL \
               AND ($10 OR inactive_since IS NULL)), \
         matched AS MATERIALIZED ( \
             SELECT m.id, m.conversation_id, m.category, m.search_length, m.search_document \
             FROM memories m, query \
             WHERE m.user_id = $1 AND m.space = $2 AND m.kind = $4 AND m.invalid_at IS NULL \
               AND ($10 OR m.inactive_since IS NULL) AND m.search_document @@ query.words), \
         postings AS ( \
             SELECT matched.id, t.lexeme AS term, cardinality(t.positions)::float8 AS frequency, \
                    matched.search_length::float8 AS length \
             FROM matched CROSS JOIN LATERAL unnest(matched.search_document) AS t, query \
             WHERE t.lexeme = ANY(query.terms)), \
         document_frequency AS (SELECT term, count(*)::float8 AS df FROM postings GROUP BY term) \
         SELECT p.id, sum(ln(1 + (c.documents - d.df + 0.5) / (d.df + 0.5)) * p.frequency * ($7 + 1) \
                  / (p.frequency + $7 * (1 - $8 + $8 * p.length / greatest(c.average_length, 1))))::float8 AS score \
         FROM postings p JOIN document_frequency d USING (term) JOIN matched m ON m.id = p.id CROSS JOIN corpus c \
         WHERE ($5::uuid IS NULL OR m.conversation_id = $5) AND ($6::text IS NULL OR m.category = $6) \
         GROUP BY p.id ORDER BY score DESC, p.id LIMIT $9",
    )
    .bind(filter.scope.user_id.as_uuid())
    .bind(filter.scope.space.as_str())
    .bind(query)
    .bind(filter.kind.as_str())
    .bind(filter.conversation)
    .bind(filter.category)
    .bind(bm25.k1)
    .bind(bm25.b)
    .bind(limit)
    .bind(filter.include_inactive)
    .fetch_all(pool)
    .await?;
    Ok(hits(rows))
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

/// Nearest entries by cosine similarity to the query embedding (score = cosine similarity).
pub async fn dense_search(
    pool: &PgPool,
    filter: &SearchFilter<'_>,
    query_embedding: &[f32],
    method: DenseMethod,
    limit: i64,
) -> Result<Vec<Hit>, StoreError> {
    let query = Vector::from(query_embedding.to_vec());
    match method {
        DenseMethod::Exact => {
            // Ordering by the similarity (not by the distance operator) keeps the planner off the
            // HNSW index: this reads the collection's vectors through the scope index.
            let rows = sqlx::query_as::<_, HitRow>(
                "SELECT e.memory_id AS id, (1 - (e.embedding <=> $3))::float8 AS score \
                 FROM memory_embeddings e JOIN memories m ON m.user_id = e.user_id AND m.id = e.memory_id \
                 WHERE e.user_id = $1 AND e.space = $2 AND e.kind = $4 AND m.invalid_at IS NULL \
                   AND ($5::uuid IS NULL OR m.conversation_id = $5) AND ($6::text IS NULL OR m.category = $6) \
                   AND ($8 OR m.inactive_since IS NULL) \
                 ORDER BY score DESC, id LIMIT $7",
            )
            .bind(filter.scope.user_id.as_uuid())
            .bind(filter.scope.space.as_str())
            .bind(&query)
            .bind(filter.kind.as_str())
            .bind(filter.conversation)
            .bind(filter.category)
            .bind(limit)
            .bind(filter.include_inactive)
            .fetch_all(pool)
            .await?;
            Ok(hits(rows))
        }
        DenseMethod::Approximate { ef_search } => {
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
            .bind(&query)
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
    }
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

/// Loads the given entries of the space (ids of other spaces are simply not found).
pub async fn load_candidates(
    pool: &PgPool,
    scope: &Scope,
    ids: &[Uuid],
) -> Result<Vec<LoadedCandidate>, StoreError> {
    if ids.is_empty() {
        return Ok(Vec::new());
    }
    let sql = concat!(
        "SELECT m.*, e.embedding FROM (SELECT ",
        memory_columns!(),
        " FROM memories WHERE user_id = $1 AND space = $2 AND id = ANY($3)) m \
         LEFT JOIN memory_embeddings e ON e.user_id = $1 AND e.memory_id = m.id"
    );
    let candidates = sqlx::query_as::<_, LoadedCandidate>(sql)
        .bind(scope.user_id.as_uuid())
        .bind(scope.space.as_str())
        .bind(ids)
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

/// What a retrieval leaves behind, written in one statement: the review it leaves pending for
/// the conversation (appended under the row lock, so concurrent retrievals never lose one), the
/// returned entries' scores, and the metrics row. The note that they were returned (retention)
/// is `retention::note_returned`'s own statement.
#[derive(Debug, Clone, Default)]
pub struct RetrievalRecord {
    pub conversation: Option<Uuid>,
    /// Episodes to review when the conversation segment closes.
    pub reviewed_memory_ids: Vec<Uuid>,
    /// `last_scores` of the returned entries.
    pub scores: Vec<(Uuid, serde_json::Value)>,
    pub metrics: RetrievalMetrics,
}

/// How old cached scores may get before a retrieval that returns the entry rewrites them. A
/// rewrite is cheap (a HOT update of the row and an update of its narrow `memory_retention` row)
/// but not free; the capacity policy only needs scores fresher than a day, and a higher total than
/// the cached one is always written, so the best relevance an entry showed is kept.
const SCORES_REFRESH: std::time::Duration = std::time::Duration::from_secs(3600);

pub async fn record(
    pool: &PgPool,
    scope: &Scope,
    record: &RetrievalRecord,
    retrieved_at: DateTime<Utc>,
) -> Result<(), StoreError> {
    let (score_ids, scores): (Vec<Uuid>, Vec<serde_json::Value>) =
        record.scores.iter().cloned().unzip();
    let metrics = &record.metrics;
    sqlx::query(
        "WITH review AS ( \
             INSERT INTO conversations (user_id, space, conversation_id, pending_reviews) \
             SELECT $1, $2, $3, jsonb_build_array(jsonb_build_object( \
                 'query', $4::text, 'memory_ids', to_jsonb($5::uuid[]), 'retrieved_at', $8::timestamptz)) \
             WHERE $3::uuid IS NOT NULL AND cardinality($5::uuid[]) > 0 \
             ON CONFLICT (user_id, space, conversation_id) DO UPDATE SET \
                 pending_reviews = COALESCE(conversations.pending_reviews, '[]'::jsonb) || EXCLUDED.pending_reviews, \
                 updated_at = now() \
             RETURNING 1), \
         scored AS ( \
             UPDATE memories m SET last_scores = s.scores \
             FROM unnest($6::uuid[], $7::jsonb[]) AS s(id, scores) \
             WHERE m.user_id = $1 AND m.id = s.id AND m.id IN ( \
                 SELECT c.id FROM memories c JOIN unnest($6::uuid[], $7::jsonb[]) AS n(id, scores) ON n.id = c.id \
                 JOIN memory_retention r ON r.user_id = c.user_id AND r.memory_id = c.id \
                 WHERE c.user_id = $1 AND c.space = $2 \
                   AND (r.last_scored_at IS NULL OR r.last_total IS NULL \
                        OR r.last_scored_at < $8::timestamptz - make_interval(secs => $22) \
                        OR r.last_total < (n.scores ->> 'total')::float8) \
                 FOR UPDATE OF c SKIP LOCKED) \
             RETURNING 1) \
         INSERT INTO retrieval_metrics (user_id, space, conversation_id, created_at, query, sparse_hits, \
             dense_hits, trigram_hits, used_fallback, retrieval_path, ranking_profile, scope_widened, \
             context_items, estimated_tokens, truncated, latency_embed_ms, latency_retrieval_ms, error_stage) \
         VALUES ($1, $2, $3, $8, $4, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19, $20, $21)",
    )
    .bind(scope.user_id.as_uuid())
    .bind(scope.space.as_str())
    .bind(record.conversation)
    .bind(&metrics.query)
    .bind(&record.reviewed_memory_ids)
    .bind(&score_ids)
    .bind(&scores)
    .bind(retrieved_at)
    .bind(metrics.sparse_hits)
    .bind(metrics.dense_hits)
    .bind(metrics.trigram_hits)
    .bind(metrics.used_fallback)
    .bind(&metrics.retrieval_path)
    .bind(&metrics.ranking_profile)
    .bind(metrics.scope_widened)
    .bind(metrics.context_items)
    .bind(metrics.estimated_tokens)
    .bind(metrics.truncated)
    .bind(metrics.latency_embed_ms)
    .bind(metrics.latency_retrieval_ms)
    .bind(metrics.error_stage.as_deref())
    .bind(SCORES_REFRESH.as_secs_f64())
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
