//! Settings are layered: compiled-in defaults, then an optional TOML file named by
//! `ENGRAM_CONFIG`, then `ENGRAM_*` environment variables with `__` between levels
//! (`ENGRAM_DATABASE__URL` sets `database.url`). Kubernetes sets env only.
//!
//! The defaults live on the settings types: each struct's `Default` holds its values, with the
//! reason beside each; a service's settings type sets what differs for it (its port, who owns
//! migrations) in its own `Default`. [`load_settings`] serializes that default as the lowest
//! layer, so every key has a value and a file or a variable overrides one key at a time.
//!
//! Each numeric setting's range is declared on its field (`#[garde(range(...))]`) and checked
//! once the layers are merged: a value out of range fails start-up with the key, its
//! environment variable and the bound it broke, never at first use.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use config::{Config, ConfigError, Environment, File, FileFormat};
use garde::Validate;
use secrecy::{ExposeSecret as _, SecretString};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize, Serializer};

/// Environment variable naming an optional TOML settings file.
pub const CONFIG_FILE_ENV: &str = "ENGRAM_CONFIG";
/// Prefix of every Engram environment variable.
pub const ENV_PREFIX: &str = "ENGRAM";

/// The gRPC listener.
#[derive(Debug, Clone, Deserialize, Serialize, garde::Validate)]
#[garde(allow_unvalidated)]
pub struct GrpcSettings {
    /// Address to listen on; port 0 picks a free port (tests).
    pub listen_addr: SocketAddr,
    /// Time allowed for in-flight requests on SIGTERM; keep it below the pod's grace period.
    #[garde(range(max = 3_600))]
    pub shutdown_grace_secs: u64,
    /// Requests one client connection may have in flight; beyond it requests are refused at once
    /// with ResourceExhausted instead of queueing without bound.
    #[garde(range(min = 1, max = 100_000))]
    pub max_concurrent_requests_per_connection: usize,
    /// A request still running after this long (or after the caller's `grpc-timeout`, if sooner)
    /// is answered DEADLINE_EXCEEDED, or UNKNOWN when its write may have landed.
    #[garde(range(min = 1, max = 3_600))]
    pub request_timeout_secs: u64,
    /// How often readiness probes the database (NOT_SERVING after two failed probes in a row).
    #[garde(range(min = 100, max = 600_000))]
    pub readiness_interval_ms: u64,
    /// Where Prometheus scrapes `GET /metrics` (port 0 picks a free port).
    pub metrics_listen_addr: SocketAddr,
    /// TLS (`grpc.tls.cert_file` and `grpc.tls.key_file` set): the listener then speaks TLS
    /// only. Unset: plaintext, for local runs and a mesh that encrypts for us.
    #[serde(default)]
    #[garde(dive)]
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
#[derive(Debug, Clone, Deserialize, Serialize, garde::Validate)]
#[garde(allow_unvalidated)]
pub struct DatabaseSettings {
    #[serde(serialize_with = "expose_default_secret")]
    pub url: SecretString,
    /// Connections opened at start, before the service reports ready, and kept open (at most
    /// `max_connections`): requests right after a start or a quiet spell do not wait for a new
    /// connection and a new server process.
    #[garde(range(max = self.max_connections))]
    pub min_connections: u32,
    #[garde(range(min = 1, max = 1_000))]
    pub max_connections: u32,
    #[garde(range(min = 1, max = 600))]
    pub connect_timeout_secs: u64,
    /// Whether this process applies migrations at start (one owner: ingest). Others wait until
    /// the schema is current.
    pub run_migrations: bool,
    /// How long a service that does not own migrations waits for them at start.
    #[garde(range(max = 3_600))]
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

/// A service's settings: defaults on the type, read from the layers, each range declared on
/// its field.
pub trait Settings: Default + Serialize + DeserializeOwned + Validate<Context = ()> {}

impl<T: Default + Serialize + DeserializeOwned + Validate<Context = ()>> Settings for T {}

/// Loads settings of type `T`: its `Default`, then the optional file, then the environment;
/// then checks every value against its range.
pub fn load_settings<T: Settings>() -> Result<T, ConfigError> {
    load_settings_from(environment())
}

/// [`load_settings`] with the environment given (tests pass variables of their own).
pub fn load_settings_from<T: Settings>(environment: Environment) -> Result<T, ConfigError> {
    let mut builder = builder_with_defaults::<T>()?;
    if let Ok(path) = std::env::var(CONFIG_FILE_ENV) {
        builder = builder.add_source(File::new(&path, FileFormat::Toml).required(true));
    }
    checked(builder.add_source(environment).build()?)
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

/// The defaults alone, through the same layer and checks as [`load_settings`], ignoring file
/// and environment (tests build settings from here).
pub fn load_defaults_only<T: Settings>() -> Result<T, ConfigError> {
    checked(builder_with_defaults::<T>()?.build()?)
}

fn builder_with_defaults<T: Default + Serialize>()
-> Result<config::ConfigBuilder<config::builder::DefaultState>, ConfigError> {
    Ok(Config::builder().add_source(Config::try_from(&T::default())?))
}

/// The merged layers as `T`, once every value is within its range and every number finite.
fn checked<T: Settings>(merged: Config) -> Result<T, ConfigError> {
    let settings: T = merged.clone().try_deserialize()?;
    let mut problems = Vec::new();
    if let Err(report) = settings.validate() {
        for (path, error) in report.iter() {
            let key = configured_key(&merged, &path.to_string());
            let value = merged
                .get::<config::Value>(&key)
                .map_or_else(|_| "?".to_owned(), |value| value.to_string());
            problems.push(format!(
                "`{key}` ({}) is {value}: {error}",
                environment_variable(&key)
            ));
        }
    }
    // A range lets NaN through (it compares false both ways); TOML and the environment can both
    // spell it.
    non_finite_numbers(&merged.cache, "", &mut problems);
    if problems.is_empty() {
        Ok(settings)
    } else {
        Err(ConfigError::Message(format!(
            "settings out of range: {}",
            problems.join("; ")
        )))
    }
}

/// The key a setting is configured under, from the path of its field: a shared struct nested
/// with serde's `flatten` (`amqp.bus.max_attempts`) adds a field name that the keys do not have
/// (`amqp.max_attempts`), so a step is kept only where the merged layers have it.
fn configured_key(merged: &Config, field_path: &str) -> String {
    let mut key = String::new();
    for step in field_path.split('.') {
        let candidate = join_key(&key, step);
        if merged.get::<config::Value>(&candidate).is_ok() {
            key = candidate;
        }
    }
    key
}

/// `amqp.max_attempts` → `ENGRAM_AMQP__MAX_ATTEMPTS`, as [`environment`] reads it.
pub fn environment_variable(key: &str) -> String {
    format!("{ENV_PREFIX}_{}", key.replace('.', "__").to_uppercase())
}

fn non_finite_numbers(value: &config::Value, key: &str, problems: &mut Vec<String>) {
    match &value.kind {
        config::ValueKind::Float(number) if !number.is_finite() => problems.push(format!(
            "`{key}` ({}) is {number}: not a finite number",
            environment_variable(key)
        )),
        config::ValueKind::Table(table) => {
            for (name, nested) in table {
                non_finite_numbers(nested, &join_key(key, name), problems);
            }
        }
        _ => {}
    }
}

/// The numeric settings of `T` that no value of their type fails: each is set in turn to
/// values far outside any sensible range, and one that loads with every probe declares no
/// range. Each service's tests assert there are none, so a new number cannot skip its range.
pub fn numeric_settings_without_range<T: Settings>() -> Vec<String> {
    const INTEGER_PROBES: [i64; 7] = [i64::MIN, -1_000_000, -1, 0, 65_535, 4_294_967_295, i64::MAX];
    const FLOAT_PROBES: [f64; 3] = [-1e12, -1.0, 1e12];
    let defaults = Config::try_from(&T::default()).expect("the defaults serialize");
    let mut numeric = Vec::new();
    numeric_keys(&defaults.cache, "", &mut numeric);
    let refused = |key: &str, probe: config::Value| {
        let merged = builder_with_defaults::<T>()
            .and_then(|builder| builder.set_override(key, probe))
            .and_then(|builder| builder.build())
            .expect("a probe builds");
        matches!(checked::<T>(merged), Err(ConfigError::Message(message))
            if message.starts_with("settings out of range") && message.contains(&format!("`{key}`")))
    };
    numeric
        .into_iter()
        .filter(|(key, is_float)| {
            if *is_float {
                !FLOAT_PROBES
                    .iter()
                    .any(|probe| refused(key, (*probe).into()))
            } else {
                !INTEGER_PROBES
                    .iter()
                    .any(|probe| refused(key, (*probe).into()))
            }
        })
        .map(|(key, _)| key)
        .collect()
}

/// Every numeric key under `key`, and whether it holds a float.
fn numeric_keys(value: &config::Value, key: &str, found: &mut Vec<(String, bool)>) {
    use config::ValueKind;
    match &value.kind {
        ValueKind::Float(_) => found.push((key.to_owned(), true)),
        ValueKind::I64(_) | ValueKind::I128(_) | ValueKind::U64(_) | ValueKind::U128(_) => {
            found.push((key.to_owned(), false));
        }
        ValueKind::Table(table) => {
            for (name, nested) in table {
                numeric_keys(nested, &join_key(key, name), found);
            }
        }
        _ => {}
    }
}

fn join_key(parent: &str, name: &str) -> String {
    if parent.is_empty() {
        name.to_owned()
    } else {
        format!("{parent}.{name}")
    }
}
