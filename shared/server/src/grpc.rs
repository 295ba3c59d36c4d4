//! The gRPC server every Engram service runs: its own services behind the access layer, plus
//! `grpc.health.v1` and server reflection, so `grpcurl -plaintext HOST:PORT list` and `describe`
//! work without proto files.
//!
//! Health: the overall status (`""`) is SERVING while the process serves, so liveness probes do
//! not restart a pod that is only waiting for a dependency; each named service turns SERVING when
//! the service says it is ready, and NOT_SERVING as soon as shutdown starts.

use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;

use anyhow::Context as _;
use tokio::net::TcpListener;
use tonic::service::Routes;
use tonic::transport::server::TcpIncoming;
use tonic_health::ServingStatus;
use tonic_health::pb::health_server::HealthServer;
use tonic_health::server::{HealthReporter, HealthService};

use crate::auth::{AuthLayer, TokenRegistry};
use crate::deadline::DeadlineLayer;
use crate::settings::GrpcSettings;

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
    shutdown_grace: Duration,
    max_concurrent_requests_per_connection: usize,
    request_timeout: Duration,
    health: HealthReporter,
    health_service: HealthServer<HealthService>,
}

impl GrpcServer {
    /// Binds the listen address (port 0 picks a free port).
    pub async fn bind(settings: &GrpcSettings) -> anyhow::Result<Self> {
        let listener = TcpListener::bind(settings.listen_addr)
            .await
            .with_context(|| format!("cannot listen on {}", settings.listen_addr))?;
        let local_addr = listener.local_addr()?;
        // The reporter starts with the overall status ("") SERVING.
        let health = HealthReporter::new();
        let health_service = HealthServer::new(HealthService::from_health_reporter(health.clone()));
        Ok(Self {
            listener,
            local_addr,
            shutdown_grace: settings.shutdown_grace(),
            max_concurrent_requests_per_connection: settings.max_concurrent_requests_per_connection,
            request_timeout: Duration::from_secs(settings.request_timeout_secs),
            health,
            health_service,
        })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
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
        // Both reflection versions: grpcurl 1.8 and many tools still speak only v1alpha.
        // The descriptors hold every Engram service (one package); only the ones this server
        // serves are advertised, so `grpcurl list` does not offer calls that answer UNIMPLEMENTED.
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
        let routes = routes
            .add_service(self.health_service)
            .add_service(reflection_v1)
            .add_service(reflection_v1alpha);

        if tokens.is_open() {
            tracing::warn!(
                addr = %self.local_addr,
                "NO ACCESS TOKENS CONFIGURED: every caller is trusted. Any client that reaches \
                 this port may read, write and delete any user's memory and run admin operations \
                 (re-embedding every space). Set ENGRAM_AUTH__TOKENS_FILE outside local runs."
            );
        }

        // TCP_NODELAY: without it small gRPC responses wait on delayed ACKs (~40 ms each).
        let incoming = TcpIncoming::from(self.listener)
            .with_nodelay(Some(true))
            .with_keepalive(Some(Duration::from_secs(60)));
        let (stop_accepting, stop_signal) = tokio::sync::oneshot::channel::<()>();
        let server = tonic::transport::Server::builder()
            .concurrency_limit_per_connection(self.max_concurrent_requests_per_connection)
            .load_shed(true)
            .trace_fn(engram_telemetry::grpc_request_span)
            // Deadlines are Engram's own (DEADLINE_EXCEEDED, or UNKNOWN for a write that may
            // have landed), not tonic's `timeout`, which answers CANCELLED.
            .layer(DeadlineLayer::new(self.request_timeout))
            .layer(AuthLayer::new(tokens))
            .layer(tower::util::MapResponseLayer::new(
                crate::status::oversized_request_as_resource_exhausted,
            ))
            .add_routes(routes)
            .serve_with_incoming_shutdown(incoming, async {
                let _ = stop_signal.await;
            });
        tokio::pin!(server);

        for name in service_names {
            self.health
                .set_service_status(name, ServingStatus::Serving)
                .await;
        }
        tracing::info!(addr = %self.local_addr, services = ?service_names, "serving grpc");

        tokio::pin!(shutdown);
        tokio::select! {
            result = &mut server => return result.context("grpc server failed"),
            () = &mut shutdown => {}
        }

        for name in service_names {
            self.health
                .set_service_status(name, ServingStatus::NotServing)
                .await;
        }
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
