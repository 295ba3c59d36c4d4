//! Settings of the ingest service (see the README's configuration table).

use std::sync::Arc;

use chrono::Duration;
use engram_core::RetentionPolicy;
use engram_core::activity::RequestActivity;
use engram_core::retention::MAX_RETENTION_DAYS;
use engram_server::{AuthSettings, DatabaseSettings, GrpcSettings};

use crate::controls::MAX_SOFT_CAP;
use serde::{Deserialize, Serialize};

pub const DEFAULT_PORT: u16 = 50051;

/// The longest gap or idle time segmentation may be set to wait for (30 days).
const MAX_GAP_SECS: i64 = 30 * 86_400;
/// The longest time constant or lifetime in seconds (ten years).
const MAX_DURATION_SECS: i64 = 3_650 * 86_400;

#[derive(Debug, Clone, Deserialize, Serialize, garde::Validate)]
pub struct IngestSettings {
    #[garde(dive)]
    pub grpc: GrpcSettings,
    #[garde(dive)]
    pub database: DatabaseSettings,
    #[serde(default)]
    #[garde(skip)]
    pub auth: AuthSettings,
    #[garde(dive)]
    pub memory: MemorySettings,
    #[garde(dive)]
    pub embed: EmbedSettings,
    #[garde(dive)]
    pub amqp: AmqpSettings,
    /// The retrieval pipeline behind "what do you remember about X".
    #[garde(dive)]
    pub recall: engram_recall::RecallSettings,
    /// How conversations become episodes and facts.
    #[garde(dive)]
    pub segmentation: SegmentationSettings,
    /// The LLM behind titles, summaries, facts and surprise (none by default: local rules).
    #[garde(dive)]
    pub llm: engram_llm::LlmSettings,
    /// How long data is kept, and the job that deletes it.
    #[garde(dive)]
    pub retention: RetentionSettings,
}

/// Data retention (`retention.*`): the service-wide defaults of each space's rules (in days, 0:
/// off; see `engram_core::retention`) and the job that carries them out.
#[derive(Debug, Clone, Deserialize, Serialize, garde::Validate)]
#[garde(allow_unvalidated)]
pub struct RetentionSettings {
    /// Off: this replica never runs the job (PreviewRetention and the settings still work). On
    /// in every replica is fine: a lock lets one run at a time.
    pub enabled: bool,
    /// Time between runs.
    #[garde(range(min = 1, max = 604_800))]
    pub interval_secs: u64,
    /// Entries (or conversations' turns) deleted per transaction.
    #[garde(range(min = 1, max = 100_000))]
    pub batch: i64,
    /// Pause after each batch, so a long run leaves room for requests.
    #[garde(range(max = 60_000))]
    pub batch_pause_ms: u64,
    /// Spaces worked on at once (each on its own connection).
    #[garde(range(min = 1, max = 64))]
    pub concurrency: usize,
    #[garde(range(max = MAX_RETENTION_DAYS))]
    pub turn_retention_days: u32,
    #[garde(range(max = MAX_RETENTION_DAYS))]
    pub max_age_days: u32,
    #[garde(range(max = MAX_RETENTION_DAYS))]
    pub inactive_after_days: u32,
    #[garde(range(max = MAX_RETENTION_DAYS))]
    pub inactive_grace_days: u32,
    /// An episode is unused while its FSRS retrievability is below this.
    #[garde(range(min = 0.0, max = 1.0))]
    pub inactive_retrievability_below: f64,
    /// Only facts of importance below this can become inactive.
    #[garde(range(min = 0.0, max = 1.0))]
    pub inactive_fact_importance_below: f64,
}

impl RetentionSettings {
    /// The rules every space follows unless it set its own.
    pub fn defaults(&self) -> engram_core::retention::RetentionOverrides {
        engram_core::retention::RetentionOverrides {
            turn_days: Some(self.turn_retention_days),
            max_age_days: Some(self.max_age_days),
            inactive_after_days: Some(self.inactive_after_days),
            inactive_grace_days: Some(self.inactive_grace_days),
        }
    }

    pub fn inactivity(&self) -> engram_core::retention::InactivityRule {
        engram_core::retention::InactivityRule {
            retrievability_below: self.inactive_retrievability_below,
            fact_importance_below: self.inactive_fact_importance_below,
        }
    }
}

/// Segmentation and consolidation of conversations (`segmentation.*`); the rules are
/// `engram_core::segmentation`'s.
#[derive(Debug, Clone, Deserialize, Serialize, garde::Validate)]
#[garde(allow_unvalidated)]
pub struct SegmentationSettings {
    /// Off: turns are stored but no episode or fact is derived from them.
    pub enabled: bool,
    #[garde(range(min = 1, max = MAX_GAP_SECS))]
    pub hard_gap_secs: i64,
    #[garde(range(min = 1, max = MAX_GAP_SECS))]
    pub soft_gap_secs: i64,
    #[garde(range(min = -1.0, max = 1.0))]
    pub soft_gap_similarity: f32,
    #[garde(range(min = -1.0, max = 1.0))]
    pub topic_shift_similarity: f32,
    #[garde(range(max = 100_000))]
    pub topic_min_tokens: u32,
    #[garde(range(min = 1, max = self.max_turns))]
    pub min_turns: usize,
    #[garde(range(min = 1, max = 10_000))]
    pub max_turns: usize,
    #[garde(range(min = 1, max = 1_000_000))]
    pub max_tokens: u32,
    #[garde(range(min = 1, max = MAX_GAP_SECS))]
    pub idle_close_secs: i64,
    /// How often the sweep looks for idle segments and episodes left unconsolidated.
    #[garde(range(min = 100, max = 3_600_000))]
    pub sweep_interval_ms: u64,
    /// Derive semantic facts from new episodes.
    pub consolidate: bool,
    /// Conversations looked at together (their turns embedded in one model call): the
    /// segmentation consumer's batch, and the sweep's.
    #[garde(range(min = 1, max = 1_024))]
    pub batch: usize,
}

impl SegmentationSettings {
    pub fn rules(&self) -> engram_core::segmentation::SegmentationRules {
        engram_core::segmentation::SegmentationRules {
            hard_gap: Duration::seconds(self.hard_gap_secs),
            soft_gap: Duration::seconds(self.soft_gap_secs),
            soft_gap_similarity: self.soft_gap_similarity,
            topic_shift_similarity: self.topic_shift_similarity,
            topic_min_tokens: self.topic_min_tokens,
            min_turns: self.min_turns,
            max_turns: self.max_turns,
            max_tokens: self.max_tokens,
            idle_close: Duration::seconds(self.idle_close_secs),
        }
    }
}

pub use engram_embed::{EmbedProvider, OpenAiEmbedSettings};

/// The embedder (`embed.*`: the model settings every service shares) and the embedding
/// backfill's own settings.
#[derive(Debug, Clone, Deserialize, Serialize, garde::Validate)]
#[garde(allow_unvalidated)]
pub struct EmbedSettings {
    #[serde(flatten)]
    #[garde(dive)]
    pub model: engram_recall::EmbedConfig,
    /// How often the backfill looks for work when nothing woke it.
    #[garde(range(min = 10, max = 3_600_000))]
    pub poll_interval_ms: u64,
    /// Permanent failures after which an entry is left aside (dead-lettered).
    #[garde(range(min = 1, max = 100))]
    pub max_failures: i32,
    /// With the bus on, the sweep only takes entries at least this old (newer ones are the
    /// consumer's); with the bus off it takes everything at once.
    #[garde(range(max = 86_400_000))]
    pub sweep_min_age_ms: u64,
    /// The local model runs the backfill's forward passes only once no request of this service
    /// has been in flight for this long (0: at once, beside the requests). See
    /// `engram_embed::YieldToRequests`.
    #[garde(range(max = 60_000))]
    pub backfill_quiet_ms: u64,
    /// The longest an entry waits for a quiet moment: once the oldest entry of a backfill batch
    /// is this old, the batch runs beside the requests.
    #[garde(range(max = 86_400))]
    pub backfill_max_deferral_secs: u64,
}

/// The write path's policy knobs.
#[derive(Debug, Clone, Deserialize, Serialize, garde::Validate)]
#[garde(allow_unvalidated)]
pub struct MemorySettings {
    /// Entries a space may hold before the lowest-scored are trimmed (per-space override via
    /// UpdateSettings).
    #[garde(range(min = 1, max = MAX_SOFT_CAP))]
    pub soft_cap: u32,
    /// How long a forgotten memory's tombstone blocks its re-creation.
    #[garde(range(min = 0, max = MAX_DURATION_SECS))]
    pub tombstone_ttl_secs: i64,
    /// Recency time constant τ.
    #[garde(range(min = 1, max = MAX_DURATION_SECS))]
    pub recency_tau_secs: i64,
    /// Cached scores older than this are recomputed before trimming.
    #[garde(range(min = 0, max = MAX_DURATION_SECS))]
    pub score_staleness_secs: i64,
    /// Longest accepted memory text, in characters.
    #[garde(range(min = 1, max = 1_000_000))]
    pub max_text_chars: usize,
    /// Most Remembers written in one transaction by the group commit.
    #[garde(range(min = 1, max = 1_000))]
    pub write_batch_max: usize,
    /// Group-commit transactions in flight at once (each holds a database connection).
    #[garde(range(min = 1, max = 64))]
    pub write_batch_concurrency: usize,
    /// The longest a freed commit slot waits for the writes of the wave it expects (its share of
    /// the writes under way, such as the callers it just answered), counted from when it starts
    /// waiting. Microseconds; 0 never waits.
    #[garde(range(max = 1_000_000))]
    pub write_batch_linger_us: u64,
}

impl EmbedSettings {
    /// The embedder, its background passes running between the requests `activity` counts.
    pub fn embedder_choice(&self, activity: &Arc<RequestActivity>) -> engram_embed::EmbedderChoice {
        engram_embed::EmbedderChoice {
            yield_to_requests: (self.backfill_quiet_ms > 0).then(|| {
                engram_embed::YieldToRequests {
                    activity: activity.clone(),
                    quiet: std::time::Duration::from_millis(self.backfill_quiet_ms),
                }
            }),
            ..self.model.embedder_choice()
        }
    }

    /// See `backfill_max_deferral_secs`.
    pub fn backfill_max_deferral(&self) -> std::time::Duration {
        std::time::Duration::from_secs(self.backfill_max_deferral_secs)
    }
}

impl MemorySettings {
    pub fn retention(&self) -> RetentionPolicy {
        RetentionPolicy {
            recency_tau: Duration::seconds(self.recency_tau_secs),
            score_staleness: Duration::seconds(self.score_staleness_secs),
        }
    }

    pub fn tombstone_ttl(&self) -> Duration {
        Duration::seconds(self.tombstone_ttl_secs)
    }

    pub fn group_commit(&self) -> GroupCommitSettings {
        GroupCommitSettings {
            max_batch: self.write_batch_max,
            concurrency: self.write_batch_concurrency,
            linger: std::time::Duration::from_micros(self.write_batch_linger_us),
        }
    }
}

impl IngestSettings {
    /// Defaults, then `ENGRAM_CONFIG`'s file, then `ENGRAM_*` variables.
    pub fn load() -> Result<Self, config::ConfigError> {
        engram_server::load_settings()
    }
}

impl Default for IngestSettings {
    fn default() -> Self {
        Self {
            grpc: GrpcSettings::on_port(DEFAULT_PORT),
            database: DatabaseSettings {
                // Ingest is the one migration owner.
                run_migrations: true,
                ..DatabaseSettings::default()
            },
            auth: AuthSettings::default(),
            memory: MemorySettings::default(),
            embed: EmbedSettings::default(),
            amqp: AmqpSettings::default(),
            recall: engram_recall::RecallSettings::default(),
            segmentation: SegmentationSettings::default(),
            llm: engram_llm::LlmSettings::default(),
            retention: RetentionSettings::default(),
        }
    }
}

impl Default for MemorySettings {
    fn default() -> Self {
        Self {
            soft_cap: 200,
            tombstone_ttl_secs: 86_400,
            recency_tau_secs: 604_800,
            score_staleness_secs: 86_400,
            max_text_chars: 8_192,
            write_batch_max: 32,
            write_batch_concurrency: 2,
            write_batch_linger_us: 3_000,
        }
    }
}

impl Default for EmbedSettings {
    fn default() -> Self {
        Self {
            model: engram_recall::EmbedConfig {
                // Everything ingest embeds is background work (backfill, segmentation,
                // consolidation) beside appends that answer in milliseconds: a busy model then
                // delays requests little (shared/embed/src/inference.rs).
                inference_nice: 10,
                ..engram_recall::EmbedConfig::default()
            },
            poll_interval_ms: 1_000,
            max_failures: 5,
            sweep_min_age_ms: 10_000,
            // At 200 requests a second a 50 ms gap between them hardly ever comes, so the model
            // waits; at a few a second most gaps are longer, and it runs in them. Five minutes
            // bounds what a sustained load defers (docs/benchmarks/README.md, "the model between
            // requests").
            backfill_quiet_ms: 50,
            backfill_max_deferral_secs: 300,
        }
    }
}

impl Default for AmqpSettings {
    fn default() -> Self {
        Self {
            bus: engram_bus::BusSettings {
                prefetch: 64,
                ..engram_bus::BusSettings::default()
            },
            relay_batch: 100,
            relay_poll_ms: 500,
            batch_window_ms: 50,
        }
    }
}

impl Default for SegmentationSettings {
    /// The rules' own defaults (`engram_core::segmentation`), on, consolidating.
    fn default() -> Self {
        let rules = engram_core::segmentation::SegmentationRules::default();
        Self {
            enabled: true,
            hard_gap_secs: rules.hard_gap.num_seconds(),
            soft_gap_secs: rules.soft_gap.num_seconds(),
            soft_gap_similarity: rules.soft_gap_similarity,
            topic_shift_similarity: rules.topic_shift_similarity,
            topic_min_tokens: rules.topic_min_tokens,
            min_turns: rules.min_turns,
            max_turns: rules.max_turns,
            max_tokens: rules.max_tokens,
            idle_close_secs: rules.idle_close.num_seconds(),
            sweep_interval_ms: 5_000,
            consolidate: true,
            batch: 32,
        }
    }
}

impl Default for RetentionSettings {
    fn default() -> Self {
        Self {
            enabled: true,
            interval_secs: 3_600,
            batch: 500,
            // Leaves the requests room: a run deleting flat out on two cores raised
            // RetrieveMemory's p95 by 23 %; with 10 ms it still deletes 6,000 rows/s
            // (docs/benchmarks/README.md, "Retention").
            batch_pause_ms: 10,
            concurrency: 2,
            // Raw turns: the summarized form (the episode) is what is kept for long.
            turn_retention_days: 180,
            // Off: nothing is deleted for its age alone unless a space asks for it.
            max_age_days: 0,
            inactive_after_days: 90,
            inactive_grace_days: 90,
            // FSRS-6's forgetting curve has a long tail (0.1 is reached only after about three
            // million stability-days); 0.5, more likely forgotten than recalled, is reached
            // after about 90 (some 200 days for an episode never reviewed).
            inactive_retrievability_below: 0.5,
            // Plain facts (0.3) and small talk fade; preferences, commitments and facts with
            // confident metadata (0.5 and more) stay.
            inactive_fact_importance_below: 0.4,
        }
    }
}

/// The RabbitMQ bus (`amqp.*`): the connection every service shares, then the outbox relay's
/// and the consumers' own settings.
#[derive(Debug, Clone, Deserialize, Serialize, garde::Validate)]
pub struct AmqpSettings {
    /// Off: no events are written or published; the sweep alone fills in embeddings.
    #[serde(flatten)]
    #[garde(dive)]
    pub bus: engram_bus::BusSettings,
    /// Outbox events published per relay round.
    #[garde(range(min = 1, max = 10_000))]
    pub relay_batch: i64,
    /// How often the relay looks for events it was not woken for.
    #[garde(range(min = 10, max = 600_000))]
    pub relay_poll_ms: u64,
    /// How long the consumer gathers messages into one embedding batch.
    #[garde(range(max = 10_000))]
    pub batch_window_ms: u64,
}

/// How writes are grouped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GroupCommitSettings {
    /// Most writes in one transaction.
    pub max_batch: usize,
    /// Transactions in flight at once (each holds a database connection).
    pub concurrency: usize,
    /// The longest a batch waits for the writes it expects, from when it starts waiting (see
    /// `group_commit::WavePlanner`). Zero: never waits.
    pub linger: std::time::Duration,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The settings as the service loads them, with `variables` as the environment.
    fn try_load(variables: &[(&str, &str)]) -> Result<IngestSettings, config::ConfigError> {
        let variables = variables
            .iter()
            .map(|(name, value)| ((*name).to_owned(), (*value).to_owned()))
            .collect();
        engram_server::settings::load_settings_from(
            engram_server::settings::environment().source(Some(variables)),
        )
    }

    fn load(variables: &[(&str, &str)]) -> IngestSettings {
        try_load(variables).unwrap()
    }

    fn refusal(variables: &[(&str, &str)]) -> String {
        try_load(variables)
            .expect_err("out of range: start-up fails")
            .to_string()
    }

    #[test]
    fn a_value_out_of_range_fails_with_its_key_variable_and_bound() {
        assert_eq!(
            refusal(&[("ENGRAM_AMQP__MAX_ATTEMPTS", "0")]),
            "settings out of range: `amqp.max_attempts` (ENGRAM_AMQP__MAX_ATTEMPTS) is 0: \
             lower than 1"
        );
        // Nested, flattened and table-declared settings are named by their keys too.
        let message = refusal(&[
            ("ENGRAM_EMBED__OPENAI__TIMEOUT_SECS", "0"),
            ("ENGRAM_EMBED__BATCH_SIZE", "100000"),
            ("ENGRAM_MEMORY__SOFT_CAP", "5000000"),
            ("ENGRAM_RECALL__MMR_LAMBDA", "7"),
        ]);
        for expected in [
            "`embed.openai.timeout_secs` (ENGRAM_EMBED__OPENAI__TIMEOUT_SECS) is 0: lower than 1",
            "`embed.batch_size` (ENGRAM_EMBED__BATCH_SIZE) is 100000: greater than 2048",
            "`memory.soft_cap` (ENGRAM_MEMORY__SOFT_CAP) is 5000000: greater than 1000000",
            "`recall.mmr_lambda` (ENGRAM_RECALL__MMR_LAMBDA) is 7: greater than 1",
        ] {
            assert!(
                message.contains(expected),
                "{expected:?} not in {message:?}"
            );
        }
        // One bound set by another setting.
        assert!(
            refusal(&[("ENGRAM_SEGMENTATION__MIN_TURNS", "500")])
                .contains("`segmentation.min_turns` (ENGRAM_SEGMENTATION__MIN_TURNS) is 500")
        );
    }

    #[test]
    fn a_number_that_is_not_finite_fails_though_no_bound_catches_it() {
        assert!(
            refusal(&[("ENGRAM_RETENTION__INACTIVE_RETRIEVABILITY_BELOW", "NaN")]).contains(
                "`retention.inactive_retrievability_below` \
                 (ENGRAM_RETENTION__INACTIVE_RETRIEVABILITY_BELOW) is NaN: not a finite number"
            )
        );
    }

    #[test]
    fn every_numeric_setting_declares_a_range_and_the_defaults_are_within_them() {
        engram_server::settings::load_defaults_only::<IngestSettings>()
            .expect("the defaults are within their ranges");
        assert_eq!(
            engram_server::settings::numeric_settings_without_range::<IngestSettings>(),
            Vec::<String>::new()
        );
    }

    #[test]
    fn a_default_that_differs_by_service_survives_a_neighbour_set_by_the_environment() {
        let settings = load(&[
            ("ENGRAM_DATABASE__URL", "postgres://elsewhere/engram"),
            ("ENGRAM_AMQP__URL", "amqp://broker:5672/%2f"),
            ("ENGRAM_EMBED__PROVIDER", "disabled"),
        ]);
        // Ingest's own defaults inside shared structs, though a key beside each was set.
        assert!(settings.database.run_migrations, "ingest owns migrations");
        assert_eq!(settings.amqp.bus.prefetch, 64);
        assert_eq!(settings.embed.model.inference_nice, 10);
        assert_eq!(settings.embed.model.provider, EmbedProvider::Disabled);
        assert_eq!(settings.grpc.listen_addr.port(), DEFAULT_PORT);
        assert_eq!(settings.grpc.metrics_listen_addr.port(), 9451);
        // The rest keeps its default.
        assert_eq!(settings.memory.soft_cap, 200);
        assert_eq!(settings.recall.token_budget, 2_000);
        assert!(settings.grpc.tls.is_none());
        assert!(settings.llm.api_key.is_none());
    }

    #[test]
    fn one_key_of_a_table_the_defaults_leave_empty_can_be_set() {
        let settings = load(&[
            ("ENGRAM_GRPC__TLS__CERT_FILE", "/etc/engram/tls.crt"),
            ("ENGRAM_GRPC__TLS__KEY_FILE", "/etc/engram/tls.key"),
            ("ENGRAM_AMQP__MAX_ATTEMPTS", "9"),
            ("ENGRAM_EMBED__BATCH_SIZE", "8"),
        ]);
        let tls = settings.grpc.tls.expect("TLS is on");
        assert_eq!(
            tls.cert_file,
            std::path::PathBuf::from("/etc/engram/tls.crt")
        );
        assert_eq!(
            tls.reload_interval_secs, 30,
            "its own defaults fill the rest"
        );
        assert_eq!(settings.amqp.bus.max_attempts, 9);
        assert_eq!(settings.amqp.relay_batch, 100);
        assert_eq!(settings.embed.model.batch_size, 8);
        assert_eq!(settings.embed.poll_interval_ms, 1_000);
    }
}
