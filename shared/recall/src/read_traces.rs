//! What retrievals leave behind besides their pending reviews (the note that entries were
//! returned, their cached scores, the metrics rows), written off the request path: a retrieval
//! hands its trace to a writer task and returns; the task writes the traces of every retrieval
//! of the last `recall.trace_flush_ms` in two statements (`store::write_read_traces`).
//!
//! The bound a crash can lose: the traces of the last flush interval and of the batch being
//! written. Retention and the capacity policy only need these rows within a day, and `make
//! report` reads metrics rows minutes later. A graceful shutdown writes what is queued
//! ([`ReadTraces::flush`]). Pending reviews are never here: the review service needs them once
//! the response is out, so they are written before it returns.

use std::time::Duration;

use backon::{ExponentialBuilder, Retryable as _};
use engram_store::retrieval::{ReadTrace, write_read_traces};
use sqlx::PgPool;
use tokio::sync::{mpsc, oneshot};

/// Traces waiting beyond this many make the next retrieval wait for room (the database is
/// slower than the reads): nothing is dropped.
const QUEUE: usize = 8192;

/// At most this many retrievals' traces in one write.
const BATCH: usize = 1024;

enum Message {
    Trace(Box<ReadTrace>),
    /// Write everything queued before this, then answer.
    Flush(oneshot::Sender<()>),
}

/// The handle retrievals hand their traces to; cloned into every copy of the pipeline.
#[derive(Debug, Clone)]
pub(crate) struct ReadTraces {
    sender: mpsc::Sender<Message>,
}

impl ReadTraces {
    /// Starts the writer task (on the current Tokio runtime). It writes every `interval`, and
    /// stops once every handle is dropped, after writing what was queued.
    pub(crate) fn start(pool: PgPool, interval: Duration) -> Self {
        let (sender, receiver) = mpsc::channel(QUEUE);
        tokio::spawn(write_traces(pool, receiver, interval));
        Self { sender }
    }

    /// Queues a retrieval's trace; waits only when the queue is full.
    pub(crate) async fn send(&self, trace: ReadTrace) {
        if self
            .sender
            .send(Message::Trace(Box::new(trace)))
            .await
            .is_err()
        {
            tracing::warn!("the read trace writer has stopped; a retrieval's trace is lost");
        }
    }

    /// Writes every trace queued so far and returns once they are written (or failed to be):
    /// for a graceful shutdown, and for tests that read what retrievals left behind.
    pub(crate) async fn flush(&self) {
        let (done, written) = oneshot::channel();
        if self.sender.send(Message::Flush(done)).await.is_ok() {
            let _ = written.await;
        }
    }
}

async fn write_traces(pool: PgPool, mut receiver: mpsc::Receiver<Message>, interval: Duration) {
    let mut batch: Vec<ReadTrace> = Vec::new();
    let mut waiting: Vec<oneshot::Sender<()>> = Vec::new();
    let mut ticks = tokio::time::interval(interval);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let open = tokio::select! {
            message = receiver.recv() => match message {
                Some(Message::Trace(trace)) => {
                    batch.push(*trace);
                    true
                }
                Some(Message::Flush(done)) => {
                    waiting.push(done);
                    true
                }
                None => false,
            },
            _ = ticks.tick() => {
                write_batch(&pool, &mut batch).await;
                continue;
            }
        };
        if !open || !waiting.is_empty() || batch.len() >= BATCH {
            write_batch(&pool, &mut batch).await;
            for done in waiting.drain(..) {
                let _ = done.send(());
            }
        }
        if !open {
            return;
        }
    }
}

/// Writes and empties the batch, retrying a failed write a few times (the database restarting,
/// a connection dropped); a batch that still fails is logged and counted, not retried forever,
/// so one bad row cannot hold up every later trace.
async fn write_batch(pool: &PgPool, batch: &mut Vec<ReadTrace>) {
    if batch.is_empty() {
        return;
    }
    let traces = std::mem::take(batch);
    let written = (|| write_read_traces(pool, &traces))
        .retry(
            ExponentialBuilder::default()
                .with_min_delay(Duration::from_millis(100))
                .with_max_times(4),
        )
        .notify(|error, wait| {
            tracing::warn!(%error, ?wait, traces = traces.len(), "could not write read traces; retrying")
        })
        .await;
    if let Err(error) = written {
        lost_traces().add(traces.len() as u64, &[]);
        tracing::error!(%error, traces = traces.len(), "read traces lost: cached scores, returned notes and metrics rows of these retrievals are not written");
    }
}

/// `engram.retrieval.read_traces_lost`: traces a failing database made the writer give up on.
fn lost_traces() -> &'static opentelemetry::metrics::Counter<u64> {
    static LOST: std::sync::OnceLock<opentelemetry::metrics::Counter<u64>> =
        std::sync::OnceLock::new();
    LOST.get_or_init(|| {
        opentelemetry::global::meter("engram-recall")
            .u64_counter("engram.retrieval.read_traces_lost")
            .with_description(
                "retrievals whose cached scores, returned notes and metrics row could not be written",
            )
            .build()
    })
}
