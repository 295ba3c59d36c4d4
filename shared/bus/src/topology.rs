//! Every exchange and queue of the bus, named and declared in one place.

use std::time::Duration;

use lapin::options::{ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{Channel, ExchangeKind};

use crate::BusError;

/// A consumer's queue: its name, the routing keys it takes, and how long a retried message waits.
#[derive(Debug, Clone)]
pub struct QueueSpec {
    pub name: &'static str,
    pub bindings: Vec<&'static str>,
    pub retry_delay: Duration,
}

/// The names of the bus, under a prefix (`engram` in production; unique per test).
#[derive(Debug, Clone)]
pub struct Topology {
    prefix: String,
}

impl Topology {
    pub fn new(prefix: impl Into<String>) -> Self {
        Self {
            prefix: prefix.into(),
        }
    }

    pub fn production() -> Self {
        Self::new("engram")
    }

    /// Topic exchange every event is published to.
    pub fn events_exchange(&self) -> String {
        format!("{}.events", self.prefix)
    }

    /// Direct exchange routing retried messages to their queue's delay queue.
    pub fn retry_exchange(&self) -> String {
        format!("{}.retry", self.prefix)
    }

    pub fn dead_letter_exchange(&self) -> String {
        format!("{}.dead-letter", self.prefix)
    }

    pub fn dead_letter_queue(&self) -> String {
        format!("{}.dead-letter", self.prefix)
    }

    pub fn queue(&self, name: &str) -> String {
        format!("{}.{name}", self.prefix)
    }

    pub fn delay_queue(&self, name: &str) -> String {
        format!("{}.{name}.delay", self.prefix)
    }

    pub(crate) async fn declare(
        &self,
        channel: &Channel,
        queues: &[QueueSpec],
    ) -> Result<(), BusError> {
        let durable = ExchangeDeclareOptions {
            durable: true,
            ..ExchangeDeclareOptions::default()
        };
        channel
            .exchange_declare(
                self.events_exchange().into(),
                ExchangeKind::Topic,
                durable,
                FieldTable::default(),
            )
            .await?;
        channel
            .exchange_declare(
                self.retry_exchange().into(),
                ExchangeKind::Direct,
                durable,
                FieldTable::default(),
            )
            .await?;
        channel
            .exchange_declare(
                self.dead_letter_exchange().into(),
                ExchangeKind::Fanout,
                durable,
                FieldTable::default(),
            )
            .await?;
        declare_queue(channel, &self.dead_letter_queue(), quorum_arguments()).await?;
        channel
            .queue_bind(
                self.dead_letter_queue().into(),
                self.dead_letter_exchange().into(),
                "".into(),
                QueueBindOptions::default(),
                FieldTable::default(),
            )
            .await?;

        for spec in queues {
            let queue = self.queue(spec.name);
            // Messages the broker itself gives up on (rejected, over a limit) go to the
            // dead-letter exchange as well.
            let mut arguments = quorum_arguments();
            arguments.insert(
                "x-dead-letter-exchange".into(),
                AMQPValue::LongString(self.dead_letter_exchange().into()),
            );
            declare_queue(channel, &queue, arguments).await?;
            for key in &spec.bindings {
                channel
                    .queue_bind(
                        queue.clone().into(),
                        self.events_exchange().into(),
                        (*key).into(),
                        QueueBindOptions::default(),
                        FieldTable::default(),
                    )
                    .await?;
            }
            // The delay queue: nothing consumes it; after the TTL, messages are dead-lettered
            // straight back into the consumer's queue through the default exchange.
            let mut delay = FieldTable::default();
            delay.insert(
                "x-queue-type".into(),
                AMQPValue::LongString("quorum".into()),
            );
            delay.insert(
                "x-message-ttl".into(),
                AMQPValue::LongLongInt(
                    i64::try_from(spec.retry_delay.as_millis()).unwrap_or(i64::MAX),
                ),
            );
            delay.insert(
                "x-dead-letter-exchange".into(),
                AMQPValue::LongString("".into()),
            );
            delay.insert(
                "x-dead-letter-routing-key".into(),
                AMQPValue::LongString(queue.clone().into()),
            );
            declare_queue(channel, &self.delay_queue(spec.name), delay).await?;
            channel
                .queue_bind(
                    self.delay_queue(spec.name).into(),
                    self.retry_exchange().into(),
                    queue.clone().into(),
                    QueueBindOptions::default(),
                    FieldTable::default(),
                )
                .await?;
        }
        Ok(())
    }
}

fn quorum_arguments() -> FieldTable {
    let mut arguments = FieldTable::default();
    arguments.insert(
        "x-queue-type".into(),
        AMQPValue::LongString("quorum".into()),
    );
    arguments
}

async fn declare_queue(
    channel: &Channel,
    name: &str,
    arguments: FieldTable,
) -> Result<(), BusError> {
    let options = QueueDeclareOptions {
        durable: true,
        ..QueueDeclareOptions::default()
    };
    channel
        .queue_declare(name.into(), options, arguments)
        .await?;
    Ok(())
}
