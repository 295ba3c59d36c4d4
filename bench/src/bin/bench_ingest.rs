//! Load generator of `make bench-ingest`.
//!
//! `bench-ingest seed`   fills the benchmark database: 10,000 spaces (one user each) holding 200
//!                       entries, plus one space of 100,000 entries (its cap raised).
//! `bench-ingest run`    drives Remember over gRPC from N concurrent clients for a duration, then
//!                       measures the near-duplicate lookup in the 200- and the 100,000-entry
//!                       space, and writes a Markdown report.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use engram_bench::bench::{HostSpeed, machine_summary, space_user};
use engram_core::{Scope, SimHash};
use engram_proto::v1;
use engram_proto::v1::ingest_service_client::IngestServiceClient;
use hdrhistogram::Histogram;
use rand::Rng as _;
use rand::seq::IndexedRandom as _;
use sqlx::postgres::PgPoolOptions;
use sqlx::{Connection as _, PgConnection};
use tokio::sync::Mutex;

const BIG_SPACE_USER: &str = "00000000-0000-4000-8000-000000000000";
const BIG_SPACE: &str = "big";
const SPACE: &str = "bench";

#[derive(Parser)]
#[command(about = "Engram ingest benchmark")]
struct Cli {
    /// Benchmark database.
    #[arg(long, env = "ENGRAM_DATABASE__URL")]
    database_url: String,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Fill the database with the starting state.
    Seed {
        #[arg(long, default_value_t = 10_000)]
        spaces: u32,
        #[arg(long, default_value_t = 200)]
        entries_per_space: u32,
        #[arg(long, default_value_t = 100_000)]
        big_space_entries: u32,
    },
    /// Run the load and the lookup measurements; write the report.
    Run {
        #[arg(long, default_value = "http://127.0.0.1:50061")]
        endpoint: String,
        #[arg(long, default_value_t = 16)]
        clients: usize,
        #[arg(long, default_value_t = 30)]
        seconds: u64,
        #[arg(long, default_value_t = 10_000)]
        spaces: u32,
        /// Share of writes that repeat an earlier text of the same space (near-duplicates).
        #[arg(long, default_value_t = 0.1)]
        repeat_share: f64,
        #[arg(long)]
        report: std::path::PathBuf,
        /// Offered loads (Remember/s) measured open-loop after the closed-loop run, each for
        /// `rate_seconds`; latency counts from the scheduled send time (no coordinated omission).
        #[arg(
            long,
            value_delimiter = ',',
            default_value = "250,500,750,1000,1250,1500"
        )]
        rates: Vec<u32>,
        #[arg(long, default_value_t = 15)]
        rate_seconds: u64,
        /// The command line to record in the report.
        #[arg(long, default_value = "make bench-ingest")]
        command_line: String,
    },
}

async fn seed(url: &str, spaces: u32, per_space: u32, big: u32) -> anyhow::Result<()> {
    let mut connection = PgConnection::connect(url).await?;
    let started = Instant::now();
    const CHUNK: u32 = 500;
    let mut first = 0;
    while first < spaces {
        let last = (first + CHUNK).min(spaces);
        insert_entries(&mut connection, first, last, per_space).await?;
        first = last;
        eprintln!("seeded {first}/{spaces} spaces ({:.0?})", started.elapsed());
    }
    // The big space: one user, cap raised so that nothing is trimmed.
    sqlx::query("INSERT INTO spaces (user_id, space, soft_cap) VALUES ($1::uuid, $2, 1000000) ON CONFLICT DO NOTHING")
        .bind(BIG_SPACE_USER)
        .bind(BIG_SPACE)
        .execute(&mut connection)
        .await?;
    sqlx::query(
        "INSERT INTO memories (id, user_id, space, kind, text, category, valid_at, simhash, importance, \
             needs_embedding, created_at, updated_at) \
         SELECT gen_random_uuid(), $1::uuid, $2, 'semantic', 'big space fact ' || i, 'fact', now(), \
                (floor(random() * 4294967296)::bigint << 32) | floor(random() * 4294967296)::bigint, 0.3, \
                false, now() - random() * interval '30 days', now() \
         FROM generate_series(1, $3) AS i",
    )
    .bind(BIG_SPACE_USER)
    .bind(BIG_SPACE)
    .bind(i64::from(big))
    .execute(&mut connection)
    .await?;
    engram_bench::bench::settle_seed(&mut connection).await?;
    eprintln!(
        "seeded {} entries in {:.0?}",
        u64::from(spaces) * u64::from(per_space) + u64::from(big),
        started.elapsed()
    );
    Ok(())
}

/// Spaces `first..last`, `per_space` entries each, with cached scores as a previous trim left them.
/// Each entry draws its own age and importance (a derived table: an uncorrelated LATERAL subquery
/// would be evaluated once, giving all the entries of a chunk one score, and in some chunks a score
/// above every new entry's, which the soft cap then trimmed at once).
async fn insert_entries(
    connection: &mut PgConnection,
    first: u32,
    last: u32,
    per_space: u32,
) -> anyhow::Result<()> {
    sqlx::query(
        "INSERT INTO memories (id, user_id, space, kind, text, category, valid_at, simhash, importance, \
             needs_embedding, created_at, updated_at, last_scores) \
         SELECT gen_random_uuid(), \
                ('00000000-0000-4000-8000-' || lpad(s::text, 12, '0'))::uuid, $3, 'semantic', \
                'seeded fact ' || i || ' of space ' || s, 'fact', now(), \
                (floor(random() * 4294967296)::bigint << 32) | floor(random() * 4294967296)::bigint, \
                imp, false, created, now(), \
                jsonb_build_object('relevance', 0, 'recency', exp(-extract(epoch FROM now() - created) / 604800), \
                    'importance', imp, 'total', exp(-extract(epoch FROM now() - created) / 604800) + imp, \
                    'computed_at', now()) \
         FROM (SELECT s, i, now() - random() * interval '30 days' AS created, 0.2 + random() * 0.5 AS imp \
               FROM generate_series($1, $2 - 1) AS s, generate_series(1, $4) AS i) AS r",
    )
    .bind(i64::from(first))
    .bind(i64::from(last))
    .bind(SPACE)
    .bind(i64::from(per_space))
    .execute(connection)
    .await
    .context("seeding entries")?;
    Ok(())
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
];

fn new_text(rng: &mut impl rand::Rng) -> String {
    format!(
        "{} {} {} {} (note {})",
        SUBJECTS.choose(rng).unwrap(),
        VERBS.choose(rng).unwrap(),
        OBJECTS.choose(rng).unwrap(),
        WHEN.choose(rng).unwrap(),
        rng.random_range(0..1_000_000_000u64)
    )
}

#[derive(Default)]
struct Tally {
    created: u64,
    merged: u64,
    /// New entries with the lowest score of their space, trimmed by the soft cap at once.
    trimmed_at_capacity: u64,
    other: u64,
    errors: u64,
    trimmed: u64,
}

struct LoadResult {
    histogram: Histogram<u64>,
    tally: Tally,
    elapsed: Duration,
    /// Requests answered in each whole second of the run.
    per_second: Vec<u64>,
}

async fn run_load(
    endpoint: &str,
    clients: usize,
    seconds: u64,
    spaces: u32,
    repeat_share: f64,
) -> anyhow::Result<LoadResult> {
    let channel = tonic::transport::Channel::from_shared(endpoint.to_owned())?
        .connect()
        .await?;
    let histogram = Arc::new(Mutex::new(Histogram::<u64>::new_with_bounds(
        1, 60_000_000, 3,
    )?));
    let tally = Arc::new(Mutex::new(Tally::default()));
    // One more than the run's seconds: the last answers arrive just after the deadline.
    let answered_in_second: Arc<Vec<AtomicU64>> =
        Arc::new((0..=seconds).map(|_| AtomicU64::new(0)).collect());
    let deadline = Instant::now() + Duration::from_secs(seconds);
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..clients {
        let mut client = IngestServiceClient::new(channel.clone());
        let histogram = histogram.clone();
        let tally = tally.clone();
        let answered_in_second = answered_in_second.clone();
        tasks.push(tokio::spawn(async move {
            let mut local = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).expect("histogram");
            let mut local_tally = Tally::default();
            let mut written: Vec<(u32, String)> = Vec::new();
            let mut rng = <rand::rngs::StdRng as rand::SeedableRng>::from_os_rng();
            while Instant::now() < deadline {
                let (space, text) = if !written.is_empty() && rng.random_bool(repeat_share) {
                    written.choose(&mut rng).cloned().expect("non-empty")
                } else {
                    let text = new_text(&mut rng);
                    let space = rng.random_range(0..spaces);
                    written.push((space, text.clone()));
                    (space, text)
                };
                let request = v1::RememberRequest {
                    scope: Some(v1::Scope {
                        user_id: space_user(i64::from(space)),
                        space: SPACE.into(),
                    }),
                    text,
                    ..Default::default()
                };
                let sent = Instant::now();
                let response = client.remember(request).await;
                local
                    .record(sent.elapsed().as_micros() as u64)
                    .expect("in range");
                let second = (started.elapsed().as_secs() as usize).min(seconds as usize);
                answered_in_second[second].fetch_add(1, Ordering::Relaxed);
                match response {
                    Ok(response) => {
                        let response = response.into_inner();
                        local_tally.trimmed += response.trimmed_ids.len() as u64;
                        match v1::RememberOutcome::try_from(response.outcome) {
                            Ok(v1::RememberOutcome::Created) => local_tally.created += 1,
                            Ok(v1::RememberOutcome::Merged) => local_tally.merged += 1,
                            Ok(v1::RememberOutcome::TrimmedAtCapacity) => {
                                local_tally.trimmed_at_capacity += 1
                            }
                            _ => local_tally.other += 1,
                        }
                    }
                    Err(status) => {
                        local_tally.errors += 1;
                        if local_tally.errors <= 3 {
                            eprintln!("remember failed: {status}");
                        }
                    }
                }
            }
            histogram
                .lock()
                .await
                .add(&local)
                .expect("compatible histograms");
            let mut tally = tally.lock().await;
            tally.created += local_tally.created;
            tally.merged += local_tally.merged;
            tally.trimmed_at_capacity += local_tally.trimmed_at_capacity;
            tally.other += local_tally.other;
            tally.errors += local_tally.errors;
            tally.trimmed += local_tally.trimmed;
        }));
    }
    for task in tasks {
        task.await?;
    }
    let elapsed = started.elapsed();
    let histogram = Arc::try_unwrap(histogram)
        .map_err(|_| anyhow::anyhow!("histogram still shared"))?
        .into_inner();
    let tally = Arc::try_unwrap(tally)
        .map_err(|_| anyhow::anyhow!("tally still shared"))?
        .into_inner();
    let per_second = answered_in_second[..seconds as usize]
        .iter()
        .map(|count| count.load(Ordering::Relaxed))
        .collect();
    Ok(LoadResult {
        histogram,
        tally,
        elapsed,
        per_second,
    })
}

/// Sends Remember at a fixed rate from at most `clients` requests in flight (the same number of
/// concurrent clients as the closed loop); latency is measured from when each request was due, so
/// a request that waited for a free client counts its wait.
async fn run_at_rate(
    endpoint: &str,
    rate: u32,
    seconds: u64,
    spaces: u32,
    clients: usize,
) -> anyhow::Result<(Histogram<u64>, u64)> {
    let channel = tonic::transport::Channel::from_shared(endpoint.to_owned())?
        .connect()
        .await?;
    let histogram = Arc::new(Mutex::new(Histogram::<u64>::new_with_bounds(
        1, 60_000_000, 3,
    )?));
    let errors = Arc::new(AtomicU64::new(0));
    let in_flight = Arc::new(tokio::sync::Semaphore::new(clients));
    let interval = Duration::from_secs_f64(1.0 / f64::from(rate));
    let start = tokio::time::Instant::now();
    let mut rng = <rand::rngs::StdRng as rand::SeedableRng>::from_os_rng();
    let mut tasks = tokio::task::JoinSet::new();
    for index in 0..u64::from(rate) * seconds {
        let due = start + interval.mul_f64(index as f64);
        tokio::time::sleep_until(due).await;
        let permit = in_flight.clone().acquire_owned().await?;
        let mut client = IngestServiceClient::new(channel.clone());
        let request = v1::RememberRequest {
            scope: Some(v1::Scope {
                user_id: space_user(i64::from(rng.random_range(0..spaces))),
                space: SPACE.into(),
            }),
            text: new_text(&mut rng),
            ..Default::default()
        };
        let histogram = histogram.clone();
        let errors = errors.clone();
        tasks.spawn(async move {
            let result = client.remember(request).await;
            let latency = due.elapsed();
            drop(permit);
            if result.is_err() {
                errors.fetch_add(1, Ordering::Relaxed);
            }
            histogram
                .lock()
                .await
                .record(latency.as_micros() as u64)
                .expect("in range");
        });
    }
    while tasks.join_next().await.is_some() {}
    let histogram = Arc::try_unwrap(histogram)
        .map_err(|_| anyhow::anyhow!("histogram still shared"))?
        .into_inner();
    Ok((histogram, errors.load(Ordering::Relaxed)))
}

struct LookupCost {
    entries: i64,
    histogram: Histogram<u64>,
    plan: String,
}

/// Times the near-duplicate lookup itself (the store function the write path calls), for random
/// fingerprints, and captures one EXPLAIN (ANALYZE, BUFFERS).
async fn measure_lookup(
    url: &str,
    user: &str,
    space: &str,
    samples: usize,
) -> anyhow::Result<LookupCost> {
    let pool = PgPoolOptions::new().max_connections(1).connect(url).await?;
    let scope = Scope::parse("scope", user, space)?;
    let entries = engram_store::memories::count(&pool, &scope).await?;
    let mut histogram = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3)?;
    let mut connection = pool.acquire().await?;
    let mut rng = rand::rng();
    for _ in 0..samples {
        let simhash = SimHash(rng.random());
        let started = Instant::now();
        engram_store::memories::find_near_duplicate(&mut connection, &scope, simhash).await?;
        histogram.record(started.elapsed().as_micros() as u64)?;
    }
    let [b0, b1, b2, b3] = SimHash(rng.random()).bands();
    let plan: Vec<String> = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) SELECT id FROM memories \
         WHERE user_id = '{user}' AND space = '{space}' AND kind = 'semantic' \
           AND (simhash_band0 = {b0} OR simhash_band1 = {b1} OR simhash_band2 = {b2} OR simhash_band3 = {b3}) \
           AND bit_count(int8send(simhash # 42)) <= 3"
    )))
    .fetch_all(&mut *connection)
    .await?;
    Ok(LookupCost {
        entries,
        histogram,
        plan: plan.join("\n"),
    })
}

/// The Postgres settings a report records.
#[derive(sqlx::FromRow)]
struct PostgresSettings {
    shared_buffers: String,
    huge_pages: String,
    synchronous_commit: String,
    full_page_writes: String,
    wal_writer_delay: String,
    wal_writer_flush_after: String,
}

fn micros(value: u64) -> String {
    format!("{:.2} ms", value as f64 / 1000.0)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Seed {
            spaces,
            entries_per_space,
            big_space_entries,
        } => {
            seed(
                &cli.database_url,
                spaces,
                entries_per_space,
                big_space_entries,
            )
            .await
        }
        Command::Run {
            endpoint,
            clients,
            seconds,
            spaces,
            repeat_share,
            rates,
            rate_seconds,
            report,
            command_line,
        } => {
            // Off the runtime's threads: the probe is a second or two of busy work.
            let host_before = tokio::task::spawn_blocking(HostSpeed::measure).await?;
            eprintln!("host speed before the load: {}", host_before.describe());
            eprintln!("load: {clients} clients for {seconds}s over {spaces} spaces");
            let load = run_load(&endpoint, clients, seconds, spaces, repeat_share).await?;
            let requests = load.histogram.len();
            let throughput = requests as f64 / load.elapsed.as_secs_f64();
            eprintln!(
                "{requests} requests, {throughput:.0}/s, p99 {}",
                micros(load.histogram.value_at_quantile(0.99))
            );
            let host_after = tokio::task::spawn_blocking(HostSpeed::measure).await?;
            eprintln!("host speed after the load: {}", host_after.describe());
            let mut per_second = load.per_second.clone();
            per_second.sort_unstable();
            let (slowest_second, median_second, fastest_second) = match per_second.as_slice() {
                [] => (0, 0, 0),
                sorted => (
                    sorted[0],
                    sorted[sorted.len() / 2],
                    sorted[sorted.len() - 1],
                ),
            };

            let mut rate_rows = Vec::new();
            for rate in rates {
                eprintln!("open loop: {rate} Remember/s for {rate_seconds}s");
                let (histogram, errors) =
                    run_at_rate(&endpoint, rate, rate_seconds, spaces, clients).await?;
                rate_rows.push(format!(
                    "| {rate} /s | {} | {} | {} | {} | {} | {errors} |",
                    histogram.len(),
                    micros(histogram.value_at_quantile(0.5)),
                    micros(histogram.value_at_quantile(0.95)),
                    micros(histogram.value_at_quantile(0.99)),
                    micros(histogram.max()),
                ));
            }

            let small = measure_lookup(&cli.database_url, &space_user(0), SPACE, 2000).await?;
            let big = measure_lookup(&cli.database_url, BIG_SPACE_USER, BIG_SPACE, 2000).await?;
            let mut connection = PgConnection::connect(&cli.database_url).await?;
            let total_entries: i64 = sqlx::query_scalar("SELECT count(*) FROM memories")
                .fetch_one(&mut connection)
                .await?;
            // The buffer cache and the settings a write's commit depends on, so that a report says
            // what it measured.
            let PostgresSettings {
                shared_buffers,
                huge_pages,
                synchronous_commit,
                full_page_writes,
                wal_writer_delay,
                wal_writer_flush_after,
            } = sqlx::query_as(
                "SELECT current_setting('shared_buffers') AS shared_buffers, \
                        current_setting('huge_pages_status') AS huge_pages, \
                        current_setting('synchronous_commit') AS synchronous_commit, \
                        current_setting('full_page_writes') AS full_page_writes, \
                        current_setting('wal_writer_delay') AS wal_writer_delay, \
                        current_setting('wal_writer_flush_after') AS wal_writer_flush_after",
            )
            .fetch_one(&mut connection)
            .await?;

            let h = &load.histogram;
            let lookup_row = |cost: &LookupCost| {
                format!(
                    "| {} | {} | {} | {} |",
                    cost.entries,
                    micros(cost.histogram.value_at_quantile(0.5)),
                    micros(cost.histogram.value_at_quantile(0.99)),
                    micros(cost.histogram.mean() as u64),
                )
            };
            let text = format!(
                "# Ingest benchmark\n\n\
                 Produced by `{command_line}` on {date}.\n\n\
                 Machine: {machine}.\n\n\
                 Postgres: shared_buffers {shared_buffers}, huge pages {huge_pages} (`make bench-ingest` puts the buffer \
                 cache on huge pages, as production should run it, when it can; `BENCH_HUGE_PAGES=0` measures on \
                 normal pages); synchronous_commit {synchronous_commit}, full_page_writes {full_page_writes}, \
                 wal_writer_delay {wal_writer_delay}, wal_writer_flush_after {wal_writer_flush_after} (0: the WAL writer \
                 flushes whatever WAL there is each time it wakes).\n\n\
                 ## Remember over gRPC\n\n\
                 Starting state: {spaces} spaces holding 200 entries each (every space at its soft cap, so every new \
                 entry also runs the capacity policy and trims one), plus one space of 100,000 entries; {total_entries} \
                 entries at the end. {clients} concurrent clients on one HTTP/2 connection for {seconds} s; {repeat:.0} % \
                 of writes repeat an earlier text of the same space (near-duplicate merges).\n\n\
                 | requests | throughput | p50 | p90 | p99 | p99.9 | max | created | merged | trimmed at once | trimmed | errors |\n\
                 |---|---|---|---|---|---|---|---|---|---|---|---|\n\
                 | {requests} | {throughput:.0} Remember/s | {p50} | {p90} | {p99} | {p999} | {max} | {created} | {merged} | {trimmed_at_once} | {trimmed} | {errors} |\n\n\
                 \"Trimmed at once\": new entries that scored lowest in their space and were trimmed by the soft cap \
                 in the same write (`REMEMBER_OUTCOME_TRIMMED_AT_CAPACITY`); \"trimmed\" counts every entry the soft \
                 cap removed. Writes answered in each second of the run: slowest {slowest_second}, median \
                 {median_second}, fastest {fastest_second}. Host speed (`engram_bench::bench::HostSpeed`, \
                 independent of Engram; compare it across reports) before the load: {host_before}; after it: \
                 {host_after}.\n\n\
                 With {clients} clients each waiting for its answer before sending again, mean latency is {clients} / \
                 throughput, so this run shows the saturation throughput, not the latency at a given load. Latency \
                 at fixed offered loads (open loop from the same {clients} concurrent clients, {rate_seconds} s each, \
                 measured from when each request was due, so time spent waiting for a free client counts):\n\n\
                 | offered load | requests | p50 | p95 | p99 | max | errors |\n|---|---|---|---|---|---|---|\n{rate_rows}\n\n\
                 ## Near-duplicate lookup cost\n\n\
                 The write path's lookup (`engram_store::memories::find_near_duplicate`), 2,000 random fingerprints \
                 per space, one connection, timed from the client:\n\n\
                 | entries in the space | p50 | p99 | mean |\n|---|---|---|---|\n{small_row}\n{big_row}\n\n\
                 Plan in the 100,000-entry space (four band-index probes, no scan of the space):\n\n```\n{big_plan}\n```\n\n\
                 Plan in a 200-entry space:\n\n```\n{small_plan}\n```\n",
                date = chrono::Utc::now().format("%Y-%m-%d %H:%M UTC"),
                machine = machine_summary(
                    "Postgres, the ingest service (release build) and the load generator"
                ),
                repeat = repeat_share * 100.0,
                p50 = micros(h.value_at_quantile(0.5)),
                p90 = micros(h.value_at_quantile(0.9)),
                p99 = micros(h.value_at_quantile(0.99)),
                p999 = micros(h.value_at_quantile(0.999)),
                max = micros(h.max()),
                created = load.tally.created,
                merged = load.tally.merged,
                trimmed = load.tally.trimmed,
                trimmed_at_once = load.tally.trimmed_at_capacity,
                host_before = host_before.describe(),
                host_after = host_after.describe(),
                errors = load.tally.errors + load.tally.other,
                rate_rows = rate_rows.join("\n"),
                small_row = lookup_row(&small),
                big_row = lookup_row(&big),
                big_plan = big.plan,
                small_plan = small.plan,
            );
            std::fs::write(&report, text)
                .with_context(|| format!("writing {}", report.display()))?;
            eprintln!("report written to {}", report.display());
            Ok(())
        }
    }
}
