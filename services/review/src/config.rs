//! Settings of the review service.

use engram_server::settings::common_defaults;
use engram_server::{AuthSettings, DatabaseSettings, GrpcSettings};
use serde::Deserialize;

pub const DEFAULT_PORT: u16 = 50053;

#[derive(Debug, Clone, Deserialize)]
pub struct ReviewSettings {
    pub grpc: GrpcSettings,
    pub database: DatabaseSettings,
    #[serde(default)]
    pub auth: AuthSettings,
}

impl ReviewSettings {
    pub fn load() -> Result<Self, config::ConfigError> {
        engram_server::load_settings(Self::defaults())
    }

    pub fn defaults() -> Vec<(&'static str, config::Value)> {
        common_defaults(DEFAULT_PORT)
    }
}
