//! Settings of the retrieval service (see the README's configuration table).

use engram_recall::{EmbedConfig, RecallSettings};
use engram_server::settings::common_defaults;
use engram_server::{AuthSettings, DatabaseSettings, GrpcSettings};
use serde::Deserialize;

pub const DEFAULT_PORT: u16 = 50052;

#[derive(Debug, Clone, Deserialize)]
pub struct RetrievalSettings {
    pub grpc: GrpcSettings,
    pub database: DatabaseSettings,
    #[serde(default)]
    pub auth: AuthSettings,
    /// The query embedder: the same model settings as ingest's backfill.
    pub embed: EmbedConfig,
    pub recall: RecallSettings,
}

impl RetrievalSettings {
    /// Defaults, then `ENGRAM_CONFIG`'s file, then `ENGRAM_*` variables.
    pub fn load() -> Result<Self, config::ConfigError> {
        engram_server::load_settings(Self::defaults())
    }

    pub fn defaults() -> Vec<(&'static str, config::Value)> {
        let mut defaults = common_defaults(DEFAULT_PORT);
        // Retrieval writes only what a read leaves behind: no read waits for a WAL flush (see
        // DatabaseSettings::synchronous_commit).
        defaults.push(("database.synchronous_commit", "off".into()));
        defaults.extend(engram_recall::embed_defaults());
        defaults.extend(RecallSettings::defaults());
        defaults
    }
}
