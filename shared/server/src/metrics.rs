//! What every server measures about itself, and the HTTP port Prometheus scrapes it from:
//! requests per RPC and status code, their latency, and the database pool's connections. The
//! services' own metrics (writes, embeddings, the bus, retention, reviews) are recorded through
//! the same OpenTelemetry meter provider and served on the same port.

use std::future::Future;
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};
use std::time::Instant;

use opentelemetry::KeyValue;
use opentelemetry::metrics::{Counter, Histogram};
use sqlx::PgPool;
use tokio::net::TcpListener;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_server::Health as _;
use tonic_health::server::HealthService;
use tower::{Layer, Service};

/// Serves `GET /metrics` (the Prometheus text format) and `GET /healthz` on `listener` until
/// `shutdown` resolves.
///
/// `/healthz?service=NAME` answers what `grpc.health.v1.Health/Check` answers for `NAME` (the
/// empty name, the default, for the process): 200 `SERVING`, 503 `NOT_SERVING`, 404 for a
/// name the server does not serve. It is there for probes that cannot speak gRPC over TLS
/// (the kubelet's gRPC probe is plaintext only), so it works whether or not `grpc.tls` is set.
pub async fn serve_metrics(
    listener: TcpListener,
    health: HealthService,
    shutdown: impl Future<Output = ()> + Send + 'static,
) {
    let app = axum::Router::new()
        .route(
            "/metrics",
            axum::routing::get(|| async {
                (
                    [(
                        http::header::CONTENT_TYPE,
                        "text/plain; version=0.0.4; charset=utf-8",
                    )],
                    engram_telemetry::render_metrics(),
                )
            }),
        )
        .route("/healthz", axum::routing::get(health_check))
        .with_state(Arc::new(health));
    if let Err(error) = axum::serve(listener, app)
        .with_graceful_shutdown(shutdown)
        .await
    {
        tracing::warn!(%error, "the metrics endpoint stopped");
    }
}

#[derive(serde::Deserialize)]
struct HealthQuery {
    #[serde(default)]
    service: String,
}

async fn health_check(
    axum::extract::State(health): axum::extract::State<Arc<HealthService>>,
    axum::extract::Query(query): axum::extract::Query<HealthQuery>,
) -> (http::StatusCode, &'static str) {
    let request = tonic::Request::new(HealthCheckRequest {
        service: query.service,
    });
    match health.check(request).await {
        Ok(response) if response.get_ref().status() == ServingStatus::Serving => {
            (http::StatusCode::OK, "SERVING\n")
        }
        Ok(_) => (http::StatusCode::SERVICE_UNAVAILABLE, "NOT_SERVING\n"),
        Err(_) => (http::StatusCode::NOT_FOUND, "SERVICE_UNKNOWN\n"),
    }
}

/// The pool's connections, in use and idle, observed at each scrape (while the returned gauge
/// is kept); `name` tells a service's pools apart (`main`, and retrieval's read-only `reads`).
pub fn observe_pool(
    pool: PgPool,
    service: &'static str,
    name: &'static str,
) -> opentelemetry::metrics::ObservableGauge<u64> {
    let meter = opentelemetry::global::meter("engram-server");
    meter
        .u64_observable_gauge("engram.db.pool.connections")
        .with_description("database pool connections by state (in_use, idle)")
        .with_callback(move |observer| {
            let size = u64::from(pool.size());
            let idle = pool.num_idle() as u64;
            observer.observe(
                size.saturating_sub(idle),
                &[
                    KeyValue::new("service", service),
                    KeyValue::new("pool", name),
                    KeyValue::new("state", "in_use"),
                ],
            );
            observer.observe(
                idle,
                &[
                    KeyValue::new("service", service),
                    KeyValue::new("pool", name),
                    KeyValue::new("state", "idle"),
                ],
            );
        })
        .build()
}

struct RpcInstruments {
    requests: Counter<u64>,
    duration: Histogram<f64>,
}

fn instruments() -> &'static RpcInstruments {
    static INSTRUMENTS: OnceLock<RpcInstruments> = OnceLock::new();
    INSTRUMENTS.get_or_init(|| {
        let meter = opentelemetry::global::meter("engram-server");
        RpcInstruments {
            requests: meter
                .u64_counter("engram.rpc.requests")
                .with_description("gRPC requests answered, by method and status code")
                .build(),
            duration: meter
                .f64_histogram("engram.rpc.duration")
                .with_unit("s")
                .with_description("time to answer a gRPC request, by method")
                .with_boundaries(vec![
                    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
                ])
                .build(),
        }
    })
}

/// Counts each request by method and gRPC status code and records how long it took. A status
/// sent in the response headers (every error of a unary call: tonic answers them
/// trailers-only) is that code; otherwise the call succeeded (0). A streaming call
/// (ExportSpace) counts when its headers go out: an error in a later page is not seen here.
/// Requests refused by load shedding never reach this layer.
#[derive(Debug, Clone, Default)]
pub struct RpcMetricsLayer;

impl<S> Layer<S> for RpcMetricsLayer {
    type Service = RpcMetrics<S>;

    fn layer(&self, inner: S) -> Self::Service {
        RpcMetrics { inner }
    }
}

#[derive(Debug, Clone)]
pub struct RpcMetrics<S> {
    inner: S,
}

impl<S, B, ResBody> Service<http::Request<B>> for RpcMetrics<S>
where
    S: Service<http::Request<B>, Response = http::Response<ResBody>> + Send,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = std::pin::Pin<Box<dyn Future<Output = Result<S::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, context: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(context)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let method = request.uri().path().to_owned();
        let started = Instant::now();
        let answer = self.inner.call(request);
        Box::pin(async move {
            let response = answer.await;
            let code = match &response {
                Ok(response) => response
                    .headers()
                    .get("grpc-status")
                    .and_then(|value| value.to_str().ok())
                    .unwrap_or("0")
                    .to_owned(),
                Err(_) => "2".to_owned(),
            };
            // A path no service answers (UNIMPLEMENTED) is anything a caller typed: one series
            // for all of them, not one each.
            let method = if code == "12" {
                "unknown".to_owned()
            } else {
                method
            };
            let instruments = instruments();
            instruments.requests.add(
                1,
                &[
                    KeyValue::new("rpc.method", method.clone()),
                    KeyValue::new("rpc.grpc.status_code", code),
                ],
            );
            instruments.duration.record(
                started.elapsed().as_secs_f64(),
                &[KeyValue::new("rpc.method", method)],
            );
            response
        })
    }
}
