//! The bus's connection settings (`amqp.*`), the same keys in every service that uses the bus;
//! each service adds the settings of its own consumers beside them.

use std::time::Duration;

use secrecy::{ExposeSecret as _, SecretString};
use serde::{Deserialize, Serialize, Serializer};

use crate::BusTls;
use crate::consumer::ConsumerSettings;

#[derive(Debug, Clone, Deserialize, Serialize, garde::Validate)]
#[garde(allow_unvalidated)]
pub struct BusSettings {
    /// Off: this service neither publishes nor consumes (Postgres and the sweeps do the work).
    pub enabled: bool,
    /// `amqp://`, or `amqps://` for TLS (the broker's certificate checked against the web PKI
    /// roots, or `tls_ca_file`).
    #[serde(serialize_with = "expose_default_url")]
    pub url: SecretString,
    /// A PEM bundle of the CAs that sign the broker's certificate (a private CA).
    #[serde(default)]
    pub tls_ca_file: Option<std::path::PathBuf>,
    /// Names of exchanges and queues start with it (`engram.events`, ...).
    pub topology_prefix: String,
    /// Unacknowledged messages a consumer holds.
    #[garde(range(min = 1))]
    pub prefetch: u16,
    /// Deliveries of a message before it is dead-lettered.
    #[garde(range(min = 1, max = 100))]
    pub max_attempts: u32,
    /// Delay before a failed message is delivered again.
    #[garde(range(max = 3_600_000))]
    pub retry_delay_ms: u64,
    /// Longest wait between reconnection attempts when the broker is away.
    #[garde(range(min = 100, max = 3_600_000))]
    pub reconnect_max_backoff_ms: u64,
}

impl Default for BusSettings {
    /// The local RabbitMQ of `make up`; five deliveries two seconds apart before a message is
    /// dead-lettered. Each service sets its consumers' prefetch.
    fn default() -> Self {
        Self {
            enabled: true,
            url: SecretString::from("amqp://guest:guest@127.0.0.1:5672/%2f"),
            tls_ca_file: None,
            topology_prefix: "engram".to_owned(),
            prefetch: 16,
            max_attempts: 5,
            retry_delay_ms: 2_000,
            reconnect_max_backoff_ms: 10_000,
        }
    }
}

/// Writes the default URL into the defaults layer (a local broker's well-known guest login);
/// what a deployment sets is never serialized.
fn expose_default_url<S: Serializer>(url: &SecretString, serializer: S) -> Result<S::Ok, S::Error> {
    serializer.serialize_str(url.expose_secret())
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
