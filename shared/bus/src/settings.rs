//! The bus's connection settings (`amqp.*`), the same keys in every service that uses the bus;
//! each service adds the settings of its own consumers beside them.

use std::time::Duration;

use secrecy::{ExposeSecret as _, SecretString};
use serde::Deserialize;

use crate::BusTls;
use crate::consumer::ConsumerSettings;

#[derive(Debug, Clone, Deserialize)]
pub struct BusSettings {
    /// Off: this service neither publishes nor consumes (Postgres and the sweeps do the work).
    pub enabled: bool,
    /// `amqp://`, or `amqps://` for TLS (the broker's certificate checked against the web PKI
    /// roots, or `tls_ca_file`).
    pub url: SecretString,
    /// A PEM bundle of the CAs that sign the broker's certificate (a private CA).
    #[serde(default)]
    pub tls_ca_file: Option<std::path::PathBuf>,
    /// Names of exchanges and queues start with it (`engram.events`, ...).
    pub topology_prefix: String,
    /// Unacknowledged messages a consumer holds.
    pub prefetch: u16,
    /// Deliveries of a message before it is dead-lettered.
    pub max_attempts: u32,
    /// Delay before a failed message is delivered again.
    pub retry_delay_ms: u64,
    /// Longest wait between reconnection attempts when the broker is away.
    pub reconnect_max_backoff_ms: u64,
}

impl BusSettings {
    pub fn retry_delay(&self) -> Duration {
        Duration::from_millis(self.retry_delay_ms)
    }

    pub fn reconnect_max_backoff(&self) -> Duration {
        Duration::from_millis(self.reconnect_max_backoff_ms)
    }

    /// A consumer's settings, handling `concurrency` deliveries at once.
    pub fn consumer(&self, concurrency: usize) -> ConsumerSettings {
        ConsumerSettings {
            url: self.url.expose_secret().to_owned(),
            topology_prefix: self.topology_prefix.clone(),
            prefetch: self.prefetch,
            concurrency,
            retry_delay: self.retry_delay(),
            reconnect_max_backoff: self.reconnect_max_backoff(),
            tls: BusTls {
                ca_file: self.tls_ca_file.clone(),
            },
        }
    }
}
