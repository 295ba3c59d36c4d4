//! The outbox, the relay and the embedding consumer against the real RabbitMQ: new entries are
//! announced in their writing transaction and embedded by the consumer; a malformed message is
//! dead-lettered without blocking the queue; a broker outage neither slows writes nor loses or
//! duplicates work.

use std::time::{Duration, Instant};

use engram_bus::{Bus, OutgoingEvent, Topology};
use engram_e2e::{Sandbox, SandboxOptions, TestBus, TestEmbedder};
use engram_proto::v1;
use engram_testkit::TcpProxy;

use crate::helpers::{new_scope, outcome, remember};

async fn wait_for(description: &str, limit: Duration, mut check: impl AsyncFnMut() -> bool) {
    let started = Instant::now();
    while !check().await {
        assert!(
            started.elapsed() < limit,
            "{description} did not happen within {limit:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn count(sandbox: &Sandbox, sql: &'static str) -> i64 {
    sqlx::query_scalar(sql)
        .fetch_one(&sandbox.pool)
        .await
        .unwrap()
}

async fn delete_topology(bus: &TestBus) {
    let connection = lapin::Connection::connect(&engram_e2e::amqp_url(), Default::default())
        .await
        .unwrap();
    let channel = connection.create_channel().await.unwrap();
    let topology = Topology::new(bus.topology_prefix.clone());
    for queue in [
        topology.queue("ingest.embedding-requested"),
        topology.delay_queue("ingest.embedding-requested"),
        topology.dead_letter_queue(),
    ] {
        let _ = channel.queue_delete(queue.into(), Default::default()).await;
    }
    for exchange in [
        topology.events_exchange(),
        topology.retry_exchange(),
        topology.dead_letter_exchange(),
    ] {
        let _ = channel
            .exchange_delete(exchange.into(), Default::default())
            .await;
    }
}

fn options(bus: &TestBus) -> SandboxOptions {
    SandboxOptions {
        embedder: TestEmbedder::Local,
        bus: Some(bus.clone()),
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn new_entries_are_announced_in_their_transaction_and_embedded_by_the_consumer() {
    let bus = TestBus::local();
    let mut sandbox = Sandbox::start_with(options(&bus)).await;
    let scope = new_scope("work");
    for index in 0..5 {
        sandbox
            .ingest
            .remember(remember(
                &scope,
                &format!("fact number {index} about the bus"),
            ))
            .await
            .unwrap();
    }
    // The sweep only takes entries older than a minute here: whatever is embedded sooner came
    // through the outbox, the broker and the consumer.
    wait_for(
        "embedding through the bus",
        Duration::from_secs(30),
        async || {
            count(
                &sandbox,
                "SELECT count(*) FROM memories WHERE needs_embedding",
            )
            .await
                == 0
        },
    )
    .await;
    assert_eq!(
        count(
            &sandbox,
            "SELECT count(*) FROM outbox_events WHERE published_at IS NOT NULL"
        )
        .await,
        5
    );
    assert_eq!(
        count(
            &sandbox,
            "SELECT count(DISTINCT message_id) FROM outbox_events"
        )
        .await,
        5
    );
    assert_eq!(sandbox.ingest_metrics.embedded(), 5);
    drop(sandbox);
    delete_topology(&bus).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_message_is_dead_lettered_and_later_messages_are_processed() {
    let bus = TestBus::local();
    let mut sandbox = Sandbox::start_with(options(&bus)).await;
    let broker = Bus::connect(&bus.url, Topology::new(bus.topology_prefix.clone()))
        .await
        .unwrap();
    // Wait until the service declared its queue, then slip a malformed message in.
    tokio::time::sleep(Duration::from_millis(500)).await;
    broker
        .publisher()
        .await
        .unwrap()
        .publish(&OutgoingEvent {
            routing_key: "memory.embedding.requested".into(),
            message_id: uuid::Uuid::new_v4(),
            type_name: "engram.v1.EmbeddingRequested".into(),
            payload: vec![0xff, 0xff, 0xff],
            trace_headers: Default::default(),
        })
        .await
        .unwrap();
    sandbox
        .ingest
        .remember(remember(
            &new_scope("work"),
            "a healthy entry after the poison",
        ))
        .await
        .unwrap();
    wait_for(
        "the healthy entry embedded",
        Duration::from_secs(30),
        async || {
            count(
                &sandbox,
                "SELECT count(*) FROM memories WHERE needs_embedding",
            )
            .await
                == 0
        },
    )
    .await;

    let connection = lapin::Connection::connect(&bus.url, Default::default())
        .await
        .unwrap();
    let channel = connection.create_channel().await.unwrap();
    let dead = channel
        .basic_get(
            Topology::new(bus.topology_prefix.clone())
                .dead_letter_queue()
                .into(),
            Default::default(),
        )
        .await
        .unwrap()
        .expect("the malformed message is in the dead-letter queue");
    assert_eq!(dead.delivery.data, vec![0xff, 0xff, 0xff]);
    drop(sandbox);
    delete_topology(&bus).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_outage_neither_slows_writes_nor_loses_or_duplicates_work() {
    let upstream: std::net::SocketAddr = "127.0.0.1:5672".parse().unwrap();
    let proxy = TcpProxy::start(upstream).await.unwrap();
    let bus = TestBus {
        url: format!("amqp://guest:guest@{}/%2f", proxy.address()),
        ..TestBus::local()
    };
    let mut sandbox = Sandbox::start_with(options(&bus)).await;
    let scope = new_scope("work");
    sandbox
        .ingest
        .remember(remember(&scope, "written while the broker is up"))
        .await
        .unwrap();
    wait_for(
        "the first entry embedded",
        Duration::from_secs(30),
        async || {
            count(
                &sandbox,
                "SELECT count(*) FROM memories WHERE needs_embedding",
            )
            .await
                == 0
        },
    )
    .await;

    // The broker goes away: writes still answer at once, and their events wait in the outbox.
    proxy.cut();
    let during_outage = [
        "The quarterly budget review moved to Thursday",
        "My sister is visiting from Madrid next month",
        "I prefer aisle seats on short flights",
        "The staging database runs out of disk every Sunday",
        "Our team lunch is on the first Friday of the month",
        "I am allergic to penicillin",
        "The new office badge works only at the north entrance",
        "Invoices go to the finance mailbox, not to Maria",
        "I want to finish the Rust book before December",
        "The printer on the third floor needs toner",
    ];
    for text in during_outage {
        let started = Instant::now();
        let response = sandbox
            .ingest
            .remember(remember(&scope, text))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(outcome(&response), v1::RememberOutcome::Created);
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "write took {:?}",
            started.elapsed()
        );
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        count(
            &sandbox,
            "SELECT count(*) FROM outbox_events WHERE published_at IS NULL"
        )
        .await
            >= 10
    );

    // The broker returns: the relay reconnects and publishes, the consumer embeds everything.
    proxy.restore().await.unwrap();
    wait_for(
        "every entry embedded after the outage",
        Duration::from_secs(60),
        async || {
            count(
                &sandbox,
                "SELECT count(*) FROM memories WHERE needs_embedding",
            )
            .await
                == 0
        },
    )
    .await;
    wait_for(
        "every event published",
        Duration::from_secs(30),
        async || {
            count(
                &sandbox,
                "SELECT count(*) FROM outbox_events WHERE published_at IS NULL",
            )
            .await
                == 0
        },
    )
    .await;
    assert_eq!(
        count(
            &sandbox,
            "SELECT count(*) FROM memories WHERE embedding IS NOT NULL"
        )
        .await,
        11
    );
    assert_eq!(
        sandbox.ingest_metrics.embedded(),
        11,
        "each entry embedded exactly once"
    );
    drop(sandbox);
    delete_topology(&bus).await;
}
