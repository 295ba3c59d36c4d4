//! Structured-request counters: exported through OpenTelemetry (when export is on, labelled by
//! task) and readable in tests.

use std::sync::atomic::{AtomicU64, Ordering};

use opentelemetry::KeyValue;
use opentelemetry::metrics::Counter;

use crate::TokenUsage;

#[derive(Debug)]
pub struct LlmMetrics {
    requests_ok: AtomicU64,
    requests_failed: AtomicU64,
    invalid_answers: AtomicU64,
    prompt_tokens: AtomicU64,
    completion_tokens: AtomicU64,
    request_counter: Counter<u64>,
    invalid_answer_counter: Counter<u64>,
    token_counter: Counter<u64>,
}

impl Default for LlmMetrics {
    fn default() -> Self {
        let meter = opentelemetry::global::meter("engram-llm");
        Self {
            requests_ok: AtomicU64::new(0),
            requests_failed: AtomicU64::new(0),
            invalid_answers: AtomicU64::new(0),
            prompt_tokens: AtomicU64::new(0),
            completion_tokens: AtomicU64::new(0),
            request_counter: meter
                .u64_counter("engram.llm.requests")
                .with_description("structured requests by task and outcome (ok or failed), retries included in one")
                .build(),
            invalid_answer_counter: meter
                .u64_counter("engram.llm.invalid_answers")
                .with_description("answers that were malformed, truncated, refused or did not match the schema")
                .build(),
            token_counter: meter
                .u64_counter("engram.llm.tokens")
                .with_description("tokens the endpoint reported, by task and kind (prompt or completion)")
                .build(),
        }
    }
}

impl LlmMetrics {
    pub(crate) fn record_outcome(&self, task: &str, ok: bool) {
        let (count, outcome) = if ok {
            (&self.requests_ok, "ok")
        } else {
            (&self.requests_failed, "failed")
        };
        count.fetch_add(1, Ordering::Relaxed);
        self.request_counter.add(
            1,
            &[
                KeyValue::new("task", task.to_owned()),
                KeyValue::new("outcome", outcome),
            ],
        );
    }

    pub(crate) fn record_invalid_answer(&self, task: &str) {
        self.invalid_answers.fetch_add(1, Ordering::Relaxed);
        self.invalid_answer_counter
            .add(1, &[KeyValue::new("task", task.to_owned())]);
    }

    pub(crate) fn record_usage(&self, task: &str, usage: TokenUsage) {
        self.prompt_tokens
            .fetch_add(usage.prompt_tokens, Ordering::Relaxed);
        self.completion_tokens
            .fetch_add(usage.completion_tokens, Ordering::Relaxed);
        for (kind, tokens) in [
            ("prompt", usage.prompt_tokens),
            ("completion", usage.completion_tokens),
        ] {
            if tokens > 0 {
                self.token_counter.add(
                    tokens,
                    &[
                        KeyValue::new("task", task.to_owned()),
                        KeyValue::new("kind", kind),
                    ],
                );
            }
        }
    }

    /// Structured requests that returned a value.
    pub fn requests_ok(&self) -> u64 {
        self.requests_ok.load(Ordering::Relaxed)
    }

    /// Structured requests that returned an error (after their retries).
    pub fn requests_failed(&self) -> u64 {
        self.requests_failed.load(Ordering::Relaxed)
    }

    /// Unusable answers, each one (retried or not).
    pub fn invalid_answers(&self) -> u64 {
        self.invalid_answers.load(Ordering::Relaxed)
    }

    /// Tokens reported by every answer, usable or not.
    pub fn usage(&self) -> TokenUsage {
        TokenUsage {
            prompt_tokens: self.prompt_tokens.load(Ordering::Relaxed),
            completion_tokens: self.completion_tokens.load(Ordering::Relaxed),
        }
    }
}
