//! Settings are layered: compiled-in defaults, then an optional TOML file named by
//! `ENGRAM_CONFIG`, then `ENGRAM_*` environment variables with `__` between levels
//! (`ENGRAM_DATABASE__URL` sets `database.url`). Kubernetes sets env only.
//!
//! The defaults live on the settings types: each struct's `Default` holds its values, with the
//! reason beside each; a service's settings type sets what differs for it (its port, who owns
//! migrations) in its own `Default`. [`load_settings`] serializes that default as the lowest
//! layer, so every key has a value and a file or a variable overrides one key at a time.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use config::{Config, Environment, File, FileFormat};
use secrecy::{ExposeSecret as _, SecretString};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize, Serializer};

/// Environment variable naming an optional TOML settings file.
pub const CONFIG_FILE_ENV: &str = "ENGRAM_CONFIG";
/// Prefix of every Engram environment variable.
pub const ENV_PREFIX: &str = "ENGRAM";

/// The gRPC listener.
#[derive(Debug, Clone, Deserialize, Serialize)]
pub struct GrpcSettings {
    /// Address to listen on; port 0 picks a free port (tests).
    pub listen_addr: SocketAddr,
    /// Time allowed for in-flight requests on SIGTERM; keep it below the pod's grace period.
    pub shutdown_grace_secs: u64,
    /// Requests one client connection may have in flight; beyond it requests are refused at once
    /// with ResourceExhausted instead of queueing without bound.
    pub max_concurrent_requests_per_connection: usize,
    /// A request still running after this long (or after the caller's `grpc-timeout`, if sooner)
    /// is answered DEADLINE_EXCEEDED, or UNKNOWN when its write may have landed.
    pub request_timeout_secs: u64,
    /// How often readiness probes the database (NOT_SERVING after two failed probes in a row).
    pub readiness_interval_ms: u64,
    /// Where Prometheus scrapes `GET /metrics` (port 0 picks a free port).
    pub metrics_listen_addr: SocketAddr,
    /// TLS (`grpc.tls.cert_file` and `grpc.tls.key_file` set): the listener then speaks TLS
    /// only. Unset: plaintext, for local runs and a mesh that encrypts for us.
    #[serde(default)]
    pub tls: Option<crate::tls::TlsSettings>,
}

impl GrpcSettings {
    /// A service's listener on `port` of the loopback interface (a deployment sets its own
    /// address), and its metrics on 94xx beside it: 9451 / 9452 / 9453 beside ingest /
    /// retrieval / review's 50051 / 50052 / 50053.
    pub fn on_port(port: u16) -> Self {
        Self {
            listen_addr: SocketAddr::from(([127, 0, 0, 1], port)),
            shutdown_grace_secs: 20,
            max_concurrent_requests_per_connection: 256,
            request_timeout_secs: 30,
            readiness_interval_ms: 2_000,
            metrics_listen_addr: SocketAddr::from(([127, 0, 0, 1], 9_400 + port % 100)),
            tls: None,
        }
    }

    pub fn shutdown_grace(&self) -> Duration {
        Duration::from_secs(self.shutdown_grace_secs)
    }
}

/// The Postgres connection pool.
#[derive(Debug, Clone, Deserialize, Serialize)]
pub struct DatabaseSettings {
    #[serde(serialize_with = "expose_default_secret")]
    pub url: SecretString,
    /// Connections opened at start, before the service reports ready, and kept open (at most
    /// `max_connections`): requests right after a start or a quiet spell do not wait for a new
    /// connection and a new server process.
    pub min_connections: u32,
    pub max_connections: u32,
    pub connect_timeout_secs: u64,
    /// Whether this process applies migrations at start (one owner: ingest). Others wait until
    /// the schema is current.
    pub run_migrations: bool,
    /// How long a service that does not own migrations waits for them at start.
    pub schema_wait_secs: u64,
    /// Postgres's `synchronous_commit` for this service's connections: `on` where a commit holds
    /// what users gave Engram (ingest, review); `off` in retrieval, whose only writes are what a
    /// read leaves behind (the scores cache, the record of what was served for review, request
    /// metrics), so that no read waits for a WAL flush.
    pub synchronous_commit: SynchronousCommit,
}

impl Default for DatabaseSettings {
    /// The local Postgres of `make up`; a service that owns migrations says so in its own
    /// defaults.
    fn default() -> Self {
        Self {
            url: SecretString::from("postgres://postgres@127.0.0.1:55432/engram"),
            min_connections: 4,
            max_connections: 16,
            connect_timeout_secs: 10,
            run_migrations: false,
            schema_wait_secs: 120,
            synchronous_commit: SynchronousCommit::On,
        }
    }
}

/// Writes a secret's default into the defaults layer. Only defaults are ever serialized (a
/// local URL without a password); what a deployment sets comes from its file or environment
/// and is never written anywhere.
pub fn expose_default_secret<S: Serializer>(
    secret: &SecretString,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    serializer.serialize_str(secret.expose_secret())
}

/// When a commit returns, as Postgres's `synchronous_commit` has it. With `off` a commit is
/// visible to every other session at once and its WAL reaches the disk within a few
/// `wal_writer_delay`s; a crash of the server within that moment loses it (never corrupts it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SynchronousCommit {
    On,
    Off,
    Local,
    RemoteWrite,
    RemoteApply,
}

impl SynchronousCommit {
    /// The setting's value as Postgres spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::On => "on",
            Self::Off => "off",
            Self::Local => "local",
            Self::RemoteWrite => "remote_write",
            Self::RemoteApply => "remote_apply",
        }
    }
}

/// Bearer-token access. With no tokens file, access is open (local runs), and the log says so.
#[derive(Debug, Clone, Deserialize, Serialize, Default)]
pub struct AuthSettings {
    /// JSON file: `[{"token": "...", "users": ["<uuid>", ...], "spaces": ["...", ...]}]`;
    /// `users` / `spaces` omitted or empty means any.
    pub tokens_file: Option<PathBuf>,
}

/// Loads settings of type `T`: its `Default`, then the optional file, then the environment.
pub fn load_settings<T: Default + Serialize + DeserializeOwned>() -> Result<T, config::ConfigError>
{
    let mut builder = builder_with_defaults::<T>()?;
    if let Ok(path) = std::env::var(CONFIG_FILE_ENV) {
        builder = builder.add_source(File::new(&path, FileFormat::Toml).required(true));
    }
    builder.add_source(environment()).build()?.try_deserialize()
}

/// The `ENGRAM_*` variables as a source. Values that read as numbers or booleans are taken as
/// such: a setting nested in a shared struct (serde's `flatten`: `amqp.*`, `embed.*`,
/// `recall.*`) is read as it comes, so `ENGRAM_AMQP__MAX_ATTEMPTS=9` must be the number 9.
/// (The one thing this costs: a text setting of such a struct cannot be all digits.)
pub fn environment() -> Environment {
    Environment::with_prefix(ENV_PREFIX)
        .prefix_separator("_")
        .separator("__")
        .try_parsing(true)
}

/// The defaults alone, through the same layer [`load_settings`] builds on, ignoring file and
/// environment (tests build settings from here).
pub fn load_defaults_only<T: Default + Serialize + DeserializeOwned>()
-> Result<T, config::ConfigError> {
    builder_with_defaults::<T>()?.build()?.try_deserialize()
}

fn builder_with_defaults<T: Default + Serialize>()
-> Result<config::ConfigBuilder<config::builder::DefaultState>, config::ConfigError> {
    Ok(Config::builder().add_source(Config::try_from(&T::default())?))
}
