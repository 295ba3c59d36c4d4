//! Start-up of the ingest service. `App::build` is what `main` runs and what tests run: it
//! connects to Postgres, applies migrations when this process owns them, and binds the gRPC port
//! (port 0 picks a free one).

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use engram_proto::v1::ingest_service_server::IngestServiceServer;
use engram_server::{GrpcServer, TokenRegistry};
use sqlx::PgPool;
use tonic::service::Routes;

use crate::config::IngestSettings;
use crate::grpc::IngestApi;
use crate::metrics::IngestMetrics;
use crate::write_path::MemoryWriter;

pub const SERVICE_NAME: &str = "engram.v1.IngestService";

pub struct App {
    server: GrpcServer,
    pool: PgPool,
    writer: MemoryWriter,
    tokens: TokenRegistry,
}

impl App {
    pub async fn build(settings: IngestSettings) -> anyhow::Result<Self> {
        let tokens = match &settings.auth.tokens_file {
            Some(path) => TokenRegistry::from_file(path)?,
            None => TokenRegistry::open(),
        };
        let pool = engram_server::database::connect(&settings.database).await?;
        let writer = MemoryWriter::new(
            pool.clone(),
            settings.memory.clone(),
            Arc::new(IngestMetrics::default()),
        );
        let server = GrpcServer::bind(&settings.grpc).await?;
        Ok(Self {
            server,
            pool,
            writer,
            tokens,
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

    /// Serves until `shutdown` resolves, then drains and closes the pool.
    pub async fn run_until(self, shutdown: impl Future<Output = ()>) -> anyhow::Result<()> {
        let routes = Routes::new(IngestServiceServer::new(IngestApi::new(self.writer)));
        let served = self
            .server
            .serve(routes, &[SERVICE_NAME], self.tokens, shutdown)
            .await;
        self.pool.close().await;
        served
    }
}
