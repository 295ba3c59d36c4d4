//! Write-path counters: exported through OpenTelemetry (when export is on) and readable in tests.

use std::sync::atomic::{AtomicU64, Ordering};

use opentelemetry::metrics::Counter;

#[derive(Debug)]
pub struct IngestMetrics {
    created: AtomicU64,
    merged: AtomicU64,
    trimmed: AtomicU64,
    pinned_trim_alerts: AtomicU64,
    created_counter: Counter<u64>,
    merged_counter: Counter<u64>,
    trimmed_counter: Counter<u64>,
    pinned_trim_alert_counter: Counter<u64>,
}

impl Default for IngestMetrics {
    fn default() -> Self {
        let meter = opentelemetry::global::meter("engram-ingest");
        Self {
            created: AtomicU64::new(0),
            merged: AtomicU64::new(0),
            trimmed: AtomicU64::new(0),
            pinned_trim_alerts: AtomicU64::new(0),
            created_counter: meter.u64_counter("engram.ingest.memories_created").build(),
            merged_counter: meter
                .u64_counter("engram.ingest.dedupe_merges")
                .with_description("writes merged into a near-duplicate (SimHash)")
                .build(),
            trimmed_counter: meter
                .u64_counter("engram.ingest.trimmed")
                .with_description("entries removed by the capacity policy")
                .build(),
            pinned_trim_alert_counter: meter
                .u64_counter("engram.ingest.pinned_trim_alerts")
                .with_description("pinned or saved entries that would have been trimmed had they not been protected")
                .build(),
        }
    }
}

impl IngestMetrics {
    pub fn record_created(&self) {
        self.created.fetch_add(1, Ordering::Relaxed);
        self.created_counter.add(1, &[]);
    }

    pub fn record_merged(&self) {
        self.merged.fetch_add(1, Ordering::Relaxed);
        self.merged_counter.add(1, &[]);
    }

    pub fn record_trimmed(&self, count: u64) {
        self.trimmed.fetch_add(count, Ordering::Relaxed);
        self.trimmed_counter.add(count, &[]);
    }

    pub fn record_pinned_trim_alerts(&self, count: u64) {
        self.pinned_trim_alerts.fetch_add(count, Ordering::Relaxed);
        self.pinned_trim_alert_counter.add(count, &[]);
    }

    pub fn created(&self) -> u64 {
        self.created.load(Ordering::Relaxed)
    }

    pub fn merged(&self) -> u64 {
        self.merged.load(Ordering::Relaxed)
    }

    pub fn trimmed(&self) -> u64 {
        self.trimmed.load(Ordering::Relaxed)
    }

    pub fn pinned_trim_alerts(&self) -> u64 {
        self.pinned_trim_alerts.load(Ordering::Relaxed)
    }
}
