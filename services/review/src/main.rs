//! `review`: serve the review gRPC API.

use clap::Parser;
use engram_review::{App, ReviewSettings};

#[derive(Parser)]
#[command(
    name = "review",
    version,
    about = "Engram review service: FSRS state of episodic memories"
)]
struct Cli {}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    Cli::parse();
    let settings = ReviewSettings::load()
        .map_err(|error| anyhow::anyhow!("invalid configuration: {error}"))?;
    let telemetry = engram_telemetry::init_telemetry("engram-review")?;
    let result = match App::build(settings).await {
        Ok(app) => app.run_until(engram_server::shutdown_signal()).await,
        Err(error) => Err(error),
    };
    if let Err(error) = &result {
        tracing::error!(error = format!("{error:#}"), "review stopped with an error");
    }
    telemetry.shutdown();
    result
}
