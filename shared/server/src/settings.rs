//! Settings are layered: compiled-in defaults, then an optional TOML file named by
//! `ENGRAM_CONFIG`, then `ENGRAM_*` environment variables with `__` between levels
//! (`ENGRAM_DATABASE__URL` sets `database.url`). Kubernetes sets env only.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use config::{Config, Environment, File, FileFormat};
use secrecy::SecretString;
use serde::Deserialize;
use serde::de::DeserializeOwned;

/// Environment variable naming an optional TOML settings file.
pub const CONFIG_FILE_ENV: &str = "ENGRAM_CONFIG";
/// Prefix of every Engram environment variable.
pub const ENV_PREFIX: &str = "ENGRAM";

/// The gRPC listener.
#[derive(Debug, Clone, Deserialize)]
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
    pub fn shutdown_grace(&self) -> Duration {
        Duration::from_secs(self.shutdown_grace_secs)
    }
}

/// The Postgres connection pool.
#[derive(Debug, Clone, Deserialize)]
pub struct DatabaseSettings {
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

/// When a commit returns, as Postgres's `synchronous_commit` has it. With `off` a commit is
/// visible to every other session at once and its WAL reaches the disk within a few
/// `wal_writer_delay`s; a crash of the server within that moment loses it (never corrupts it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
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
#[derive(Debug, Clone, Deserialize, Default)]
pub struct AuthSettings {
    /// JSON file: `[{"token": "...", "users": ["<uuid>", ...], "spaces": ["...", ...]}]`;
    /// `users` / `spaces` omitted or empty means any.
    pub tokens_file: Option<PathBuf>,
}

/// Defaults shared by every service; each service adds its own before calling [`load_settings`].
pub fn common_defaults(default_port: u16) -> Vec<(&'static str, config::Value)> {
    vec![
        (
            "grpc.listen_addr",
            format!("127.0.0.1:{default_port}").into(),
        ),
        ("grpc.shutdown_grace_secs", 20i64.into()),
        ("grpc.max_concurrent_requests_per_connection", 256i64.into()),
        ("grpc.request_timeout_secs", 30i64.into()),
        ("grpc.readiness_interval_ms", 2_000i64.into()),
        // 9451 / 9452 / 9453 beside ingest / retrieval / review's 50051 / 50052 / 50053.
        (
            "grpc.metrics_listen_addr",
            format!("127.0.0.1:{}", 9_400 + default_port % 100).into(),
        ),
        (
            "database.url",
            "postgres://postgres@127.0.0.1:55432/engram".into(),
        ),
        ("database.min_connections", 4i64.into()),
        ("database.max_connections", 16i64.into()),
        ("database.connect_timeout_secs", 10i64.into()),
        ("database.run_migrations", false.into()),
        ("database.schema_wait_secs", 120i64.into()),
        ("database.synchronous_commit", "on".into()),
    ]
}

/// Loads settings of type `T` from defaults, the optional file and the environment.
pub fn load_settings<T: DeserializeOwned>(
    defaults: Vec<(&'static str, config::Value)>,
) -> Result<T, config::ConfigError> {
    let mut builder = builder_with_defaults(defaults)?;
    if let Ok(path) = std::env::var(CONFIG_FILE_ENV) {
        builder = builder.add_source(File::new(&path, FileFormat::Toml).required(true));
    }
    builder
        .add_source(
            Environment::with_prefix(ENV_PREFIX)
                .prefix_separator("_")
                .separator("__")
                .try_parsing(true),
        )
        .build()?
        .try_deserialize()
}

/// The defaults alone, ignoring file and environment (tests build settings from here).
pub fn load_defaults_only<T: DeserializeOwned>(
    defaults: Vec<(&'static str, config::Value)>,
) -> Result<T, config::ConfigError> {
    builder_with_defaults(defaults)?.build()?.try_deserialize()
}

fn builder_with_defaults(
    defaults: Vec<(&'static str, config::Value)>,
) -> Result<config::ConfigBuilder<config::builder::DefaultState>, config::ConfigError> {
    defaults
        .into_iter()
        .try_fold(Config::builder(), |builder, (key, value)| {
            builder.set_default(key, value)
        })
}
