//! The one telemetry entry point of every Engram binary: [`init_telemetry`] installs `tracing`
//! (human-readable logs, or JSON with `ENGRAM_LOG_FORMAT=json`), the OpenTelemetry metrics
//! every service records, readable in the Prometheus text format ([`render_metrics`], served on
//! each service's metrics port), and — when the standard `OTEL_EXPORTER_OTLP_ENDPOINT` is set —
//! trace and metric export over OTLP/gRPC.
//! The W3C trace-context propagator is installed globally either way, so traces continue across
//! gRPC and AMQP hops. [`TelemetryHandle::shutdown`] flushes what is buffered.
//!
//! Export runs on the Tokio runtime (the OTLP/gRPC exporter needs its reactor), so call
//! [`init_telemetry`] from inside the runtime.

#![forbid(unsafe_code)]

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::{MetricExporter, SpanExporter};
use opentelemetry_sdk::metrics::SdkMeterProvider;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::SdkTracerProvider;
use opentelemetry_sdk::{Resource, runtime};
use tracing_subscriber::EnvFilter;
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;

/// Standard variable that switches OTLP export on.
pub const OTLP_ENDPOINT_ENV: &str = "OTEL_EXPORTER_OTLP_ENDPOINT";
/// `json` for one JSON object per log line (Kubernetes log pipelines); anything else is text.
pub const LOG_FORMAT_ENV: &str = "ENGRAM_LOG_FORMAT";
const DEFAULT_FILTER: &str = "info,sqlx=warn,h2=warn,tower=warn,hyper=warn";

/// Keeps the providers alive; call [`TelemetryHandle::shutdown`] before exiting.
#[derive(Debug)]
pub struct TelemetryHandle {
    tracer_provider: Option<SdkTracerProvider>,
    meter_provider: Option<SdkMeterProvider>,
}

#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    #[error("cannot build the otlp {signal} exporter: {reason}")]
    Exporter {
        signal: &'static str,
        reason: String,
    },
    #[error("cannot install the tracing subscriber: {0}")]
    Subscriber(String),
}

/// Installs logging, tracing and (with an OTLP endpoint) export for `service_name`.
pub fn init_telemetry(service_name: &'static str) -> Result<TelemetryHandle, TelemetryError> {
    opentelemetry::global::set_text_map_propagator(TraceContextPropagator::new());

    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(DEFAULT_FILTER));
    let json =
        std::env::var(LOG_FORMAT_ENV).is_ok_and(|format| format.eq_ignore_ascii_case("json"));
    let fmt_layer = if json {
        tracing_subscriber::fmt::layer()
            .json()
            .with_current_span(true)
            .boxed()
    } else {
        tracing_subscriber::fmt::layer().with_target(true).boxed()
    };

    let export = std::env::var(OTLP_ENDPOINT_ENV).is_ok_and(|endpoint| !endpoint.trim().is_empty());
    let (tracer_provider, meter_provider) = if export {
        let resource = Resource::builder().with_service_name(service_name).build();
        // The exporters read OTEL_EXPORTER_OTLP_ENDPOINT (and the other OTEL_* variables) themselves.
        let span_exporter = SpanExporter::builder()
            .with_tonic()
            .build()
            .map_err(|error| TelemetryError::Exporter {
                signal: "trace",
                reason: error.to_string(),
            })?;
        let span_processor =
            opentelemetry_sdk::trace::span_processor_with_async_runtime::BatchSpanProcessor::builder(
                span_exporter,
                runtime::Tokio,
            )
            .build();
        let tracer_provider = SdkTracerProvider::builder()
            .with_span_processor(span_processor)
            .with_resource(resource.clone())
            .build();
        let metric_exporter = MetricExporter::builder()
            .with_tonic()
            .build()
            .map_err(|error| TelemetryError::Exporter {
                signal: "metric",
                reason: error.to_string(),
            })?;
        let reader = opentelemetry_sdk::metrics::periodic_reader_with_async_runtime::PeriodicReader::builder(
            metric_exporter,
            runtime::Tokio,
        )
        .build();
        let meter_provider = install_meters(Some((reader, resource)));
        if meter_provider.is_none() {
            tracing::warn!(
                "metrics were installed before telemetry: they are not exported over otlp"
            );
        }
        (Some(tracer_provider), meter_provider)
    } else {
        metrics_registry();
        (None, None)
    };

    let otel_layer = tracer_provider
        .as_ref()
        .map(|provider| tracing_opentelemetry::layer().with_tracer(provider.tracer(service_name)));
    tracing_subscriber::registry()
        .with(filter)
        .with(fmt_layer)
        .with(otel_layer)
        .try_init()
        .map_err(|error| TelemetryError::Subscriber(error.to_string()))?;

    if export {
        tracing::info!(
            service = service_name,
            "exporting traces and metrics over otlp"
        );
    }
    Ok(TelemetryHandle {
        tracer_provider,
        meter_provider,
    })
}

impl TelemetryHandle {
    /// Flushes and stops exporters; safe to call when export is off.
    pub fn shutdown(self) {
        if let Some(provider) = self.tracer_provider
            && let Err(error) = provider.shutdown()
        {
            eprintln!("engram: trace export shutdown failed: {error}");
        }
        if let Some(provider) = self.meter_provider
            && let Err(error) = provider.shutdown()
        {
            eprintln!("engram: metric export shutdown failed: {error}");
        }
    }
}

use tracing_subscriber::Layer as _;

/// The Prometheus registry the global meter provider reports into.
static METRICS: std::sync::OnceLock<prometheus::Registry> = std::sync::OnceLock::new();

/// Installs the global meter provider, reporting into the Prometheus registry (and to `otlp`,
/// when given). Only the first call installs; later ones return `None`.
fn install_meters(
    otlp: Option<(
        opentelemetry_sdk::metrics::periodic_reader_with_async_runtime::PeriodicReader<
            MetricExporter,
        >,
        Resource,
    )>,
) -> Option<SdkMeterProvider> {
    let mut installed = None;
    METRICS.get_or_init(|| {
        let registry = prometheus::Registry::new();
        let mut builder = SdkMeterProvider::builder();
        match opentelemetry_prometheus::exporter()
            .with_registry(registry.clone())
            .build()
        {
            Ok(exporter) => builder = builder.with_reader(exporter),
            Err(error) => eprintln!("engram: cannot build the prometheus exporter: {error}"),
        }
        if let Some((reader, resource)) = otlp {
            builder = builder.with_reader(reader).with_resource(resource);
        }
        let provider = builder.build();
        opentelemetry::global::set_meter_provider(provider.clone());
        installed = Some(provider);
        registry
    });
    installed
}

/// The registry behind [`render_metrics`]. The first call installs the global meter provider,
/// so call it (or [`init_telemetry`]) before creating instruments: an instrument made from the
/// no-op provider before it stays no-op.
pub fn metrics_registry() -> &'static prometheus::Registry {
    install_meters(None);
    METRICS.get().expect("installed above")
}

/// Every metric recorded in this process, in the Prometheus text format.
pub fn render_metrics() -> String {
    use prometheus::Encoder as _;
    let mut text = Vec::new();
    let encoder = prometheus::TextEncoder::new();
    if let Err(error) = encoder.encode(&metrics_registry().gather(), &mut text) {
        tracing::warn!(%error, "cannot encode the metrics");
    }
    String::from_utf8(text).unwrap_or_default()
}

/// Reads W3C trace context from HTTP/2 (gRPC) headers.
struct HeaderExtractor<'a>(&'a http::HeaderMap);

impl opentelemetry::propagation::Extractor for HeaderExtractor<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|value| value.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(|key| key.as_str()).collect()
    }
}

/// The span of one gRPC request, continuing the caller's trace when it sent a `traceparent`.
/// Pass it to tonic's `Server::trace_fn`.
pub fn grpc_request_span(request: &http::Request<()>) -> tracing::Span {
    use tracing_opentelemetry::OpenTelemetrySpanExt as _;
    let span = tracing::info_span!(
        "grpc.request",
        otel.kind = "server",
        rpc.system = "grpc",
        rpc.method = %request.uri().path(),
    );
    let parent = opentelemetry::global::get_text_map_propagator(|propagator| {
        propagator.extract(&HeaderExtractor(request.headers()))
    });
    // Without a remote parent this keeps the span a root; errors only mean no context was sent.
    let _ = span.set_parent(parent);
    span
}

#[cfg(test)]
mod tests {
    use opentelemetry::trace::TraceContextExt as _;
    use tracing_opentelemetry::OpenTelemetrySpanExt as _;

    use super::*;

    #[test]
    fn a_traceparent_header_becomes_the_parent_of_the_request_span() {
        opentelemetry::global::set_text_map_propagator(TraceContextPropagator::new());
        let provider = SdkTracerProvider::builder().build();
        let subscriber = tracing_subscriber::registry()
            .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("test")));
        tracing::subscriber::with_default(subscriber, || {
            let request = http::Request::builder()
                .uri("/engram.v1.IngestService/Remember")
                .header(
                    "traceparent",
                    "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
                )
                .body(())
                .unwrap();
            let span = grpc_request_span(&request);
            let context = span.context();
            let trace_id = context.span().span_context().trace_id();
            assert_eq!(trace_id.to_string(), "4bf92f3577b34da6a3ce929d0e0e4736");
        });
    }
}
