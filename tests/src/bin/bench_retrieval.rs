//! Load generator of `make bench-retrieval`.
//!
//! `bench-retrieval seed`  fills the benchmark database: 10,000 spaces (one user each) of 100
//!                         memories, 80 % facts and 20 % episodes, in English and Chinese. Texts
//!                         come from a pool of 10,000 distinct sentences embedded with the local
//!                         model; each memory's vector is its sentence's model embedding plus a
//!                         small deterministic perturbation (so a million distinct vectors cost
//!                         10,000 model calls, and nearest neighbours stay meaningful).
//! `bench-retrieval run`   sends one mixed query set three ways and reports each at a fixed rate
//!                         and at saturation:
//!                         (a) RetrieveMemory over gRPC (the whole pipeline);
//!                         (b) what a user would write instead: embed the query, then one
//!                             hand-written SQL statement fusing a tsvector and a pgvector search;
//!                         (c) the floor: embed the query, then one indexed vector query.
//!                         (b) and (c) embed through the same micro-batching, caching query
//!                         embedder and model as the service.

use std::collections::HashSet;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use engram_e2e::bench::{machine_summary, space_user};
use engram_embed::{Embedder, LocalEmbedder, LocalModelSettings};
use engram_proto::v1;
use engram_proto::v1::retrieval_service_client::RetrievalServiceClient;
use engram_recall::{QueryEmbedder, QueryEmbedderSettings};
use hdrhistogram::Histogram;
use pgvector::Vector;
use rand::rngs::StdRng;
use rand::seq::IndexedRandom as _;
use rand::{Rng as _, SeedableRng as _};
use sqlx::postgres::PgPoolOptions;
use sqlx::{Connection as _, PgConnection, PgPool};
use tokio::sync::Mutex;

const SPACE: &str = "bench";
/// Distinct perturbation vectors; memory n gets number n mod this.
const NOISE_VECTORS: i64 = 997;
/// Norm of a perturbation (model embeddings have norm 1).
const NOISE_NORM: f32 = 0.15;

#[derive(Parser)]
#[command(about = "Engram retrieval benchmark")]
struct Cli {
    #[arg(long, env = "ENGRAM_DATABASE__URL")]
    database_url: String,
    #[arg(long)]
    model_dir: std::path::PathBuf,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Fill the database.
    Seed {
        #[arg(long, default_value_t = 10_000)]
        spaces: i64,
        #[arg(long, default_value_t = 100)]
        per_space: i64,
        #[arg(long, default_value_t = 10_000)]
        pool: usize,
    },
    /// Measure the three ways; write the report.
    Run {
        #[arg(long, default_value = "http://127.0.0.1:50063")]
        endpoint: String,
        #[arg(long, default_value_t = 10_000)]
        spaces: i64,
        /// Fixed offered load, queries per second.
        #[arg(long, default_value_t = 50)]
        rate: u32,
        /// Seconds per measurement.
        #[arg(long, default_value_t = 30)]
        seconds: u64,
        /// Concurrent clients of the saturation runs.
        #[arg(long, default_value_t = 32)]
        concurrency: usize,
        #[arg(long)]
        report: std::path::PathBuf,
        #[arg(long, default_value = "make bench-retrieval")]
        command_line: String,
    },
    /// Make a share of the memories due for deletion by age, then measure RetrieveMemory at a
    /// fixed rate before and while one retention run deletes them; write the report.
    Retention {
        #[arg(long, default_value = "http://127.0.0.1:50064")]
        endpoint: String,
        #[arg(long, default_value_t = 10_000)]
        spaces: i64,
        #[arg(long, default_value_t = 50)]
        rate: u32,
        /// Seconds of the measurement before the run.
        #[arg(long, default_value_t = 30)]
        seconds: u64,
        /// Percentage of the memories made due (by age).
        #[arg(long, default_value_t = 10)]
        due_percent: i32,
        #[arg(long)]
        report: std::path::PathBuf,
        #[arg(long, default_value = "make bench-retention")]
        command_line: String,
    },
}

const SUBJECTS: &[&str] = &[
    "I",
    "My manager",
    "The team",
    "My sister",
    "Our client",
    "The on-call engineer",
    "My doctor",
    "The landlord",
    "My partner",
    "The design lead",
    "Our accountant",
    "My coach",
];
const VERBS: &[&str] = &[
    "prefers",
    "asked for",
    "scheduled",
    "cancelled",
    "recommended",
    "mentioned",
    "moved",
    "reviewed",
    "postponed",
    "approved",
    "complained about",
    "booked",
    "forgot",
    "paid for",
    "signed up for",
    "worried about",
];
const OBJECTS: &[&str] = &[
    "the quarterly report",
    "a dentist appointment",
    "green tea",
    "the Rust rewrite",
    "the Lisbon trip",
    "dark mode",
    "the budget review",
    "the standup",
    "the kitchen renovation",
    "a new laptop",
    "the marathon training plan",
    "the database migration",
    "piano lessons",
    "the insurance claim",
    "the team offsite",
    "a vegetarian diet",
    "the pull request backlog",
    "the wedding venue",
    "the hiring pipeline",
    "a flu shot",
    "the tax return",
    "the car service",
    "the security audit",
    "the product launch",
    "a Spanish course",
    "the rent increase",
    "the conference talk",
    "the garden fence",
    "the on-call rotation",
    "the mortgage offer",
];
const WHEN: &[&str] = &[
    "on Monday",
    "next week",
    "every Friday at 10am",
    "before the release",
    "in March",
    "after lunch",
    "tomorrow",
    "at 4pm",
    "last month",
    "over the weekend",
    "in the morning",
    "before Christmas",
];
const ZH_SUBJECTS: &[&str] = &["我", "我的经理", "团队", "我姐姐", "客户", "房东"];
const ZH_VERBS: &[&str] = &["安排了", "取消了", "推荐了", "提到了", "推迟了", "批准了"];
const ZH_OBJECTS: &[&str] = &[
    "季度报告",
    "牙医预约",
    "绿茶",
    "预算评审",
    "里斯本之行",
    "厨房装修",
    "数据库迁移",
    "钢琴课",
    "保险理赔",
    "团建活动",
    "婚礼场地",
    "招聘流程",
    "税务申报",
    "产品发布",
];
const ZH_WHEN: &[&str] = &[
    "周一",
    "下周",
    "每周五上午十点",
    "发布之前",
    "三月",
    "周末",
    "明天",
];

/// A sentence of the pool: one in ten Chinese.
fn sentence(rng: &mut StdRng) -> (String, String) {
    if rng.random_bool(0.1) {
        let object = ZH_OBJECTS.choose(rng).unwrap();
        let text = format!(
            "{}{}{}{}",
            ZH_SUBJECTS.choose(rng).unwrap(),
            ZH_WHEN.choose(rng).unwrap(),
            ZH_VERBS.choose(rng).unwrap(),
            object
        );
        (text, format!("关于{object}"))
    } else {
        let object = OBJECTS.choose(rng).unwrap();
        let text = format!(
            "{} {} {} {}",
            SUBJECTS.choose(rng).unwrap(),
            VERBS.choose(rng).unwrap(),
            object,
            WHEN.choose(rng).unwrap()
        );
        (text, format!("About {object}"))
    }
}

async fn seed(
    url: &str,
    model_dir: &std::path::Path,
    spaces: i64,
    per_space: i64,
    pool_size: usize,
) -> anyhow::Result<()> {
    let started = Instant::now();
    let mut connection = PgConnection::connect(url).await?;
    // Two statements: a query naming bench_pool fails at parse time on a fresh database, whatever
    // its WHERE clause says.
    let pool_exists: bool = sqlx::query_scalar("SELECT to_regclass('bench_pool') IS NOT NULL")
        .fetch_one(&mut connection)
        .await?;
    let pooled: Option<i64> = if pool_exists {
        Some(
            sqlx::query_scalar("SELECT count(*) FROM bench_pool")
                .fetch_one(&mut connection)
                .await?,
        )
    } else {
        None
    };
    if pooled != Some(pool_size as i64) {
        seed_pool(&mut connection, model_dir, pool_size).await?;
    }

    seed_memories(&mut connection, spaces, per_space, pool_size, started).await
}

/// The sentence pool embedded with the local model, and the perturbation vectors (kept in the
/// database, so a failed seed does not embed again).
async fn seed_pool(
    connection: &mut PgConnection,
    model_dir: &std::path::Path,
    pool_size: usize,
) -> anyhow::Result<()> {
    let started = Instant::now();
    let mut rng = StdRng::seed_from_u64(42);
    sqlx::query("DROP TABLE IF EXISTS bench_pool, bench_noise")
        .execute(&mut *connection)
        .await?;
    let mut seen = HashSet::new();
    let mut pool: Vec<(String, String)> = Vec::with_capacity(pool_size);
    while pool.len() < pool_size {
        let (text, title) = sentence(&mut rng);
        if seen.insert(text.clone()) {
            pool.push((text, title));
        }
    }
    let model_dir = model_dir.to_owned();
    let texts: Vec<String> = pool.iter().map(|(text, _)| text.clone()).collect();
    eprintln!(
        "embedding {} pool sentences with the local model",
        texts.len()
    );
    let vectors = tokio::task::spawn_blocking(move || -> anyhow::Result<Vec<Vec<f32>>> {
        let model = LocalEmbedder::load(&LocalModelSettings {
            model_dir,
            max_batch: 32,
            max_tokens: 256,
            inference_nice: 0,
            yield_to_requests: None,
        })?;
        let mut vectors = Vec::with_capacity(texts.len());
        for chunk in texts.chunks(32) {
            vectors.extend(model.embed_blocking(chunk)?);
        }
        Ok(vectors)
    })
    .await??;
    eprintln!("pool embedded ({:.0?})", started.elapsed());

    sqlx::query("CREATE TABLE bench_pool (n bigint PRIMARY KEY, text text NOT NULL, title text NOT NULL, embedding vector(384) NOT NULL)")
        .execute(&mut *connection)
        .await?;
    sqlx::query("CREATE TABLE bench_noise (n bigint PRIMARY KEY, embedding vector(384) NOT NULL)")
        .execute(&mut *connection)
        .await?;
    for (n, ((text, title), vector)) in pool.iter().zip(&vectors).enumerate() {
        sqlx::query("INSERT INTO bench_pool VALUES ($1, $2, $3, $4)")
            .bind(n as i64)
            .bind(text)
            .bind(title)
            .bind(Vector::from(vector.clone()))
            .execute(&mut *connection)
            .await?;
    }
    for n in 0..NOISE_VECTORS {
        let raw: Vec<f32> = (0..384).map(|_| rng.random_range(-1.0f32..1.0)).collect();
        let norm = raw.iter().map(|x| x * x).sum::<f32>().sqrt();
        let noise: Vec<f32> = raw.iter().map(|x| x / norm * NOISE_NORM).collect();
        sqlx::query("INSERT INTO bench_noise VALUES ($1, $2)")
            .bind(n)
            .bind(Vector::from(noise))
            .execute(&mut *connection)
            .await?;
    }
    Ok(())
}

async fn seed_memories(
    connection: &mut PgConnection,
    spaces: i64,
    per_space: i64,
    pool_size: usize,
    started: Instant,
) -> anyhow::Result<()> {
    // A seed that failed halfway starts over (the pool is kept).
    sqlx::query("TRUNCATE memory_embeddings, memories, spaces")
        .execute(&mut *connection)
        .await?;
    // Memories, in chunks of spaces. Memory i of space s uses pool sentence (s·per_space + i)·7919
    // mod pool: 7919 is prime, so the sentences of one space are distinct.
    sqlx::query("DROP INDEX IF EXISTS memory_embeddings_hnsw")
        .execute(&mut *connection)
        .await?;
    const CHUNK: i64 = 500;
    let mut first = 0;
    while first < spaces {
        let last = (first + CHUNK).min(spaces);
        sqlx::query(
            "INSERT INTO memories (id, user_id, space, kind, conversation_id, text, category, valid_at, \
                 title, messages, surprise, start_at, end_at, stability, difficulty, last_reviewed_at, \
                 simhash, importance, needs_embedding, embedding_model, embedded_at, created_at, updated_at) \
             SELECT gen_random_uuid(), ('00000000-0000-4000-8000-' || lpad(s::text, 12, '0'))::uuid, $3, \
                    CASE WHEN episodic THEN 'episodic' ELSE 'semantic' END, \
                    CASE WHEN episodic THEN gen_random_uuid() END, p.text, \
                    CASE WHEN episodic THEN NULL ELSE 'fact' END, CASE WHEN episodic THEN NULL ELSE created END, \
                    CASE WHEN episodic THEN p.title END, \
                    CASE WHEN episodic THEN jsonb_build_array(jsonb_build_object('role', 'user', 'content', p.text)) END, \
                    CASE WHEN episodic THEN (i % 10) / 10.0 END, \
                    CASE WHEN episodic THEN created END, CASE WHEN episodic THEN created END, \
                    CASE WHEN episodic THEN 1.0 + i % 30 END, CASE WHEN episodic THEN 5.0 END, \
                    CASE WHEN episodic THEN created END, \
                    (floor(random() * 4294967296)::bigint << 32) | floor(random() * 4294967296)::bigint, \
                    0.2 + (i % 7) / 10.0, false, 'all-MiniLM-L6-v2', now(), created, now() \
             FROM generate_series($1, $2 - 1) AS s, generate_series(0, $4 - 1) AS i, bench_pool p, \
                  LATERAL (SELECT i % 5 = 0 AS episodic, \
                                  now() - ((s * 31 + i * 17) % 180) * interval '1 day' AS created) r \
             WHERE p.n = ((s * $4 + i) * 7919) % $5",
        )
        .bind(first)
        .bind(last)
        .bind(SPACE)
        .bind(per_space)
        .bind(pool_size as i64)
        .execute(&mut *connection)
        .await
        .context("seeding memories")?;
        first = last;
        eprintln!("seeded {first}/{spaces} spaces ({:.0?})", started.elapsed());
    }
    eprintln!("embeddings: the pool vector of each memory plus its perturbation");
    sqlx::query(
        "INSERT INTO memory_embeddings (memory_id, user_id, space, kind, embedding) \
         SELECT m.id, m.user_id, m.space, m.kind, p.embedding + z.embedding \
         FROM (SELECT id, user_id, space, kind, text, row_number() OVER () AS n FROM memories) m \
         JOIN bench_pool p ON p.text = m.text \
         JOIN bench_noise z ON z.n = m.n % $1",
    )
    .bind(NOISE_VECTORS)
    .execute(&mut *connection)
    .await
    .context("seeding embeddings")?;
    eprintln!("building the HNSW index ({:.0?})", started.elapsed());
    sqlx::query("SET maintenance_work_mem = '6GB'")
        .execute(&mut *connection)
        .await?;
    sqlx::query("SET max_parallel_maintenance_workers = 2")
        .execute(&mut *connection)
        .await?;
    sqlx::query(
        "CREATE INDEX memory_embeddings_hnsw ON memory_embeddings USING hnsw (embedding vector_cosine_ops)",
    )
    .execute(&mut *connection)
    .await?;
    engram_e2e::bench::settle_seed(&mut *connection).await?;
    eprintln!(
        "seeded {} memories in {:.0?}",
        spaces * per_space,
        started.elapsed()
    );
    Ok(())
}

/// One query of the mixed set.
#[derive(Clone)]
struct Query {
    user: String,
    text: String,
}

/// The mixed query set: words of one of the space's own memories, questions in other words,
/// popular repeated questions (served from the embedding cache), and Chinese.
async fn query_set(pool: &PgPool, spaces: i64, count: usize) -> anyhow::Result<Vec<Query>> {
    let mut rng = StdRng::seed_from_u64(7);
    let mut queries = Vec::with_capacity(count);
    let popular: Vec<String> = OBJECTS
        .iter()
        .take(10)
        .map(|object| format!("what do you remember about {object}?"))
        .collect();
    while queries.len() < count {
        let space = rng.random_range(0..spaces);
        let user = space_user(space);
        let roll: f64 = rng.random();
        let text = if roll < 0.4 {
            // Words of one of the space's memories.
            let text: String = sqlx::query_scalar(
                "SELECT text FROM memories WHERE user_id = $1::uuid AND space = $2 ORDER BY id LIMIT 1 OFFSET $3",
            )
            .bind(&user)
            .bind(SPACE)
            .bind(rng.random_range(0..50i64))
            .fetch_one(pool)
            .await?;
            if text.is_ascii() {
                text.split_whitespace()
                    .skip(1)
                    .take(4)
                    .collect::<Vec<_>>()
                    .join(" ")
            } else {
                text.chars().skip(2).take(6).collect()
            }
        } else if roll < 0.7 {
            format!(
                "when did {} talk about {}?",
                SUBJECTS.choose(&mut rng).unwrap().to_lowercase(),
                OBJECTS.choose(&mut rng).unwrap()
            )
        } else if roll < 0.9 {
            popular.choose(&mut rng).unwrap().clone()
        } else {
            format!("之前说过的{}", ZH_OBJECTS.choose(&mut rng).unwrap())
        };
        queries.push(Query { user, text });
    }
    Ok(queries)
}

type Call =
    Arc<dyn Fn(Query) -> Pin<Box<dyn Future<Output = anyhow::Result<()>> + Send>> + Send + Sync>;

struct Measurement {
    histogram: Histogram<u64>,
    elapsed: Duration,
    errors: u64,
}

impl Measurement {
    fn qps(&self) -> f64 {
        self.histogram.len() as f64 / self.elapsed.as_secs_f64()
    }
}

fn new_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 120_000_000, 3).expect("valid bounds")
}

/// Open loop: one query every 1/rate seconds; latency counts from when each was due.
async fn at_rate(call: &Call, queries: &[Query], rate: u32, seconds: u64) -> Measurement {
    let histogram = Arc::new(Mutex::new(new_histogram()));
    let errors = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let period = Duration::from_secs_f64(1.0 / f64::from(rate));
    let total = u64::from(rate) * seconds;
    let started = tokio::time::Instant::now();
    let mut tasks = Vec::with_capacity(total as usize);
    for n in 0..total {
        let due = started + period * n as u32;
        tokio::time::sleep_until(due).await;
        let call = call.clone();
        let query = queries[n as usize % queries.len()].clone();
        let histogram = histogram.clone();
        let errors = errors.clone();
        tasks.push(tokio::spawn(async move {
            let result = call(query).await;
            let micros = due.elapsed().as_micros() as u64;
            histogram
                .lock()
                .await
                .record(micros.max(1))
                .expect("in range");
            if let Err(error) = result
                && errors.fetch_add(1, std::sync::atomic::Ordering::Relaxed) < 3
            {
                eprintln!("query failed: {error:#}");
            }
        }));
    }
    for task in tasks {
        let _ = task.await;
    }
    Measurement {
        histogram: Arc::try_unwrap(histogram).expect("tasks done").into_inner(),
        elapsed: started.elapsed(),
        errors: errors.load(std::sync::atomic::Ordering::Relaxed),
    }
}

/// Closed loop: `concurrency` clients each sending the next query as soon as the last returned.
async fn saturated(
    call: &Call,
    queries: &[Query],
    concurrency: usize,
    seconds: u64,
) -> Measurement {
    let histogram = Arc::new(Mutex::new(new_histogram()));
    let errors = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let queries = Arc::new(queries.to_vec());
    let started = Instant::now();
    let deadline = started + Duration::from_secs(seconds);
    let mut tasks = Vec::new();
    for _ in 0..concurrency {
        let (call, histogram, errors, next, queries) = (
            call.clone(),
            histogram.clone(),
            errors.clone(),
            next.clone(),
            queries.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let mut local = new_histogram();
            while Instant::now() < deadline {
                let n = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let sent = Instant::now();
                if call(queries[n % queries.len()].clone()).await.is_err() {
                    errors.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
                local
                    .record((sent.elapsed().as_micros() as u64).max(1))
                    .expect("in range");
            }
            histogram.lock().await.add(&local).expect("same bounds");
        }));
    }
    for task in tasks {
        let _ = task.await;
    }
    Measurement {
        histogram: Arc::try_unwrap(histogram).expect("tasks done").into_inner(),
        elapsed: started.elapsed(),
        errors: errors.load(std::sync::atomic::Ordering::Relaxed),
    }
}

/// (b): a hybrid query as a user would write it: websearch tsquery ranked by ts_rank, pgvector
/// cosine, both within the space, fused by RRF in SQL, top 25 with their text.
const HAND_WRITTEN_SQL: &str = "\
WITH q AS (SELECT websearch_to_tsquery('english', replace($4, ' ', ' or ')) AS words), \
sparse AS ( \
    SELECT m.id, row_number() OVER (ORDER BY ts_rank(m.search_document, q.words) DESC) AS r \
    FROM memories m, q \
    WHERE m.user_id = $1::uuid AND m.space = $2 AND m.search_document @@ q.words \
    ORDER BY ts_rank(m.search_document, q.words) DESC LIMIT 100), \
dense AS MATERIALIZED ( \
    SELECT e.memory_id AS id, row_number() OVER (ORDER BY e.embedding <=> $3) AS r \
    FROM memory_embeddings e WHERE e.user_id = $1::uuid AND e.space = $2 \
    ORDER BY e.embedding <=> $3 LIMIT 100), \
fused AS ( \
    SELECT coalesce(s.id, d.id) AS id, \
           coalesce(1.0 / (60 + s.r), 0) + coalesce(1.0 / (60 + d.r), 0) AS score \
    FROM sparse s FULL OUTER JOIN dense d ON s.id = d.id) \
SELECT m.id, m.kind, m.title, m.text, f.score::float8 \
FROM fused f JOIN memories m ON m.user_id = $1::uuid AND m.id = f.id \
ORDER BY f.score DESC LIMIT 25";

/// (c): the floor: one indexed vector query within the space.
const FLOOR_SQL: &str = "\
WITH space AS MATERIALIZED ( \
    SELECT memory_id, embedding FROM memory_embeddings WHERE user_id = $1::uuid AND space = $2) \
SELECT memory_id FROM space ORDER BY embedding <=> $3 LIMIT 25";

/// (b) and (c): the query embedded by the same micro-batching, caching embedder as the service,
/// then one SQL statement ($1 user, $2 space, $3 query embedding, and $4 the query text when
/// `with_text`).
fn embed_then_sql(
    pool: PgPool,
    embedder: QueryEmbedder,
    sql: &'static str,
    with_text: bool,
) -> Call {
    Arc::new(move |query: Query| {
        let (pool, embedder) = (pool.clone(), embedder.clone());
        Box::pin(async move {
            let vector = embedder
                .embed(&query.text)
                .await
                .map_err(anyhow::Error::msg)?;
            let mut statement = sqlx::query(sql)
                .bind(&query.user)
                .bind(SPACE)
                .bind(Vector::from(vector.as_ref().clone()));
            if with_text {
                statement = statement.bind(&query.text);
            }
            let rows = statement.fetch_all(&pool).await?;
            anyhow::ensure!(!rows.is_empty(), "no rows");
            Ok(())
        })
    })
}

fn millis(micros: u64) -> String {
    format!("{:.1} ms", micros as f64 / 1000.0)
}

fn row(name: &str, load: &str, m: &Measurement) -> String {
    let h = &m.histogram;
    format!(
        "| {name} | {load} | {} | {:.0} | {} | {} | {} | {} | {} |",
        h.len(),
        m.qps(),
        millis(h.value_at_quantile(0.5)),
        millis(h.value_at_quantile(0.95)),
        millis(h.value_at_quantile(0.99)),
        millis(h.max()),
        m.errors
    )
}

/// (a): RetrieveMemory over gRPC with default settings; an answer the dense leg did not serve
/// counts as an error (the benchmark measures the hybrid pipeline, not its fallback).
async fn retrieve_call(endpoint: &str) -> anyhow::Result<Call> {
    let channel = tonic::transport::Channel::from_shared(endpoint.to_owned())?
        .connect()
        .await?;
    Ok(Arc::new(move |query: Query| {
        let mut client = RetrievalServiceClient::new(channel.clone());
        Box::pin(async move {
            let response = client
                .retrieve_memory(v1::RetrieveMemoryRequest {
                    scope: Some(v1::Scope {
                        user_id: query.user,
                        space: SPACE.into(),
                    }),
                    query: query.text,
                    ..Default::default()
                })
                .await?
                .into_inner();
            anyhow::ensure!(
                response
                    .served_by
                    .is_some_and(|s| !s.used_fallback || s.dense_hits > 0),
                "the dense leg did not serve"
            );
            Ok(())
        })
    }))
}

#[allow(clippy::too_many_arguments)]
async fn run(
    url: &str,
    model_dir: &std::path::Path,
    endpoint: &str,
    spaces: i64,
    rate: u32,
    seconds: u64,
    concurrency: usize,
    report: &std::path::Path,
    command_line: &str,
) -> anyhow::Result<()> {
    let pool = PgPoolOptions::new()
        .max_connections(16)
        .connect(url)
        .await?;
    let memories: i64 = sqlx::query_scalar("SELECT count(*) FROM memories")
        .fetch_one(&pool)
        .await?;
    // Whether requests will also rewrite cached scores: a fresh seed has none, and a retrieval
    // rewrites missing, hour-old or lower scores of the entries it returns.
    let fresh_scores: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM memories WHERE engram_cached_at(last_scores) > now() - interval '1 hour'",
    )
    .fetch_one(&pool)
    .await?;
    let queries = query_set(&pool, spaces, 20_000).await?;
    let distinct = queries
        .iter()
        .map(|q| q.text.as_str())
        .collect::<HashSet<_>>()
        .len();

    let service = retrieve_call(endpoint).await?;

    let model_dir = model_dir.to_owned();
    let model = tokio::task::spawn_blocking(move || {
        LocalEmbedder::load(&LocalModelSettings {
            model_dir,
            max_batch: 32,
            max_tokens: 256,
            inference_nice: 0,
            yield_to_requests: None,
        })
    })
    .await??;
    let embedder = QueryEmbedder::start(
        Arc::new(model) as Arc<dyn Embedder>,
        QueryEmbedderSettings {
            max_batch: 32,
            cache_entries: 10_000,
            timeout: Duration::from_secs(10),
        },
    );
    let hand_written = embed_then_sql(pool.clone(), embedder.clone(), HAND_WRITTEN_SQL, true);
    let floor = embed_then_sql(pool.clone(), embedder.clone(), FLOOR_SQL, false);

    // Warm the caches of Postgres and of the model once, then measure each way at the fixed load
    // and at saturation, each over a different slice of the query set (no way is handed another
    // way's cached embeddings).
    eprintln!("warming up");
    let _ = at_rate(&service, &queries[..200], 50, 4).await;
    let slice = |n: usize| -> Vec<Query> {
        let size = queries.len() / 6;
        queries[n * size..(n + 1) * size].to_vec()
    };
    let mut rows = Vec::new();
    for (index, (name, call)) in [
        ("(a) RetrieveMemory over gRPC", &service),
        ("(b) hand-written hybrid SQL", &hand_written),
        ("(c) floor: embed + one vector query", &floor),
    ]
    .into_iter()
    .enumerate()
    {
        eprintln!("{name}: {rate} QPS for {seconds} s");
        let fixed = at_rate(call, &slice(index * 2), rate, seconds).await;
        eprintln!("  p95 {}", millis(fixed.histogram.value_at_quantile(0.95)));
        rows.push(row(name, &format!("{rate} QPS offered"), &fixed));
        eprintln!("{name}: saturation with {concurrency} clients for {seconds} s");
        let full = saturated(call, &slice(index * 2 + 1), concurrency, seconds).await;
        eprintln!("  {:.0} QPS", full.qps());
        rows.push(row(
            name,
            &format!("saturation ({concurrency} clients)"),
            &full,
        ));
    }

    let plan: Vec<String> = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF, SUMMARY ON) {}",
        FLOOR_SQL
            .replace("$1", &format!("'{}'", space_user(1)))
            .replace("$2", &format!("'{SPACE}'"))
            .replace("$3", "(SELECT embedding FROM bench_pool WHERE n = 1)")
    )))
    .fetch_all(&pool)
    .await?;
    let text = format!(
        "# Retrieval benchmark\n\n\
         Produced by `{command_line}` on {date}.\n\n\
         Machine: {machine}.\n\n\
         ## Data\n\n\
         {memories} memories in {spaces} spaces of 100 (one user each): 80 % facts, 20 % episodes with FSRS \
         state; one text in ten is Chinese. Texts come from a pool of 10,000 distinct sentences embedded with \
         the local model (all-MiniLM-L6-v2); each memory's vector is its sentence's model embedding plus a \
         deterministic perturbation of norm {NOISE_NORM} (one of {NOISE_VECTORS}), so a million distinct \
         vectors cost 10,000 model calls and neighbours stay meaningful. The HNSW index covers all of them; \
         spaces this small are searched exactly through the scope index, as the service does.\n\n\
         ## Queries\n\n\
         {count} generated queries ({distinct} distinct texts), each against a random space: 40 % words of one of \
         the space's own memories, 30 % questions in other words, 20 % ten popular repeated questions, 10 % \
         Chinese. Queries are embedded with the real model at request time; repeated texts come from the \
         embedding cache, as in the service. Each measurement uses its own slice of the set.\n\n\
         ## Results\n\n\
         (a) is the whole RetrieveMemory pipeline with default settings (BM25 and vector legs over facts and \
         episodes, RRF, the default ranking profile, MMR, the Markdown and its token count, pending reviews, \
         cached scores and a metrics row written per request) over gRPC from this process. When the run \
         started, {fresh_scores} of the {memories} memories had cached scores less than an hour old \
         (a retrieval rewrites the missing, older or lower scores of the entries it returns: with none \
         fresh, every request rewrites them all). (b) is what a user would write \
         instead: the same query embedder, then one SQL statement (websearch tsquery ranked by ts_rank, \
         pgvector cosine, RRF in SQL). (c) is the floor: the query embedding plus one indexed vector query. \
         Fixed load is open loop (latency from when each query was due); saturation is closed loop.\n\n\
         | way | load | queries | QPS | p50 | p95 | p99 | max | errors |\n|---|---|---|---|---|---|---|---|---|\n{rows}\n\n\
         Plan of the floor query in one space:\n\n```\n{plan}\n```\n",
        date = chrono::Utc::now().format("%Y-%m-%d %H:%M UTC"),
        machine = machine_summary(
            "Postgres, the retrieval service (release build), the model and the load generator"
        ),
        count = queries.len(),
        rows = rows.join("\n"),
        plan = plan.join("\n"),
    );
    std::fs::write(report, text).with_context(|| format!("writing {}", report.display()))?;
    eprintln!("report written to {}", report.display());
    Ok(())
}

/// The load of the retention benchmark.
struct RetentionLoad {
    rate: u32,
    seconds: u64,
    due_percent: i32,
}

/// How old the memories made due are, and the maximum age every space gets: the seed's own
/// memories are far younger, so exactly the chosen share is due.
const DUE_AGE_DAYS: i32 = 4_000;
const MAX_AGE_DAYS: i32 = 3_650;
/// Seconds of load before the baseline is measured.
const WARM_UP_SECONDS: u64 = 30;

async fn retention(
    url: &str,
    endpoint: &str,
    spaces: i64,
    load: RetentionLoad,
    report: &std::path::Path,
    command_line: &str,
) -> anyhow::Result<()> {
    let pool = PgPoolOptions::new()
        .max_connections(16)
        .connect(url)
        .await?;
    eprintln!("making {} % of the memories due by age", load.due_percent);
    sqlx::query("UPDATE spaces SET max_age_days = $1")
        .bind(MAX_AGE_DAYS)
        .execute(&pool)
        .await?;
    sqlx::query(
        "UPDATE memories SET created_at = now() - make_interval(days => $1) \
         WHERE NOT pinned AND NOT manually_saved AND abs(hashtext(id::text)) % 100 < $2",
    )
    .bind(DUE_AGE_DAYS)
    .bind(load.due_percent)
    .execute(&pool)
    .await?;
    engram_e2e::bench::settle_seed(&mut *pool.acquire().await?).await?;
    let (memories, due): (i64, i64) = sqlx::query_as(
        "SELECT count(*), count(*) FILTER (WHERE created_at < now() - make_interval(days => $1) \
                                            AND NOT pinned AND NOT manually_saved) FROM memories",
    )
    .bind(MAX_AGE_DAYS)
    .fetch_one(&pool)
    .await?;
    anyhow::ensure!(due > 0, "nothing is due: is the database seeded?");

    let queries = query_set(&pool, spaces, 6_000).await?;
    let service = retrieve_call(endpoint).await?;
    // The copy's files are new to Postgres' buffer cache, and a fresh seed has no cached scores:
    // the first queries of a copy are slower than the service ever is once warm, so the
    // baseline starts after a warm-up of its own.
    eprintln!("warming up for {WARM_UP_SECONDS} s");
    let _ = at_rate(&service, &queries[..1_500], load.rate, WARM_UP_SECONDS).await;
    eprintln!(
        "RetrieveMemory at {} QPS for {} s, before the run",
        load.rate, load.seconds
    );
    let before = at_rate(&service, &queries[1_500..3_000], load.rate, load.seconds).await;
    eprintln!("  p95 {}", millis(before.histogram.value_at_quantile(0.95)));

    // The job as the ingest service runs it: its default settings, its own connections.
    let settings: engram_ingest::IngestSettings =
        engram_server::settings::load_defaults_only(engram_ingest::IngestSettings::defaults())?;
    let job_pool = PgPoolOptions::new().max_connections(4).connect(url).await?;
    let job = engram_ingest::retention::RetentionJob::new(
        job_pool,
        settings.retention.clone(),
        settings.memory.tombstone_ttl(),
        Arc::new(engram_ingest::metrics::IngestMetrics::default()),
    )?;
    eprintln!("one retention run, under the same load");
    let run = tokio::spawn(async move { job.run_once(chrono::Utc::now()).await });
    let mut during = Measurement {
        histogram: new_histogram(),
        elapsed: Duration::ZERO,
        errors: 0,
    };
    let mut offset = 3_000;
    while !run.is_finished() {
        let end = (offset + load.rate as usize * 2).min(queries.len());
        let window = at_rate(&service, &queries[offset..end], load.rate, 2).await;
        offset = if end == queries.len() { 3_000 } else { end };
        during.histogram.add(&window.histogram)?;
        during.elapsed += window.elapsed;
        during.errors += window.errors;
    }
    let outcome = run.await??.context("another retention run held the lock")?;
    let deleted = outcome.entries_deleted();
    let rate = deleted as f64 / outcome.took.as_secs_f64();
    eprintln!(
        "  deleted {deleted} in {:.1} s ({rate:.0} rows/s); p95 {}",
        outcome.took.as_secs_f64(),
        millis(during.histogram.value_at_quantile(0.95))
    );

    let (left, tombstones, audited): (i64, i64, i64) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM memories WHERE created_at < now() - make_interval(days => $1) \
                   AND NOT pinned AND NOT manually_saved), \
                (SELECT count(*) FROM tombstones), \
                (SELECT count(*) FROM audit_events WHERE action = 'retention_delete')",
    )
    .bind(MAX_AGE_DAYS)
    .fetch_one(&pool)
    .await?;
    let marked: u64 = outcome
        .spaces
        .iter()
        .map(|(_, run)| run.marked_inactive)
        .sum();
    let before_p95 = before.histogram.value_at_quantile(0.95);
    let during_p95 = during.histogram.value_at_quantile(0.95);
    let raised = during_p95 as f64 / before_p95.max(1) as f64;
    let verdict = |met: bool| if met { "met" } else { "**missed**" };
    let text = format!(
        "# Retention benchmark\n\n\
         Produced by `{command_line}` on {date}.\n\n\
         Machine: {machine}.\n\n\
         ## Data\n\n\
         A copy of the retrieval benchmark's database (`make bench-retrieval`: {memories} memories in {spaces} \
         spaces of 100, facts and episodes, with embeddings and the HNSW index). Every space gets \
         `max_age_days = {MAX_AGE_DAYS}`; {percent} % of the memories neither pinned nor saved (chosen by a hash \
         of their id) were made {DUE_AGE_DAYS} days old: **{due} due**. The other rules are at their defaults \
         (turns 180 days, inactivity after 90 days with a 90-day grace), so the run also looks for \
         inactive entries in every space, as it would in production.\n\n\
         ## Run\n\n\
         One run of the job as the ingest service runs it (`engram_ingest::retention::RetentionJob`, default \
         settings: due entries of up to 50 spaces per transaction, at most {batch} per transaction, holding \
         those spaces' locks, a {pause} ms pause after each; turns and inactivity {concurrency} spaces at a \
         time; every deleted entry leaves a tombstone and an audit event), on 4 connections of its \
         own, in this process, after {WARM_UP_SECONDS} s of the same load (the copy starts with a cold buffer \
         cache) and the baseline, while \
         RetrieveMemory is asked {rate_qps} queries a second over gRPC (open loop, latency from when each \
         query was due; the query mix of `make bench-retrieval`) against a release retrieval service.\n\n\
         ## Targets\n\n\
         | target | measured | |\n|---|---|---|\n\
         | deletes at ≥ 5,000 rows/s | {deleted} deleted in {took:.1} s: **{rate:.0} rows/s** | {rate_verdict} |\n\
         | RetrieveMemory p95 at {rate_qps} QPS raised ≤ 20 % while it runs | {before_p95} before, {during_p95} during (×{raised:.2}) | {latency_verdict} |\n\n\
         ## Detail\n\n\
         | RetrieveMemory at {rate_qps} QPS | queries | p50 | p95 | p99 | max | errors |\n|---|---|---|---|---|---|---|\n\
         | before the run ({seconds} s) | {before_n} | {before_p50} | {before_p95} | {before_p99} | {before_max} | {before_errors} |\n\
         | during the run | {during_n} | {during_p50} | {during_p95} | {during_p99} | {during_max} | {during_errors} |\n\n\
         After the run: {left} due memories left, {tombstones} tombstones, {audited} `retention_delete` audit \
         events; {spaces_touched} spaces had something done; {marked} entries were found inactive.\n",
        date = chrono::Utc::now().format("%Y-%m-%d %H:%M UTC"),
        machine = machine_summary(
            "Postgres, the retrieval service (release build), the query model, the retention job and the load generator"
        ),
        percent = load.due_percent,
        batch = settings.retention.batch,
        concurrency = settings.retention.concurrency,
        pause = settings.retention.batch_pause_ms,
        rate_qps = load.rate,
        seconds = load.seconds,
        took = outcome.took.as_secs_f64(),
        rate_verdict = verdict(rate >= 5_000.0 && left == 0),
        latency_verdict = verdict(raised <= 1.2),
        before_p95 = millis(before_p95),
        during_p95 = millis(during_p95),
        before_n = before.histogram.len(),
        before_p50 = millis(before.histogram.value_at_quantile(0.5)),
        before_p99 = millis(before.histogram.value_at_quantile(0.99)),
        before_max = millis(before.histogram.max()),
        before_errors = before.errors,
        during_n = during.histogram.len(),
        during_p50 = millis(during.histogram.value_at_quantile(0.5)),
        during_p99 = millis(during.histogram.value_at_quantile(0.99)),
        during_max = millis(during.histogram.max()),
        during_errors = during.errors,
        spaces_touched = outcome.spaces.len(),
    );
    std::fs::write(report, text).with_context(|| format!("writing {}", report.display()))?;
    eprintln!("report written to {}", report.display());
    Ok(())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Seed {
            spaces,
            per_space,
            pool,
        } => seed(&cli.database_url, &cli.model_dir, spaces, per_space, pool).await,
        Command::Run {
            endpoint,
            spaces,
            rate,
            seconds,
            concurrency,
            report,
            command_line,
        } => {
            run(
                &cli.database_url,
                &cli.model_dir,
                &endpoint,
                spaces,
                rate,
                seconds,
                concurrency,
                &report,
                &command_line,
            )
            .await
        }
        Command::Retention {
            endpoint,
            spaces,
            rate,
            seconds,
            due_percent,
            report,
            command_line,
        } => {
            retention(
                &cli.database_url,
                &endpoint,
                spaces,
                RetentionLoad {
                    rate,
                    seconds,
                    due_percent,
                },
                &report,
                &command_line,
            )
            .await
        }
    }
}
