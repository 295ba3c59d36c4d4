//! A consumer that stays connected: connects, declares every queue, consumes one queue and hands
//! each delivery to its handler; reconnects with capped jittered backoff when the broker goes
//! away, and stops (after the delivery in hand) when asked to.

use std::future::Future;
use std::time::Duration;

use backon::BackoffBuilder as _;
use engram_core::backoff::jittered_backoff;
use tokio::sync::watch;

use crate::{Bus, BusError, Delivery, QueueSpec, Topology, queues};

/// Where and how a consumer connects.
#[derive(Debug, Clone)]
pub struct ConsumerSettings {
    /// `amqp://…` (secret: never logged).
    pub url: String,
    pub topology_prefix: String,
    /// Unacknowledged messages it holds.
    pub prefetch: u16,
    /// Every queue's delayed-retry time (declared the same by every service).
    pub retry_delay: Duration,
    /// Longest wait between reconnection attempts.
    pub reconnect_max_backoff: Duration,
}

/// Connects and declares every queue of the bus (so that whoever connects first leaves them
/// ready for the rest).
pub async fn connect(settings: &ConsumerSettings) -> Result<Bus, BusError> {
    let bus = Bus::connect(
        &settings.url,
        Topology::new(settings.topology_prefix.clone()),
    )
    .await?;
    bus.declare(&queues::all(settings.retry_delay)).await?;
    Ok(bus)
}

/// Consumes `queue` until `stop` turns true, one delivery at a time: `handle` acks, retries or
/// dead-letters each (it returns an error only when the broker is gone, which reconnects).
pub async fn consume_each<F, Fut>(
    settings: ConsumerSettings,
    queue: QueueSpec,
    mut stop: watch::Receiver<bool>,
    handle: F,
) where
    F: Fn(Delivery) -> Fut,
    Fut: Future<Output = Result<(), BusError>>,
{
    let backoff =
        || jittered_backoff(Duration::from_millis(100), settings.reconnect_max_backoff).build();
    let mut delays = backoff();
    loop {
        if *stop.borrow() {
            break;
        }
        let consumed = async {
            let bus = connect(&settings).await?;
            let deliveries = bus.consume(&queue, settings.prefetch).await?;
            Ok::<_, BusError>((bus, deliveries))
        }
        .await;
        let (bus, mut deliveries) = match consumed {
            Ok(connected) => connected,
            Err(error) => {
                let delay = delays.next().unwrap_or(settings.reconnect_max_backoff);
                tracing::warn!(%error, ?delay, queue = queue.name, "consumer cannot reach the broker; retrying");
                tokio::select! {
                    () = tokio::time::sleep(delay) => {}
                    _ = stop.changed() => break,
                }
                continue;
            }
        };
        delays = backoff();
        tracing::info!(queue = queue.name, "consumer connected");
        let stopped = loop {
            let next = tokio::select! {
                next = deliveries.next() => next,
                _ = stop.changed() => break true,
            };
            let Some(Ok(delivery)) = next else {
                break false;
            };
            // A delivery in hand is finished even when stop arrives meanwhile.
            if let Err(error) = handle(delivery).await {
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
