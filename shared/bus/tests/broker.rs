//! The bus against a real RabbitMQ (`ENGRAM_AMQP__URL`, default the local broker of `make up`).
//! Each test declares its own topology under a unique prefix and deletes it afterwards.

use std::collections::HashMap;
use std::time::Duration;

use engram_bus::{Bus, FAILURE_REASON_HEADER, OutgoingEvent, QueueSpec, Topology};
use lapin::options::{ExchangeDeleteOptions, QueueDeleteOptions};
use uuid::Uuid;

fn amqp_url() -> String {
    std::env::var("ENGRAM_AMQP__URL")
        .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".into())
}

fn spec() -> QueueSpec {
    QueueSpec {
        name: "worker",
        bindings: vec!["memory.#"],
        retry_delay: Duration::from_millis(300),
    }
}

async fn connect() -> (Bus, Topology) {
    let topology = Topology::new(format!("test-{}", Uuid::new_v4().simple()));
    let bus = Bus::connect(&amqp_url(), topology.clone())
        .await
        .expect("RabbitMQ is up (make up)");
    bus.declare(&[spec()]).await.unwrap();
    (bus, topology)
}

async fn cleanup(topology: &Topology) {
    let connection = lapin::Connection::connect(&amqp_url(), Default::default())
        .await
        .unwrap();
    let channel = connection.create_channel().await.unwrap();
    for queue in [
        topology.queue("worker"),
        topology.delay_queue("worker"),
        topology.dead_letter_queue(),
    ] {
        let _ = channel
            .queue_delete(queue.into(), QueueDeleteOptions::default())
            .await;
    }
    for exchange in [
        topology.events_exchange(),
        topology.retry_exchange(),
        topology.dead_letter_exchange(),
    ] {
        let _ = channel
            .exchange_delete(exchange.into(), ExchangeDeleteOptions::default())
            .await;
    }
}

fn event(routing_key: &str, payload: &[u8]) -> OutgoingEvent {
    OutgoingEvent {
        routing_key: routing_key.into(),
        message_id: Uuid::new_v4(),
        type_name: "engram.v1.EmbeddingRequested".into(),
        payload: payload.to_vec(),
        trace_headers: HashMap::from([(
            "traceparent".to_owned(),
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".to_owned(),
        )]),
    }
}

/// The first message of the test's dead-letter queue, read directly (and taken off it).
async fn first_dead_letter(topology: &Topology) -> Option<lapin::message::BasicGetMessage> {
    let connection = lapin::Connection::connect(&amqp_url(), Default::default())
        .await
        .unwrap();
    let channel = connection.create_channel().await.unwrap();
    channel
        .basic_get(
            topology.dead_letter_queue().into(),
            lapin::options::BasicGetOptions { no_ack: true },
        )
        .await
        .unwrap()
}

async fn next(deliveries: &mut engram_bus::Deliveries) -> engram_bus::Delivery {
    tokio::time::timeout(Duration::from_secs(10), deliveries.next())
        .await
        .expect("a message arrives")
        .expect("consumer open")
        .expect("delivery")
}

#[tokio::test]
async fn published_events_reach_the_bound_queue_with_their_metadata() {
    let (bus, topology) = connect().await;
    // Declaring again changes nothing (every service declares at start).
    bus.declare(&[spec()]).await.unwrap();
    let publisher = bus.publisher().await.unwrap();
    let sent = event("memory.embedding.requested", b"payload-1");
    publisher.publish(&sent).await.unwrap();
    // A routing key nobody binds is confirmed too, and simply not delivered.
    publisher
        .publish(&event("conversation.segment.closed", b"elsewhere"))
        .await
        .unwrap();

    let mut deliveries = bus.consume(&spec(), 10).await.unwrap();
    let delivery = next(&mut deliveries).await;
    assert_eq!(delivery.payload(), b"payload-1");
    assert_eq!(
        delivery.message_id(),
        Some(sent.message_id.to_string().as_str())
    );
    assert_eq!(delivery.type_name(), Some("engram.v1.EmbeddingRequested"));
    assert_eq!(delivery.content_type(), Some(engram_bus::CONTENT_TYPE));
    assert_eq!(delivery.attempts(), 0);
    assert_eq!(
        delivery.header("traceparent").as_deref(),
        Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
    );
    delivery.ack().await.unwrap();
    assert!(
        tokio::time::timeout(Duration::from_millis(500), deliveries.next())
            .await
            .is_err(),
        "nothing else routed"
    );
    cleanup(&topology).await;
}

#[tokio::test]
async fn a_retried_message_comes_back_after_the_delay_with_its_attempt_count() {
    let (bus, topology) = connect().await;
    bus.publisher()
        .await
        .unwrap()
        .publish(&event("memory.embedding.requested", b"flaky"))
        .await
        .unwrap();
    let mut deliveries = bus.consume(&spec(), 10).await.unwrap();
    let first = next(&mut deliveries).await;
    let started = std::time::Instant::now();
    first.retry_later().await.unwrap();
    let second = next(&mut deliveries).await;
    assert!(
        started.elapsed() >= Duration::from_millis(250),
        "came back after {:?}",
        started.elapsed()
    );
    assert_eq!(second.payload(), b"flaky");
    assert_eq!(second.attempts(), 1);
    second.ack().await.unwrap();
    cleanup(&topology).await;
}

#[tokio::test]
async fn a_dead_lettered_message_keeps_its_reason_and_does_not_block_the_queue() {
    let (bus, topology) = connect().await;
    let publisher = bus.publisher().await.unwrap();
    publisher
        .publish(&event("memory.embedding.requested", b"poison"))
        .await
        .unwrap();
    publisher
        .publish(&event("memory.embedding.requested", b"healthy"))
        .await
        .unwrap();
    let mut deliveries = bus.consume(&spec(), 1).await.unwrap();
    let poison = next(&mut deliveries).await;
    assert_eq!(poison.payload(), b"poison");
    poison.dead_letter("cannot decode payload").await.unwrap();
    let healthy = next(&mut deliveries).await;
    assert_eq!(healthy.payload(), b"healthy");
    healthy.ack().await.unwrap();

    // Read the dead-letter queue directly.
    let message = first_dead_letter(&topology)
        .await
        .expect("the poison message is in the dead-letter queue");
    assert_eq!(message.delivery.data, b"poison");
    let headers = message.delivery.properties.headers().clone().unwrap();
    let reason = match headers
        .inner()
        .get(FAILURE_REASON_HEADER)
        .expect("reason header")
    {
        lapin::types::AMQPValue::LongString(value) => {
            String::from_utf8_lossy(value.as_bytes()).into_owned()
        }
        other => panic!("unexpected reason value {other:?}"),
    };
    assert_eq!(reason, "cannot decode payload");
    cleanup(&topology).await;
}

#[tokio::test]
async fn transient_failures_use_up_no_attempt_and_the_message_is_handled_after_the_outage() {
    let (bus, topology) = connect().await;
    bus.publisher()
        .await
        .unwrap()
        .publish(&event("memory.embedding.requested", b"during-an-outage"))
        .await
        .unwrap();
    let mut deliveries = bus.consume(&spec(), 10).await.unwrap();
    let max_attempts = 2;
    // An outage longer than the attempts allow: every delivery fails for a transient reason.
    for retried in 0..max_attempts + 2 {
        let delivery = next(&mut deliveries).await;
        assert_eq!(delivery.transient_retries(), retried);
        assert_eq!(
            delivery.attempts(),
            0,
            "a transient failure uses up no attempt"
        );
        let dead = delivery
            .fail("database unreachable: Connection reset", true, max_attempts)
            .await
            .unwrap();
        assert!(!dead, "retry {retried} was dead-lettered");
    }
    // The database is back: the message is handled.
    let after = next(&mut deliveries).await;
    assert_eq!(after.payload(), b"during-an-outage");
    // A failure that is not transient still counts, and dead-letters once attempts run out.
    assert!(!after.fail("bad row", false, max_attempts).await.unwrap());
    let last = next(&mut deliveries).await;
    assert_eq!(last.attempts(), 1);
    assert_eq!(
        last.transient_retries(),
        0,
        "the run of transient failures ended"
    );
    assert!(last.fail("bad row", false, max_attempts).await.unwrap());
    let dead = first_dead_letter(&topology)
        .await
        .expect("dead-lettered once its attempts ran out");
    assert_eq!(dead.delivery.data, b"during-an-outage");
    cleanup(&topology).await;
}

#[tokio::test]
async fn a_message_failing_transiently_for_longer_than_the_window_is_dead_lettered() {
    let (bus, topology) = connect().await;
    // Failing transiently since two hours ago (a message that crashes the database each time
    // looks like an outage that never ends).
    let since = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
        - 2 * 3_600 * 1_000;
    let mut looping = event("memory.embedding.requested", b"crashes-the-backend");
    looping.trace_headers.insert(
        engram_bus::TRANSIENT_SINCE_HEADER.to_owned(),
        since.to_string(),
    );
    bus.publisher()
        .await
        .unwrap()
        .publish(&looping)
        .await
        .unwrap();
    let mut deliveries = bus.consume(&spec(), 10).await.unwrap();
    let delivery = next(&mut deliveries).await;
    assert!(
        delivery
            .fail("database unreachable: Connection reset", true, 5)
            .await
            .unwrap(),
        "dead-lettered once the window is over"
    );
    let dead = first_dead_letter(&topology)
        .await
        .expect("in the dead-letter queue");
    assert_eq!(dead.delivery.data, b"crashes-the-backend");
    cleanup(&topology).await;
}
