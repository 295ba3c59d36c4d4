//! The `llm.*` settings: whether a language model is used, and how to reach it.

use secrecy::SecretString;
use serde::{Deserialize, Serialize};

/// The default `llm.max_response_bytes`: room for answers far beyond any `max_tokens` one
/// would configure, small enough that a runaway endpoint cannot grow a service by much.
pub const DEFAULT_MAX_RESPONSE_BYTES: usize = 4 * 1024 * 1024;
/// Below this no chat completion fits (its envelope alone is a few hundred bytes).
const MIN_RESPONSE_BYTES: usize = 1024;
/// Far beyond any completion; what a service would hold of one answer at most.
const MAX_RESPONSE_BYTES: usize = 256 * 1024 * 1024;

/// Which language model backs the structured answers.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum LlmProvider {
    /// None (the default): features that need a model are off.
    #[default]
    Disabled,
    /// An OpenAI-compatible `/v1/chat/completions` endpoint (OpenAI, vLLM, Ollama, llama.cpp).
    Openai,
}

/// How to reach the chat-completions endpoint. Services embed it in their settings under `llm`;
/// its defaults are [`LlmSettings::default`].
#[derive(Debug, Clone, Deserialize, Serialize, garde::Validate)]
#[serde(default)]
#[garde(allow_unvalidated)]
pub struct LlmSettings {
    pub provider: LlmProvider,
    /// Base URL, e.g. `http://127.0.0.1:8080` or `https://api.openai.com`
    /// (`/v1/chat/completions` is appended).
    pub base_url: String,
    pub model: String,
    /// Sent as a bearer token when set (never part of the defaults).
    #[serde(skip_serializing)]
    pub api_key: Option<SecretString>,
    /// Per-request timeout, connection to last byte.
    #[garde(range(min = 1, max = 3_600))]
    pub timeout_secs: u64,
    /// Retries after the first attempt for transport errors, 5xx and 429.
    #[garde(range(max = 20))]
    pub max_retries: usize,
    /// Fresh attempts after an answer that is malformed, truncated, refused or does not match
    /// the schema.
    #[garde(range(max = 10))]
    pub invalid_answer_retries: usize,
    /// Completion token cap, sent as `max_tokens`.
    #[garde(range(min = 1, max = 1_000_000))]
    pub max_tokens: u32,
    #[garde(range(min = 0.0, max = 2.0))]
    pub temperature: f32,
    /// Bytes of a response body read at most: a longer answer is not read on, and counts as an
    /// unusable answer (the caller falls back to its local rules). A completion within
    /// `max_tokens` is a few kilobytes; the cap only stops an endpoint that sends megabytes.
    #[garde(range(min = MIN_RESPONSE_BYTES, max = MAX_RESPONSE_BYTES))]
    pub max_response_bytes: usize,
}

impl Default for LlmSettings {
    fn default() -> Self {
        Self {
            provider: LlmProvider::Disabled,
            base_url: "http://127.0.0.1:11434".into(),
            model: "llama3.1".into(),
            api_key: None,
            timeout_secs: 60,
            max_retries: 3,
            invalid_answer_retries: 1,
            max_tokens: 1024,
            temperature: 0.0,
            max_response_bytes: DEFAULT_MAX_RESPONSE_BYTES,
        }
    }
}

impl LlmSettings {
    /// Checks what the endpoint would otherwise reject on every request: its address and
    /// model, and the numbers' ranges (checked at load too, but a client can be built from
    /// settings made in code).
    pub(crate) fn check(&self) -> Result<(), String> {
        let base_url = self.base_url.trim();
        if !(base_url.starts_with("http://") || base_url.starts_with("https://")) {
            return Err(format!(
                "llm.base_url must start with http:// or https://, got {:?}",
                self.base_url
            ));
        }
        if self.model.trim().is_empty() {
            return Err("llm.model must not be empty".into());
        }
        if self.temperature.is_nan() {
            return Err("llm.temperature is not a number".into());
        }
        garde::Validate::validate(self).map_err(|report| {
            let problems: Vec<String> = report
                .iter()
                .map(|(field, error)| format!("llm.{field} {error}"))
                .collect();
            problems.join("; ")
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn from_config(overrides: &[(&str, config::Value)]) -> LlmSettings {
        #[derive(Serialize)]
        struct Service {
            llm: LlmSettings,
        }
        let defaults = config::Config::try_from(&Service {
            llm: LlmSettings::default(),
        })
        .unwrap();
        let mut builder = config::Config::builder().add_source(defaults);
        for (key, value) in overrides {
            builder = builder.set_override(*key, value.clone()).unwrap();
        }
        builder.build().unwrap().get("llm").unwrap()
    }

    #[test]
    fn the_defaults_deserialize_to_a_disabled_local_endpoint() {
        let settings = from_config(&[]);
        let expected = LlmSettings::default();
        assert_eq!(settings.provider, LlmProvider::Disabled);
        assert_eq!(settings.base_url, expected.base_url);
        assert_eq!(settings.model, "llama3.1");
        assert!(settings.api_key.is_none());
        assert_eq!(settings.timeout_secs, 60);
        assert_eq!(settings.max_retries, 3);
        assert_eq!(settings.invalid_answer_retries, 1);
        assert_eq!(settings.max_tokens, 1024);
        assert_eq!(settings.temperature, 0.0);
        assert_eq!(settings.max_response_bytes, 4 * 1024 * 1024);
        assert_eq!(settings.check(), Ok(()));
    }

    #[test]
    fn provider_and_key_come_from_configuration() {
        let settings = from_config(&[
            ("llm.provider", "openai".into()),
            ("llm.api_key", "sk-test".into()),
            ("llm.temperature", 0.2.into()),
        ]);
        assert_eq!(settings.provider, LlmProvider::Openai);
        assert_eq!(
            secrecy::ExposeSecret::expose_secret(settings.api_key.as_ref().unwrap()),
            "sk-test"
        );
        assert!((settings.temperature - 0.2).abs() < 1e-6);
    }

    #[test]
    fn validation_names_the_wrong_setting() {
        let check = |change: fn(&mut LlmSettings)| {
            let mut settings = LlmSettings::default();
            change(&mut settings);
            settings.check().unwrap_err()
        };
        assert!(check(|s| s.base_url = "127.0.0.1:8080".into()).contains("llm.base_url"));
        assert!(check(|s| s.model = " ".into()).contains("llm.model"));
        assert!(check(|s| s.timeout_secs = 0).contains("llm.timeout_secs"));
        assert!(check(|s| s.max_tokens = 0).contains("llm.max_tokens"));
        assert!(check(|s| s.temperature = f32::NAN).contains("llm.temperature"));
        assert!(check(|s| s.temperature = -0.1).contains("llm.temperature"));
        assert!(check(|s| s.max_response_bytes = 100).contains("llm.max_response_bytes"));
    }
}
