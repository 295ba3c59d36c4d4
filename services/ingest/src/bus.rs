//! The ingest service on the bus: the outbox relay publishes the events the write path stored,
//! and the embedding consumer embeds the entries those events name. Both reconnect on their own
//! with jittered backoff, so the broker can come and go; nothing the write path does waits for it.

use std::sync::Arc;
use std::time::Duration;

use backon::BackoffBuilder as _;
use engram_bus::{Bus, BusError, Delivery, OutgoingEvent};
use engram_core::backoff::jittered_backoff;
use engram_proto::v1;
use engram_server::status::ServiceError as _;
use engram_store::embeddings::{self, EntryKey};
use engram_store::{StoreError, outbox};
use prost::Message as _;
use sqlx::PgPool;
use tokio::sync::{Notify, watch};
use tracing_opentelemetry::OpenTelemetrySpanExt as _;
use uuid::Uuid;

use engram_core::{ConversationId, Scope};

use crate::backfill::EmbeddingBackfill;
use crate::config::AmqpSettings;
use crate::conversations::segmentation::Segmenter;
use engram_bus::queues::{self, routes};

fn consumer_settings(settings: &AmqpSettings) -> engram_bus::consumer::ConsumerSettings {
    // Embedding and segmentation gather their own batches (consume_batches).
    settings.bus.consumer(1)
}

fn reconnect_backoff(settings: &AmqpSettings) -> impl Iterator<Item = Duration> {
    jittered_backoff(
        Duration::from_millis(100),
        settings.bus.reconnect_max_backoff(),
    )
    .build()
}

/// Waits `delay` unless asked to stop first; returns whether to stop.
async fn sleep_or_stop(delay: Duration, stop: &mut watch::Receiver<bool>) -> bool {
    tokio::select! {
        () = tokio::time::sleep(delay) => *stop.borrow(),
        _ = stop.changed() => true,
    }
}

/// Connects and declares every consumer queue, so that what the relay publishes always has a
/// queue to wait in.
async fn connect(settings: &AmqpSettings) -> Result<Bus, BusError> {
    engram_bus::consumer::connect(&consumer_settings(settings)).await
}

/// Publishes outbox events with publisher confirms and marks them published.
pub struct OutboxRelay {
    pub pool: PgPool,
    pub settings: AmqpSettings,
    pub wake: Arc<Notify>,
}

/// How often the outbox backlog is measured.
const OUTBOX_WATCH_INTERVAL: Duration = Duration::from_secs(5);

/// Measures the outbox backlog every few seconds (`engram.outbox.backlog`, the events not yet
/// published, and `engram.outbox.oldest_pending_age`): it grows while the broker is away, when
/// the relay itself cannot say so.
pub async fn watch_outbox_backlog(pool: PgPool) {
    let meter = opentelemetry::global::meter("engram-ingest");
    let backlog = meter
        .u64_gauge("engram.outbox.backlog")
        .with_description("events written but not yet published to the broker")
        .build();
    let oldest = meter
        .f64_gauge("engram.outbox.oldest_pending_age")
        .with_unit("s")
        .with_description("age of the oldest event not yet published (0 when none)")
        .build();
    let mut ticks = tokio::time::interval(OUTBOX_WATCH_INTERVAL);
    loop {
        ticks.tick().await;
        match outbox::backlog(&pool).await {
            Ok((pending, first)) => {
                backlog.record(u64::try_from(pending).unwrap_or(0), &[]);
                let age = first.map_or(0.0, |first| {
                    (chrono::Utc::now() - first).num_milliseconds().max(0) as f64 / 1000.0
                });
                oldest.record(age, &[]);
            }
            Err(error) => tracing::debug!(%error, "cannot measure the outbox backlog"),
        }
    }
}

impl OutboxRelay {
    pub async fn run(self, mut stop: watch::Receiver<bool>) {
        let mut delays = reconnect_backoff(&self.settings);
        'connection: loop {
            if *stop.borrow() {
                break;
            }
            let bus = match connect(&self.settings).await {
                Ok(bus) => bus,
                Err(error) => {
                    let delay = delays.next().unwrap_or(Duration::from_secs(10));
                    tracing::warn!(%error, ?delay, "outbox relay cannot reach the broker; events wait in the outbox");
                    if sleep_or_stop(delay, &mut stop).await {
                        break;
                    }
                    continue;
                }
            };
            let publisher = match bus.publisher().await {
                Ok(publisher) => publisher,
                Err(error) => {
                    tracing::warn!(%error, "cannot open a publisher channel");
                    continue;
                }
            };
            delays = reconnect_backoff(&self.settings);
            tracing::info!("outbox relay connected");
            loop {
                match self.publish_round(&publisher).await {
                    Ok(published) if published as i64 == self.settings.relay_batch => continue,
                    Ok(_) => {}
                    Err(RelayError::Bus(error)) => {
                        tracing::warn!(%error, "outbox relay lost the broker; reconnecting");
                        bus.close().await;
                        continue 'connection;
                    }
                    Err(RelayError::Store(error)) => {
                        // The broker is fine: keep its connection and try the round again. What
                        // was not marked published goes out again (at least once).
                        tracing::warn!(%error, "outbox relay cannot read or mark the outbox; retrying");
                        let pause = Duration::from_millis(self.settings.relay_poll_ms);
                        if sleep_or_stop(pause, &mut stop).await {
                            bus.close().await;
                            break 'connection;
                        }
                        continue;
                    }
                }
                tokio::select! {
                    () = self.wake.notified() => {}
                    () = tokio::time::sleep(Duration::from_millis(self.settings.relay_poll_ms)) => {}
                    _ = stop.changed() => {
                        // One last round so that what is committed goes out before we stop.
                        let _ = self.publish_round(&publisher).await;
                        bus.close().await;
                        break 'connection;
                    }
                }
            }
        }
        tracing::info!("outbox relay stopped");
    }

    /// Publishes one batch inside a transaction that holds the rows; only confirmed events are
    /// marked published, so a failure leaves the rest for the next round (at-least-once).
    async fn publish_round(&self, publisher: &engram_bus::Publisher) -> Result<usize, RelayError> {
        let mut transaction = engram_store::begin(&self.pool).await?;
        let events = outbox::lock_unpublished(&mut transaction, self.settings.relay_batch).await?;
        // Each event's publish is a span of the trace that wrote it (the headers stored with
        // the event), and the message carries that span on: write -> publish -> consumer.
        let spans: Vec<tracing::Span> = events
            .iter()
            .map(|event| {
                let span = tracing::info_span!(
                    "outbox.publish",
                    otel.kind = "producer",
                    routing_key = %event.routing_key,
                    message_id = %event.message_id,
                );
                let parent = opentelemetry::global::get_text_map_propagator(|propagator| {
                    propagator.extract(&event.trace_headers())
                });
                let _ = span.set_parent(parent);
                span
            })
            .collect();
        let outgoing: Vec<OutgoingEvent> = events
            .iter()
            .zip(&spans)
            .map(|(event, span)| OutgoingEvent {
                routing_key: event.routing_key.clone(),
                message_id: event.message_id,
                type_name: event.type_name.clone(),
                payload: event.payload.clone(),
                trace_headers: span.in_scope(engram_bus::current_trace_headers),
            })
            .collect();
        let (confirmed, error) = publisher.publish_all(&outgoing).await;
        drop(spans);
        let published: Vec<i64> = events
            .iter()
            .take(confirmed)
            .map(|event| event.id)
            .collect();
        let failure = error.map(|error| (events[confirmed].id, error));
        outbox::mark_published(&mut transaction, &published).await?;
        transaction.commit().await.map_err(StoreError::from)?;
        match failure {
            None => Ok(published.len()),
            Some((id, error)) => {
                let _ = outbox::record_publish_failure(&self.pool, id, &error.to_string()).await;
                Err(error.into())
            }
        }
    }
}

#[derive(Debug, thiserror::Error)]
enum RelayError {
    #[error(transparent)]
    Bus(#[from] BusError),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Embeds the entries named by EmbeddingRequested messages, in batches gathered by size and time
/// window; acks only after the embeddings are committed.
pub struct EmbeddingConsumer {
    pub backfill: EmbeddingBackfill,
    pub settings: AmqpSettings,
    pub batch_size: usize,
}

impl EmbeddingConsumer {
    pub async fn run(self, stop: watch::Receiver<bool>) {
        let settings = consumer_settings(&self.settings);
        let queue = queues::embedding_requested(self.settings.bus.retry_delay());
        let batching = engram_bus::consumer::Batching {
            max: self.batch_size,
            window: Duration::from_millis(self.settings.batch_window_ms),
        };
        engram_bus::consumer::consume_batches(settings, queue, stop, batching, |batch| {
            self.handle_batch(batch)
        })
        .await;
    }

    async fn handle_batch(&self, batch: Vec<Delivery>) -> Result<(), BusError> {
        let mut requests: Vec<(EntryKey, Delivery)> = Vec::with_capacity(batch.len());
        for delivery in batch {
            match decode(&delivery) {
                Ok(key) => requests.push((key, delivery)),
                Err(reason) => {
                    self.backfill.metrics().record_dead_lettered();
                    delivery.dead_letter(&reason).await?;
                }
            }
        }
        if requests.is_empty() {
            return Ok(());
        }
        let keys: Vec<EntryKey> = requests.iter().map(|(key, _)| *key).collect();
        let outcome = match embeddings::claim_by_keys(
            self.backfill.pool(),
            &keys,
            crate::backfill::CLAIM_LEASE,
        )
        .await
        {
            // Entries already embedded (or gone) need nothing: the same request twice is a no-op.
            Ok(pending) if pending.is_empty() => Ok(0),
            Ok(pending) => self.backfill.embed_batch(&pending).await,
            Err(error) => Err(error.into()),
        };
        match outcome {
            Ok(_) => {
                for (_, delivery) in requests {
                    delivery.ack().await?;
                }
            }
            Err(error) => {
                let reason = error.to_string();
                let transient = error.is_retryable();
                for (_, delivery) in requests {
                    if delivery
                        .fail(&reason, transient, self.settings.bus.max_attempts)
                        .await?
                    {
                        self.backfill.metrics().record_dead_lettered();
                    }
                }
            }
        }
        Ok(())
    }
}

/// The memory id of an EmbeddingRequested message, or why it is not one.
fn decode(delivery: &Delivery) -> Result<EntryKey, String> {
    if delivery.type_name() != Some(routes::EMBEDDING_REQUESTED_TYPE) {
        return Err(format!(
            "unexpected message type {:?}",
            delivery.type_name()
        ));
    }
    let event = v1::EmbeddingRequested::decode(delivery.payload())
        .map_err(|e| format!("malformed payload: {e}"))?;
    let id = Uuid::parse_str(&event.memory_id)
        .map_err(|_| format!("memory_id {:?} is not a UUID", event.memory_id))?;
    let scope = engram_server::convert::scope_from_proto(event.scope)
        .map_err(|e| format!("bad scope: {e}"))?;
    Ok(EntryKey {
        user_id: scope.user_id.as_uuid(),
        id,
    })
}

/// Segments conversations named by SegmentationRequested messages, a batch of them at a time
/// (the local model embeds a batch several times faster than single texts); acks each message
/// once its conversation's segmentation committed (or found nothing to do: the same request
/// twice is a no-op).
pub struct SegmentationConsumer {
    pub segmenter: Segmenter,
    pub settings: AmqpSettings,
}

impl SegmentationConsumer {
    pub async fn run(self, stop: watch::Receiver<bool>) {
        let settings = consumer_settings(&self.settings);
        let queue = queues::segmentation_requested(self.settings.bus.retry_delay());
        let batching = engram_bus::consumer::Batching {
            max: self.segmenter.settings.batch,
            window: Duration::from_millis(self.settings.batch_window_ms),
        };
        engram_bus::consumer::consume_batches(settings, queue, stop, batching, |batch| {
            self.handle_batch(batch)
        })
        .await;
    }

    async fn handle_batch(&self, batch: Vec<Delivery>) -> Result<(), BusError> {
        // Each distinct conversation once, with the deliveries that asked for it.
        let mut conversations: Vec<(Scope, ConversationId)> = Vec::new();
        let mut requests: Vec<(usize, Delivery)> = Vec::with_capacity(batch.len());
        for delivery in batch {
            match decode_segmentation(&delivery) {
                Ok(request) => {
                    let position = match conversations.iter().position(|c| *c == request) {
                        Some(position) => position,
                        None => {
                            conversations.push(request);
                            conversations.len() - 1
                        }
                    };
                    requests.push((position, delivery));
                }
                Err(reason) => delivery.dead_letter(&reason).await?,
            }
        }
        if conversations.is_empty() {
            return Ok(());
        }
        // Cleared before the tails are read: a turn committed from now on asks again.
        // Each outcome: done, or why not and whether the reason is transient.
        let outcomes: Vec<Result<(), (String, bool)>> =
            match engram_store::conversations::clear_segmentation_requests(
                &self.segmenter.pool,
                &conversations,
            )
            .await
            {
                Err(error) => {
                    vec![Err((error.to_string(), error.is_retryable())); conversations.len()]
                }
                Ok(()) => self
                    .segmenter
                    .segment_many(&conversations)
                    .await
                    .into_iter()
                    .map(|outcome| {
                        outcome
                            .map(drop)
                            .map_err(|error| (error.to_string(), error.is_retryable()))
                    })
                    .collect(),
            };
        for (position, delivery) in requests {
            match &outcomes[position] {
                Ok(()) => delivery.ack().await?,
                Err((reason, transient)) => {
                    delivery
                        .fail(reason, *transient, self.settings.bus.max_attempts)
                        .await?;
                }
            }
        }
        Ok(())
    }
}

/// The conversation a SegmentationRequested message names, or why it is not one.
fn decode_segmentation(delivery: &Delivery) -> Result<(Scope, ConversationId), String> {
    if delivery.type_name() != Some(routes::SEGMENTATION_REQUESTED_TYPE) {
        return Err(format!(
            "unexpected message type {:?}",
            delivery.type_name()
        ));
    }
    let event = v1::SegmentationRequested::decode(delivery.payload())
        .map_err(|e| format!("malformed payload: {e}"))?;
    let scope = engram_server::convert::scope_from_proto(event.scope)
        .map_err(|e| format!("bad scope: {e}"))?;
    let conversation = ConversationId::parse("conversation_id", &event.conversation_id)
        .map_err(|e| format!("bad conversation: {e}"))?;
    Ok((scope, conversation))
}
