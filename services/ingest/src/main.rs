//! `ingest`: serve the ingest gRPC API, or `ingest migrate` to apply migrations and exit.

use clap::{Parser, Subcommand};
use engram_ingest::{App, IngestSettings};

/// Many small, short-lived allocations per request (protobuf, JSON, analysis): mimalloc serves them
/// with far less CPU than glibc malloc (see docs/benchmarks/README.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(
    name = "ingest",
    version,
    about = "Engram ingest service: the memory write path and user controls"
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// Serve the gRPC API (the default).
    Serve,
    /// Apply database migrations and exit.
    Migrate,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let command = cli.command.unwrap_or(Command::Serve);
    engram_server::run_service("engram-ingest", IngestSettings::load(), |settings| async {
        match command {
            Command::Migrate => {
                let mut settings = settings;
                settings.database.run_migrations = true;
                let pool = engram_server::database::connect(&settings.database).await?;
                tracing::info!("migrations applied");
                drop(pool);
                Ok(())
            }
            Command::Serve => {
                let app = App::build(settings).await?;
                app.run_until(engram_server::shutdown_signal()).await
            }
        }
    })
    .await
}
