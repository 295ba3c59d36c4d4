//! Start-up of the ingest service. `App::build` is what `main` runs and what tests run: it
//! connects to Postgres, applies migrations when this process owns them, loads the embedder and
//! checks its dimension against the store, and binds the gRPC port (port 0 picks a free one).

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use engram_proto::v1::ingest_service_server::IngestServiceServer;
use engram_server::{GrpcServer, TokenRegistry};
use sqlx::PgPool;
use tokio::sync::{Notify, watch};
use tonic::service::Routes;

use crate::backfill::{BackfillSettings, EmbeddingBackfill};
use crate::bus::{EmbeddingConsumer, OutboxRelay};
use crate::config::IngestSettings;
use crate::grpc::IngestApi;
use crate::metrics::IngestMetrics;
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
    bus: Option<(OutboxRelay, EmbeddingConsumer)>,
}

impl App {
    pub async fn build(settings: IngestSettings) -> anyhow::Result<Self> {
        let tokens = match &settings.auth.tokens_file {
            Some(path) => TokenRegistry::from_file(path)?,
            None => TokenRegistry::open(),
        };
        let pool = engram_server::database::connect(&settings.database).await?;
        let metrics = Arc::new(IngestMetrics::default());

        let embedder = engram_recall::load_embedder(&settings.embed.embedder_choice()).await?;
        if let Some(embedder) = &embedder {
            engram_recall::check_dimension(&pool, embedder.as_ref()).await?;
        }
        // "What do you remember about X" runs the retrieval pipeline over the same model.
        let recall = engram_recall::start_recall(
            pool.clone(),
            embedder.clone(),
            settings.embed.query_embedder(),
            settings.recall.clone(),
        )?;
        let Some(embedder) = embedder else {
            tracing::warn!(
                "embedding backfill disabled: entries keep needs_embedding until an embedder runs"
            );
            let writer = MemoryWriter::new(
                pool.clone(),
                settings.memory.clone(),
                metrics,
                BackfillHooks::default(),
            )
            .with_recall(recall);
            let server = GrpcServer::bind(&settings.grpc)
                .await?
                .watching_database(pool.clone());
            return Ok(Self {
                server,
                pool,
                writer,
                tokens,
                backfill: None,
                bus: None,
            });
        };
        let model = embedder.model_id().to_owned();
        tracing::info!(model = %model, bus = settings.amqp.enabled, "embedding backfill enabled");

        // With the bus, new entries are announced through the outbox and embedded by the consumer;
        // the sweep only takes what is older than `sweep_min_age_ms` (lost messages, broker down).
        // Without it, the write path wakes the sweep directly.
        let bus_enabled = settings.amqp.enabled;
        let min_age = if bus_enabled {
            Duration::from_millis(settings.embed.sweep_min_age_ms)
        } else {
            Duration::ZERO
        };
        let sweep_wake = Arc::new(Notify::new());
        let backfill = EmbeddingBackfill::new(
            pool.clone(),
            embedder,
            BackfillSettings {
                batch_size: settings.embed.batch_size.max(1),
                poll_interval: Duration::from_millis(settings.embed.poll_interval_ms),
                max_failures: settings.embed.max_failures,
                min_age,
            },
            sweep_wake.clone(),
            metrics.clone(),
        );
        let (hooks, bus) = if bus_enabled {
            let relay_wake = Arc::new(Notify::new());
            let hooks = BackfillHooks {
                new_entry_wake: Some(relay_wake.clone()),
                sweep_wake: Some(sweep_wake.clone()),
                embedding_model: Some(model),
                publish_events: true,
            };
            let relay = OutboxRelay {
                pool: pool.clone(),
                settings: settings.amqp.clone(),
                wake: relay_wake,
            };
            let consumer = EmbeddingConsumer {
                backfill: backfill.clone(),
                settings: settings.amqp.clone(),
                batch_size: settings.embed.batch_size.max(1),
            };
            (hooks, Some((relay, consumer)))
        } else {
            let hooks = BackfillHooks {
                new_entry_wake: Some(sweep_wake.clone()),
                sweep_wake: Some(sweep_wake),
                embedding_model: Some(model),
                publish_events: false,
            };
            (hooks, None)
        };
        let writer = MemoryWriter::new(pool.clone(), settings.memory.clone(), metrics, hooks)
            .with_recall(recall);
        let server = GrpcServer::bind(&settings.grpc)
            .await?
            .watching_database(pool.clone());
        Ok(Self {
            server,
            pool,
            writer,
            tokens,
            backfill: Some(backfill),
            bus,
        })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.server.local_addr()
    }

    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    pub fn metrics(&self) -> Arc<IngestMetrics> {
        self.writer.metrics.clone()
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
        if let Some((relay, consumer)) = self.bus {
            background.push(tokio::spawn(relay.run(background_stop.clone())));
            background.push(tokio::spawn(consumer.run(background_stop.clone())));
        }

        let commit_pool = self.writer.commit_pool().clone();
        let routes = Routes::new(IngestServiceServer::new(IngestApi::new(self.writer)));
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
