//! Settings of the retrieval service (see the README's configuration table).

use engram_recall::{EmbedConfig, RecallSettings};
use engram_server::{AuthSettings, DatabaseSettings, GrpcSettings, SynchronousCommit};
use serde::{Deserialize, Serialize};

pub const DEFAULT_PORT: u16 = 50052;

#[derive(Debug, Clone, Deserialize, Serialize, garde::Validate)]
pub struct RetrievalSettings {
    #[garde(dive)]
    pub grpc: GrpcSettings,
    #[garde(dive)]
    pub database: DatabaseSettings,
    #[serde(default)]
    #[garde(skip)]
    pub auth: AuthSettings,
    /// The query embedder: the same model settings as ingest's backfill.
    #[garde(dive)]
    pub embed: EmbedConfig,
    #[garde(dive)]
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_numeric_setting_declares_a_range_and_the_defaults_are_within_them() {
        engram_server::settings::load_defaults_only::<RetrievalSettings>()
            .expect("the defaults are within their ranges");
        assert_eq!(
            engram_server::settings::numeric_settings_without_range::<RetrievalSettings>(),
            Vec::<String>::new()
        );
    }
}
