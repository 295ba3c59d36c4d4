//! Start-up of the ingest service. `App::build` is what `main` runs and what tests run: it
//! connects to Postgres, applies migrations when this process owns them, loads the embedder and
//! checks its dimension against the store, and binds the gRPC port (port 0 picks a free one).

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use engram_proto::v1::ingest_service_server::IngestServiceServer;
use engram_server::{Foundation, GrpcServer, TokenRegistry};
use sqlx::PgPool;
use tokio::sync::{Notify, watch};
use tonic::service::Routes;

use crate::backfill::{BackfillSettings, EmbeddingBackfill};
use crate::bus::{EmbeddingConsumer, OutboxRelay, SegmentationConsumer};
use crate::config::IngestSettings;
use crate::conversations::consolidation::Consolidator;
use crate::conversations::describe::Describer;
use crate::conversations::segmentation::Segmenter;
use crate::grpc::IngestApi;
use crate::metrics::IngestMetrics;
use crate::retention::RetentionJob;
use crate::service::Ingest;
use crate::write_path::{BackfillHooks, MemoryWriter};

pub const SERVICE_NAME: &str = "engram.v1.IngestService";

/// How often expired tombstones are deleted. They stop blocking writes the moment they expire;
/// this only keeps the table small.
const TOMBSTONE_PURGE_INTERVAL: Duration = Duration::from_secs(3600);

pub struct App {
    server: GrpcServer,
    pool: PgPool,
    writer: MemoryWriter,
    tokens: TokenRegistry,
    backfill: Option<EmbeddingBackfill>,
    segmenter: Option<(Segmenter, Arc<Notify>)>,
    bus: Option<BusWorkers>,
    retention: RetentionJob,
    /// Whether this replica runs the retention job (`retention.enabled`).
    runs_retention: bool,
}

/// What runs on the bus: the outbox relay, and the consumers of what this service handles.
struct BusWorkers {
    relay: OutboxRelay,
    embedding: Option<EmbeddingConsumer>,
    segmentation: Option<SegmentationConsumer>,
}

impl BusWorkers {
    fn new(
        settings: &IngestSettings,
        pool: &PgPool,
        relay_wake: Arc<Notify>,
        backfill: &Option<EmbeddingBackfill>,
        segmenter: &Option<Segmenter>,
    ) -> Self {
        Self {
            relay: OutboxRelay {
                pool: pool.clone(),
                settings: settings.amqp.clone(),
                wake: relay_wake,
            },
            embedding: backfill.clone().map(|backfill| EmbeddingConsumer {
                backfill,
                settings: settings.amqp.clone(),
                batch_size: settings.embed.model.batch_size,
            }),
            segmentation: segmenter.clone().map(|segmenter| SegmentationConsumer {
                segmenter,
                settings: settings.amqp.clone(),
            }),
        }
    }
}

impl App {
    pub async fn build(settings: IngestSettings) -> anyhow::Result<Self> {
        let Foundation { tokens, pool } =
            Foundation::lay(&settings.auth, &settings.database).await?;
        // Turns and responses are counted in tokens: load the vocabulary before serving.
        tokio::task::spawn_blocking(engram_core::retrieval::budget::load_tokenizer).await?;
        let metrics = Arc::new(IngestMetrics::new());

        // The requests the server serves, which the model's backfill passes wait to be over.
        let requests = Arc::new(engram_core::activity::RequestActivity::new());
        let embedders =
            engram_recall::load_embedders(&settings.embed.embedder_choice(&requests)).await?;
        let embedder = embedders.text.clone();
        if let Some(embedder) = &embedder {
            engram_recall::check_dimension(&pool, embedder.as_ref()).await?;
        }
        // "What do you remember about X" runs the retrieval pipeline over the same model (and
        // the same pool: it is occasional here, and needs no read-only pool of its own).
        let recall = engram_recall::start_recall(
            pool.clone(),
            pool.clone(),
            embedders.clone(),
            settings.embed.model.query_embedder(),
            settings.recall.clone(),
        )?;
        let llm = engram_llm::ChatClient::from_settings(&settings.llm)?;
        match &llm {
            Some(client) => tracing::info!(
                model = client.model(),
                "segments are described by an LLM (local rules when it fails)"
            ),
            None => tracing::info!(
                "no LLM configured: segments are described by the local extractive rules"
            ),
        }

        // With the bus, new entries are announced through the outbox and embedded by the consumer;
        // the sweep only takes what is older than `sweep_min_age_ms` (lost messages, broker down).
        // Without it, the write path wakes the sweep directly.
        let bus_enabled = settings.amqp.bus.enabled;
        let sweep_wake = Arc::new(Notify::new());
        let relay_wake = Arc::new(Notify::new());
        let segmentation_wake = Arc::new(Notify::new());
        let backfill = embedder.as_ref().map(|embedder| {
            embedding_backfill(&settings, &pool, embedder, sweep_wake.clone(), &metrics)
        });
        if backfill.is_none() {
            tracing::warn!(
                "embedding backfill disabled: entries keep needs_embedding until an embedder runs"
            );
        }
        let hooks = BackfillHooks {
            new_entry_wake: if bus_enabled {
                Some(relay_wake.clone())
            } else {
                backfill.as_ref().map(|_| sweep_wake.clone())
            },
            sweep_wake: backfill.as_ref().map(|_| sweep_wake.clone()),
            embedding_model: embedder.as_ref().map(|e| e.model_id().to_owned()),
            publish_events: bus_enabled,
            segmentation_wake: (!bus_enabled).then(|| segmentation_wake.clone()),
        };
        let writer = MemoryWriter::new(
            pool.clone(),
            settings.memory.clone(),
            metrics.clone(),
            hooks,
        )
        .with_recall(recall);
        let segmenter = settings
            .segmentation
            .enabled
            .then(|| segmenter(&settings, &pool, &writer, embedders.topic, llm, &metrics));
        let bus = bus_enabled
            .then(|| BusWorkers::new(&settings, &pool, relay_wake, &backfill, &segmenter));
        let retention = RetentionJob::new(
            pool.clone(),
            settings.retention.clone(),
            settings.memory.tombstone_ttl(),
            metrics.clone(),
        )?;
        let server = GrpcServer::bind(&settings.grpc)
            .await?
            .watching_database(pool.clone(), "ingest")
            .counting_requests_in(requests);
        Ok(Self {
            server,
            pool,
            writer,
            tokens,
            backfill,
            segmenter: segmenter.map(|segmenter| (segmenter, segmentation_wake)),
            bus,
            retention,
            runs_retention: settings.retention.enabled,
        })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.server.local_addr()
    }

    /// Where Prometheus scrapes `GET /metrics`.
    pub fn metrics_addr(&self) -> SocketAddr {
        self.server.metrics_addr()
    }

    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    pub fn metrics(&self) -> Arc<IngestMetrics> {
        self.writer.metrics.clone()
    }

    /// The retention job this service runs (periodically when `retention.enabled`); a run can
    /// also be started from it directly.
    pub fn retention(&self) -> RetentionJob {
        self.retention.clone()
    }

    /// Serves until `shutdown` resolves, then drains, stops the background work (each finishes
    /// what it holds) and closes the pools: the group commit's once its batches are done, then
    /// the rest.
    pub async fn run_until(self, shutdown: impl Future<Output = ()>) -> anyhow::Result<()> {
        let purger = tokio::spawn(purge_expired_tombstones(self.pool.clone()));
        let (stop_background, background_stop) = watch::channel(false);
        let mut background = Vec::new();
        if let Some(backfill) = self.backfill {
            background.push(tokio::spawn(backfill.run(background_stop.clone())));
        }
        if let Some((segmenter, wake)) = self.segmenter {
            background.push(tokio::spawn(segmenter.run(wake, background_stop.clone())));
        }
        if self.runs_retention {
            background.push(tokio::spawn(
                self.retention.clone().run(background_stop.clone()),
            ));
        }
        let outbox_watch = self
            .bus
            .is_some()
            .then(|| tokio::spawn(crate::bus::watch_outbox_backlog(self.pool.clone())));
        if let Some(bus) = self.bus {
            background.push(tokio::spawn(bus.relay.run(background_stop.clone())));
            if let Some(consumer) = bus.embedding {
                background.push(tokio::spawn(consumer.run(background_stop.clone())));
            }
            if let Some(consumer) = bus.segmentation {
                background.push(tokio::spawn(consumer.run(background_stop.clone())));
            }
        }

        let commit_pool = self.writer.commit_pool().clone();
        let recall = self.writer.recall.clone();
        let routes = Routes::new(IngestServiceServer::new(IngestApi::new(Ingest::new(
            self.writer,
            self.retention,
        ))));
        let served = self
            .server
            .serve(routes, &[SERVICE_NAME], self.tokens, shutdown)
            .await;

        let _ = stop_background.send(true);
        for task in background {
            if let Err(error) = task.await {
                tracing::error!(%error, "background task failed");
            }
        }
        purger.abort();
        if let Some(watch) = outbox_watch {
            watch.abort();
        }
        // What the last "what do you remember" retrievals left behind is written.
        if let Some(recall) = recall {
            recall.flush_traces().await;
        }
        // Batches under way finish (their callers may have gone; what they commit stays).
        commit_pool.close().await;
        self.pool.close().await;
        served
    }
}

async fn purge_expired_tombstones(pool: PgPool) {
    let mut interval = tokio::time::interval(TOMBSTONE_PURGE_INTERVAL);
    loop {
        interval.tick().await;
        let purged = match pool.acquire().await {
            Ok(mut connection) => engram_store::tombstones::purge_expired(&mut connection).await,
            Err(error) => Err(error.into()),
        };
        match purged {
            Ok(0) => {}
            Ok(count) => tracing::info!(count, "purged expired tombstones"),
            Err(error) => tracing::warn!(%error, "cannot purge expired tombstones; will retry"),
        }
    }
}

/// The embedding backfill: with the bus, new entries are embedded by the consumer and the sweep
/// only takes what is older than `sweep_min_age_ms` (lost messages, broker down); without it,
/// the write path wakes the sweep directly.
fn embedding_backfill(
    settings: &IngestSettings,
    pool: &PgPool,
    embedder: &Arc<dyn engram_embed::Embedder>,
    sweep_wake: Arc<Notify>,
    metrics: &Arc<IngestMetrics>,
) -> EmbeddingBackfill {
    let bus_enabled = settings.amqp.bus.enabled;
    tracing::info!(model = %embedder.model_id(), bus = bus_enabled, "embedding backfill enabled");
    let min_age = if bus_enabled {
        Duration::from_millis(settings.embed.sweep_min_age_ms)
    } else {
        Duration::ZERO
    };
    EmbeddingBackfill::new(
        pool.clone(),
        embedder.clone(),
        BackfillSettings {
            batch_size: settings.embed.model.batch_size,
            poll_interval: Duration::from_millis(settings.embed.poll_interval_ms),
            max_failures: settings.embed.max_failures,
            min_age,
            max_deferral: settings.embed.backfill_max_deferral(),
        },
        sweep_wake,
        metrics.clone(),
    )
}

/// Segmentation and what it runs: the describer (titles and summaries) and the consolidator
/// (facts), by the LLM when one is configured, else by the local rules.
fn segmenter(
    settings: &IngestSettings,
    pool: &PgPool,
    writer: &MemoryWriter,
    topic_embedder: Option<Arc<dyn engram_embed::Embedder>>,
    llm: Option<engram_llm::ChatClient>,
    metrics: &Arc<IngestMetrics>,
) -> Segmenter {
    Segmenter {
        pool: pool.clone(),
        writer: writer.clone(),
        topic_embedder,
        describer: Describer {
            llm: llm.clone(),
            metrics: metrics.clone(),
            max_text_chars: settings.memory.max_text_chars,
        },
        consolidator: Consolidator {
            pool: pool.clone(),
            writer: writer.clone(),
            llm,
            metrics: metrics.clone(),
        },
        settings: Arc::new(settings.segmentation.clone()),
        metrics: metrics.clone(),
    }
}
