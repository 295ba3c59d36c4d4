//! Load generator of `make bench-retrieval`.
//!
//! `bench-retrieval seed`  fills the benchmark database: 10,000 spaces (one user each) of 100
//!                         memories, 80 % facts and 20 % episodes, in English and Chinese. Texts
//!                         come from a pool of 10,000 distinct sentences embedded with the local
//!                         model; each memory's vector is its sentence's model embedding plus a
//!                         small deterministic perturbation (so a million distinct vectors cost
//!                         10,000 model calls, and nearest neighbours stay meaningful). Each
//!                         episode also holds its stored conversation, as segmentation leaves it:
//!                         8 to 12 turns of pool sentences (its excerpt), a conversation row
//!                         segmented through the last turn, and a turn vector per turn (the
//!                         sentence's static token vector plus a perturbation).
//! `bench-retrieval run`   sends one mixed query set four ways and reports each at a fixed rate
//!                         and at saturation:
//!                         (a) RetrieveMemory over gRPC (the whole pipeline), twice: excerpts on
//!                             (the default detail, AUTO: the stored turns are searched and
//!                             their lines shown) and off (detail NONE: no turn search);
//!                         (b) what a user would write instead: embed the query, then one
//!                             hand-written SQL statement fusing a tsvector and a pgvector search;
//!                         (c) the floor: embed the query, then one indexed vector query.
//!                         (b) and (c) each embed through a micro-batching, caching query
//!                         embedder of their own over the service's model, which the script
//!                         runs on one thread, as the service runs it.

use std::collections::HashSet;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use engram_bench::bench::{machine_summary, space_user};
use engram_bench::profile::{CpuProfile, Profiler};
use engram_embed::{
    Embedder, LocalEmbedder, LocalModelSettings, TOKEN_VECTORS_MODEL_ID, TokenVectorEmbedder,
};
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
/// An episode's conversation has MIN_TURNS + (a number below TURN_COUNT_SPREAD) turns.
const MIN_TURNS: i64 = 8;
const TURN_COUNT_SPREAD: i64 = 5;
/// Turn j of an episode says pool sentence (the episode's own + j·TURN_STRIDE) mod pool: a
/// prime above any pool size, so the turns of one episode are distinct sentences.
const TURN_STRIDE: i64 = 104_729;
/// Spaces per seeding statement.
const SEED_CHUNK: i64 = 500;

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
    /// Fill the database: memories, and the stored conversations of the episodes.
    Seed {
        #[arg(long, default_value_t = 10_000)]
        spaces: i64,
        #[arg(long, default_value_t = 100)]
        per_space: i64,
        #[arg(long, default_value_t = 10_000)]
        pool: usize,
    },
    /// Measure the four ways; write the report.
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
        /// The retrieval service's process: its CPU profile during (a) with excerpts on at
        /// saturation goes into the report (needs `perf`).
        #[arg(long)]
        service_pid: Option<u32>,
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
    if table_rows(&mut connection, "bench_pool").await? != Some(pool_size as i64) {
        seed_pool(&mut connection, model_dir, pool_size).await?;
    }
    if table_rows(&mut connection, "bench_turn_pool").await? != Some(pool_size as i64) {
        seed_turn_pool(&mut connection, model_dir).await?;
    }
    seed_memories(&mut connection, spaces, per_space, pool_size, started).await?;
    seed_turns(&mut connection, spaces, started).await?;
    index_and_settle(&mut connection, started).await?;
    let turns: i64 = sqlx::query_scalar("SELECT count(*) FROM conversation_turns")
        .fetch_one(&mut connection)
        .await?;
    eprintln!(
        "seeded {} memories and {turns} turns in {:.0?}",
        spaces * per_space,
        started.elapsed()
    );
    Ok(())
}

/// The rows of a table the seed keeps between runs, or `None` when there is no such table.
async fn table_rows(connection: &mut PgConnection, table: &str) -> anyhow::Result<Option<i64>> {
    // Two statements: a query naming a missing table fails at parse time, whatever its WHERE
    // clause says.
    let exists: bool = sqlx::query_scalar("SELECT to_regclass($1) IS NOT NULL")
        .bind(table)
        .fetch_one(&mut *connection)
        .await?;
    if !exists {
        return Ok(None);
    }
    let rows = sqlx::query_scalar(sqlx::AssertSqlSafe(format!("SELECT count(*) FROM {table}")))
        .fetch_one(&mut *connection)
        .await?;
    Ok(Some(rows))
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
    // The turn vectors are the old pool's sentences': made again below.
    sqlx::query("DROP TABLE IF EXISTS bench_pool, bench_noise, bench_turn_pool")
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
        let model = load_model(model_dir)?;
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

/// The local model as the seed and the load generator run it.
fn load_model(model_dir: std::path::PathBuf) -> anyhow::Result<LocalEmbedder> {
    Ok(LocalEmbedder::load(&LocalModelSettings {
        model_dir,
        max_batch: 32,
        max_tokens: 256,
        inference_nice: 0,
        yield_to_requests: None,
    })?)
}

/// The pool sentences' turn vectors, of the kind the services store for a turn and the
/// retrieval service compares the query with: the local model's static token vectors
/// ([`TokenVectorEmbedder`]), a space of their own, not the model's sentence embeddings.
async fn seed_turn_pool(
    connection: &mut PgConnection,
    model_dir: &std::path::Path,
) -> anyhow::Result<()> {
    let started = Instant::now();
    let pool: Vec<(i64, String)> = sqlx::query_as("SELECT n, text FROM bench_pool ORDER BY n")
        .fetch_all(&mut *connection)
        .await?;
    let texts: Vec<String> = pool.iter().map(|(_, text)| text.clone()).collect();
    let model_dir = model_dir.to_owned();
    eprintln!("turn vectors of {} pool sentences", texts.len());
    let vectors = tokio::task::spawn_blocking(move || -> anyhow::Result<Vec<Vec<f32>>> {
        let turn_vectors = TokenVectorEmbedder::new(load_model(model_dir)?);
        Ok(turn_vectors.embed_blocking(&texts)?)
    })
    .await??;
    sqlx::query("DROP TABLE IF EXISTS bench_turn_pool")
        .execute(&mut *connection)
        .await?;
    sqlx::query(
        "CREATE TABLE bench_turn_pool (n bigint PRIMARY KEY, embedding vector(384) NOT NULL)",
    )
    .execute(&mut *connection)
    .await?;
    let numbers: Vec<i64> = pool.iter().map(|(n, _)| *n).collect();
    let vectors: Vec<Vector> = vectors.into_iter().map(Vector::from).collect();
    sqlx::query("INSERT INTO bench_turn_pool SELECT * FROM unnest($1::int8[], $2::vector[])")
        .bind(&numbers)
        .bind(&vectors)
        .execute(&mut *connection)
        .await?;
    eprintln!("pool turn vectors made ({:.0?})", started.elapsed());
    Ok(())
}

async fn seed_memories(
    connection: &mut PgConnection,
    spaces: i64,
    per_space: i64,
    pool_size: usize,
    started: Instant,
) -> anyhow::Result<()> {
    // A seed that failed halfway starts over (the pools are kept).
    sqlx::query(
        "TRUNCATE conversation_turn_blocks, conversation_turn_embeddings, conversation_turns, summarized_segments, \
                  conversations, memory_embeddings, memories, spaces",
    )
    .execute(&mut *connection)
    .await?;
    // Memories, in chunks of spaces. Memory i of space s uses pool sentence (s·per_space + i)·7919
    // mod pool: 7919 is prime, so the sentences of one space are distinct. An episode's excerpt
    // (`messages`) is its conversation, alternating user and assistant, one minute a turn up to
    // its end: its own sentence first, then others of the pool (see TURN_STRIDE).
    sqlx::query("DROP INDEX IF EXISTS memory_embeddings_hnsw")
        .execute(&mut *connection)
        .await?;
    let mut first = 0;
    while first < spaces {
        let last = (first + SEED_CHUNK).min(spaces);
        sqlx::query(
            "INSERT INTO memories (id, user_id, space, kind, conversation_id, text, category, valid_at, \
                 title, messages, surprise, start_at, end_at, stability, difficulty, last_reviewed_at, \
                 simhash, importance, needs_embedding, embedding_model, embedded_at, created_at, updated_at) \
             SELECT gen_random_uuid(), ('00000000-0000-4000-8000-' || lpad(s::text, 12, '0'))::uuid, $3, \
                    CASE WHEN episodic THEN 'episodic' ELSE 'semantic' END, \
                    CASE WHEN episodic THEN gen_random_uuid() END, p.text, \
                    CASE WHEN episodic THEN NULL ELSE 'fact' END, CASE WHEN episodic THEN NULL ELSE created END, \
                    CASE WHEN episodic THEN p.title END, \
                    CASE WHEN episodic THEN \
                        (SELECT jsonb_agg(jsonb_build_object( \
                                    'role', CASE WHEN j % 2 = 0 THEN 'user' ELSE 'assistant' END, \
                                    'content', q.text) ORDER BY j) \
                         FROM generate_series(0, turns - 1) AS j \
                         JOIN bench_pool q ON q.n = (p.n + j * $8) % $5) END, \
                    CASE WHEN episodic THEN (i % 10) / 10.0 END, \
                    CASE WHEN episodic THEN created - (turns - 1) * interval '1 minute' END, \
                    CASE WHEN episodic THEN created END, \
                    CASE WHEN episodic THEN 1.0 + i % 30 END, CASE WHEN episodic THEN 5.0 END, \
                    CASE WHEN episodic THEN created END, \
                    (floor(random() * 4294967296)::bigint << 32) | floor(random() * 4294967296)::bigint, \
                    0.2 + (i % 7) / 10.0, false, 'all-MiniLM-L6-v2', now(), created, now() \
             FROM generate_series($1, $2 - 1) AS s, generate_series(0, $4 - 1) AS i, bench_pool p, \
                  LATERAL (SELECT i % 5 = 0 AS episodic, \
                                  now() - ((s * 31 + i * 17) % 180) * interval '1 day' AS created, \
                                  $6 + (s + i / 5) % $7 AS turns) r \
             WHERE p.n = ((s * $4 + i) * 7919) % $5",
        )
        .bind(first)
        .bind(last)
        .bind(SPACE)
        .bind(per_space)
        .bind(pool_size as i64)
        .bind(MIN_TURNS)
        .bind(TURN_COUNT_SPREAD)
        .bind(TURN_STRIDE)
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
    Ok(())
}

/// Each episode's conversation as segmentation leaves it: the conversation row segmented
/// through the last turn, and the closed segment whose turns retention tracks.
/// $1..$2 the users of a chunk of spaces.
const SEED_CONVERSATIONS_SQL: &str = "\
WITH episode AS ( \
    SELECT user_id, space, conversation_id, start_at, end_at, \
           jsonb_array_length(messages) - 1 AS last_turn \
    FROM memories WHERE kind = 'episodic' AND user_id BETWEEN $1::uuid AND $2::uuid), \
conversation AS ( \
    INSERT INTO conversations (user_id, space, conversation_id, created_at, updated_at, \
                               next_turn_index, segmented_through, last_turn_at, last_appended_at) \
    SELECT user_id, space, conversation_id, start_at, end_at, last_turn + 1, last_turn, end_at, end_at \
    FROM episode) \
INSERT INTO summarized_segments (user_id, space, conversation_id, last_turn_index, closed_at) \
SELECT user_id, space, conversation_id, last_turn, end_at FROM episode";

/// The turns: the episode's excerpt, spread evenly over its time span (so the episode holds
/// them), with tokens at about four characters a token.
const SEED_TURNS_SQL: &str = "\
INSERT INTO conversation_turns (user_id, space, conversation_id, turn_index, role, content, \
                                spoken_at, created_at, tokens) \
SELECT m.user_id, m.space, m.conversation_id, line.number::int - 1, line.message ->> 'role', \
       line.message ->> 'content', said.at, said.at, length(line.message ->> 'content') / 4 + 1 \
FROM memories m \
CROSS JOIN LATERAL jsonb_array_elements(m.messages) WITH ORDINALITY AS line(message, number) \
CROSS JOIN LATERAL (SELECT m.start_at + (m.end_at - m.start_at) \
        * ((line.number - 1)::float8 / greatest(jsonb_array_length(m.messages) - 1, 1)) AS at) said \
WHERE m.kind = 'episodic' AND m.user_id BETWEEN $1::uuid AND $2::uuid";

/// A turn vector per turn: its sentence's token vector plus a perturbation, under the model id
/// ($3) the retrieval service searches; $4 the number of perturbations.
const SEED_TURN_VECTORS_SQL: &str = "\
INSERT INTO conversation_turn_embeddings (user_id, space, conversation_id, turn_index, model, embedding) \
SELECT t.user_id, t.space, t.conversation_id, t.turn_index, $3, v.embedding + z.embedding \
FROM conversation_turns t \
JOIN bench_pool p ON p.text = t.content \
JOIN bench_turn_pool v ON v.n = p.n \
JOIN bench_noise z ON z.n = (abs(hashtext(t.conversation_id::text)::bigint) + t.turn_index) % $4 \
WHERE t.user_id BETWEEN $1::uuid AND $2::uuid";

/// The stored conversations of the episodes (after the memories), in chunks of spaces.
async fn seed_turns(
    connection: &mut PgConnection,
    spaces: i64,
    started: Instant,
) -> anyhow::Result<()> {
    let mut first = 0;
    while first < spaces {
        let last = (first + SEED_CHUNK).min(spaces);
        let (from, to) = (space_user(first), space_user(last - 1));
        sqlx::query(SEED_CONVERSATIONS_SQL)
            .bind(&from)
            .bind(&to)
            .execute(&mut *connection)
            .await
            .context("seeding conversations")?;
        sqlx::query(SEED_TURNS_SQL)
            .bind(&from)
            .bind(&to)
            .execute(&mut *connection)
            .await
            .context("seeding turns")?;
        sqlx::query(SEED_TURN_VECTORS_SQL)
            .bind(&from)
            .bind(&to)
            .bind(TOKEN_VECTORS_MODEL_ID)
            .bind(NOISE_VECTORS)
            .execute(&mut *connection)
            .await
            .context("seeding turn vectors")?;
        first = last;
        eprintln!(
            "seeded the conversations of {first}/{spaces} spaces ({:.0?})",
            started.elapsed()
        );
    }
    Ok(())
}

/// The HNSW index over every memory vector, built once they are all in (far faster than
/// inserting into it), then the whole database vacuumed and analyzed.
async fn index_and_settle(connection: &mut PgConnection, started: Instant) -> anyhow::Result<()> {
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
    engram_bench::bench::settle_seed(&mut *connection).await?;
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

/// Closed loop: `concurrency` clients each sending the next query as soon as the last returned,
/// through `queries` once (or until `seconds` have passed). Never twice: a way that went round its
/// slice again would find every text's embedding cached the second time, so a faster way would
/// pay for fewer model passes a query than a slower one and look cheaper than it is. (Until
/// 2026-12-06 the loop went round for the whole 30 s: the hand-written SQL went round its slice
/// of 3,000 eleven times, RetrieveMemory one and a half times; docs/benchmarks/README.md.)
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
                let Some(query) = queries.get(n) else { break };
                let sent = Instant::now();
                if let Err(error) = call(query.clone()).await
                    && errors.fetch_add(1, std::sync::atomic::Ordering::Relaxed) < 3
                {
                    eprintln!("query failed: {error:#}");
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

/// What the answers of a RetrieveMemory way held: how many came back, how many showed lines of
/// a conversation (an episode's whole excerpt, or the lines that answer), and their Markdown's
/// tokens; so the report shows what excerpts on changed besides the time.
#[derive(Default)]
struct AnswerCounts {
    answers: AtomicU64,
    with_lines: AtomicU64,
    tokens: AtomicU64,
    /// Answers the vector leg did not serve, by the reason the service gave.
    without_vectors: std::sync::Mutex<std::collections::BTreeMap<String, u64>>,
}

impl AnswerCounts {
    fn count(&self, response: &v1::RetrieveMemoryResponse) {
        let shows_lines = response.episodic.iter().any(|m| !m.lines_shown.is_empty());
        self.answers.fetch_add(1, Ordering::Relaxed);
        self.with_lines
            .fetch_add(u64::from(shows_lines), Ordering::Relaxed);
        self.tokens
            .fetch_add(u64::from(response.tokens), Ordering::Relaxed);
        if let Some(served_by) = &response.served_by
            && served_by.used_fallback
            && served_by.dense_hits == 0
        {
            *self
                .without_vectors
                .lock()
                .expect("not poisoned")
                .entry(served_by.fallback_reason.clone())
                .or_default() += 1;
        }
    }

    fn describe(&self) -> String {
        let answers = self.answers.load(Ordering::Relaxed);
        let with_lines = self.with_lines.load(Ordering::Relaxed);
        let tokens = self.tokens.load(Ordering::Relaxed);
        let per_answer = |n: u64| n as f64 / answers.max(1) as f64;
        let without_vectors = self.without_vectors.lock().expect("not poisoned");
        let fallbacks = if without_vectors.is_empty() {
            "every answer was served by both legs".to_owned()
        } else {
            let reasons: Vec<String> = without_vectors
                .iter()
                .map(|(reason, n)| format!("{n} because \"{reason}\""))
                .collect();
            format!(
                "answers served without the vector leg (the documented fallback, not errors): {}",
                reasons.join(", ")
            )
        };
        format!(
            "{with_lines} of {answers} answers ({:.0} %) showed lines of a conversation, {:.0} \
             Markdown tokens an answer; {fallbacks}",
            100.0 * per_answer(with_lines),
            per_answer(tokens)
        )
    }
}

/// (a): RetrieveMemory over gRPC at `detail`, everything else at its defaults, each answer
/// counted in `counts` (an answer the vector leg did not serve is counted apart, with its
/// reason: the service's documented fallback, e.g. when the query embedding is not ready within
/// `embed.query_timeout_ms`); an error is a call that failed.
async fn retrieve_call(
    endpoint: &str,
    detail: v1::DetailLevel,
    counts: Arc<AnswerCounts>,
) -> anyhow::Result<Call> {
    let channel = tonic::transport::Channel::from_shared(endpoint.to_owned())?
        .connect()
        .await?;
    Ok(Arc::new(move |query: Query| {
        let mut client = RetrievalServiceClient::new(channel.clone());
        let counts = counts.clone();
        Box::pin(async move {
            let response = client
                .retrieve_memory(v1::RetrieveMemoryRequest {
                    scope: Some(v1::Scope {
                        user_id: query.user,
                        space: SPACE.into(),
                    }),
                    query: query.text,
                    detail: detail.into(),
                    ..Default::default()
                })
                .await?
                .into_inner();
            counts.count(&response);
            Ok(())
        })
    }))
}

/// The query embedder of (b) and (c): the same micro-batching, caching embedder and model as
/// the service's.
/// The query model, loaded once for the ways that embed in this process.
async fn load_query_model(model_dir: &std::path::Path) -> anyhow::Result<Arc<dyn Embedder>> {
    let model_dir = model_dir.to_owned();
    let model = tokio::task::spawn_blocking(move || load_model(model_dir)).await??;
    Ok(Arc::new(model) as Arc<dyn Embedder>)
}

/// A micro-batching, caching query embedder of one way's own over the shared model, as the
/// service has one, warmed with the warm-up queries the service was warmed with: no way finds
/// embeddings that another way's queries left in a cache it shares (the set repeats its texts,
/// so a way measured after another on one cache would pay for fewer model passes).
async fn way_embedder(
    model: &Arc<dyn Embedder>,
    warm_up: &[Query],
) -> anyhow::Result<QueryEmbedder> {
    let embedder = QueryEmbedder::start(
        model.clone(),
        QueryEmbedderSettings {
            max_batch: 32,
            cache_entries: 10_000,
            timeout: Duration::from_secs(10),
        },
    );
    for query in warm_up {
        embedder
            .embed(&query.text)
            .await
            .map_err(anyhow::Error::msg)?;
    }
    Ok(embedder)
}

const EXCERPTS_ON: &str = "(a) RetrieveMemory over gRPC, excerpts on (detail AUTO, the default)";
const EXCERPTS_OFF: &str = "(a) RetrieveMemory over gRPC, excerpts off (detail NONE)";
const HAND_WRITTEN: &str = "(b) hand-written hybrid SQL";
const FLOOR: &str = "(c) floor: embed + one vector query";

/// Issue 38: RetrieveMemory's p95 with excerpts on, at 50 QPS, at most this many times the
/// floor's.
const EXCERPTS_TARGET: f64 = 1.5;
const EXCERPTS_TARGET_RATE: u32 = 50;

/// A way of answering the query set.
struct Way {
    name: &'static str,
    call: Call,
}

/// A way measured at the fixed load and at saturation.
struct Measured {
    name: &'static str,
    fixed: Measurement,
    full: Measurement,
}

/// The load of `run`: the fixed rate, seconds per measurement, clients at saturation.
struct RunLoad {
    rate: u32,
    seconds: u64,
    concurrency: usize,
    /// The service's process, profiled during the first way's saturation.
    service_pid: Option<u32>,
}

/// A statement by the time Postgres spent in it during a measurement (pg_stat_statements).
struct StatementCost {
    /// The statement's text from its first line that is not a comment, shortened.
    text: String,
    calls: i64,
    mean_ms: f64,
    total_ms: f64,
}

/// Starts counting statements afresh, where the server loads pg_stat_statements (`make up`
/// does); false where it does not.
async fn reset_statement_costs(pool: &PgPool) -> bool {
    let reset = async {
        sqlx::query("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
            .execute(pool)
            .await?;
        sqlx::query("SELECT pg_stat_statements_reset()")
            .execute(pool)
            .await?;
        Ok::<_, sqlx::Error>(())
    };
    match reset.await {
        Ok(()) => true,
        Err(error) => {
            eprintln!("no statement costs in the report: {error}");
            false
        }
    }
}

/// This database's statements since the reset, by the time spent in them, most first.
async fn statement_costs(pool: &PgPool) -> anyhow::Result<Vec<StatementCost>> {
    let rows: Vec<(String, i64, f64, f64)> = sqlx::query_as(
        "SELECT query, calls, mean_exec_time, total_exec_time FROM pg_stat_statements \
         WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database()) \
           AND query NOT LIKE '%pg_stat_statements%' \
         ORDER BY total_exec_time DESC LIMIT 12",
    )
    .fetch_all(pool)
    .await?;
    Ok(rows
        .into_iter()
        .map(|(query, calls, mean_ms, total_ms)| {
            let code = query
                .lines()
                .map(str::trim)
                .filter(|line| !line.starts_with("--"))
                .collect::<Vec<_>>()
                .join(" ");
            let code = code.split_whitespace().collect::<Vec<_>>().join(" ");
            let text = match code.char_indices().nth(110) {
                Some((end, _)) => format!("{}…", &code[..end]),
                None => code,
            };
            StatementCost {
                text: text.replace('|', "\\|"),
                calls,
                mean_ms,
                total_ms,
            }
        })
        .collect())
}

/// Each way at the fixed load, then at saturation, each measurement over a slice of `queries`
/// of its own (no way is handed another way's cached embeddings). The statements of the first
/// way's saturation are counted, where the server allows.
async fn measure_ways(
    pool: &PgPool,
    ways: &[Way],
    queries: &[Query],
    load: &RunLoad,
) -> (Vec<Measured>, Vec<StatementCost>, Option<CpuProfile>) {
    let size = queries.len() / (2 * ways.len());
    let slice = |n: usize| &queries[n * size..(n + 1) * size];
    let mut measured = Vec::with_capacity(ways.len());
    let mut costs = Vec::new();
    let mut profile = None;
    for (index, way) in ways.iter().enumerate() {
        eprintln!("{}: {} QPS for {} s", way.name, load.rate, load.seconds);
        let fixed = at_rate(&way.call, slice(index * 2), load.rate, load.seconds).await;
        eprintln!("  p95 {}", millis(fixed.histogram.value_at_quantile(0.95)));
        eprintln!(
            "{}: saturation with {} clients for {} s",
            way.name, load.concurrency, load.seconds
        );
        let counted = index == 0 && reset_statement_costs(pool).await;
        let profiler = load
            .service_pid
            .filter(|_| index == 0)
            .and_then(|pid| Profiler::start(load.seconds, pid));
        let full = saturated(
            &way.call,
            slice(index * 2 + 1),
            load.concurrency,
            load.seconds,
        )
        .await;
        eprintln!("  {:.0} QPS", full.qps());
        if let Some(profiler) = profiler {
            profile = profiler.finish();
        }
        if counted {
            // The trace writer's last batch lands within its interval.
            tokio::time::sleep(Duration::from_millis(500)).await;
            costs = statement_costs(pool).await.unwrap_or_else(|error| {
                eprintln!("no statement costs in the report: {error}");
                Vec::new()
            });
        }
        measured.push(Measured {
            name: way.name,
            fixed,
            full,
        });
    }
    (measured, costs, profile)
}

/// What the benchmark database holds, as the report states it.
struct Seeded {
    spaces: i64,
    memories: i64,
    episodes: i64,
    turns: i64,
    /// Turn vectors of the retrieval service's turn embedder (the only ones it searches).
    turn_vectors: i64,
    /// Memories whose cached scores were less than an hour old when the run started.
    fresh_scores: i64,
}

async fn seeded(pool: &PgPool) -> anyhow::Result<Seeded> {
    // Fresh scores tell whether requests will also rewrite cached scores: a fresh seed has none,
    // and a retrieval rewrites missing, hour-old or lower scores of the entries it returns.
    let (spaces, memories, episodes, turns, turn_vectors, fresh_scores) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM spaces), (SELECT count(*) FROM memories), \
                (SELECT count(*) FROM memories WHERE kind = 'episodic'), \
                (SELECT count(*) FROM conversation_turns), \
                (SELECT count(*) FROM conversation_turn_embeddings WHERE model = $1), \
                (SELECT count(*) FROM memory_retention \
                 WHERE last_scored_at > now() - interval '1 hour')",
    )
    .bind(TOKEN_VECTORS_MODEL_ID)
    .fetch_one(pool)
    .await?;
    // Without them the turn search runs over nothing, and the report would say otherwise.
    anyhow::ensure!(
        turns > 0 && turn_vectors > 0,
        "the benchmark database holds {turns} stored turns and {turn_vectors} turn vectors of \
         {TOKEN_VECTORS_MODEL_ID}: an older build seeded it; seed it again (without BENCH_REUSE=1)"
    );
    Ok(Seeded {
        spaces,
        memories,
        episodes,
        turns,
        turn_vectors,
        fresh_scores,
    })
}

/// The plan of the floor query in one space.
async fn floor_plan(pool: &PgPool) -> anyhow::Result<Vec<String>> {
    Ok(sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF, SUMMARY ON) {}",
        FLOOR_SQL
            .replace("$1", &format!("'{}'", space_user(1)))
            .replace("$2", &format!("'{SPACE}'"))
            .replace("$3", "(SELECT embedding FROM bench_pool WHERE n = 1)")
    )))
    .fetch_all(pool)
    .await?)
}

/// Queries sent before the measurements, to warm the caches of Postgres and of the model; none
/// of them is measured.
const WARM_UP_QUERIES: usize = 200;
/// Queries measured: a slice of 3,000 for each way and load.
const MEASURED_QUERIES: usize = 24_000;

async fn run(
    url: &str,
    model_dir: &std::path::Path,
    endpoint: &str,
    spaces: i64,
    load: RunLoad,
    report: &std::path::Path,
    command_line: &str,
) -> anyhow::Result<()> {
    let pool = PgPoolOptions::new()
        .max_connections(16)
        .connect(url)
        .await?;
    let seeded = seeded(&pool).await?;
    let queries = query_set(&pool, spaces, WARM_UP_QUERIES + MEASURED_QUERIES).await?;
    let (warm_up, queries) = queries.split_at(WARM_UP_QUERIES);
    let distinct = queries
        .iter()
        .map(|q| q.text.as_str())
        .collect::<HashSet<_>>()
        .len();

    let excerpts_on = Arc::new(AnswerCounts::default());
    let excerpts_off = Arc::new(AnswerCounts::default());
    let model = load_query_model(model_dir).await?;
    let ways = [
        Way {
            name: EXCERPTS_ON,
            call: retrieve_call(endpoint, v1::DetailLevel::Auto, excerpts_on.clone()).await?,
        },
        Way {
            name: EXCERPTS_OFF,
            call: retrieve_call(endpoint, v1::DetailLevel::None, excerpts_off.clone()).await?,
        },
        Way {
            name: HAND_WRITTEN,
            call: embed_then_sql(
                pool.clone(),
                way_embedder(&model, warm_up).await?,
                HAND_WRITTEN_SQL,
                true,
            ),
        },
        Way {
            name: FLOOR,
            call: embed_then_sql(
                pool.clone(),
                way_embedder(&model, warm_up).await?,
                FLOOR_SQL,
                false,
            ),
        },
    ];

    // The caches of Postgres and of the model are warmed once, by queries no measurement uses.
    eprintln!("warming up");
    let warm_up_call = retrieve_call(
        endpoint,
        v1::DetailLevel::Auto,
        Arc::new(AnswerCounts::default()),
    )
    .await?;
    let _ = at_rate(&warm_up_call, warm_up, 50, 4).await;
    let (measured, statement_costs, cpu_profile) = measure_ways(&pool, &ways, queries, &load).await;

    let text = RunReport {
        command_line,
        seeded,
        queries: queries.len(),
        distinct,
        load: &load,
        measured,
        statement_costs,
        cpu_profile,
        excerpts_on: &excerpts_on,
        excerpts_off: &excerpts_off,
        plan: floor_plan(&pool).await?,
    }
    .markdown();
    std::fs::write(report, text).with_context(|| format!("writing {}", report.display()))?;
    eprintln!("report written to {}", report.display());
    Ok(())
}

/// What `run` found, for its report.
struct RunReport<'a> {
    command_line: &'a str,
    seeded: Seeded,
    queries: usize,
    distinct: usize,
    load: &'a RunLoad,
    measured: Vec<Measured>,
    /// Postgres' statements during (a) with excerpts on at saturation.
    statement_costs: Vec<StatementCost>,
    /// The machine's CPU during the same measurement.
    cpu_profile: Option<CpuProfile>,
    excerpts_on: &'a AnswerCounts,
    excerpts_off: &'a AnswerCounts,
    plan: Vec<String>,
}

impl RunReport<'_> {
    fn fixed_p95(&self, name: &str) -> u64 {
        self.measured
            .iter()
            .find(|m| m.name == name)
            .map_or(0, |m| m.fixed.histogram.value_at_quantile(0.95))
    }

    fn saturation_qps(&self, name: &str) -> f64 {
        self.measured
            .iter()
            .find(|m| m.name == name)
            .map_or(0.0, |m| m.full.qps())
    }

    /// Issue 41's targets: a retrieval costs at most twice the hand-written query (saturation at
    /// least half of its), and its p95 at the fixed load within 1.2× the floor's.
    fn cost_target_line(&self) -> String {
        let judge = |met: bool| if met { "met" } else { "**missed**" };
        let (on, hand) = (
            self.saturation_qps(EXCERPTS_ON),
            self.saturation_qps(HAND_WRITTEN),
        );
        let share = on / hand.max(f64::MIN_POSITIVE);
        let off_share = self.saturation_qps(EXCERPTS_OFF) / hand.max(f64::MIN_POSITIVE);
        let p95_ratio = self.fixed_p95(EXCERPTS_ON) as f64 / self.fixed_p95(FLOOR).max(1) as f64;
        format!(
            "**Targets** (issue 41): RetrieveMemory with excerpts on saturates at {on:.0} QPS, \
             {share_pct:.0} % of the hand-written SQL's {hand:.0} (target ≥ 50 %: {share_verdict}; \
             with excerpts off {off_pct:.0} %); its p95 at the fixed load is ×{p95_ratio:.2} the \
             floor's (target ≤ ×1.2: {p95_verdict}).",
            share_pct = 100.0 * share,
            share_verdict = judge(share >= 0.5),
            off_pct = 100.0 * off_share,
            p95_verdict = judge(p95_ratio <= 1.2),
        )
    }

    /// Issue 38's target: p95 with excerpts on over the floor's, at the fixed load.
    fn target_line(&self) -> String {
        let (on, off, floor) = (
            self.fixed_p95(EXCERPTS_ON),
            self.fixed_p95(EXCERPTS_OFF),
            self.fixed_p95(FLOOR),
        );
        let ratio = |p95: u64| p95 as f64 / floor.max(1) as f64;
        let verdict = if self.load.rate != EXCERPTS_TARGET_RATE {
            format!("not judged: the target is at {EXCERPTS_TARGET_RATE} QPS")
        } else if ratio(on) <= EXCERPTS_TARGET {
            "met".to_owned()
        } else {
            "**missed**".to_owned()
        };
        format!(
            "**Target** (issue 38): RetrieveMemory's p95 at {EXCERPTS_TARGET_RATE} QPS with excerpts \
             on within {EXCERPTS_TARGET}× the floor's. Measured at {rate} QPS: (a) excerpts on {on_ms} \
             / (c) floor {floor_ms} = **×{on_ratio:.2}** ({verdict}). Before the turn search, \
             (a) excerpts off: {off_ms}, ×{off_ratio:.2}.",
            rate = self.load.rate,
            on_ms = millis(on),
            floor_ms = millis(floor),
            on_ratio = ratio(on),
            off_ms = millis(off),
            off_ratio = ratio(off),
        )
    }

    /// Where Postgres' time went during (a) with excerpts on at saturation.
    fn statement_section(&self) -> String {
        if self.statement_costs.is_empty() {
            return String::new();
        }
        let requests = self
            .measured
            .first()
            .map_or(1, |m| m.full.histogram.len().max(1)) as f64;
        let total: f64 = self.statement_costs.iter().map(|c| c.total_ms).sum();
        let rows: Vec<String> = self
            .statement_costs
            .iter()
            .map(|cost| {
                format!(
                    "| {:.0} % | {:.2} | {:.2} ms | `{}` |",
                    100.0 * cost.total_ms / total.max(f64::MIN_POSITIVE),
                    cost.calls as f64 / requests,
                    cost.mean_ms,
                    cost.text
                )
            })
            .collect();
        format!(
            "Where Postgres' time went during (a) with excerpts on at saturation \
             (pg_stat_statements over the {requests:.0} requests of that measurement, the \
             twelve statements that took most; the share is of those twelve's time, calls are \
             per request):\n\n\
             | share | calls | mean | statement |\n|---|---|---|---|\n{}\n\n",
            rows.join("\n")
        )
    }

    fn rows(&self) -> String {
        let mut rows = Vec::new();
        for m in &self.measured {
            rows.push(row(
                m.name,
                &format!("{} QPS offered", self.load.rate),
                &m.fixed,
            ));
            rows.push(row(
                m.name,
                &format!("saturation ({} clients)", self.load.concurrency),
                &m.full,
            ));
        }
        rows.join("\n")
    }

    fn markdown(&self) -> String {
        let seeded = &self.seeded;
        format!(
            "# Retrieval benchmark\n\n\
             Produced by `{command_line}` on {date}.\n\n\
             Machine: {machine}.\n\n\
             ## Data\n\n\
             {memories} memories in {spaces} spaces of 100 (one user each): 80 % facts, 20 % episodes \
             with FSRS state; one text in ten is Chinese. Texts come from a pool of 10,000 distinct \
             sentences embedded with the local model (all-MiniLM-L6-v2); each memory's vector is its \
             sentence's model embedding plus a deterministic perturbation of norm {NOISE_NORM} (one of \
             {NOISE_VECTORS}), so a million distinct vectors cost 10,000 model calls and neighbours stay \
             meaningful. The HNSW index covers all of them; spaces this small are searched exactly \
             through the scope index, as the service does.\n\n\
             Each of the {episodes} episodes holds its stored conversation as segmentation leaves it, \
             {turns} turns in all ({min_turns} to {max_turns} an episode, about {turns_per_space:.0} a \
             space): the episode's own sentence, then other sentences of the pool, alternating user \
             and assistant, one minute apart over the episode's time span; the same lines are the \
             episode's excerpt. Its conversation row is segmented through the last turn, so every turn \
             is held by its episode and may be shown. Each turn has a turn vector ({turn_vectors} in \
             all) under `{TOKEN_VECTORS_MODEL_ID}`, the id of the retrieval service's turn vectors: the \
             sentence's static token vector plus a perturbation, as for the memories. The service \
             searches a space's turns by BM25 over their words (one pass over the space's turns) \
             and by an exact scan of its turn vectors.\n\n\
             ## Queries\n\n\
             {queries} generated queries ({distinct} distinct texts), each against a random space: 40 % \
             words of one of the space's own memories, 30 % questions in other words, 20 % ten popular \
             repeated questions, 10 % Chinese. Queries are embedded with the real model at request \
             time; repeated texts come from the embedding cache, as in the service. Each measurement \
             uses its own slice of the set, after {WARM_UP_QUERIES} warm-up queries of their own. (b) \
             and (c) each embed through a caching query embedder of their own, warmed with those \
             queries as the service was, so neither finds embeddings the other's queries left (the \
             set repeats its texts); (a) with excerpts off runs after (a) with excerpts on in the \
             same service and finds what those left in its cache. Every way runs the model on one \
             thread, as the service does (`RAYON_NUM_THREADS=1`; on two cores, two threads made a \
             model pass of a query slower, not faster). A saturation measurement goes through its slice \
             once at most (it stops when the slice or the time runs out), so every way embeds about \
             the same share of its queries with the model: going round again, a faster way would find \
             its embeddings cached and pay for fewer model passes a query.\n\n\
             ## Results\n\n\
             (a) is the whole RetrieveMemory pipeline over gRPC from this process (BM25 and vector legs \
             over facts and episodes, RRF, the default ranking profile, MMR, the Markdown and its token \
             count; what each request leaves behind, its cached scores, the note that its entries \
             were returned and its metrics row, goes to the service's trace writer, which writes \
             every request's of the last 250 ms in two statements; the queries carry no \
             conversation, so no pending review), measured twice. With excerpts on, the default request (detail AUTO), it also searches the space's \
             stored turns (BM25 over their words, and the query's mean of static token vectors against \
             the stored turn vectors: no model pass over turns), loads the turns found with a neighbour \
             either side and the episode holding each, and shows the lines that answer (and a \
             surprising episode's whole excerpt): {on_counts}. With excerpts off (detail NONE) the \
             turns are not searched and no lines are shown: {off_counts}. That is the pipeline without \
             the turn search, the \"before\"; a little lighter than the default was before the turn \
             search existed, as it also leaves out surprising episodes' whole excerpts. When the run started, {fresh_scores} of the {memories} \
             memories had cached scores less than an hour old (the script clears what earlier runs \
             cached, so that runs compare: a retrieval rewrites the missing, older or lower scores of \
             the entries it returns, and with none fresh, every request rewrites them all, as the \
             first retrieval of an hour in a space does). (b) is what a user would write instead: the same query embedder, then one SQL \
             statement (websearch tsquery ranked by ts_rank, pgvector cosine, RRF in SQL). (c) is the \
             floor: the query embedding plus one indexed vector query. Fixed load is open loop \
             (latency from when each query was due); saturation is closed loop.\n\n\
             | way | load | queries | QPS | p50 | p95 | p99 | max | errors |\n\
             |---|---|---|---|---|---|---|---|---|\n{rows}\n\n\
             {target}\n\n\
             {cost_target}\n\n\
             {profile}\
             {statements}\
             Plan of the floor query in one space:\n\n```\n{plan}\n```\n",
            command_line = self.command_line,
            date = chrono::Utc::now().format("%Y-%m-%d %H:%M UTC"),
            machine = machine_summary(
                "Postgres, the retrieval service (release build), the model and the load generator"
            ),
            memories = seeded.memories,
            spaces = seeded.spaces,
            episodes = seeded.episodes,
            turns = seeded.turns,
            min_turns = MIN_TURNS,
            max_turns = MIN_TURNS + TURN_COUNT_SPREAD - 1,
            turns_per_space = seeded.turns as f64 / seeded.spaces.max(1) as f64,
            turn_vectors = seeded.turn_vectors,
            queries = self.queries,
            distinct = self.distinct,
            on_counts = self.excerpts_on.describe(),
            off_counts = self.excerpts_off.describe(),
            fresh_scores = seeded.fresh_scores,
            rows = self.rows(),
            target = self.target_line(),
            statements = self.statement_section(),
            cost_target = self.cost_target_line(),
            profile = self.cpu_profile.as_ref().map_or_else(
                || "No CPU profile (run with `--service-pid` where `perf` works).\n\n".to_owned(),
                |profile| profile.markdown("(a) with excerpts on at saturation"),
            ),
            plan = self.plan.join("\n"),
        )
    }
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
    engram_bench::bench::settle_seed(&mut *pool.acquire().await?).await?;
    let (memories, due): (i64, i64) = sqlx::query_as(
        "SELECT count(*), count(*) FILTER (WHERE created_at < now() - make_interval(days => $1) \
                                            AND NOT pinned AND NOT manually_saved) FROM memories",
    )
    .bind(MAX_AGE_DAYS)
    .fetch_one(&pool)
    .await?;
    anyhow::ensure!(due > 0, "nothing is due: is the database seeded?");

    let queries = query_set(&pool, spaces, 6_000).await?;
    let service = retrieve_call(endpoint, v1::DetailLevel::Auto, Arc::default()).await?;
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
        engram_server::settings::load_defaults_only::<engram_ingest::IngestSettings>()?;
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
         spaces of 100, facts and episodes, with embeddings and the HNSW index, and each episode's stored \
         conversation: its turns, their turn vectors and its closed segment, which the turn rule reads). Every space gets \
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
         events; {spaces_touched} spaces had something done; {marked} entries were found inactive; \
         {turns_deleted} stored turns were deleted.\n",
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
        turns_deleted = outcome.turns_deleted(),
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
            service_pid,
        } => {
            run(
                &cli.database_url,
                &cli.model_dir,
                &endpoint,
                spaces,
                RunLoad {
                    rate,
                    seconds,
                    concurrency,
                    service_pid,
                },
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
