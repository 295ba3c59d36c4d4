//! Review counters: exported through OpenTelemetry (when export is on) and readable in tests.

use std::sync::atomic::{AtomicU64, Ordering};

use opentelemetry::KeyValue;
use opentelemetry::metrics::Counter;

#[derive(Debug)]
pub struct ReviewMetrics {
    graded: AtomicU64,
    applied: AtomicU64,
    redelivered: AtomicU64,
    llm_fallbacks: AtomicU64,
    invented: AtomicU64,
    omitted: AtomicU64,
    graded_counter: Counter<u64>,
    llm_counter: Counter<u64>,
}

impl Default for ReviewMetrics {
    fn default() -> Self {
        let meter = opentelemetry::global::meter("engram-review");
        Self {
            graded: AtomicU64::new(0),
            applied: AtomicU64::new(0),
            redelivered: AtomicU64::new(0),
            llm_fallbacks: AtomicU64::new(0),
            invented: AtomicU64::new(0),
            omitted: AtomicU64::new(0),
            graded_counter: meter
                .u64_counter("engram.review.graded")
                .with_description("memories graded, by rating")
                .build(),
            llm_counter: meter
                .u64_counter("engram.review.llm_problems")
                .with_description("LLM grading problems: fallback to the local grader, invented or omitted memories")
                .build(),
        }
    }
}

/// The counters, readable in tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ReviewCounts {
    pub graded: u64,
    pub applied: u64,
    pub redelivered: u64,
    pub llm_fallbacks: u64,
    pub invented: u64,
    pub omitted: u64,
}

impl ReviewMetrics {
    pub fn record_graded(&self, rating: &'static str, applied: bool) {
        self.graded.fetch_add(1, Ordering::Relaxed);
        if applied {
            self.applied.fetch_add(1, Ordering::Relaxed);
        }
        self.graded_counter
            .add(1, &[KeyValue::new("rating", rating)]);
    }

    /// A segment's review of a memory was recorded before: the delivery applied nothing.
    pub fn record_redelivered(&self) {
        self.redelivered.fetch_add(1, Ordering::Relaxed);
    }

    pub fn record_llm_fallback(&self) {
        self.llm_fallbacks.fetch_add(1, Ordering::Relaxed);
        self.llm_counter
            .add(1, &[KeyValue::new("problem", "fallback")]);
    }

    pub fn record_invented(&self, labels: u64) {
        self.invented.fetch_add(labels, Ordering::Relaxed);
        self.llm_counter
            .add(labels, &[KeyValue::new("problem", "invented")]);
    }

    pub fn record_omitted(&self, memories: u64) {
        self.omitted.fetch_add(memories, Ordering::Relaxed);
        self.llm_counter
            .add(memories, &[KeyValue::new("problem", "omitted")]);
    }

    pub fn counts(&self) -> ReviewCounts {
        ReviewCounts {
            graded: self.graded.load(Ordering::Relaxed),
            applied: self.applied.load(Ordering::Relaxed),
            redelivered: self.redelivered.load(Ordering::Relaxed),
            llm_fallbacks: self.llm_fallbacks.load(Ordering::Relaxed),
            invented: self.invented.load(Ordering::Relaxed),
            omitted: self.omitted.load(Ordering::Relaxed),
        }
    }
}
