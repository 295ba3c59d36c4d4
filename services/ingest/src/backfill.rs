//! The embedding backfill: every entry written with `needs_embedding` gets an embedding, in
//! batches, without slowing the write path. The database flag is the truth, so the worker simply
//! drains the oldest flagged entries; the write path wakes it after each new entry, and a poll
//! catches everything else (other processes, restarts). Transient failures back off with jitter;
//! an entry the embedder rejects for good is retried one by one and, after a few failures, left
//! aside (dead-lettered) so it never blocks the others. A new episode's surprise, which
//! segmentation leaves to it, is measured in the transaction that stores the episode's embedding.

use std::sync::Arc;
use std::time::{Duration, Instant};

use backon::BackoffBuilder as _;
use chrono::Utc;
use engram_core::backoff::jittered_backoff;
use engram_embed::{EmbedError, Embedder};
use engram_store::StoreError;
use engram_store::embeddings::{self, PendingEmbedding};
use engram_store::segments;
use sqlx::PgPool;
use tokio::sync::{Notify, watch};

use crate::metrics::IngestMetrics;

/// How long a worker owns the entries it claimed; longer than any batch takes (retries included),
/// and short enough that a worker that died releases its entries soon.
pub const CLAIM_LEASE: Duration = Duration::from_secs(120);

#[derive(Debug, thiserror::Error)]
pub enum BackfillError {
    #[error(transparent)]
    Embed(#[from] EmbedError),
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl BackfillError {
    /// Whether trying again later may succeed (the embedder or the database unreachable).
    pub fn is_retryable(&self) -> bool {
        match self {
            BackfillError::Embed(error) => error.is_retryable(),
            BackfillError::Store(error) => error.is_retryable(),
        }
    }
}

/// Tunables of the backfill.
#[derive(Debug, Clone)]
pub struct BackfillSettings {
    pub batch_size: usize,
    pub poll_interval: Duration,
    pub max_failures: i32,
    /// Only entries at least this old: with the bus on, new entries are the consumer's, and the
    /// sweep only catches what a lost message or a stopped broker left behind.
    pub min_age: Duration,
    /// The longest an entry's embedding waits for a gap between requests (the embedder may
    /// run the backfill only in such gaps: `engram_embed::YieldToRequests`).
    pub max_deferral: Duration,
}

#[derive(Clone)]
pub struct EmbeddingBackfill {
    pool: PgPool,
    embedder: Arc<dyn Embedder>,
    settings: BackfillSettings,
    wake: Arc<Notify>,
    metrics: Arc<IngestMetrics>,
}

impl EmbeddingBackfill {
    pub fn new(
        pool: PgPool,
        embedder: Arc<dyn Embedder>,
        settings: BackfillSettings,
        wake: Arc<Notify>,
        metrics: Arc<IngestMetrics>,
    ) -> Self {
        Self {
            pool,
            embedder,
            settings,
            wake,
            metrics,
        }
    }

    /// Runs until `stop` turns true; a batch in progress is finished (embedded and committed)
    /// first, so stopping never loses or duplicates work.
    pub async fn run(self, mut stop: watch::Receiver<bool>) {
        let backoff =
            || jittered_backoff(Duration::from_millis(200), Duration::from_secs(30)).build();
        let mut delays = backoff();
        loop {
            if *stop.borrow() {
                break;
            }
            let idle = match self.run_once().await {
                Ok(embedded) => {
                    delays = backoff();
                    embedded < self.settings.batch_size
                }
                Err(error) => {
                    self.metrics.record_embedding_failure();
                    let delay = delays.next().unwrap_or(Duration::from_secs(30));
                    tracing::warn!(%error, ?delay, "embedding backfill failed; backing off");
                    tokio::select! {
                        () = tokio::time::sleep(delay) => {}
                        _ = stop.changed() => {}
                    }
                    continue;
                }
            };
            if idle {
                tokio::select! {
                    () = self.wake.notified() => {}
                    () = tokio::time::sleep(self.settings.poll_interval) => {}
                    _ = stop.changed() => {}
                }
            }
        }
        tracing::info!("embedding backfill stopped");
    }

    /// Embeds one batch of the oldest pending entries; returns how many were embedded.
    pub async fn run_once(&self) -> Result<usize, BackfillError> {
        let backlog = embeddings::backlog(&self.pool, self.settings.max_failures).await?;
        self.metrics
            .record_backlog(backlog.pending, backlog.oldest_created_at);
        if backlog.pending == 0 {
            return Ok(0);
        }
        let batch = embeddings::claim_oldest_pending(
            &self.pool,
            self.settings.batch_size as i64,
            self.settings.max_failures,
            self.settings.min_age,
            CLAIM_LEASE,
        )
        .await?;
        if batch.is_empty() {
            return Ok(0);
        }
        self.embed_batch(&batch).await
    }

    /// Embeds and stores the given entries (the bus consumer calls this with the entries its
    /// messages name); returns how many were embedded.
    #[tracing::instrument(name = "embedding.write", skip_all, fields(entries = batch.len()), err(Display))]
    pub async fn embed_batch(&self, batch: &[PendingEmbedding]) -> Result<usize, BackfillError> {
        let inputs: Vec<String> = batch
            .iter()
            .map(PendingEmbedding::embedding_input)
            .collect();
        match self
            .embedder
            .embed_between_requests(&inputs, self.latest_start(batch))
            .await
        {
            Ok(vectors) => self.store(batch, vectors).await,
            Err(error) if error.is_retryable() => {
                // Give the entries back so that the next attempt (ours or another worker's) can
                // take them at once.
                let keys: Vec<_> = batch.iter().map(PendingEmbedding::key).collect();
                embeddings::release_claims(&self.pool, &keys).await?;
                Err(error.into())
            }
            // The embedder rejects something in the batch: find which one, embed the rest.
            Err(_) => self.embed_one_by_one(batch).await,
        }
    }

    /// When the batch must start at the latest: once its oldest entry has waited
    /// `max_deferral`.
    fn latest_start(&self, batch: &[PendingEmbedding]) -> Instant {
        let now = Utc::now();
        let waited = batch
            .iter()
            .map(|entry| (now - entry.created_at).to_std().unwrap_or_default())
            .max()
            .unwrap_or_default();
        Instant::now() + self.settings.max_deferral.saturating_sub(waited)
    }

    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    pub fn metrics(&self) -> &IngestMetrics {
        &self.metrics
    }

    async fn store(
        &self,
        batch: &[PendingEmbedding],
        vectors: Vec<Vec<f32>>,
    ) -> Result<usize, BackfillError> {
        let pairs: Vec<_> = batch
            .iter()
            .map(PendingEmbedding::key)
            .zip(vectors)
            .collect();
        let mut transaction = engram_store::begin(&self.pool).await?;
        let stored = embeddings::store(&mut transaction, &pairs, self.embedder.model_id()).await?;
        // A new episode's surprise is measured with the embedding it just got (see
        // `conversations::segmentation`); a batch of facts alone has none to measure.
        let episodes: Vec<_> = batch
            .iter()
            .filter(|entry| entry.title.is_some())
            .map(PendingEmbedding::key)
            .collect();
        if !episodes.is_empty() {
            segments::settle_pending_surprise(&mut transaction, &episodes).await?;
        }
        // A crash that undoes the commit leaves the entries flagged, and they are embedded again.
        engram_store::commit_derived(transaction).await?;
        let now = Utc::now();
        for entry in batch {
            self.metrics
                .record_embedding_latency((now - entry.created_at).to_std().unwrap_or_default());
        }
        self.metrics.record_embedded(stored);
        Ok(batch.len())
    }

    async fn embed_one_by_one(&self, batch: &[PendingEmbedding]) -> Result<usize, BackfillError> {
        let mut embedded = 0;
        for entry in batch {
            match self
                .embedder
                .embed(std::slice::from_ref(&entry.embedding_input()))
                .await
            {
                Ok(vectors) => embedded += self.store(std::slice::from_ref(entry), vectors).await?,
                Err(error) if error.is_retryable() => return Err(error.into()),
                Err(error) => {
                    let dead = embeddings::record_failure(
                        &self.pool,
                        entry.key(),
                        &error.to_string(),
                        self.settings.max_failures,
                    )
                    .await?;
                    tracing::warn!(memory = %entry.id, %error, dead_lettered = dead, "cannot embed entry");
                    if dead {
                        self.metrics.record_dead_lettered();
                    }
                }
            }
        }
        Ok(embedded)
    }
}
