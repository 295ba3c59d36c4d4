//! One trace from the gRPC call through the outbox and RabbitMQ to the work it asked for: the
//! request's span, the relay's publish, the consumer's batch and the embedding write (for a
//! Remember), or the segmentation (for AppendMessages), share one trace id. Spans are collected
//! in memory by the same tracing-opentelemetry layer the services export with.

use std::time::Duration;

use engram_e2e::{Sandbox, SandboxOptions, TestBus, TestEmbedder};
use opentelemetry::trace::{TraceId, TracerProvider as _};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider, SpanData};
use tracing_subscriber::layer::SubscriberExt as _;

use crate::bus::wait_for;
use crate::conversations::{Chat, assistant, user};
use crate::helpers::{new_scope, remember};

/// Installs an in-memory trace pipeline for this test process (nextest runs each test in a
/// process of its own).
fn collect_spans() -> (SdkTracerProvider, InMemorySpanExporter) {
    opentelemetry::global::set_text_map_propagator(TraceContextPropagator::new());
    let exporter = InMemorySpanExporter::default();
    let provider = SdkTracerProvider::builder()
        .with_simple_exporter(exporter.clone())
        .build();
    let subscriber = tracing_subscriber::registry()
        .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("engram-test")));
    tracing::subscriber::set_global_default(subscriber).expect("the only subscriber");
    (provider, exporter)
}

fn attribute(span: &SpanData, key: &str) -> Option<String> {
    span.attributes
        .iter()
        .find(|attribute| attribute.key.as_str() == key)
        .map(|attribute| attribute.value.to_string())
}

/// The trace of the gRPC request to `method`, and every span of it.
fn trace_of(spans: &[SpanData], method: &str) -> (TraceId, Vec<SpanData>) {
    let request = spans
        .iter()
        .find(|span| {
            span.name == "grpc.request"
                && attribute(span, "rpc.method").is_some_and(|path| path.ends_with(method))
        })
        .unwrap_or_else(|| panic!("no span of the {method} request"));
    let trace = request.span_context.trace_id();
    let members = spans
        .iter()
        .filter(|span| span.span_context.trace_id() == trace)
        .cloned()
        .collect();
    (trace, members)
}

fn names(spans: &[SpanData]) -> Vec<String> {
    spans.iter().map(|span| span.name.to_string()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_trace_follows_a_write_through_the_outbox_and_the_bus() {
    let (provider, exporter) = collect_spans();
    let bus = TestBus::local();
    let mut sandbox = Sandbox::start_with(SandboxOptions {
        embedder: TestEmbedder::Local,
        bus: Some(bus.clone()),
        ..Default::default()
    })
    .await;

    // A Remember: the request, its outbox event's publish, the embedding consumer's batch and
    // the embedding write.
    let scope = new_scope("work");
    sandbox
        .ingest
        .remember(remember(
            &scope,
            "The quarterly review is on Thursday at ten",
        ))
        .await
        .unwrap();
    wait_for("the embedding", Duration::from_secs(30), async || {
        sqlx::query_scalar::<_, i64>("SELECT count(*) FROM memories WHERE needs_embedding")
            .fetch_one(&sandbox.pool)
            .await
            .unwrap()
            == 0
    })
    .await;

    // AppendMessages: the request, its SegmentationRequested's publish, the segmentation
    // consumer's batch.
    let chat = Chat::new("travel");
    let start = chrono::Utc::now() - chrono::Duration::minutes(10);
    chat.append(
        &mut sandbox,
        vec![
            user(
                "I want to visit Kyoto in April for the cherry blossoms.",
                start,
            ),
            assistant("April is the best time; shall I look at ryokans?", start),
        ],
    )
    .await;
    chat.close(&mut sandbox).await;
    chat.wait_for_episodes(&mut sandbox, 1).await;

    // A span is exported when its work is done: the consumers' batches end after the episode
    // and the embedding are committed (consolidation, acks), and the model runs at a lower
    // priority than the tests beside it, so wait for the last spans rather than a fixed time.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let spans = loop {
        provider.force_flush().unwrap();
        let spans = exporter.get_finished_spans().unwrap();
        let segmentation_batch_ended = spans.iter().any(|span| {
            span.name == "bus.batch"
                && attribute(span, "queue").is_some_and(|queue| queue.contains("segmentation"))
        });
        let embedding_written = spans.iter().any(|span| span.name == "embedding.write");
        if (segmentation_batch_ended && embedding_written) || std::time::Instant::now() > deadline {
            break spans;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };

    let (_, remember_trace) = trace_of(&spans, "/Remember");
    let in_remember = names(&remember_trace);
    for expected in [
        "grpc.request",
        "outbox.publish",
        "bus.batch",
        "embedding.write",
    ] {
        assert!(
            in_remember.iter().any(|name| name == expected),
            "{expected} is not in the Remember's trace: {in_remember:?}"
        );
    }
    let publish = remember_trace
        .iter()
        .find(|span| span.name == "outbox.publish")
        .unwrap();
    assert!(
        attribute(publish, "routing_key").is_some_and(|key| key.contains("embedding")),
        "{publish:?}"
    );

    let (_, append_trace) = trace_of(&spans, "/AppendMessages");
    let batches: Vec<String> = append_trace
        .iter()
        .filter(|span| span.name == "bus.batch")
        .filter_map(|span| attribute(span, "queue"))
        .collect();
    assert!(
        names(&append_trace)
            .iter()
            .any(|name| name == "outbox.publish"),
        "{:?}",
        names(&append_trace)
    );
    assert!(
        batches.iter().any(|queue| queue.contains("segmentation")),
        "the segmentation consumer's batch is in the AppendMessages' trace: {batches:?}"
    );

    drop(sandbox);
    crate::helpers::delete_topology(&bus).await;
}
