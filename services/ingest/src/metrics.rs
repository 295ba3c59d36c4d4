//! Write-path counters: exported through OpenTelemetry (when export is on) and readable in tests.

use std::sync::atomic::{AtomicU64, Ordering};

use opentelemetry::KeyValue;
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
    writes: WriteMetrics,
    embedding: EmbeddingMetrics,
    conversations: ConversationMetrics,
    retention: RetentionMetrics,
}

/// The retention job: what it deleted and why, what it found inactive, and how its runs went.
#[derive(Debug)]
struct RetentionMetrics {
    deleted_entries: AtomicU64,
    deleted_turns: AtomicU64,
    marked_inactive: AtomicU64,
    runs: AtomicU64,
    deleted_counter: Counter<u64>,
    inactive_counter: Counter<u64>,
    runs_counter: Counter<u64>,
    run_duration: opentelemetry::metrics::Histogram<f64>,
}

/// Conversations: turns kept or skipped, segments closed, episodes and facts derived, and how
/// often an LLM step fell back to its local rules.
#[derive(Debug)]
struct ConversationMetrics {
    turns_stored: AtomicU64,
    turns_skipped: AtomicU64,
    segments_closed: AtomicU64,
    episodes_created: AtomicU64,
    facts_derived: AtomicU64,
    facts_superseded: AtomicU64,
    llm_fallbacks: AtomicU64,
    turns_counter: Counter<u64>,
    segments_counter: Counter<u64>,
    facts_counter: Counter<u64>,
    llm_fallback_counter: Counter<u64>,
}

/// The group commit: how many Remembers wait or are being written, and how they are grouped.
#[derive(Debug)]
struct WriteMetrics {
    in_flight: std::sync::Arc<AtomicU64>,
    batches: AtomicU64,
    batched_writes: AtomicU64,
    batch_size_histogram: opentelemetry::metrics::Histogram<u64>,
}

/// Counts a Remember as in flight until dropped.
#[derive(Debug)]
pub struct InFlightWrite(std::sync::Arc<AtomicU64>);

impl Drop for InFlightWrite {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Backfill metrics: readable here, exported through OpenTelemetry.
#[derive(Debug)]
struct EmbeddingMetrics {
    embedded: AtomicU64,
    failures: AtomicU64,
    dead_lettered: AtomicU64,
    backlog: AtomicU64,
    oldest_pending_age_ms: AtomicU64,
    latencies_ms: std::sync::Mutex<Vec<u64>>,
    embedded_counter: Counter<u64>,
    failure_counter: Counter<u64>,
    dead_letter_counter: Counter<u64>,
    latency_histogram: opentelemetry::metrics::Histogram<f64>,
    backlog_gauge: opentelemetry::metrics::Gauge<u64>,
    oldest_age_gauge: opentelemetry::metrics::Gauge<f64>,
}

/// Most recent write-to-embedding latencies kept for percentiles.
const LATENCY_WINDOW: usize = 10_000;

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
            writes: WriteMetrics::new(&meter),
            embedding: EmbeddingMetrics::new(&meter),
            conversations: ConversationMetrics::new(&meter),
            retention: RetentionMetrics::new(&meter),
        }
    }
}

impl WriteMetrics {
    fn new(meter: &opentelemetry::metrics::Meter) -> Self {
        Self {
            in_flight: std::sync::Arc::new(AtomicU64::new(0)),
            batches: AtomicU64::new(0),
            batched_writes: AtomicU64::new(0),
            batch_size_histogram: meter
                .u64_histogram("engram.ingest.write_batch_size")
                .with_description("Remembers written together by one group commit")
                .with_boundaries(vec![1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0])
                .build(),
        }
    }
}

impl EmbeddingMetrics {
    fn new(meter: &opentelemetry::metrics::Meter) -> Self {
        Self {
            embedded: AtomicU64::new(0),
            failures: AtomicU64::new(0),
            dead_lettered: AtomicU64::new(0),
            backlog: AtomicU64::new(0),
            oldest_pending_age_ms: AtomicU64::new(0),
            latencies_ms: std::sync::Mutex::new(Vec::new()),
            embedded_counter: meter.u64_counter("engram.embedding.embedded").build(),
            failure_counter: meter
                .u64_counter("engram.embedding.failures")
                .with_description("backfill batches that failed (retried with backoff)")
                .build(),
            dead_letter_counter: meter
                .u64_counter("engram.embedding.dead_lettered")
                .with_description("entries left aside after repeated permanent failures")
                .build(),
            latency_histogram: meter
                .f64_histogram("engram.embedding.write_to_embedding")
                .with_unit("s")
                .with_description("time from an entry's write to its embedding")
                .build(),
            backlog_gauge: meter.u64_gauge("engram.embedding.backlog").build(),
            oldest_age_gauge: meter
                .f64_gauge("engram.embedding.oldest_pending_age")
                .with_unit("s")
                .build(),
        }
    }
}

impl ConversationMetrics {
    fn new(meter: &opentelemetry::metrics::Meter) -> Self {
        Self {
            turns_stored: AtomicU64::new(0),
            turns_skipped: AtomicU64::new(0),
            segments_closed: AtomicU64::new(0),
            episodes_created: AtomicU64::new(0),
            facts_derived: AtomicU64::new(0),
            facts_superseded: AtomicU64::new(0),
            llm_fallbacks: AtomicU64::new(0),
            turns_counter: meter
                .u64_counter("engram.conversations.turns")
                .with_description("conversation turns appended (outcome: stored, skipped)")
                .build(),
            segments_counter: meter
                .u64_counter("engram.conversations.segments_closed")
                .with_description("segments closed, by the rule that closed them")
                .build(),
            facts_counter: meter
                .u64_counter("engram.conversations.facts")
                .with_description("facts consolidated from episodes (outcome: derived, superseded)")
                .build(),
            llm_fallback_counter: meter
                .u64_counter("engram.conversations.llm_fallbacks")
                .with_description("LLM steps that fell back to the local rules")
                .build(),
        }
    }
}

impl RetentionMetrics {
    fn new(meter: &opentelemetry::metrics::Meter) -> Self {
        Self {
            deleted_entries: AtomicU64::new(0),
            deleted_turns: AtomicU64::new(0),
            marked_inactive: AtomicU64::new(0),
            runs: AtomicU64::new(0),
            deleted_counter: meter
                .u64_counter("engram.retention.deleted")
                .with_description("rows retention deleted (reason: AGE, INACTIVE, TURNS_SUMMARIZED)")
                .build(),
            inactive_counter: meter
                .u64_counter("engram.retention.marked_inactive")
                .with_description("entries retention found unused and made inactive")
                .build(),
            runs_counter: meter
                .u64_counter("engram.retention.runs")
                .with_description("retention runs (outcome: completed, skipped because another replica ran, failed)")
                .build(),
            run_duration: meter
                .f64_histogram("engram.retention.run_duration")
                .with_unit("s")
                .with_description("how long a completed retention run took")
                .build(),
        }
    }
}

impl IngestMetrics {
    /// The metrics with their alerting series present from the start (at 0): Prometheus'
    /// `increase()` cannot see a counter's first event when its series begins at 1.
    pub fn new() -> Self {
        let metrics = Self::default();
        metrics.pinned_trim_alert_counter.add(0, &[]);
        metrics.embedding.dead_letter_counter.add(0, &[]);
        for outcome in ["failed", "completed_with_failures"] {
            metrics
                .retention
                .runs_counter
                .add(0, &[KeyValue::new("outcome", outcome)]);
        }
        metrics
    }

    /// Marks a Remember in flight (queued for or inside its group commit) until the guard drops.
    pub fn write_in_flight(&self) -> InFlightWrite {
        self.writes.in_flight.fetch_add(1, Ordering::Relaxed);
        InFlightWrite(self.writes.in_flight.clone())
    }

    /// Remembers queued for or inside their group commit now.
    pub fn writes_in_flight(&self) -> u64 {
        self.writes.in_flight.load(Ordering::Relaxed)
    }

    pub fn record_write_batch(&self, writes: usize) {
        self.writes.batches.fetch_add(1, Ordering::Relaxed);
        self.writes
            .batched_writes
            .fetch_add(writes as u64, Ordering::Relaxed);
        self.writes.batch_size_histogram.record(writes as u64, &[]);
    }

    /// Group commits so far, and the writes they carried.
    pub fn write_batches(&self) -> (u64, u64) {
        (
            self.writes.batches.load(Ordering::Relaxed),
            self.writes.batched_writes.load(Ordering::Relaxed),
        )
    }

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

    pub fn record_embedded(&self, count: u64) {
        self.embedding.embedded.fetch_add(count, Ordering::Relaxed);
        self.embedding.embedded_counter.add(count, &[]);
    }

    pub fn record_embedding_failure(&self) {
        self.embedding.failures.fetch_add(1, Ordering::Relaxed);
        self.embedding.failure_counter.add(1, &[]);
    }

    pub fn record_dead_lettered(&self) {
        self.embedding.dead_lettered.fetch_add(1, Ordering::Relaxed);
        self.embedding.dead_letter_counter.add(1, &[]);
    }

    pub fn record_embedding_latency(&self, latency: std::time::Duration) {
        self.embedding
            .latency_histogram
            .record(latency.as_secs_f64(), &[]);
        let mut window = self
            .embedding
            .latencies_ms
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if window.len() == LATENCY_WINDOW {
            window.remove(0);
        }
        window.push(latency.as_millis() as u64);
    }

    pub fn record_backlog(&self, pending: i64, oldest: Option<chrono::DateTime<chrono::Utc>>) {
        let pending = u64::try_from(pending).unwrap_or(0);
        let age = oldest.map_or(0.0, |oldest| {
            (chrono::Utc::now() - oldest).num_milliseconds().max(0) as f64 / 1000.0
        });
        self.embedding.backlog.store(pending, Ordering::Relaxed);
        self.embedding
            .oldest_pending_age_ms
            .store((age * 1000.0) as u64, Ordering::Relaxed);
        self.embedding.backlog_gauge.record(pending, &[]);
        self.embedding.oldest_age_gauge.record(age, &[]);
    }

    pub fn embedded(&self) -> u64 {
        self.embedding.embedded.load(Ordering::Relaxed)
    }

    pub fn embedding_failures(&self) -> u64 {
        self.embedding.failures.load(Ordering::Relaxed)
    }

    pub fn dead_lettered(&self) -> u64 {
        self.embedding.dead_lettered.load(Ordering::Relaxed)
    }

    /// Entries waiting for an embedding at the last check, and the age of the oldest (ms).
    pub fn backlog(&self) -> (u64, u64) {
        (
            self.embedding.backlog.load(Ordering::Relaxed),
            self.embedding.oldest_pending_age_ms.load(Ordering::Relaxed),
        )
    }

    /// Percentile (0–100) of recent write-to-embedding latencies, in milliseconds.
    pub fn embedding_latency_percentile(&self, percentile: f64) -> Option<u64> {
        let window = self
            .embedding
            .latencies_ms
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if window.is_empty() {
            return None;
        }
        let mut sorted = window.clone();
        sorted.sort_unstable();
        let rank = ((percentile / 100.0) * (sorted.len() - 1) as f64).round() as usize;
        sorted.get(rank).copied()
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

/// Conversation counters, readable in tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ConversationCounts {
    pub turns_stored: u64,
    pub turns_skipped: u64,
    pub segments_closed: u64,
    pub episodes_created: u64,
    pub facts_derived: u64,
    pub facts_superseded: u64,
    pub llm_fallbacks: u64,
}

impl IngestMetrics {
    pub fn record_turns_stored(&self, turns: u64) {
        let metrics = &self.conversations;
        metrics.turns_stored.fetch_add(turns, Ordering::Relaxed);
        metrics
            .turns_counter
            .add(turns, &[KeyValue::new("outcome", "stored")]);
    }

    pub fn record_turns_skipped(&self, turns: u64) {
        let metrics = &self.conversations;
        metrics.turns_skipped.fetch_add(turns, Ordering::Relaxed);
        metrics
            .turns_counter
            .add(turns, &[KeyValue::new("outcome", "skipped")]);
    }

    pub fn record_segment_closed(&self, reason: &'static str, episode_created: bool) {
        let metrics = &self.conversations;
        metrics.segments_closed.fetch_add(1, Ordering::Relaxed);
        if episode_created {
            metrics.episodes_created.fetch_add(1, Ordering::Relaxed);
        }
        metrics
            .segments_counter
            .add(1, &[KeyValue::new("reason", reason)]);
    }

    pub fn record_facts_derived(&self, facts: u64) {
        let metrics = &self.conversations;
        metrics.facts_derived.fetch_add(facts, Ordering::Relaxed);
        metrics
            .facts_counter
            .add(facts, &[KeyValue::new("outcome", "derived")]);
    }

    pub fn record_facts_superseded(&self, facts: u64) {
        let metrics = &self.conversations;
        metrics.facts_superseded.fetch_add(facts, Ordering::Relaxed);
        metrics
            .facts_counter
            .add(facts, &[KeyValue::new("outcome", "superseded")]);
    }

    pub fn record_llm_fallback(&self, step: &'static str) {
        let metrics = &self.conversations;
        metrics.llm_fallbacks.fetch_add(1, Ordering::Relaxed);
        metrics
            .llm_fallback_counter
            .add(1, &[KeyValue::new("step", step)]);
    }

    pub fn conversation_counts(&self) -> ConversationCounts {
        let metrics = &self.conversations;
        ConversationCounts {
            turns_stored: metrics.turns_stored.load(Ordering::Relaxed),
            turns_skipped: metrics.turns_skipped.load(Ordering::Relaxed),
            segments_closed: metrics.segments_closed.load(Ordering::Relaxed),
            episodes_created: metrics.episodes_created.load(Ordering::Relaxed),
            facts_derived: metrics.facts_derived.load(Ordering::Relaxed),
            facts_superseded: metrics.facts_superseded.load(Ordering::Relaxed),
            llm_fallbacks: metrics.llm_fallbacks.load(Ordering::Relaxed),
        }
    }
}

/// Retention counters, readable in tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RetentionCounts {
    pub deleted_entries: u64,
    pub deleted_turns: u64,
    pub marked_inactive: u64,
    pub runs: u64,
}

impl IngestMetrics {
    pub fn record_retention_deleted(
        &self,
        reason: engram_core::retention::DeletionReason,
        rows: u64,
    ) {
        use engram_core::retention::DeletionReason;
        if rows == 0 {
            return;
        }
        let metrics = &self.retention;
        let total = if reason == DeletionReason::TurnsSummarized {
            &metrics.deleted_turns
        } else {
            &metrics.deleted_entries
        };
        total.fetch_add(rows, Ordering::Relaxed);
        metrics
            .deleted_counter
            .add(rows, &[KeyValue::new("reason", reason.as_str())]);
    }

    pub fn record_retention_marked_inactive(&self, entries: u64) {
        let metrics = &self.retention;
        metrics
            .marked_inactive
            .fetch_add(entries, Ordering::Relaxed);
        metrics.inactive_counter.add(entries, &[]);
    }

    /// A run ended: `completed`, `skipped` (another replica held the lock) or `failed`.
    pub fn record_retention_run(&self, outcome: &'static str, took: Option<std::time::Duration>) {
        let metrics = &self.retention;
        if outcome == "completed" {
            metrics.runs.fetch_add(1, Ordering::Relaxed);
        }
        metrics
            .runs_counter
            .add(1, &[KeyValue::new("outcome", outcome)]);
        if let Some(took) = took {
            metrics.run_duration.record(took.as_secs_f64(), &[]);
        }
    }

    pub fn retention_counts(&self) -> RetentionCounts {
        let metrics = &self.retention;
        RetentionCounts {
            deleted_entries: metrics.deleted_entries.load(Ordering::Relaxed),
            deleted_turns: metrics.deleted_turns.load(Ordering::Relaxed),
            marked_inactive: metrics.marked_inactive.load(Ordering::Relaxed),
            runs: metrics.runs.load(Ordering::Relaxed),
        }
    }
}
