//! Settings of the retrieval service (see the README's configuration table).

use engram_recall::{EmbedConfig, RecallSettings};
use engram_server::{AuthSettings, DatabaseSettings, GrpcSettings, SynchronousCommit};
use serde::{Deserialize, Serialize};

pub const DEFAULT_PORT: u16 = 50052;

#[derive(Debug, Clone, Deserialize, Serialize)]
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
        engram_server::load_settings()
    }
}

impl Default for RetrievalSettings {
    fn default() -> Self {
        Self {
            grpc: GrpcSettings::on_port(DEFAULT_PORT),
            database: DatabaseSettings {
                // Retrieval writes only what a read leaves behind: no read waits for a WAL flush
                // (see DatabaseSettings::synchronous_commit).
                synchronous_commit: SynchronousCommit::Off,
                ..DatabaseSettings::default()
            },
            auth: AuthSettings::default(),
            embed: EmbedConfig::default(),
            recall: RecallSettings::default(),
        }
    }
}
