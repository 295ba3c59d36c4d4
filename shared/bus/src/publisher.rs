//! Publishing with publisher confirms.

use std::collections::HashMap;

use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Channel};
use tracing_opentelemetry::OpenTelemetrySpanExt as _;
use uuid::Uuid;

use crate::{BusError, CONTENT_TYPE, Topology};

/// An event ready to publish: a protobuf payload and what identifies it.
#[derive(Debug, Clone)]
pub struct OutgoingEvent {
    pub routing_key: String,
    /// Consumers use it to recognise a message they already handled.
    pub message_id: Uuid,
    /// Fully qualified protobuf type, e.g. `engram.v1.EmbeddingRequested`.
    pub type_name: String,
    pub payload: Vec<u8>,
    /// W3C trace context to send; the current span's when empty.
    pub trace_headers: HashMap<String, String>,
}

/// Publishes to the events exchange in confirm mode.
pub struct Publisher {
    channel: Channel,
    topology: Topology,
}

impl Publisher {
    pub(crate) async fn new(channel: Channel, topology: Topology) -> Result<Self, BusError> {
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await?;
        Ok(Self { channel, topology })
    }

    /// Returns once the broker confirmed the message (persistent, routed to the events exchange).
    pub async fn publish(&self, event: &OutgoingEvent) -> Result<(), BusError> {
        match self.publish_all(std::slice::from_ref(event)).await {
            (_, Some(error)) => Err(error),
            (_, None) => Ok(()),
        }
    }

    /// Publishes a batch with the confirms pipelined (all sent, then all awaited) and returns how
    /// many leading events the broker confirmed, with the error that stopped the rest if any.
    /// Only the confirmed prefix may be considered published.
    pub async fn publish_all(&self, events: &[OutgoingEvent]) -> (usize, Option<BusError>) {
        let mut pending = Vec::with_capacity(events.len());
        for event in events {
            let sent = self
                .channel
                .basic_publish(
                    self.topology.events_exchange().into(),
                    event.routing_key.clone().into(),
                    BasicPublishOptions::default(),
                    &event.payload,
                    properties_of(event),
                )
                .await;
            match sent {
                Ok(confirm) => pending.push(confirm),
                Err(error) => return (confirmed_prefix(pending).await, Some(error.into())),
            }
        }
        let total = pending.len();
        let confirmed = confirmed_prefix(pending).await;
        if confirmed == total {
            (confirmed, None)
        } else {
            (confirmed, Some(BusError::Nacked))
        }
    }
}

/// How many of the leading confirms were acks.
async fn confirmed_prefix(pending: Vec<lapin::PublisherConfirm>) -> usize {
    let mut confirmed = 0;
    for confirm in pending {
        match confirm.await {
            Ok(confirmation) if !confirmation.is_nack() => confirmed += 1,
            _ => break,
        }
    }
    confirmed
}

/// Message id, protobuf type, content type, persistence and trace context of an event.
fn properties_of(event: &OutgoingEvent) -> BasicProperties {
    let trace_headers = if event.trace_headers.is_empty() {
        current_trace_headers()
    } else {
        event.trace_headers.clone()
    };
    let mut headers = FieldTable::default();
    for (name, value) in trace_headers {
        headers.insert(name.into(), AMQPValue::LongString(value.into()));
    }
    BasicProperties::default()
        .with_message_id(event.message_id.to_string().into())
        .with_type(event.type_name.clone().into())
        .with_content_type(CONTENT_TYPE.into())
        .with_delivery_mode(2)
        .with_headers(headers)
}

/// The W3C trace context (`traceparent`, `tracestate`) of the current span, to send with a message
/// or store beside an outbox event.
pub fn current_trace_headers() -> HashMap<String, String> {
    let mut headers = HashMap::new();
    let context = tracing::Span::current().context();
    opentelemetry::global::get_text_map_propagator(|propagator| {
        propagator.inject_context(&context, &mut headers)
    });
    headers
}

/// Publishes on a confirm-mode channel and waits for the broker's answer; a nack is an error.
pub(crate) async fn publish_confirmed(
    channel: &Channel,
    exchange: &str,
    routing_key: &str,
    payload: &[u8],
    properties: BasicProperties,
) -> Result<(), BusError> {
    let confirmation = channel
        .basic_publish(
            exchange.into(),
            routing_key.into(),
            BasicPublishOptions::default(),
            payload,
            properties,
        )
        .await?
        .await?;
    if confirmation.is_nack() {
        Err(BusError::Nacked)
    } else {
        Ok(())
    }
}
