//! Start-up of the review service (same shape as ingest: `App::build` is used by `main` and
//! by tests).

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use engram_proto::v1::review_service_server::ReviewServiceServer;
use engram_server::{Foundation, GrpcServer, TokenRegistry};
use sqlx::PgPool;
use tokio::sync::watch;
use tonic::service::Routes;

use crate::config::{LlmFailure, ReviewSettings};
use crate::grading::Grader;
use crate::grpc::ReviewApi;
use crate::metrics::ReviewMetrics;
use crate::segments::SegmentConsumer;
use crate::service::Reviewer;

pub const SERVICE_NAME: &str = "engram.v1.ReviewService";

pub struct App {
    server: GrpcServer,
    pool: PgPool,
    tokens: TokenRegistry,
    reviewer: Reviewer,
    consumer: Option<SegmentConsumer>,
}

impl App {
    pub async fn build(settings: ReviewSettings) -> anyhow::Result<Self> {
        let Foundation { tokens, pool } =
            Foundation::lay(&settings.auth, &settings.database).await?;
        // The local grader compares memories with turns by topic; the search embeddings are not
        // its business.
        let embedder = engram_recall::load_embedders(&settings.embed.embedder_choice())
            .await?
            .topic;
        let llm = engram_llm::ChatClient::from_settings(&settings.llm)?;
        match &llm {
            Some(client) => tracing::info!(
                model = client.model(),
                on_failure = ?settings.grading.on_llm_failure,
                "memories are graded by an LLM"
            ),
            None => tracing::info!(
                embedder = embedder.as_ref().map(|e| e.model_id().to_owned()),
                "no LLM configured: memories are graded by the local grader"
            ),
        }
        let metrics = Arc::new(ReviewMetrics::default());
        let reviewer = Reviewer {
            pool: pool.clone(),
            grader: Grader {
                llm,
                embedder,
                thresholds: settings.grading.thresholds(),
                fall_back_locally: settings.grading.on_llm_failure == LlmFailure::Local,
                metrics: metrics.clone(),
            },
            desired_retention: settings.grading.desired_retention,
            metrics,
        };
        let consumer = settings.amqp.bus.enabled.then(|| SegmentConsumer {
            reviewer: reviewer.clone(),
            settings: settings.amqp.clone(),
            spaces_in_review: Default::default(),
        });
        let server = GrpcServer::bind(&settings.grpc)
            .await?
            .watching_database(pool.clone(), "review");
        Ok(Self {
            server,
            pool,
            tokens,
            reviewer,
            consumer,
        })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.server.local_addr()
    }

    /// Where Prometheus scrapes `GET /metrics`.
    pub fn metrics_addr(&self) -> SocketAddr {
        self.server.metrics_addr()
    }

    /// What the consumer and the RPCs run (the review benchmark times it in process).
    pub fn reviewer(&self) -> &Reviewer {
        &self.reviewer
    }

    pub fn metrics(&self) -> Arc<ReviewMetrics> {
        self.reviewer.metrics.clone()
    }

    /// Serves until `shutdown` resolves; the consumer finishes the segment in hand first.
    pub async fn run_until(self, shutdown: impl Future<Output = ()>) -> anyhow::Result<()> {
        let (stop_background, background_stop) = watch::channel(false);
        let consumer = self
            .consumer
            .map(|consumer| tokio::spawn(consumer.run(background_stop)));
        let routes = Routes::new(ReviewServiceServer::new(ReviewApi::new(self.reviewer)));
        let served = self
            .server
            .serve(routes, &[SERVICE_NAME], self.tokens, shutdown)
            .await;
        let _ = stop_background.send(true);
        if let Some(consumer) = consumer
            && let Err(error) = consumer.await
        {
            tracing::error!(%error, "the segment consumer failed");
        }
        self.pool.close().await;
        served
    }
}
