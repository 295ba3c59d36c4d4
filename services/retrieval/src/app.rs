//! Start-up of the retrieval service (same shape as ingest: `App::build` is used by `main` and
//! by tests): connects to Postgres, loads the query embedder, starts the retrieval pipeline.

use std::future::Future;
use std::net::SocketAddr;

use anyhow::Context as _;
use engram_proto::v1::retrieval_service_server::RetrievalServiceServer;
use engram_recall::Recall;
use engram_server::{Foundation, GrpcServer, TokenRegistry};
use sqlx::PgPool;
use tonic::service::Routes;

use crate::config::RetrievalSettings;
use crate::grpc::RetrievalApi;
use crate::service::Retriever;

pub const SERVICE_NAME: &str = "engram.v1.RetrievalService";

pub struct App {
    server: GrpcServer,
    pool: PgPool,
    recall: Recall,
    tokens: TokenRegistry,
}

impl App {
    pub async fn build(settings: RetrievalSettings) -> anyhow::Result<Self> {
        let Foundation { tokens, pool } =
            Foundation::lay(&settings.auth, &settings.database).await?;
        // Turns and responses are counted in tokens: load the vocabulary before serving.
        tokio::task::spawn_blocking(engram_core::retrieval::budget::load_tokenizer).await?;
        let embedders = engram_recall::load_embedders(&settings.embed.embedder_choice()).await?;
        match &embedders.text {
            Some(embedder) => {
                engram_recall::check_dimension(&pool, embedder.as_ref()).await?;
                tracing::info!(model = %embedder.model_id(), "query embedder loaded");
            }
            None => tracing::warn!(
                "no embedder configured: retrieval serves BM25 and its fallbacks only"
            ),
        }
        if let Some(turn_vectors) = &embedders.topic {
            // The turn vectors' shared part is computed once per process (about a second of the
            // local model): before serving, so that the first retrievals' query embeddings do
            // not wait behind it on the model's threads.
            let sample = ["warm up the turn vectors".to_owned()];
            let warm_up = turn_vectors.embed(&sample);
            match tokio::time::timeout(std::time::Duration::from_secs(10), warm_up).await {
                Ok(Ok(_)) => {}
                Ok(Err(error)) => tracing::warn!(%error, "could not warm up the turn vectors"),
                Err(_) => tracing::warn!("the turn vectors were not warm after 10 s; serving"),
            }
        }
        // Retrieval's reads go through sessions that cannot write, without the release check.
        let reads = engram_store::read_only_pool_beside(&pool)
            .await
            .context("cannot connect the read-only pool to postgres (ENGRAM_DATABASE__URL)")?;
        let recall = engram_recall::start_recall(
            pool.clone(),
            reads.clone(),
            embedders,
            settings.embed.query_embedder(),
            settings.recall.clone(),
        )?;
        let server = GrpcServer::bind(&settings.grpc)
            .await?
            .watching_database(pool.clone(), "retrieval")
            .observing_read_pool(reads, "retrieval");
        Ok(Self {
            server,
            pool,
            recall,
            tokens,
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

    /// The retrieval pipeline the service runs (tests flush its traces through it).
    pub fn recall(&self) -> &Recall {
        &self.recall
    }

    pub async fn run_until(self, shutdown: impl Future<Output = ()>) -> anyhow::Result<()> {
        let routes = Routes::new(RetrievalServiceServer::new(RetrievalApi::new(
            Retriever::new(self.pool.clone(), self.recall.clone()),
        )));
        let served = self
            .server
            .serve(routes, &[SERVICE_NAME], self.tokens, shutdown)
            .await;
        // What the last retrievals left behind is written before the pool closes.
        self.recall.flush_traces().await;
        self.pool.close().await;
        served
    }
}
