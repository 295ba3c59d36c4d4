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

pub(crate) async fn wait_for(
    description: &str,
    limit: Duration,
    mut check: impl AsyncFnMut() -> bool,
) {
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
    count_in(&sandbox.pool, sql).await
}

async fn count_in(pool: &sqlx::PgPool, sql: &'static str) -> i64 {
    sqlx::query_scalar(sql).fetch_one(pool).await.unwrap()
}

/// Why a dead-lettered message was given up (the header the consumers set).
/// An OpenAI-style embeddings answer to `body`: one 384-dimensional unit vector per input.
fn embeddings_of(body: &serde_json::Value) -> serde_json::Value {
    let inputs = body["input"].as_array().unwrap().len();
    let data: Vec<serde_json::Value> = (0..inputs)
        .map(|index| {
            let mut vector = vec![0.0f32; 384];
            vector[index] = 1.0;
            serde_json::json!({ "index": index, "embedding": vector })
        })
        .collect();
    serde_json::json!({ "data": data })
}

fn failure_reason(delivery: &lapin::message::Delivery) -> String {
    let headers = delivery.properties.headers().clone().unwrap();
    match headers
        .inner()
        .get(engram_bus::FAILURE_REASON_HEADER)
        .unwrap()
    {
        lapin::types::AMQPValue::LongString(value) => {
            String::from_utf8_lossy(value.as_bytes()).into_owned()
        }
        other => panic!("unexpected {other:?}"),
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
    crate::helpers::delete_topology(&bus).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_message_is_dead_lettered_and_later_messages_are_processed() {
    let bus = TestBus::local();
    let mut sandbox = Sandbox::start_with(options(&bus)).await;
    let broker = Bus::connect(&bus.url, Topology::new(bus.topology_prefix.clone()))
        .await
        .unwrap();
    // Declare the topology as the service does (idempotent), so the malformed message has its
    // queue whether or not the service got there first.
    // The sandbox runs with a 200 ms retry delay; a different one would be an inequivalent queue.
    broker
        .declare(&[engram_bus::queues::embedding_requested(
            std::time::Duration::from_millis(200),
        )])
        .await
        .unwrap();
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
    crate::helpers::delete_topology(&bus).await;
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
        count(&sandbox, "SELECT count(*) FROM memory_embeddings").await,
        11
    );
    assert_eq!(
        sandbox.ingest_metrics.embedded(),
        11,
        "each entry embedded exactly once"
    );
    drop(sandbox);
    crate::helpers::delete_topology(&bus).await;
}

/// An embedding endpoint that is down for longer than a message's attempts last: a transient
/// failure uses up no attempt, so the message keeps coming back (nothing dead-lettered) and the
/// consumer embeds the entry once the endpoint recovers; writes keep answering at their normal
/// speed meanwhile. (A database or endpoint outage once dead-lettered every message it met.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_embedder_outage_longer_than_the_attempts_is_retried_not_dead_lettered() {
    use axum::Json;
    use axum::http::StatusCode;
    use axum::response::IntoResponse as _;
    use serde_json::Value;
    // Each delivery asks twice (a try and the client's one retry); 5 attempts would be 10.
    const DOWN_FOR_REQUESTS: usize = 16;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base_url = format!("http://{}", listener.local_addr().unwrap());
    let requests = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let seen = requests.clone();
    let app = axum::Router::new().route(
        "/v1/embeddings",
        axum::routing::post(move |Json(body): Json<Value>| {
            let seen = seen.clone();
            async move {
                if seen.fetch_add(1, std::sync::atomic::Ordering::SeqCst) < DOWN_FOR_REQUESTS {
                    return (StatusCode::SERVICE_UNAVAILABLE, "embedding backend down")
                        .into_response();
                }
                Json(embeddings_of(&body)).into_response()
            }
        }),
    );
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });

    // The sweep waits long: only the consumer can embed the entry in time.
    let bus = TestBus {
        sweep_min_age_ms: 600_000,
        ..TestBus::local()
    };
    let mut sandbox = Sandbox::start_with(SandboxOptions {
        embedder: TestEmbedder::OpenAi {
            base_url,
            dimension: 384,
        },
        bus: Some(bus.clone()),
        ..Default::default()
    })
    .await;
    let started = Instant::now();
    let response = sandbox
        .ingest
        .remember(remember(&new_scope("work"), "the endpoint is down today"))
        .await
        .unwrap();
    assert_eq!(outcome(response.get_ref()), v1::RememberOutcome::Created);
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "the write does not wait for the embedder"
    );

    let waited = Instant::now();
    while count(
        &sandbox,
        "SELECT count(*) FROM memories WHERE needs_embedding",
    )
    .await
        > 0
    {
        assert!(
            waited.elapsed() < Duration::from_secs(60),
            "the entry was never embedded ({} requests to the endpoint)",
            requests.load(std::sync::atomic::Ordering::SeqCst)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(
        requests.load(std::sync::atomic::Ordering::SeqCst) > DOWN_FOR_REQUESTS,
        "the outage outlasted the attempts a failure that is not transient would get"
    );
    let connection = lapin::Connection::connect(&bus.url, Default::default())
        .await
        .unwrap();
    let channel = connection.create_channel().await.unwrap();
    let dead_letters = Topology::new(bus.topology_prefix.clone()).dead_letter_queue();
    let dead = channel
        .basic_get(dead_letters.into(), Default::default())
        .await
        .unwrap();
    assert!(
        dead.is_none(),
        "a message was dead-lettered during the outage"
    );
    drop(sandbox);
    crate::helpers::delete_topology(&bus).await;
}

/// SIGTERM while the consumer holds a batch: it finishes that batch (embedded, committed, acked);
/// what it had not taken stays in the queue for the next replica. Nothing lost, nothing twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_stopped_mid_batch_finishes_it_and_leaves_the_rest_to_the_next() {
    use axum::Json;
    use serde_json::Value;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base_url = format!("http://{}", listener.local_addr().unwrap());
    let started_batches = std::sync::Arc::new(tokio::sync::Notify::new());
    let signal = started_batches.clone();
    // A slow embedder: each batch takes a second, so a stop can land in the middle of one.
    let app = axum::Router::new().route(
        "/v1/embeddings",
        axum::routing::post(move |Json(body): Json<Value>| {
            let signal = signal.clone();
            async move {
                signal.notify_one();
                tokio::time::sleep(Duration::from_secs(1)).await;
                Json(embeddings_of(&body))
            }
        }),
    );
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });

    let bus = TestBus::local();
    let mut sandbox = Sandbox::start_with(SandboxOptions {
        embedder: TestEmbedder::OpenAi {
            base_url,
            dimension: 384,
        },
        bus: Some(bus.clone()),
        ..Default::default()
    })
    .await;
    let scope = new_scope("work");
    let texts = [
        "The quarterly budget review moved to Thursday",
        "My sister is visiting from Madrid next month",
        "I prefer aisle seats on short flights",
        "The staging database runs out of disk every Sunday",
        "Our team lunch is on the first Friday of the month",
        "I am allergic to penicillin",
    ];
    sandbox
        .ingest
        .remember(remember(&scope, texts[0]))
        .await
        .unwrap();
    // The consumer is now inside a batch; more work arrives, then the stop.
    tokio::time::timeout(Duration::from_secs(30), started_batches.notified())
        .await
        .expect("a batch started");
    for text in &texts[1..] {
        sandbox
            .ingest
            .remember(remember(&scope, text))
            .await
            .unwrap();
    }
    let first_metrics = sandbox.ingest_metrics.clone();
    // The sandbox's pool belongs to the first service, which is about to stop: use our own.
    let pool = sqlx::PgPool::connect(sandbox.database.url()).await.unwrap();
    let first = sandbox.services.remove(0);
    first.stop().await.expect("graceful stop");
    let embedded_by_first = first_metrics.embedded();
    assert!(embedded_by_first >= 1, "the batch in hand was finished");
    assert_eq!(
        count_in(&pool, "SELECT count(*) FROM memory_embeddings").await as u64,
        embedded_by_first
    );

    // A replacement takes the rest from the queue.
    let (_second, second_metrics) = sandbox.start_another_ingest().await;
    wait_for(
        "the rest embedded by the replacement",
        Duration::from_secs(60),
        async || count_in(&pool, "SELECT count(*) FROM memories WHERE needs_embedding").await == 0,
    )
    .await;
    pool.close().await;
    assert_eq!(
        embedded_by_first + second_metrics.embedded(),
        texts.len() as u64,
        "each entry embedded exactly once"
    );
    drop(sandbox);
    crate::helpers::delete_topology(&bus).await;
}

/// The segmentation consumer follows the same delivery rules as the embedding consumer: a
/// SegmentationRequested message it cannot read is dead-lettered with its reason, and the
/// requests after it are still handled (the conversation appended after it gets segmented).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_segmentation_request_is_dead_lettered_and_later_ones_are_handled() {
    use engram_bus::queues::routes;

    let bus = TestBus::local();
    let sandbox = Sandbox::start_with(SandboxOptions {
        bus: Some(bus.clone()),
        ..Default::default()
    })
    .await;
    let broker = Bus::connect(&bus.url, Topology::new(bus.topology_prefix.clone()))
        .await
        .unwrap();
    // As the service declares it (the sandbox's retry delay is 200 ms).
    broker
        .declare(&[engram_bus::queues::segmentation_requested(
            Duration::from_millis(200),
        )])
        .await
        .unwrap();
    let poison = vec![0xff, 0xff, 0xff];
    broker
        .publisher()
        .await
        .unwrap()
        .publish(&OutgoingEvent {
            routing_key: routes::SEGMENTATION_REQUESTED.into(),
            message_id: uuid::Uuid::new_v4(),
            type_name: routes::SEGMENTATION_REQUESTED_TYPE.into(),
            payload: poison.clone(),
            trace_headers: Default::default(),
        })
        .await
        .unwrap();

    let chat = crate::conversations::Chat::new("work");
    let said = |content: &str| {
        let mut message = crate::conversations::user(content, chrono::Utc::now());
        message.at = None;
        message
    };
    sandbox
        .ingest
        .clone()
        .append_messages(v1::AppendMessagesRequest {
            scope: Some(chat.scope.clone()),
            conversation_id: chat.id.clone(),
            messages: vec![
                said("I am planning a trip to Kyoto in April with my sister"),
                said("We want to see the cherry blossoms along the Philosopher's Path"),
            ],
            close_segment: true,
        })
        .await
        .unwrap();
    wait_for(
        "the conversation after the poison segmented",
        Duration::from_secs(30),
        async || {
            count(
                &sandbox,
                "SELECT count(*) FROM conversations WHERE segmented_through >= 1",
            )
            .await
                == 1
        },
    )
    .await;

    let connection = lapin::Connection::connect(&bus.url, Default::default())
        .await
        .unwrap();
    let channel = connection.create_channel().await.unwrap();
    let dead_letters = Topology::new(bus.topology_prefix.clone()).dead_letter_queue();
    let mut dead = None;
    let waited = Instant::now();
    while dead.is_none() {
        assert!(
            waited.elapsed() < Duration::from_secs(60),
            "the malformed request never reached the dead-letter queue"
        );
        dead = channel
            .basic_get(dead_letters.clone().into(), Default::default())
            .await
            .unwrap();
        if dead.is_none() {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    let dead = dead.unwrap();
    assert_eq!(dead.delivery.data, poison);
    let reason = failure_reason(&dead.delivery);
    assert!(reason.contains("malformed payload"), "{reason}");
    drop(sandbox);
    crate::helpers::delete_topology(&bus).await;
}
