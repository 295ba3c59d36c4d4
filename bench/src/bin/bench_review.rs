//! Load generator of `make bench-review` (deploy/bench/review.sh starts a release review service
//! on the bus first):
//!
//! 1. **Latency.** A segment with 50 pending memories, decoded, graded by the local grader and
//!    applied, timed in process through the reviewer `App::build` makes (what the consumer runs
//!    for each message, without the broker's round trip): target p95 ≤ 50 ms.
//! 2. **Consumer throughput.** Thousands of SegmentClosed messages published to RabbitMQ, consumed
//!    by the release review service: segments reviewed per second, from the commits' own times
//!    (the consumer's rate, whatever the publisher's) and end to end: target ≥ 100 segments/s.
//!
//! The seed is written in SQL: spaces of episodic memories with stored embeddings, and one
//! conversation per space whose turns segmentation has embedded, as production has them when a
//! segment closes. No LLM takes part (grading by an LLM is the LLM's latency, not Engram's).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use chrono::{DateTime, Utc};
use clap::{Parser, Subcommand};
use engram_bench::bench::{HostSpeed, machine_summary, space_user};
use engram_bus::queues::{self, routes};
use engram_bus::{Bus, OutgoingEvent, Topology};
use engram_proto::v1;
use engram_review::ReviewSettings;
use pgvector::Vector;
use prost::Message as _;
use rand::Rng as _;
use rand::seq::{IndexedRandom as _, SliceRandom as _};
use secrecy::SecretString;
use sqlx::PgPool;
use sqlx::postgres::PgPoolOptions;
use uuid::Uuid;

const LOCAL_AMQP: &str = "amqp://guest:guest@127.0.0.1:5672/%2f";
const SPACE: &str = "bench-review";
const DIMENSION: usize = 384;
/// Turns of each seeded conversation; a segment reviews 20 of them.
const TURNS: i32 = 40;
const SEGMENT_TURNS: i32 = 20;

#[derive(Parser)]
#[command(about = "Engram review benchmark")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Seeds, measures and writes the report.
    Run(RunArgs),
    /// Removes a run's exchanges and queues from the broker.
    DropTopology {
        #[arg(long, env = "ENGRAM_AMQP__URL", default_value = LOCAL_AMQP)]
        amqp_url: String,
        #[arg(long)]
        topology_prefix: String,
    },
}

#[derive(clap::Args)]
struct RunArgs {
    #[arg(long, env = "ENGRAM_DATABASE__URL")]
    database_url: String,
    #[arg(long, env = "ENGRAM_AMQP__URL", default_value = LOCAL_AMQP)]
    amqp_url: String,
    /// The topology prefix the review service under test consumes with.
    #[arg(long)]
    topology_prefix: String,
    #[arg(long, env = "ENGRAM_EMBED__MODEL_DIR")]
    model_dir: PathBuf,
    #[arg(long, default_value_t = 20)]
    spaces: usize,
    #[arg(long, default_value_t = 300)]
    memories_per_space: usize,
    /// Segments timed in process (after 20 of warm-up), 50 memories each.
    #[arg(long, default_value_t = 400)]
    latency_segments: usize,
    /// Segments published for the consumer, of 10 memories each ...
    #[arg(long, default_value_t = 3000)]
    throughput_segments: usize,
    /// ... then of 50 memories each.
    #[arg(long, default_value_t = 600)]
    large_throughput_segments: usize,
    #[arg(long)]
    report: PathBuf,
    #[arg(long, default_value = "make bench-review")]
    command_line: String,
}

const WORDS: &[&str] = &[
    "marathon",
    "training",
    "knee",
    "physio",
    "Lisbon",
    "flight",
    "sister",
    "wedding",
    "budget",
    "Rust",
    "compiler",
    "lifetimes",
    "garden",
    "tomatoes",
    "piano",
    "lessons",
    "vegetarian",
    "recipe",
    "deadline",
    "manager",
    "promotion",
    "apartment",
    "lease",
    "cat",
    "vet",
    "allergy",
    "cycling",
    "commute",
    "novel",
    "chapter",
    "daughter",
    "school",
    "violin",
    "mortgage",
    "holiday",
    "Kyoto",
    "camera",
    "lens",
    "climbing",
    "gym",
    "sleep",
    "coffee",
    "tea",
    "doctor",
];

fn sentence(rng: &mut impl rand::Rng, words: std::ops::Range<usize>) -> String {
    let length = rng.random_range(words);
    let picked: Vec<&str> = (0..length).map(|_| *WORDS.choose(rng).unwrap()).collect();
    picked.join(" ")
}

fn unit_vector(rng: &mut impl rand::Rng) -> Vector {
    let mut values: Vec<f32> = (0..DIMENSION)
        .map(|_| rng.random_range(-1.0f32..1.0))
        .collect();
    let norm = values
        .iter()
        .map(|v| v * v)
        .sum::<f32>()
        .sqrt()
        .max(f32::EPSILON);
    values.iter_mut().for_each(|v| *v /= norm);
    Vector::from(values)
}

fn conversation_of(space: usize) -> Uuid {
    Uuid::from_u128(0x5EED_0000_0000_0000_0000_0000_0000_0000 | space as u128)
}

/// The seed: per space, `per_space` episodes (title, summary, stored embedding, an FSRS state
/// last reviewed a few days ago) and one conversation of [`TURNS`] embedded turns.
async fn seed(pool: &PgPool, spaces: usize, per_space: usize) -> anyhow::Result<Vec<Vec<Uuid>>> {
    let mut rng = rand::rng();
    let mut memory_ids = Vec::with_capacity(spaces);
    let started = Instant::now();
    for space in 0..spaces {
        let user: Uuid = space_user(space as i64).parse()?;
        let conversation = conversation_of(space);
        sqlx::query(
            "INSERT INTO conversations (user_id, space, conversation_id, next_turn_index) VALUES ($1, $2, $3, $4)",
        )
        .bind(user)
        .bind(SPACE)
        .bind(conversation)
        .bind(TURNS)
        .execute(pool)
        .await
        .context("seeding a conversation")?;
        let indexes: Vec<i32> = (0..TURNS).collect();
        let roles: Vec<&str> = indexes
            .iter()
            .map(|i| if i % 2 == 0 { "user" } else { "assistant" })
            .collect();
        let contents: Vec<String> = indexes.iter().map(|_| sentence(&mut rng, 8..30)).collect();
        let message_ids: Vec<String> = indexes.iter().map(|i| format!("m{i}")).collect();
        sqlx::query(
            "INSERT INTO conversation_turns (user_id, space, conversation_id, turn_index, role, content, \
                 spoken_at, client_message_id, tokens) \
             SELECT $1, $2, $3, t.turn_index, t.role, t.content, now(), t.client_message_id, 20 \
             FROM unnest($4::int4[], $5::text[], $6::text[], $7::text[]) AS t(turn_index, role, content, client_message_id)",
        )
        .bind(user)
        .bind(SPACE)
        .bind(conversation)
        .bind(&indexes)
        .bind(&roles)
        .bind(&contents)
        .bind(&message_ids)
        .execute(pool)
        .await
        .context("seeding turns")?;
        let turn_vectors: Vec<Vector> = indexes.iter().map(|_| unit_vector(&mut rng)).collect();
        sqlx::query(
            "INSERT INTO conversation_turn_embeddings (user_id, space, conversation_id, turn_index, embedding, model) \
             SELECT $1, $2, $3, e.turn_index, e.embedding, $6 FROM unnest($4::int4[], $5::vector[]) AS e(turn_index, embedding)",
        )
        .bind(user)
        .bind(SPACE)
        .bind(conversation)
        .bind(&indexes)
        .bind(&turn_vectors)
        // As segmentation stores them: the grader's own topic vectors.
        .bind(engram_embed::TOKEN_VECTORS_MODEL_ID)
        .execute(pool)
        .await
        .context("seeding turn embeddings")?;

        let ids: Vec<Uuid> = (0..per_space).map(|_| Uuid::now_v7()).collect();
        let titles: Vec<String> = ids.iter().map(|_| sentence(&mut rng, 3..6)).collect();
        let texts: Vec<String> = ids.iter().map(|_| sentence(&mut rng, 15..40)).collect();
        let simhashes: Vec<i64> = ids.iter().map(|_| rng.random()).collect();
        sqlx::query(
            "INSERT INTO memories (id, user_id, space, kind, conversation_id, text, title, messages, surprise, \
                 start_at, end_at, stability, difficulty, last_reviewed_at, simhash, importance, \
                 needs_embedding, embedding_model, embedded_at, created_at, updated_at) \
             SELECT m.id, $1, $2, 'episodic', $3, m.text, m.title, \
                    jsonb_build_array(jsonb_build_object('role', 'user', 'content', m.text)), 0.3, \
                    now() - interval '5 days', now() - interval '5 days', 3.0, 5.0, now() - interval '5 days', \
                    m.simhash, 0.5, false, 'all-MiniLM-L6-v2', now(), now() - interval '5 days', now() \
             FROM unnest($4::uuid[], $5::text[], $6::text[], $7::int8[]) AS m(id, title, text, simhash)",
        )
        .bind(user)
        .bind(SPACE)
        .bind(conversation)
        .bind(&ids)
        .bind(&titles)
        .bind(&texts)
        .bind(&simhashes)
        .execute(pool)
        .await
        .context("seeding memories")?;
        let vectors: Vec<Vector> = ids.iter().map(|_| unit_vector(&mut rng)).collect();
        sqlx::query(
            "INSERT INTO memory_embeddings (memory_id, user_id, space, kind, embedding) \
             SELECT e.id, $1, $2, 'episodic', e.embedding FROM unnest($3::uuid[], $4::vector[]) AS e(id, embedding)",
        )
        .bind(user)
        .bind(SPACE)
        .bind(&ids)
        .bind(&vectors)
        .execute(pool)
        .await
        .context("seeding embeddings")?;
        memory_ids.push(ids);
    }
    let mut connection = pool.acquire().await?;
    engram_bench::bench::settle_seed(&mut connection).await?;
    eprintln!(
        "seeded {spaces} spaces of {per_space} episodes and a conversation of {TURNS} embedded turns each ({:.1?})",
        started.elapsed()
    );
    Ok(memory_ids)
}

/// A SegmentClosed of space `space` reviewing `memories` distinct memories, retrieved by
/// queries of ten (one of them retrieved twice, as happens), against 20 of its turns.
fn segment_closed(
    rng: &mut impl rand::Rng,
    space: usize,
    pool_of_space: &[Uuid],
    memories: usize,
    reviewed_at: DateTime<Utc>,
) -> v1::SegmentClosed {
    let mut chosen: Vec<Uuid> = pool_of_space
        .choose_multiple(rng, memories)
        .copied()
        .collect();
    chosen.shuffle(rng);
    let mut pending_reviews: Vec<v1::PendingReview> = chosen
        .chunks(10)
        .map(|ids| v1::PendingReview {
            query: sentence(rng, 2..5),
            memory_ids: ids.iter().map(Uuid::to_string).collect(),
            retrieved_at: Some(engram_server::time::to_proto(reviewed_at)),
        })
        .collect();
    if let Some(first) = chosen.first() {
        pending_reviews.push(v1::PendingReview {
            query: sentence(rng, 2..5),
            memory_ids: vec![first.to_string()],
            retrieved_at: Some(engram_server::time::to_proto(reviewed_at)),
        });
    }
    let first_turn = if rng.random_bool(0.5) {
        0
    } else {
        TURNS - SEGMENT_TURNS
    };
    let context = (first_turn..first_turn + SEGMENT_TURNS)
        .map(|index| v1::Message {
            role: if index % 2 == 0 {
                v1::SpeakerRole::User
            } else {
                v1::SpeakerRole::Assistant
            }
            .into(),
            content: sentence(rng, 8..30),
        })
        .collect();
    v1::SegmentClosed {
        scope: Some(v1::Scope {
            user_id: space_user(space as i64),
            space: SPACE.into(),
        }),
        conversation_id: conversation_of(space).to_string(),
        episode_id: String::new(),
        closed_at: Some(engram_server::time::to_proto(reviewed_at)),
        context,
        pending_reviews,
        reviewed_at: Some(engram_server::time::to_proto(reviewed_at)),
        first_turn_index: first_turn as u32,
        last_turn_index: (first_turn + SEGMENT_TURNS - 1) as u32,
        segment_id: Uuid::now_v7().to_string(),
        reason: "hard_gap".into(),
    }
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((p / 100.0) * (sorted.len() - 1) as f64).round() as usize]
}

struct Latency {
    segments: usize,
    p50: f64,
    p95: f64,
    p99: f64,
    max: f64,
    applied_per_segment: f64,
}

/// Part 1: the consumer's work for one message, in process.
async fn measure_latency(
    args: &RunArgs,
    pool: &PgPool,
    ids: &[Vec<Uuid>],
) -> anyhow::Result<Latency> {
    let mut settings: ReviewSettings =
        engram_server::settings::load_defaults_only::<ReviewSettings>()?;
    settings.database.url = SecretString::from(args.database_url.clone());
    settings.database.run_migrations = false;
    settings.grpc.listen_addr = "127.0.0.1:0".parse()?;
    settings.amqp.bus.enabled = false;
    settings.embed.provider = engram_embed::EmbedProvider::Local;
    settings.embed.model_dir = args.model_dir.clone();
    let app = engram_review::App::build(settings).await?;
    let reviewer = app.reviewer().clone();
    let mut rng = rand::rng();
    const WARM_UP: usize = 20;
    let mut latencies = Vec::with_capacity(args.latency_segments);
    let applied_before = applied_reviews(pool).await?;
    for index in 0..WARM_UP + args.latency_segments {
        let space = index % ids.len();
        let event = segment_closed(&mut rng, space, &ids[space], 50, Utc::now());
        let payload = event.encode_to_vec();
        let started = Instant::now();
        let segment = engram_review::segments::decode(Some(routes::SEGMENT_CLOSED_TYPE), &payload)
            .map_err(|reason| anyhow::anyhow!("the benchmark's own message: {reason}"))?;
        let graded = reviewer.review_segment(&segment).await?;
        let elapsed = started.elapsed().as_secs_f64() * 1000.0;
        anyhow::ensure!(
            graded == 50,
            "segment {index} graded {graded} memories, not 50"
        );
        if index >= WARM_UP {
            latencies.push(elapsed);
        }
    }
    let applied = applied_reviews(pool).await? - applied_before;
    latencies.sort_by(f64::total_cmp);
    Ok(Latency {
        segments: latencies.len(),
        p50: percentile(&latencies, 50.0),
        p95: percentile(&latencies, 95.0),
        p99: percentile(&latencies, 99.0),
        max: latencies.last().copied().unwrap_or(f64::NAN),
        applied_per_segment: applied as f64 / (WARM_UP + args.latency_segments) as f64,
    })
}

async fn applied_reviews(pool: &PgPool) -> anyhow::Result<i64> {
    Ok(
        sqlx::query_scalar("SELECT count(*) FROM applied_reviews WHERE applied")
            .fetch_one(pool)
            .await?,
    )
}

struct Throughput {
    segments: usize,
    memories: usize,
    publish_secs: f64,
    end_to_end_per_sec: f64,
    consumer_per_sec: f64,
}

/// Part 2: `segments` messages of `memories` memories each through the broker to the review
/// service under test.
async fn measure_throughput(
    bus: &Bus,
    pool: &PgPool,
    ids: &[Vec<Uuid>],
    segments: usize,
    memories: usize,
) -> anyhow::Result<Throughput> {
    let mut rng = rand::rng();
    let base = Utc::now();
    let events: Vec<((Uuid, Uuid), OutgoingEvent)> = (0..segments)
        .map(|index| {
            let space = index % ids.len();
            // Later segments review later, as a stream of closing segments does.
            let at = base + chrono::Duration::microseconds(index as i64);
            let event = segment_closed(&mut rng, space, &ids[space], memories, at);
            let segment_id: Uuid = event.segment_id.parse().expect("a UUID");
            let user_id: Uuid = event
                .scope
                .as_ref()
                .expect("a scope")
                .user_id
                .parse()
                .expect("a UUID");
            (
                (user_id, segment_id),
                OutgoingEvent {
                    routing_key: routes::SEGMENT_CLOSED.into(),
                    message_id: segment_id,
                    type_name: routes::SEGMENT_CLOSED_TYPE.into(),
                    payload: event.encode_to_vec(),
                    trace_headers: Default::default(),
                },
            )
        })
        .collect();
    // Found by their key, user first.
    let (segment_users, segment_ids): (Vec<Uuid>, Vec<Uuid>) =
        events.iter().map(|(key, _)| *key).unzip();
    let publisher = bus.publisher().await?;
    let started = Instant::now();
    for chunk in events.chunks(200) {
        let chunk: Vec<OutgoingEvent> = chunk.iter().map(|(_, event)| event.clone()).collect();
        let (confirmed, error) = publisher.publish_all(&chunk).await;
        if let Some(error) = error {
            anyhow::bail!("publishing: {error} ({confirmed} of a chunk confirmed)");
        }
    }
    let publish_secs = started.elapsed().as_secs_f64();
    let deadline = started + Duration::from_secs(600);
    loop {
        let reviewed: i64 = sqlx::query_scalar(
            "SELECT count(DISTINCT segment_id) FROM applied_reviews WHERE (user_id, segment_id) IN (SELECT * FROM unnest($1::uuid[], $2::uuid[]))",
        )
        .bind(&segment_users)
    .bind(&segment_ids)
        .fetch_one(pool)
        .await?;
        if reviewed as usize == segments {
            break;
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "only {reviewed} of {segments} segments reviewed in 10 minutes"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let end_to_end = started.elapsed().as_secs_f64();
    // The consumer's own rate: from its first commit to its last (created_at is each review
    // transaction's start).
    let (first, last): (DateTime<Utc>, DateTime<Utc>) = sqlx::query_as(
        "SELECT min(created_at), max(created_at) FROM applied_reviews WHERE (user_id, segment_id) IN (SELECT * FROM unnest($1::uuid[], $2::uuid[]))",
    )
    .bind(&segment_users)
    .bind(&segment_ids)
    .fetch_one(pool)
    .await?;
    let consumer_secs = (last - first).as_seconds_f64().max(f64::EPSILON);
    let not_applied: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM applied_reviews WHERE (user_id, segment_id) IN (SELECT * FROM unnest($1::uuid[], $2::uuid[])) AND NOT applied",
    )
    .bind(&segment_users)
    .bind(&segment_ids)
    .fetch_one(pool)
    .await?;
    if not_applied > 0 {
        eprintln!(
            "note: {not_applied} reviews recorded but not applied (a later review of the same memory committed first)"
        );
    }
    Ok(Throughput {
        segments,
        memories,
        publish_secs,
        end_to_end_per_sec: segments as f64 / end_to_end,
        consumer_per_sec: (segments - 1) as f64 / consumer_secs,
    })
}

async fn run(args: RunArgs) -> anyhow::Result<()> {
    let host = HostSpeed::measure();
    eprintln!("host: {}", host.describe());
    let pool = PgPoolOptions::new()
        .max_connections(4)
        .connect(&args.database_url)
        .await?;
    let ids = seed(&pool, args.spaces, args.memories_per_space).await?;

    let latency = measure_latency(&args, &pool, &ids).await?;
    eprintln!(
        "50 memories per segment, in process: p50 {:.2} ms, p95 {:.2} ms, p99 {:.2} ms",
        latency.p50, latency.p95, latency.p99
    );

    let bus = Bus::connect(&args.amqp_url, Topology::new(args.topology_prefix.clone())).await?;
    bus.declare(&queues::all(Duration::from_secs(2))).await?;
    let mut throughputs = Vec::new();
    for (segments, memories) in [
        (args.throughput_segments, 10),
        (args.large_throughput_segments, 50),
    ] {
        let throughput = measure_throughput(&bus, &pool, &ids, segments, memories).await?;
        eprintln!(
            "{segments} segments of {memories} memories through the bus: consumer {:.0}/s, end to end {:.0}/s",
            throughput.consumer_per_sec, throughput.end_to_end_per_sec
        );
        throughputs.push(throughput);
    }
    bus.close().await;

    let verdict = |met: bool| if met { "met" } else { "**missed**" };
    let mut rows = String::new();
    for t in &throughputs {
        rows.push_str(&format!(
            "| {} | {} | {:.1} s | **{:.0}** | {:.0} |\n",
            t.segments, t.memories, t.publish_secs, t.consumer_per_sec, t.end_to_end_per_sec
        ));
    }
    let consumer_rate = throughputs
        .iter()
        .map(|t| t.consumer_per_sec)
        .fold(f64::INFINITY, f64::min);
    let report = format!(
        "# Review benchmark\n\n\
         Produced by `{command}` on {date}, release build; {machine}. Host speed at the start: {host}.\n\n\
         The seed: {spaces} spaces of {per_space} episodes, each with its stored embedding and an FSRS state \
         last reviewed five days before, and one conversation per space of {turns} turns that segmentation \
         embedded. A segment reviews {segment_turns} of those turns (half of them the assistant's) and the \
         memories retrieved during it, by queries of ten memories each (one memory retrieved twice). Grading \
         is the local grader's (the service's default without an LLM): the cosines are of token vectors, \
         the turns' as segmentation stored them and the memories' computed from their texts (no \
         transformer pass once their tokens were met), and the stemmed term overlap from the texts.\n\n\
         ## A segment of 50 memories, graded and applied\n\n\
         Target: p95 ≤ 50 ms — {latency_verdict}.\n\n\
         What the consumer does with one SegmentClosed, timed in process on the reviewer `App::build` makes: \
         decode, read the 50 memories and the segment's stored turn vectors, grade, and \
         apply in one transaction (lock the 50 states, record the 50 reviews, update the states, audit). \
         {segments} segments after 20 of warm-up, one at a time; {applied:.1} reviews applied per segment.\n\n\
         | segments | p50 | p95 | p99 | max |\n|---|---|---|---|---|\n\
         | {segments} | {p50:.2} ms | **{p95:.2} ms** | {p99:.2} ms | {max:.2} ms |\n\n\
         ## The review consumer\n\n\
         Target: ≥ 100 segments/s — {throughput_verdict}.\n\n\
         SegmentClosed messages published to RabbitMQ with confirms, consumed by a release review service \
         (defaults: prefetch 16, four segments at a time, of different spaces, each acknowledged after \
         its commit; the seed's {spaces} spaces take turns). *Consumer* is the \
         rate between its first and last commit of the run; *end to end* from the first publish to the last \
         segment reviewed.\n\n\
         | segments | memories each | publishing | consumer, segments/s | end to end, segments/s |\n\
         |---|---|---|---|---|\n{rows}",
        command = args.command_line,
        date = Utc::now().format("%Y-%m-%d %H:%M UTC"),
        machine = machine_summary("Postgres, RabbitMQ, the review service and this load generator"),
        host = host.describe(),
        spaces = args.spaces,
        per_space = args.memories_per_space,
        turns = TURNS,
        segment_turns = SEGMENT_TURNS,
        latency_verdict = verdict(latency.p95 <= 50.0),
        segments = latency.segments,
        applied = latency.applied_per_segment,
        p50 = latency.p50,
        p95 = latency.p95,
        p99 = latency.p99,
        max = latency.max,
        throughput_verdict = verdict(consumer_rate >= 100.0),
    );
    engram_bench::eval::write_report(&args.report, &report)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    match Cli::parse().command {
        Command::Run(args) => run(args).await,
        Command::DropTopology {
            amqp_url,
            topology_prefix,
        } => engram_bench::bench::drop_topology(&amqp_url, &topology_prefix).await,
    }
}
