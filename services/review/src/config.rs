//! Settings of the review service (see the README's configuration table).

use engram_core::review::GraderThresholds;
use engram_recall::EmbedConfig;
use engram_server::{AuthSettings, DatabaseSettings, GrpcSettings};
use serde::{Deserialize, Serialize};

pub const DEFAULT_PORT: u16 = 50053;

#[derive(Debug, Clone, Deserialize, Serialize, garde::Validate)]
pub struct ReviewSettings {
    #[garde(dive)]
    pub grpc: GrpcSettings,
    #[garde(dive)]
    pub database: DatabaseSettings,
    #[serde(default)]
    #[garde(skip)]
    pub auth: AuthSettings,
    /// The local grader's embedder: the same model settings as the other services.
    #[garde(dive)]
    pub embed: EmbedConfig,
    /// The LLM grader (none by default: the local grader).
    #[garde(dive)]
    pub llm: engram_llm::LlmSettings,
    #[garde(dive)]
    pub amqp: ReviewBusSettings,
    #[garde(dive)]
    pub grading: GradingSettings,
}

/// The consumer of closed segments (`amqp.*`: the connection every service shares, and how
/// many segments it reviews at once).
#[derive(Debug, Clone, Deserialize, Serialize, garde::Validate)]
pub struct ReviewBusSettings {
    /// Off: segments are not consumed (GradeMemories still works).
    #[serde(flatten)]
    #[garde(dive)]
    pub bus: engram_bus::BusSettings,
    /// Segments reviewed at once (of different spaces; a space's wait their turn). Reviews
    /// mostly wait on the database's commit, so a few at a time multiply the throughput.
    #[garde(range(min = 1, max = 256))]
    pub review_concurrency: u16,
}

/// How memories are graded and what a grade does (`grading.*`).
#[derive(Debug, Clone, Deserialize, Serialize, garde::Validate)]
#[garde(allow_unvalidated)]
pub struct GradingSettings {
    /// The retention FSRS schedules for (FSRS works between 0.7 and 0.99).
    #[garde(range(min = 0.7, max = 0.99))]
    pub desired_retention: f32,
    /// When the LLM fails: `local` grades with the local grader (and says so in the audit),
    /// `retry` leaves the message for a later delivery (and the dead-letter queue in the end).
    pub on_llm_failure: LlmFailure,
    /// The local grader's evidence bands and the term overlap's share of the evidence
    /// (calibrated on tests/eval/review: docs/eval/review.md).
    #[garde(range(min = 0.0, max = self.local_good))]
    pub local_hard: f64,
    #[garde(range(min = 0.0, max = self.local_easy))]
    pub local_good: f64,
    #[garde(range(min = 0.0, max = 1.0))]
    pub local_easy: f64,
    #[garde(range(min = 0.0, max = 1.0))]
    pub local_overlap_weight: f64,
    /// Cosine to the conversation from which an unused memory counts as on the topic (Hard).
    #[garde(range(min = -1.0, max = 1.0))]
    pub local_topic: f64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum LlmFailure {
    Local,
    Retry,
}

impl GradingSettings {
    pub fn thresholds(&self) -> GraderThresholds {
        GraderThresholds {
            hard: self.local_hard,
            good: self.local_good,
            easy: self.local_easy,
            overlap_weight: self.local_overlap_weight,
            topic: self.local_topic,
        }
    }
}

impl ReviewSettings {
    /// Defaults, then `ENGRAM_CONFIG`'s file, then `ENGRAM_*` variables.
    pub fn load() -> Result<Self, config::ConfigError> {
        engram_server::load_settings()
    }
}

impl Default for ReviewSettings {
    fn default() -> Self {
        Self {
            grpc: GrpcSettings::on_port(DEFAULT_PORT),
            database: DatabaseSettings::default(),
            auth: AuthSettings::default(),
            embed: EmbedConfig {
                // Grading runs beside the review RPCs: the model yields to them.
                inference_nice: 10,
                ..EmbedConfig::default()
            },
            llm: engram_llm::LlmSettings::default(),
            amqp: ReviewBusSettings {
                bus: engram_bus::BusSettings::default(),
                review_concurrency: 4,
            },
            grading: GradingSettings::default(),
        }
    }
}

impl Default for GradingSettings {
    fn default() -> Self {
        Self {
            desired_retention: engram_core::memory_state::DESIRED_RETENTION,
            on_llm_failure: LlmFailure::Local,
            // Calibrated by `make eval-review` on tests/eval/review (docs/eval/review.md).
            local_hard: 0.24,
            local_good: 0.28,
            local_easy: 0.40,
            local_overlap_weight: 0.7,
            local_topic: 0.42,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_numeric_setting_declares_a_range_and_the_defaults_are_within_them() {
        engram_server::settings::load_defaults_only::<ReviewSettings>()
            .expect("the defaults are within their ranges");
        assert_eq!(
            engram_server::settings::numeric_settings_without_range::<ReviewSettings>(),
            Vec::<String>::new()
        );
    }
}
