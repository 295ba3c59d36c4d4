//! `retrieval`: serve the retrieval gRPC API.

use clap::Parser;
use engram_retrieval::{App, RetrievalSettings};

/// A retrieval allocates many short-lived strings and vectors (rows, candidates, renderings):
/// glibc malloc took about a tenth of the service's CPU at saturation (`perf`, 2026-12-06);
/// mimalloc, as in ingest, serves them with less.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(
    name = "retrieval",
    version,
    about = "Engram retrieval service: reads memory for assistants"
)]
struct Cli {}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    Cli::parse();
    engram_server::run_service(
        "engram-retrieval",
        RetrievalSettings::load(),
        |settings| async {
            let app = App::build(settings).await?;
            app.run_until(engram_server::shutdown_signal()).await
        },
    )
    .await
}
