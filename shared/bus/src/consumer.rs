//! A consumer that stays connected: connects, declares every queue, consumes one queue and hands
//! each delivery to its handler (a few at a time when asked); reconnects with capped jittered
//! backoff when the broker goes away, and stops (after the deliveries in hand) when asked to.

use std::future::Future;
use std::time::Duration;

use backon::BackoffBuilder as _;
use engram_core::backoff::jittered_backoff;
use futures::StreamExt as _;
use futures::stream::FuturesUnordered;
use tokio::sync::watch;
use tracing::Instrument as _;
use tracing_opentelemetry::OpenTelemetrySpanExt as _;

use crate::{Bus, BusError, Deliveries, Delivery, QueueSpec, Topology, queues};

/// Where and how a consumer connects.
#[derive(Debug, Clone)]
pub struct ConsumerSettings {
    /// `amqp://…` (secret: never logged).
    pub url: String,
    pub topology_prefix: String,
    /// Unacknowledged messages it holds.
    pub prefetch: u16,
    /// Deliveries handled at once (at least 1; at most `prefetch` are ever in hand). Handlers
    /// that must keep an order among some messages serialize those themselves.
    pub concurrency: usize,
    /// Every queue's delayed-retry time (declared the same by every service).
    pub retry_delay: Duration,
    /// Longest wait between reconnection attempts.
    pub reconnect_max_backoff: Duration,
    /// The CAs an `amqps://` broker is verified with.
    pub tls: crate::BusTls,
}

/// Connects and declares every queue of the bus (so that whoever connects first leaves them
/// ready for the rest).
pub async fn connect(settings: &ConsumerSettings) -> Result<Bus, BusError> {
    let bus = Bus::connect_with_tls(
        &settings.url,
        Topology::new(settings.topology_prefix.clone()),
        &settings.tls,
    )
    .await?;
    bus.declare(&queues::all(settings.retry_delay)).await?;
    Ok(bus)
}

/// Connects and starts consuming `queue`, retrying with capped jittered backoff while the broker
/// is away; `None` once `stop` turns true first.
async fn connect_consuming(
    settings: &ConsumerSettings,
    queue: &QueueSpec,
    stop: &mut watch::Receiver<bool>,
) -> Option<(Bus, Deliveries)> {
    let mut delays =
        jittered_backoff(Duration::from_millis(100), settings.reconnect_max_backoff).build();
    loop {
        if *stop.borrow() {
            return None;
        }
        let consumed = async {
            let bus = connect(settings).await?;
            let deliveries = bus.consume(queue, settings.prefetch).await?;
            Ok::<_, BusError>((bus, deliveries))
        }
        .await;
        match consumed {
            Ok(connected) => return Some(connected),
            Err(error) => {
                let delay = delays.next().unwrap_or(settings.reconnect_max_backoff);
                tracing::warn!(%error, ?delay, queue = queue.name, "consumer cannot reach the broker; retrying");
                tokio::select! {
                    () = tokio::time::sleep(delay) => {}
                    _ = stop.changed() => return None,
                }
            }
        }
    }
}

/// Consumes `queue` until `stop` turns true, up to `settings.concurrency` deliveries at a time
/// (polled together in this task, so handlers may borrow): `handle` acks, retries or
/// dead-letters each (it returns an error only when the broker is gone, which reconnects once
/// the deliveries in hand are finished).
pub async fn consume_each<F, Fut>(
    settings: ConsumerSettings,
    queue: QueueSpec,
    mut stop: watch::Receiver<bool>,
    handle: F,
) where
    F: Fn(Delivery) -> Fut,
    Fut: Future<Output = Result<(), BusError>>,
{
    let concurrency = settings.concurrency.max(1);
    while let Some((bus, mut deliveries)) = connect_consuming(&settings, &queue, &mut stop).await {
        tracing::info!(queue = queue.name, concurrency, "consumer connected");
        let mut in_hand = FuturesUnordered::new();
        let stopped = loop {
            tokio::select! {
                // Finished deliveries first: they free room for the next ones.
                biased;
                Some(handled) = in_hand.next(), if !in_hand.is_empty() => {
                    if let Err(error) = handled {
                        tracing::warn!(%error, queue = queue.name, "consumer lost the broker; reconnecting");
                        break false;
                    }
                }
                _ = stop.changed() => break true,
                next = deliveries.next(), if in_hand.len() < concurrency => {
                    let Some(Ok(delivery)) = next else {
                        break false;
                    };
                    in_hand.push(handle(delivery));
                }
            }
        };
        // Deliveries in hand are finished even when stop arrives meanwhile (an unfinished one
        // would be redelivered; finishing it spares the repeat).
        while let Some(handled) = in_hand.next().await {
            if let Err(error) = handled {
                tracing::warn!(%error, queue = queue.name, "consumer lost the broker while finishing");
            }
        }
        bus.close().await;
        if stopped {
            break;
        }
    }
    tracing::info!(queue = queue.name, "consumer stopped");
}

/// How a batch consumer gathers deliveries: up to `max` of them, waiting at most `window` after
/// the first for the rest.
#[derive(Debug, Clone, Copy)]
pub struct Batching {
    pub max: usize,
    pub window: Duration,
}

/// Consumes `queue` until `stop` turns true, a batch at a time: `handle` gets the deliveries
/// gathered as `batching` says, in a `bus.batch` span continuing the first message's trace, and
/// acks, retries or dead-letters each (an error means the broker is gone: it reconnects). A batch
/// in hand is finished even when stop arrives meanwhile.
pub async fn consume_batches<F, Fut>(
    settings: ConsumerSettings,
    queue: QueueSpec,
    mut stop: watch::Receiver<bool>,
    batching: Batching,
    handle: F,
) where
    F: Fn(Vec<Delivery>) -> Fut,
    Fut: Future<Output = Result<(), BusError>>,
{
    let max = batching.max.max(1);
    while let Some((bus, mut deliveries)) = connect_consuming(&settings, &queue, &mut stop).await {
        tracing::info!(queue = queue.name, batch = max, "consumer connected");
        let stopped = loop {
            // Wait for the first delivery of a batch, or stop.
            let first = tokio::select! {
                next = deliveries.next() => next,
                _ = stop.changed() => break true,
            };
            let Some(Ok(first)) = first else { break false };
            let mut batch = vec![first];
            let window = tokio::time::sleep(batching.window);
            tokio::pin!(window);
            while batch.len() < max {
                tokio::select! {
                    next = deliveries.next() => match next {
                        Some(Ok(delivery)) => batch.push(delivery),
                        _ => break,
                    },
                    () = &mut window => break,
                }
            }
            // The batch continues the trace of its first message (the write -> outbox -> here).
            let span = tracing::info_span!(
                "bus.batch",
                otel.kind = "consumer",
                queue = %queue.name,
                messages = batch.len()
            );
            if let Some(first) = batch.first() {
                let _ = span.set_parent(first.trace_context());
            }
            if let Err(error) = handle(batch).instrument(span).await {
                tracing::warn!(%error, queue = queue.name, "consumer lost the broker; reconnecting");
                break false;
            }
        };
        bus.close().await;
        if stopped {
            break;
        }
    }
    tracing::info!(queue = queue.name, "consumer stopped");
}
