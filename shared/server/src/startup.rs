//! What every service does the same way at start: the process around `App::build`
//! ([`run_service`]) and the first steps of `App::build` itself ([`Foundation`]).

use std::future::Future;

use sqlx::PgPool;

use crate::auth::TokenRegistry;
use crate::settings::{AuthSettings, DatabaseSettings};

/// The parts every service builds first, in the order they must come: the metrics provider
/// before any instrument is made (instruments report to the provider installed first), the
/// access tokens, and the database pool (migrated by its owner, or waited for).
pub struct Foundation {
    pub tokens: TokenRegistry,
    pub pool: PgPool,
}

impl Foundation {
    pub async fn lay(auth: &AuthSettings, database: &DatabaseSettings) -> anyhow::Result<Self> {
        engram_telemetry::metrics_registry();
        let tokens = match &auth.tokens_file {
            Some(path) => TokenRegistry::from_file(path)?,
            None => TokenRegistry::open(),
        };
        let pool = crate::database::connect(database).await?;
        Ok(Self { tokens, pool })
    }
}

/// A service's `main` after its command line: telemetry up, `serve` run with the loaded
/// settings, the failure logged, telemetry flushed. `serve` is given the settings and
/// resolves when the service has stopped.
pub async fn run_service<S, F>(
    name: &'static str,
    settings: Result<S, config::ConfigError>,
    serve: impl FnOnce(S) -> F,
) -> anyhow::Result<()>
where
    F: Future<Output = anyhow::Result<()>>,
{
    let settings = settings.map_err(|error| anyhow::anyhow!("invalid configuration: {error}"))?;
    let telemetry = engram_telemetry::init_telemetry(name)?;
    let result = serve(settings).await;
    if let Err(error) = &result {
        tracing::error!(error = format!("{error:#}"), "{name} stopped with an error");
    }
    telemetry.shutdown();
    result
}
