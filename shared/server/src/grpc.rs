//! The gRPC server every Engram service runs: its own services behind the access layer, plus
//! `grpc.health.v1` and server reflection, so `grpcurl -plaintext HOST:PORT list` and `describe`
//! work without proto files.
//!
//! Health: the overall status (`""`) is SERVING while the process serves, so liveness probes do
//! not restart a pod that is only waiting for a dependency. Each named service (readiness) turns
//! SERVING when serving starts, NOT_SERVING while its database does not answer (two probes in a
//! row fail; SERVING again at the first that passes), and NOT_SERVING as soon as shutdown starts.
//!
//! Why readiness follows the database: a service whose database does not answer can do no work
//! (every RPC would answer UNAVAILABLE), so Kubernetes should send its traffic to replicas that
//! can. When the database is down for every replica, all of them leave the Service's endpoints and
//! clients get UNAVAILABLE from the connection instead of from the handler: the same code, and
//! nothing restarts (liveness stays SERVING), so the pods are back the moment the database is.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use engram_core::activity::RequestActivity;
use sqlx::PgPool;
use tokio::net::TcpListener;
use tonic::service::Routes;
use tonic::transport::server::TcpIncoming;
use tonic_health::ServingStatus;
use tonic_health::pb::health_server::HealthServer;
use tonic_health::server::{HealthReporter, HealthService};

use crate::activity::RequestActivityLayer;
use crate::auth::{AuthLayer, TokenRegistry};
use crate::deadline::DeadlineLayer;
use crate::settings::GrpcSettings;
use crate::tls::TlsConfigWatch;
use futures::future::Either;

/// Served by every Engram server beside its own services.
const REFLECTION_AND_HEALTH_SERVICES: [&str; 3] = [
    "grpc.health.v1.Health",
    "grpc.reflection.v1.ServerReflection",
    "grpc.reflection.v1alpha.ServerReflection",
];

/// A bound gRPC listener, ready to serve.
pub struct GrpcServer {
    listener: TcpListener,
    local_addr: SocketAddr,
    /// The Prometheus endpoint (`GET /metrics`).
    metrics_listener: TcpListener,
    metrics_addr: SocketAddr,
    /// Keeps the pool gauge's callback registered.
    _pool_gauges: Vec<opentelemetry::metrics::ObservableGauge<u64>>,
    shutdown_grace: Duration,
    max_concurrent_requests_per_connection: usize,
    request_timeout: Duration,
    health: HealthReporter,
    health_service: HealthServer<HealthService>,
    /// The database readiness follows, and how often it is probed.
    readiness_database: Option<PgPool>,
    readiness_interval: Duration,
    /// TLS, when configured.
    tls: Option<TlsConfigWatch>,
    /// Counts the requests being served, when something watches them (see `crate::activity`).
    request_activity: Option<Arc<RequestActivity>>,
}

impl GrpcServer {
    /// Binds the listen address (port 0 picks a free port).
    pub async fn bind(settings: &GrpcSettings) -> anyhow::Result<Self> {
        // Certificates first: a service that cannot load them should not start listening.
        let tls = settings
            .tls
            .as_ref()
            .map(TlsConfigWatch::start)
            .transpose()
            .context("cannot load the TLS certificates (grpc.tls)")?;
        let listener = TcpListener::bind(settings.listen_addr)
            .await
            .with_context(|| format!("cannot listen on {}", settings.listen_addr))?;
        let local_addr = listener.local_addr()?;
        let metrics_listener = TcpListener::bind(settings.metrics_listen_addr)
            .await
            .with_context(|| {
                format!(
                    "cannot listen on {} (metrics)",
                    settings.metrics_listen_addr
                )
            })?;
        let metrics_addr = metrics_listener.local_addr()?;
        // The reporter starts with the overall status ("") SERVING.
        let health = HealthReporter::new();
        let health_service = HealthServer::new(HealthService::from_health_reporter(health.clone()));
        Ok(Self {
            listener,
            local_addr,
            metrics_listener,
            metrics_addr,
            _pool_gauges: Vec::new(),
            shutdown_grace: settings.shutdown_grace(),
            max_concurrent_requests_per_connection: settings.max_concurrent_requests_per_connection,
            request_timeout: Duration::from_secs(settings.request_timeout_secs),
            health,
            health_service,
            readiness_database: None,
            readiness_interval: Duration::from_millis(settings.readiness_interval_ms.max(10)),
            tls,
            request_activity: None,
        })
    }

    /// Counts the requests this server serves in `activity`, which background work of the
    /// service watches to run between requests (the ingest service's embedding backfill).
    pub fn counting_requests_in(mut self, activity: Arc<RequestActivity>) -> Self {
        self.request_activity = Some(activity);
        self
    }

    /// Readiness follows this database (NOT_SERVING while it does not answer), and its pool's
    /// connections are a metric.
    pub fn watching_database(mut self, pool: PgPool, service: &'static str) -> Self {
        self._pool_gauges
            .push(crate::metrics::observe_pool(pool.clone(), service, "main"));
        self.readiness_database = Some(pool);
        self
    }

    /// A read-only pool of the service beside the one it watches (retrieval's reads), whose
    /// connections are a metric too (`pool="reads"`).
    pub fn observing_read_pool(mut self, pool: PgPool, service: &'static str) -> Self {
        self._pool_gauges
            .push(crate::metrics::observe_pool(pool, service, "reads"));
        self
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Where Prometheus scrapes `GET /metrics`.
    pub fn metrics_addr(&self) -> SocketAddr {
        self.metrics_addr
    }

    /// Lets the service report its own readiness (for example NOT_SERVING while its database is
    /// unreachable).
    pub fn health_reporter(&self) -> HealthReporter {
        self.health.clone()
    }

    /// Serves `routes` until `shutdown` resolves, then reports NOT_SERVING, stops accepting
    /// connections and lets in-flight requests finish within the grace period.
    ///
    /// `service_names` are the fully qualified names of the services in `routes`; they are marked
    /// SERVING once serving starts.
    pub async fn serve(
        self,
        routes: Routes,
        service_names: &[&str],
        tokens: TokenRegistry,
        shutdown: impl Future<Output = ()>,
    ) -> anyhow::Result<()> {
        let routes = with_reflection(routes.add_service(self.health_service), service_names)?;

        warn_if_open(&tokens, self.local_addr);

        // TCP_NODELAY: without it small gRPC responses wait on delayed ACKs (~40 ms each).
        let incoming = TcpIncoming::from(self.listener)
            .with_nodelay(Some(true))
            .with_keepalive(Some(Duration::from_secs(60)));
        let (stop_accepting, stop_signal) = tokio::sync::oneshot::channel::<()>();
        let stop = async {
            let _ = stop_signal.await;
        };
        let tls = self.tls.is_some();
        let router = tonic::transport::Server::builder()
            .concurrency_limit_per_connection(self.max_concurrent_requests_per_connection)
            .load_shed(true)
            .trace_fn(engram_telemetry::grpc_request_span)
            // Only where background work watches the requests (ingest's backfill).
            .layer(tower::util::option_layer(
                self.request_activity.clone().map(RequestActivityLayer::new),
            ))
            .layer(crate::metrics::RpcMetricsLayer)
            // Deadlines are Engram's own (DEADLINE_EXCEEDED, or UNKNOWN for a write that may
            // have landed), not tonic's `timeout`, which answers CANCELLED.
            .layer(DeadlineLayer::new(self.request_timeout))
            .layer(AuthLayer::new(tokens))
            .layer(tower::util::MapResponseLayer::new(
                crate::status::oversized_request_as_resource_exhausted,
            ))
            .add_routes(routes);
        let server = match self.tls.clone() {
            None => Either::Left(router.serve_with_incoming_shutdown(incoming, stop)),
            Some(tls) => {
                Either::Right(router.serve_with_incoming_shutdown(tls.accept(incoming), stop))
            }
        };
        tokio::pin!(server);

        set_status(&self.health, service_names, ServingStatus::Serving).await;
        tracing::info!(addr = %self.local_addr, tls, services = ?service_names, "serving grpc");

        let readiness = self.readiness_database.clone().map(|pool| {
            tokio::spawn(follow_database(
                pool,
                self.health.clone(),
                service_names
                    .iter()
                    .map(|name| (*name).to_owned())
                    .collect(),
                self.readiness_interval,
            ))
        });

        let (stop_metrics, metrics_stop) = tokio::sync::oneshot::channel::<()>();
        let metrics = tokio::spawn(crate::metrics::serve_metrics(
            self.metrics_listener,
            HealthService::from_health_reporter(self.health.clone()),
            async {
                let _ = metrics_stop.await;
            },
        ));
        tracing::info!(addr = %self.metrics_addr, "serving /metrics and /healthz");

        tokio::pin!(shutdown);
        let stopped = tokio::select! {
            result = &mut server => Some(result),
            () = &mut shutdown => None,
        };
        if let Some(readiness) = readiness {
            readiness.abort();
        }
        // Metrics stay readable while requests drain; they stop with the server.
        let _stop_metrics_on_return = StopOnDrop(Some(stop_metrics), metrics);
        if let Some(result) = stopped {
            return result.context("grpc server failed");
        }

        set_status(&self.health, service_names, ServingStatus::NotServing).await;
        let _ = stop_accepting.send(());
        match tokio::time::timeout(self.shutdown_grace, server).await {
            Ok(result) => result.context("grpc server failed while draining")?,
            Err(_) => tracing::warn!(
                grace_secs = self.shutdown_grace.as_secs(),
                "in-flight requests did not finish within the shutdown grace period"
            ),
        }
        tracing::info!("grpc server stopped");
        Ok(())
    }
}

/// `routes` with both reflection versions (grpcurl 1.8 and many tools still speak only
/// v1alpha). The descriptors hold every Engram service (one package); only the ones this server
/// serves are advertised, so `grpcurl list` does not offer calls that answer UNIMPLEMENTED.
fn with_reflection(routes: Routes, service_names: &[&str]) -> anyhow::Result<Routes> {
    let advertised: Vec<&str> = service_names
        .iter()
        .copied()
        .chain(REFLECTION_AND_HEALTH_SERVICES)
        .collect();
    let reflection = || {
        advertised.iter().fold(
            tonic_reflection::server::Builder::configure()
                .register_encoded_file_descriptor_set(engram_proto::FILE_DESCRIPTOR_SET)
                .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET),
            |builder, name| builder.with_service_name(*name),
        )
    };
    let reflection_v1 = reflection()
        .build_v1()
        .context("cannot build the reflection service")?;
    let reflection_v1alpha = reflection()
        .build_v1alpha()
        .context("cannot build the reflection service")?;
    Ok(routes
        .add_service(reflection_v1)
        .add_service(reflection_v1alpha))
}

/// Said loudly at start: a server without access tokens trusts every caller.
fn warn_if_open(tokens: &TokenRegistry, addr: SocketAddr) {
    if tokens.is_open() {
        tracing::warn!(
            addr = %addr,
            "NO ACCESS TOKENS CONFIGURED: every caller is trusted. Any client that reaches \
             this port may read, write and delete any user's memory and run admin operations \
             (re-embedding every space). Set ENGRAM_AUTH__TOKENS_FILE outside local runs."
        );
    }
}

async fn set_status(health: &HealthReporter, service_names: &[&str], status: ServingStatus) {
    for name in service_names {
        health.set_service_status(name, status).await;
    }
}

/// Stops the metrics endpoint when the server's `serve` returns, however it returns.
struct StopOnDrop(
    Option<tokio::sync::oneshot::Sender<()>>,
    tokio::task::JoinHandle<()>,
);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        if let Some(stop) = self.0.take() {
            let _ = stop.send(());
        }
        self.1.abort();
    }
}

/// Consecutive failed probes after which a service reports NOT_SERVING (one slow probe is no
/// outage).
const FAILED_PROBES_BEFORE_NOT_SERVING: u32 = 2;

/// Probes the database every `interval` and reports the named services NOT_SERVING while it
/// does not answer, SERVING again at its first answer.
async fn follow_database(
    pool: PgPool,
    health: HealthReporter,
    service_names: Vec<String>,
    interval: Duration,
) {
    let mut failures = 0u32;
    let mut ready = true;
    loop {
        tokio::time::sleep(interval).await;
        let probe = tokio::time::timeout(interval.max(Duration::from_secs(1)), async {
            sqlx::query("SELECT 1").execute(&pool).await
        })
        .await;
        let answered = matches!(probe, Ok(Ok(_)));
        if answered {
            failures = 0;
        } else {
            failures += 1;
        }
        let now_ready = answered || (ready && failures < FAILED_PROBES_BEFORE_NOT_SERVING);
        if now_ready == ready {
            continue;
        }
        ready = now_ready;
        let status = if ready {
            tracing::info!("the database answers again: ready for traffic");
            ServingStatus::Serving
        } else {
            tracing::warn!(
                failures,
                "the database does not answer: NOT_SERVING until it does"
            );
            ServingStatus::NotServing
        };
        for name in &service_names {
            health.set_service_status(name, status).await;
        }
    }
}
