//! Engram's RabbitMQ bus.
//!
//! - [`Topology`] names and declares everything in one place: a durable topic exchange for Engram
//!   events, one durable quorum queue per consumer, a retry exchange whose per-queue delay queues
//!   hand messages back after a TTL, and a dead-letter exchange and queue. A test prefix keeps
//!   tests from touching each other's (or production's) names.
//! - [`Publisher`] publishes in confirm mode: a publish returns only once the broker confirmed it,
//!   and a nack is an error. Every message carries a message id, its protobuf type, a content type
//!   and the W3C trace context of the publishing span.
//! - [`Deliveries`] hands out messages; a handler acks after its own work committed, sends a
//!   message back for a delayed retry, or dead-letters it with the reason.

#![forbid(unsafe_code)]

pub mod consumer;
mod error;
mod publisher;
pub mod queues;
mod settings;
mod topology;

use std::collections::HashMap;

pub use error::BusError;
use futures::StreamExt as _;
use lapin::options::{BasicAckOptions, BasicConsumeOptions, BasicQosOptions};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{Channel, Connection, ConnectionProperties};
pub use publisher::{OutgoingEvent, Publisher, current_trace_headers};
pub use settings::BusSettings;
pub use topology::{QueueSpec, Topology};

/// Header counting how many times a message was sent back for a retry.
pub const ATTEMPTS_HEADER: &str = "x-engram-attempts";
/// Header counting how many times in a row a message was sent back after a transient failure
/// (the database or a dependency unreachable), which uses up no attempt.
pub const TRANSIENT_RETRIES_HEADER: &str = "x-engram-transient-retries";
/// Header holding when (milliseconds since the Unix epoch) the transient failures in a row began.
pub const TRANSIENT_SINCE_HEADER: &str = "x-engram-transient-since";
/// How long a message may keep failing transiently before it is dead-lettered all the same. An
/// outage that long is an incident; the bound keeps a message that fails "transiently" every
/// time (one that crashes a database backend, say) from cycling for ever.
pub const TRANSIENT_RETRY_WINDOW: std::time::Duration = std::time::Duration::from_secs(3_600);
/// Header holding why a message was dead-lettered.
pub const FAILURE_REASON_HEADER: &str = "x-engram-failure-reason";
/// Content type of every Engram event (the type name is in the `type` property).
pub const CONTENT_TYPE: &str = "application/x-protobuf";

/// A connection to the broker with its topology.
pub struct Bus {
    connection: Connection,
    topology: Topology,
}

/// Which CAs to trust for an `amqps://` broker: the web PKI roots, or the PEM bundle in
/// `ca_file` (a private CA).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BusTls {
    pub ca_file: Option<std::path::PathBuf>,
}

impl Bus {
    pub async fn connect(url: &str, topology: Topology) -> Result<Self, BusError> {
        Self::connect_with_tls(url, topology, &BusTls::default()).await
    }

    /// Connects trusting `tls`'s CAs when the URL is `amqps://` (the file is read at each
    /// connection, so a rotated bundle is used from the next reconnect on).
    pub async fn connect_with_tls(
        url: &str,
        topology: Topology,
        tls: &BusTls,
    ) -> Result<Self, BusError> {
        let mut config = lapin::tcp::OwnedTLSConfig::default();
        if let Some(path) = &tls.ca_file {
            let bundle = std::fs::read_to_string(path).map_err(|error| BusError::Ca {
                path: path.display().to_string(),
                reason: error.to_string(),
            })?;
            // A bundle without a certificate would quietly leave the web PKI roots in charge.
            if !bundle.contains("-----BEGIN CERTIFICATE-----") {
                return Err(BusError::Ca {
                    path: path.display().to_string(),
                    reason: "it holds no PEM certificate".into(),
                });
            }
            config.cert_chain = Some(bundle);
        }
        let connection = Connection::connect_with_config(
            url,
            ConnectionProperties::default(),
            config,
            lapin::runtime::default_runtime()?,
        )
        .await?;
        Ok(Self {
            connection,
            topology,
        })
    }

    pub fn topology(&self) -> &Topology {
        &self.topology
    }

    /// Declares the exchanges and the given consumers' queues (idempotent).
    pub async fn declare(&self, queues: &[QueueSpec]) -> Result<(), BusError> {
        let channel = self.connection.create_channel().await?;
        self.topology.declare(&channel, queues).await?;
        let _ = channel.close(200, "topology declared".into()).await;
        Ok(())
    }

    pub async fn publisher(&self) -> Result<Publisher, BusError> {
        Publisher::new(
            self.connection.create_channel().await?,
            self.topology.clone(),
        )
        .await
    }

    /// Starts consuming a queue with at most `prefetch` unacknowledged messages.
    pub async fn consume(&self, queue: &QueueSpec, prefetch: u16) -> Result<Deliveries, BusError> {
        // The queue's alerting series exist from the start (see engram.bus.dead_letters).
        bus_instruments().dead_letters.add(0, &queue_label(queue));
        let channel = self.connection.create_channel().await?;
        channel
            .basic_qos(prefetch, BasicQosOptions::default())
            .await?;
        // Retries and dead-letters are re-published from this channel: confirm them too.
        channel
            .confirm_select(lapin::options::ConfirmSelectOptions::default())
            .await?;
        let consumer = channel
            .basic_consume(
                self.topology.queue(queue.name).into(),
                "".into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await?;
        Ok(Deliveries {
            consumer,
            channel,
            topology: self.topology.clone(),
            queue: queue.clone(),
        })
    }

    pub async fn close(self) {
        let _ = self.connection.close(200, "bye".into()).await;
    }
}

/// Messages of one queue.
pub struct Deliveries {
    consumer: lapin::Consumer,
    channel: Channel,
    topology: Topology,
    queue: QueueSpec,
}

/// One message, with what its handler may do with it.
pub struct Delivery {
    inner: lapin::message::Delivery,
    channel: Channel,
    topology: Topology,
    queue: QueueSpec,
}

/// Deliveries, retries and dead-letters per queue (`engram.bus.*`).
struct BusInstruments {
    deliveries: opentelemetry::metrics::Counter<u64>,
    retries: opentelemetry::metrics::Counter<u64>,
    dead_letters: opentelemetry::metrics::Counter<u64>,
}

fn bus_instruments() -> &'static BusInstruments {
    static INSTRUMENTS: std::sync::OnceLock<BusInstruments> = std::sync::OnceLock::new();
    INSTRUMENTS.get_or_init(|| {
        let meter = opentelemetry::global::meter("engram-bus");
        BusInstruments {
            deliveries: meter
                .u64_counter("engram.bus.deliveries")
                .with_description("messages delivered to a consumer, by queue")
                .build(),
            retries: meter
                .u64_counter("engram.bus.retries")
                .with_description("messages sent back for a delayed retry, by queue")
                .build(),
            dead_letters: meter
                .u64_counter("engram.bus.dead_letters")
                .with_description("messages moved to the dead-letter queue, by queue")
                .build(),
        }
    })
}

fn queue_label(queue: &QueueSpec) -> [opentelemetry::KeyValue; 1] {
    [opentelemetry::KeyValue::new("queue", queue.name)]
}

impl Deliveries {
    /// The next message; `None` when the consumer was cancelled or the channel closed.
    pub async fn next(&mut self) -> Option<Result<Delivery, BusError>> {
        let next = self.consumer.next().await?;
        if next.is_ok() {
            bus_instruments()
                .deliveries
                .add(1, &queue_label(&self.queue));
        }
        Some(next.map_err(BusError::from).map(|inner| Delivery {
            inner,
            channel: self.channel.clone(),
            topology: self.topology.clone(),
            queue: self.queue.clone(),
        }))
    }
}

fn header_string(headers: &FieldTable, name: &str) -> Option<String> {
    match headers.inner().get(name)? {
        AMQPValue::LongString(value) => {
            Some(String::from_utf8_lossy(value.as_bytes()).into_owned())
        }
        AMQPValue::ShortString(value) => Some(value.as_str().to_owned()),
        _ => None,
    }
}

impl Delivery {
    pub fn payload(&self) -> &[u8] {
        &self.inner.data
    }

    pub fn message_id(&self) -> Option<&str> {
        self.inner
            .properties
            .message_id()
            .as_ref()
            .map(|id| id.as_str())
    }

    /// The protobuf type the payload claims to be.
    pub fn type_name(&self) -> Option<&str> {
        self.inner
            .properties
            .kind()
            .as_ref()
            .map(|kind| kind.as_str())
    }

    pub fn content_type(&self) -> Option<&str> {
        self.inner
            .properties
            .content_type()
            .as_ref()
            .map(|kind| kind.as_str())
    }

    /// How many times this message was already retried (transient failures not counted).
    pub fn attempts(&self) -> u32 {
        self.counter(ATTEMPTS_HEADER)
    }

    /// How many times this message was already sent back after a transient failure.
    pub fn transient_retries(&self) -> u32 {
        self.counter(TRANSIENT_RETRIES_HEADER)
    }

    fn counter(&self, header: &str) -> u32 {
        self.number(header)
            .and_then(|value| u32::try_from(value).ok())
            .unwrap_or(0)
    }

    /// A header holding a number (written by us as an integer; a string of digits is read too).
    fn number(&self, header: &str) -> Option<u64> {
        let headers = self.inner.properties.headers().clone().unwrap_or_default();
        match headers.inner().get(header)? {
            AMQPValue::LongUInt(value) => Some(u64::from(*value)),
            AMQPValue::LongLongInt(value) => u64::try_from(*value).ok(),
            AMQPValue::LongString(value) => String::from_utf8_lossy(value.as_bytes()).parse().ok(),
            _ => None,
        }
    }

    pub fn header(&self, name: &str) -> Option<String> {
        header_string(self.inner.properties.headers().as_ref()?, name)
    }

    /// The W3C trace context the publisher sent, to continue its trace.
    pub fn trace_context(&self) -> opentelemetry::Context {
        let headers: HashMap<String, String> = ["traceparent", "tracestate"]
            .into_iter()
            .filter_map(|name| self.header(name).map(|value| (name.to_owned(), value)))
            .collect();
        opentelemetry::global::get_text_map_propagator(|propagator| propagator.extract(&headers))
    }

    /// The work is done and committed.
    pub async fn ack(self) -> Result<(), BusError> {
        self.inner.acker.ack(BasicAckOptions::default()).await?;
        Ok(())
    }

    /// Sends the message to this queue's delay queue; it comes back after the queue's retry delay
    /// with its attempt count raised. The original is acked once the copy is confirmed.
    pub async fn retry_later(self) -> Result<(), BusError> {
        let attempts = self.attempts() + 1;
        // A failure that is not transient ends a run of transient ones.
        self.send_back(
            &[(ATTEMPTS_HEADER, AMQPValue::LongUInt(attempts))],
            &[TRANSIENT_RETRIES_HEADER, TRANSIENT_SINCE_HEADER],
        )
        .await
    }

    /// Sends the message back like [`Self::retry_later`], with the headers `set` and without
    /// those in `remove`.
    async fn send_back(self, set: &[(&str, AMQPValue)], remove: &[&str]) -> Result<(), BusError> {
        let mut headers = FieldTable::default();
        let received = self.inner.properties.headers().clone().unwrap_or_default();
        for (name, value) in received.inner() {
            if !remove.contains(&name.as_str()) {
                headers.insert(name.clone(), value.clone());
            }
        }
        for (name, value) in set {
            headers.insert((*name).into(), value.clone());
        }
        let properties = self.inner.properties.clone().with_headers(headers);
        publisher::publish_confirmed(
            &self.channel,
            &self.topology.retry_exchange(),
            &self.topology.queue(self.queue.name),
            &self.inner.data,
            properties,
        )
        .await?;
        bus_instruments().retries.add(1, &queue_label(&self.queue));
        self.ack().await
    }

    /// Settles a message whose handling failed: back later while it has attempts left (of
    /// `max_attempts` deliveries in all), else to the dead-letter queue with the reason. A
    /// `transient` failure (the database or a dependency unreachable: nothing wrong with the
    /// message) uses up no attempt: the message comes back after the retry delay for as long as
    /// the outage lasts, up to [`TRANSIENT_RETRY_WINDOW`]. Returns whether it was dead-lettered.
    pub async fn fail(
        self,
        reason: &str,
        transient: bool,
        max_attempts: u32,
    ) -> Result<bool, BusError> {
        if transient {
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default()
                .as_millis() as u64;
            let since = self.number(TRANSIENT_SINCE_HEADER).unwrap_or(now);
            let retries = self.transient_retries() + 1;
            let failing_for = std::time::Duration::from_millis(now.saturating_sub(since));
            if failing_for > TRANSIENT_RETRY_WINDOW {
                self.dead_letter(&format!(
                    "gave up after {} s of transient failures ({retries} in a row): {reason}",
                    failing_for.as_secs()
                ))
                .await?;
                return Ok(true);
            }
            tracing::warn!(
                reason,
                queue = self.queue.name,
                retries,
                "handling failed for a transient reason; retrying later"
            );
            self.send_back(
                &[
                    (TRANSIENT_RETRIES_HEADER, AMQPValue::LongUInt(retries)),
                    (
                        TRANSIENT_SINCE_HEADER,
                        AMQPValue::LongLongInt(i64::try_from(since).unwrap_or(i64::MAX)),
                    ),
                ],
                &[],
            )
            .await?;
            return Ok(false);
        }
        if self.attempts() + 1 >= max_attempts {
            self.dead_letter(&format!("gave up after {max_attempts} attempts: {reason}"))
                .await?;
            Ok(true)
        } else {
            tracing::warn!(
                reason,
                queue = self.queue.name,
                "handling failed; retrying later"
            );
            self.retry_later().await?;
            Ok(false)
        }
    }

    /// Moves the message to the dead-letter queue with the reason, so that it never blocks the
    /// queue again. The original is acked once the copy is confirmed.
    pub async fn dead_letter(self, reason: &str) -> Result<(), BusError> {
        let mut headers = self.inner.properties.headers().clone().unwrap_or_default();
        headers.insert(
            FAILURE_REASON_HEADER.into(),
            AMQPValue::LongString(reason.into()),
        );
        headers.insert(
            "x-engram-queue".into(),
            AMQPValue::LongString(self.topology.queue(self.queue.name).into()),
        );
        let properties = self.inner.properties.clone().with_headers(headers);
        publisher::publish_confirmed(
            &self.channel,
            &self.topology.dead_letter_exchange(),
            &self.topology.queue(self.queue.name),
            &self.inner.data,
            properties,
        )
        .await?;
        tracing::warn!(queue = self.queue.name, reason, "message dead-lettered");
        bus_instruments()
            .dead_letters
            .add(1, &queue_label(&self.queue));
        self.ack().await
    }
}
