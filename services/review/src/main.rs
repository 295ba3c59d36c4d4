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
    engram_server::run_service("engram-review", ReviewSettings::load(), |settings| async {
        let app = App::build(settings).await?;
        app.run_until(engram_server::shutdown_signal()).await
    })
    .await
}
