//! Load generator of `make bench-embed`: the local model's raw throughput (batch 1 and 32), the
//! backfill's throughput draining a backlog, and the write-to-embedding latency at a steady write
//! rate, measured in one run against a release ingest service (started by deploy/bench/embed.sh).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use clap::Parser;
use engram_embed::{LocalEmbedder, LocalModelSettings};
use engram_proto::v1;
use engram_proto::v1::ingest_service_client::IngestServiceClient;
use rand::seq::IndexedRandom as _;
use sqlx::postgres::PgPoolOptions;

#[derive(Parser)]
#[command(about = "Engram embedding benchmark")]
struct Cli {
    #[arg(long, env = "ENGRAM_DATABASE__URL")]
    database_url: String,
    #[arg(long, env = "ENGRAM_EMBED__MODEL_DIR")]
    model_dir: PathBuf,
    #[arg(long, default_value = "http://127.0.0.1:50062")]
    endpoint: String,
    /// Entries in the backlog the backfill drains.
    #[arg(long, default_value_t = 2000)]
    backlog: usize,
    /// Steady write rate for the latency measurement.
    #[arg(long, default_value_t = 100)]
    rate: u32,
    #[arg(long, default_value_t = 30)]
    seconds: u64,
    #[arg(long)]
    report: PathBuf,
    #[arg(long, default_value = "make bench-embed")]
    command_line: String,
}

const WORDS: &[&str] = &[
    "meeting", "project", "flight", "coffee", "report", "deadline", "sister", "team", "budget",
    "Rust", "dentist", "Lisbon", "release", "weekly", "prefers", "moved", "reviewed", "asked",
    "every", "Friday", "morning", "garden", "invoice", "train", "database", "holiday", "doctor",
    "music", "running", "dinner",
];

fn sentence(rng: &mut impl rand::Rng) -> String {
    let length = rng.random_range(6..14);
    let words: Vec<&str> = (0..length).map(|_| *WORDS.choose(rng).unwrap()).collect();
    format!("{} {}", words.join(" "), rng.random_range(0..1_000_000))
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((p / 100.0) * (sorted.len() - 1) as f64).round() as usize]
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let mut rng = <rand::rngs::StdRng as rand::SeedableRng>::from_os_rng();

    // 1. Raw model throughput, in this process.
    let model = LocalEmbedder::load(&LocalModelSettings {
        model_dir: cli.model_dir.clone(),
        max_batch: 32,
        max_tokens: 256,
        inference_nice: 0,
        yield_to_requests: None,
    })?;
    let singles: Vec<String> = (0..64).map(|_| sentence(&mut rng)).collect();
    let started = Instant::now();
    for text in &singles {
        model.embed_blocking(std::slice::from_ref(text))?;
    }
    let batch1 = singles.len() as f64 / started.elapsed().as_secs_f64();
    let batched: Vec<String> = (0..512).map(|_| sentence(&mut rng)).collect();
    let started = Instant::now();
    model.embed_blocking(&batched)?;
    let batch32 = batched.len() as f64 / started.elapsed().as_secs_f64();
    drop(model);
    eprintln!("raw: batch 1 {batch1:.1}/s, batch 32 {batch32:.1}/s");

    // 2. Backfill throughput: a burst of writes over gRPC (16 at a time), each announced on the
    // bus; time from the first write until every entry is embedded.
    let pool = PgPoolOptions::new()
        .max_connections(2)
        .connect(&cli.database_url)
        .await?;
    let channel = tonic::transport::Channel::from_shared(cli.endpoint.clone())?
        .connect()
        .await?;
    let texts: Vec<String> = (0..cli.backlog).map(|_| sentence(&mut rng)).collect();
    let started = Instant::now();
    let mut burst = tokio::task::JoinSet::new();
    for chunk in texts.chunks(cli.backlog.div_ceil(16)) {
        let mut client = IngestServiceClient::new(channel.clone());
        let chunk = chunk.to_vec();
        burst.spawn(async move {
            for (index, text) in chunk.into_iter().enumerate() {
                let request = v1::RememberRequest {
                    scope: Some(v1::Scope {
                        user_id: format!("00000000-0000-4000-8000-{:012}", index % 50),
                        space: "burst".into(),
                    }),
                    text,
                    ..Default::default()
                };
                client.remember(request).await?;
            }
            Ok::<_, tonic::Status>(())
        });
    }
    while let Some(result) = burst.join_next().await {
        result??;
    }
    // From here on only the backfill works: its own rate, without the writes competing.
    let writes_done = Instant::now();
    let embedded_when_writes_done: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM memories WHERE space = 'burst' AND NOT needs_embedding",
    )
    .fetch_one(&pool)
    .await?;
    loop {
        let pending: i64 =
            sqlx::query_scalar("SELECT count(*) FROM memories WHERE needs_embedding")
                .fetch_one(&pool)
                .await?;
        if pending == 0 {
            break;
        }
        anyhow::ensure!(
            started.elapsed() < Duration::from_secs(600),
            "backlog not drained in 10 minutes"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let embedded_burst: i64 =
        sqlx::query_scalar("SELECT count(*) FROM memories WHERE space = 'burst'")
            .fetch_one(&pool)
            .await?;
    let drain = embedded_burst as f64 / started.elapsed().as_secs_f64();
    let drain_alone =
        (embedded_burst - embedded_when_writes_done) as f64 / writes_done.elapsed().as_secs_f64();
    eprintln!(
        "backfill embedded a burst of {embedded_burst} entries at {drain:.1}/s ({drain_alone:.1}/s after the writes)"
    );

    // 3. Write-to-embedding latency at a steady write rate over gRPC.
    let channel = tonic::transport::Channel::from_shared(cli.endpoint.clone())?
        .connect()
        .await?;
    let interval = Duration::from_secs_f64(1.0 / f64::from(cli.rate));
    let start = tokio::time::Instant::now();
    let mut writes = tokio::task::JoinSet::new();
    for index in 0..u64::from(cli.rate) * cli.seconds {
        tokio::time::sleep_until(start + interval.mul_f64(index as f64)).await;
        let mut client = IngestServiceClient::new(channel.clone());
        let request = v1::RememberRequest {
            scope: Some(v1::Scope {
                user_id: format!("00000000-0000-4000-8000-{:012}", index % 100),
                space: "steady".into(),
            }),
            text: sentence(&mut rng),
            ..Default::default()
        };
        writes.spawn(async move { client.remember(request).await.map(|_| ()) });
    }
    let mut failed = 0;
    while let Some(result) = writes.join_next().await {
        if !matches!(result, Ok(Ok(()))) {
            failed += 1;
        }
    }
    let settle = Instant::now();
    loop {
        let pending: i64 =
            sqlx::query_scalar("SELECT count(*) FROM memories WHERE needs_embedding")
                .fetch_one(&pool)
                .await?;
        if pending == 0 || settle.elapsed() > Duration::from_secs(120) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut latencies: Vec<f64> = sqlx::query_scalar(
        "SELECT extract(epoch FROM embedded_at - created_at)::float8 * 1000 FROM memories \
         WHERE space = 'steady' AND embedded_at IS NOT NULL",
    )
    .fetch_all(&pool)
    .await?;
    latencies.sort_by(f64::total_cmp);
    let writes = u64::from(cli.rate) * cli.seconds;
    eprintln!(
        "steady: {} embedded, p50 {:.0} ms, p95 {:.0} ms",
        latencies.len(),
        percentile(&latencies, 50.0),
        percentile(&latencies, 95.0)
    );

    let report = format!(
        "# Embedding benchmark\n\n\
         Produced by `{command}` on {date}, release build, 2 cores shared by Postgres, the ingest service and this \
         load generator. Model: all-MiniLM-L6-v2 (candle, CPU, f32), texts of 6–13 words.\n\n\
         ## Raw model throughput (in process)\n\n\
         | batch | sentences/s |\n|---|---|\n| 1 | {batch1:.1} |\n| 32 | {batch32:.1} |\n\n\
         ## Backfill throughput\n\n\
         A burst of {backlog} Remember calls over gRPC (16 at a time; {burst} distinct entries after near-duplicate \
         merging), each announced through the outbox and RabbitMQ; the ingest service's consumer embeds them in \
         batches and stores them. From the first write until every entry is embedded: **{drain:.1} entries/s**, \
         {share:.0} % of the raw batch-32 throughput. Once the writes were done ({writes_secs:.1} s in), the \
         backfill alone embedded the remaining {remaining} entries at **{drain_alone:.1} entries/s**, \
         {share_alone:.0} % of the raw throughput: the difference is the write burst competing for the same two \
         cores.\n\n\
         ## Write to embedding at {rate} writes/s\n\n\
         {writes} Remember calls over gRPC at a steady {rate}/s for {seconds} s ({failed} failed); time from each \
         entry's commit (`created_at`) to its embedding (`embedded_at`):\n\n\
         | embedded | p50 | p95 | max |\n|---|---|---|---|\n| {embedded} | {p50:.0} ms | {p95:.0} ms | {max:.0} ms |\n",
        command = cli.command_line,
        date = chrono::Utc::now().format("%Y-%m-%d %H:%M UTC"),
        backlog = cli.backlog,
        burst = embedded_burst,
        share = 100.0 * drain / batch32,
        share_alone = 100.0 * drain_alone / batch32,
        remaining = embedded_burst - embedded_when_writes_done,
        writes_secs = (writes_done - started).as_secs_f64(),
        rate = cli.rate,
        seconds = cli.seconds,
        embedded = latencies.len(),
        p50 = percentile(&latencies, 50.0),
        p95 = percentile(&latencies, 95.0),
        max = latencies.last().copied().unwrap_or(f64::NAN),
    );
    std::fs::write(&cli.report, report)
        .with_context(|| format!("writing {}", cli.report.display()))?;
    eprintln!("report written to {}", cli.report.display());
    Ok(())
}
