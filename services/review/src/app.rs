//! Start-up of the review service (same shape as ingest: `App::build` is used by `main` and
//! by tests).

use std::future::Future;
use std::net::SocketAddr;

use engram_proto::v1::review_service_server::ReviewServiceServer;
use engram_server::{GrpcServer, TokenRegistry};
use sqlx::PgPool;
use tonic::service::Routes;

use crate::config::ReviewSettings;
use crate::grpc::ReviewApi;

pub const SERVICE_NAME: &str = "engram.v1.ReviewService";

pub struct App {
    server: GrpcServer,
    pool: PgPool,
    tokens: TokenRegistry,
}

impl App {
    pub async fn build(settings: ReviewSettings) -> anyhow::Result<Self> {
        let tokens = match &settings.auth.tokens_file {
            Some(path) => TokenRegistry::from_file(path)?,
            None => TokenRegistry::open(),
        };
        let pool = engram_server::database::connect(&settings.database).await?;
        let server = GrpcServer::bind(&settings.grpc)
            .await?
            .watching_database(pool.clone());
        Ok(Self {
            server,
            pool,
            tokens,
        })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.server.local_addr()
    }

    pub async fn run_until(self, shutdown: impl Future<Output = ()>) -> anyhow::Result<()> {
        let routes = Routes::new(ReviewServiceServer::new(ReviewApi::new(self.pool.clone())));
        let served = self
            .server
            .serve(routes, &[SERVICE_NAME], self.tokens, shutdown)
            .await;
        self.pool.close().await;
        served
    }
}
