//! Group commit: concurrent writes share one transaction and one set of statements.
//!
//! A write costs Postgres far more in per-statement and per-transaction work (round trips,
//! executor start-up, locks on the table and its indexes, the commit's WAL flush) than in the rows
//! it touches. So writes wait in a queue, and a dispatcher hands whatever is waiting (up to
//! `write_batch_max`) to the next free commit slot (`write_batch_concurrency` of them). When the
//! service is idle a write goes alone at once, adding no latency; under load, writes that arrive
//! while the slots are busy leave together, and the batch grows with the load.
//!
//! This module is only the queue and the batching: what a batch does with its writes is the
//! [`BatchCommitter`]'s (for Remembers, `write_path::batch`).
//!
//! A write leaves with its batch once the batch starts: a caller who goes away after that (a
//! cancelled request, a passed deadline) may still find the write made, as with any database
//! write whose client disconnects while it commits, and its request's [`WriteMark`] says so.
//! Callers already gone when a batch starts are skipped ([`take_callers_still_waiting`]).

use std::future::Future;
use std::sync::Arc;
use std::time::Instant;

use engram_server::deadline::WriteMark;
use tokio::sync::{mpsc, oneshot};
use tracing::Instrument as _;

use crate::config::GroupCommitSettings;
use crate::error::IngestError;
use crate::metrics::{InFlightWrite, IngestMetrics};

/// Carries out one batch: writes it and answers each caller.
pub(crate) trait BatchCommitter: Send + Sync + 'static {
    /// What a caller queues.
    type Write: Send + 'static;
    /// What a caller gets back when its write went well.
    type Output: Send + 'static;

    /// Writes the batch and answers its callers; returns how many callers it answered.
    fn commit(
        &self,
        batch: Vec<Queued<Self::Write, Self::Output>>,
    ) -> impl Future<Output = usize> + Send;
}

/// A write waiting for its group commit, with where to send its answer.
pub(crate) struct Queued<W, O> {
    pub(crate) write: W,
    answer: oneshot::Sender<Result<O, IngestError>>,
    /// The caller's request, told when its write reaches a transaction (from then on it may land
    /// whatever becomes of the caller).
    write_mark: Option<WriteMark>,
    /// Counts the write in flight until the committer is done with it.
    _in_flight: InFlightWrite,
}

impl<W, O> Queued<W, O> {
    /// Sends the caller its outcome (a caller that left is not told).
    pub(crate) fn answer(self, outcome: Result<O, IngestError>) {
        let _ = self.answer.send(outcome);
    }

    /// The caller stopped waiting (cancelled, past its deadline).
    pub(crate) fn caller_left(&self) -> bool {
        self.answer.is_closed()
    }
}

/// The writes of a batch whose callers still wait, each marked as reaching its transaction: a
/// caller that went away gets nothing written. The mark is set before the check, so a caller
/// whose deadline passes in between hears UNKNOWN rather than a wrong DEADLINE_EXCEEDED.
pub(crate) fn take_callers_still_waiting<W, O>(batch: Vec<Queued<W, O>>) -> Vec<Queued<W, O>> {
    batch
        .into_iter()
        .filter(|queued| {
            if let Some(mark) = &queued.write_mark {
                mark.set();
            }
            !queued.caller_left()
        })
        .collect()
}

/// Where writes wait for their group commit; cheap to clone. The dispatcher stops when the last
/// clone is dropped (after the writes already queued are done).
pub(crate) struct WriteQueue<C: BatchCommitter> {
    sender: mpsc::Sender<Queued<C::Write, C::Output>>,
    metrics: Arc<IngestMetrics>,
}

impl<C: BatchCommitter> Clone for WriteQueue<C> {
    fn clone(&self) -> Self {
        Self {
            sender: self.sender.clone(),
            metrics: self.metrics.clone(),
        }
    }
}

impl<C: BatchCommitter> std::fmt::Debug for WriteQueue<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WriteQueue")
            .field(
                "queued",
                &(self.sender.max_capacity() - self.sender.capacity()),
            )
            .finish()
    }
}

impl<C: BatchCommitter> WriteQueue<C> {
    /// Starts the dispatcher on the current Tokio runtime.
    pub(crate) fn start(
        committer: C,
        settings: GroupCommitSettings,
        metrics: Arc<IngestMetrics>,
    ) -> Self {
        // Room for a few full batches per slot; beyond that, callers wait to enqueue (their
        // request deadline still applies).
        let (sender, receiver) = mpsc::channel(settings.max_batch * settings.concurrency * 4);
        tokio::spawn(dispatch(receiver, Arc::new(committer), settings));
        Self { sender, metrics }
    }

    /// Queues a write and waits for its outcome.
    pub(crate) async fn write(&self, write: C::Write) -> Result<C::Output, IngestError> {
        let (answer, outcome) = oneshot::channel();
        self.sender
            .send(Queued {
                write,
                answer,
                write_mark: WriteMark::current(),
                _in_flight: self.metrics.write_in_flight(),
            })
            .await
            .map_err(|_| IngestError::Unavailable("the write path is shutting down".into()))?;
        outcome.await.map_err(|_| {
            IngestError::Unavailable("the write was abandoned by its group commit".into())
        })?
    }
}

/// A commit slot handed back by its batch: how many writes the batch took, and how many callers
/// it answered.
#[derive(Debug, Clone, Copy)]
struct FreedSlot {
    taken: usize,
    answered: usize,
}

/// Hands what is waiting to the next free commit slot, until every sender is gone.
async fn dispatch<C: BatchCommitter>(
    mut queue: mpsc::Receiver<Queued<C::Write, C::Output>>,
    committer: Arc<C>,
    settings: GroupCommitSettings,
) {
    let (slot_freed, mut freed_slots) = mpsc::channel::<FreedSlot>(settings.concurrency);
    let mut planner = WavePlanner::new(settings);
    loop {
        // A free slot and the first writes. Batches finishing meanwhile are taken into account
        // as they are handed back, so that the callers they answered are expected before any
        // batch leaves.
        let mut batch = Vec::with_capacity(settings.max_batch);
        loop {
            tokio::select! {
                biased;
                Some(slot) = freed_slots.recv() => planner.slot_freed(slot, Instant::now()),
                received = queue.recv_many(&mut batch, settings.max_batch), if planner.free_slots > 0 => {
                    if received == 0 {
                        return;
                    }
                    let now = Instant::now();
                    planner.forget_stale(now);
                    planner.received(received, now);
                    break;
                }
                // Unreachable while this task holds a sender of freed slots; stop rather than spin.
                else => return,
            }
        }
        let wanted = planner.batch_to_wait_for(batch.len(), queue.len());
        if wanted > batch.len() {
            // One deadline for the whole wait, never moved by arrivals. A wave of answered callers
            // is back within a few milliseconds; a deadline that each arrival moved would also be
            // kept alive by writes that are not the wave at all (independent callers at a steady
            // rate), and every batch held that way would owe more callers to the next one, which
            // then waited longer still: at 500 writes/s, p50 6-7 ms and p99 20 ms, against 3-5
            // and 6-11 ms with one deadline (docs/benchmarks/README.md).
            let deadline = tokio::time::Instant::now() + settings.linger;
            while batch.len() < wanted {
                let room = wanted - batch.len();
                tokio::select! {
                    biased;
                    Some(slot) = freed_slots.recv() => planner.slot_freed(slot, Instant::now()),
                    received = tokio::time::timeout_at(deadline, queue.recv_many(&mut batch, room)) => {
                        match received {
                            Ok(0) => break,
                            Ok(received) => planner.received(received, Instant::now()),
                            Err(_) => {
                                planner.stop_expecting();
                                break;
                            }
                        }
                    }
                }
            }
        }
        let taken = batch.len();
        tracing::trace!(
            wanted,
            taken,
            committing = planner.committing,
            owed = planner.owed,
            free = planner.free_slots,
            "batch planned"
        );
        planner.dispatched(taken);
        let committer = committer.clone();
        let slot_freed = slot_freed.clone();
        let span = tracing::info_span!("group_commit", writes = taken);
        tokio::spawn(
            async move {
                let mut slot = SlotHandBack {
                    to: slot_freed,
                    freed: FreedSlot { taken, answered: 0 },
                };
                slot.freed.answered = committer.commit(batch).await;
            }
            .instrument(span),
        );
    }
}

/// Hands a commit slot back to the dispatcher when its batch is done, however it ends (a panic
/// or a cancelled task included), so that no slot is ever lost.
struct SlotHandBack {
    to: mpsc::Sender<FreedSlot>,
    freed: FreedSlot,
}

impl Drop for SlotHandBack {
    fn drop(&mut self) {
        // Never full: the channel has room for every slot, and each slot is handed back once.
        let _ = self.to.try_send(self.freed);
    }
}

/// How big the next batch should be: what the dispatcher knows about the writes under way.
///
/// Under load, writes come back in waves: the callers a batch has just answered send their next
/// write at once. A batch that leaves with the first of a wave is paid in full (each batch costs
/// several round trips and a commit whatever its size) for a few writes, and the writes it leaves
/// behind wait a whole batch for the next slot, which doubles their latency; and slots whose
/// batches differ in size stay that way, one carrying most of the load, the other a few writes at
/// full price. So a batch waits for its share of the writes under way — committing, gathered,
/// queued, or owed: answered moments ago and not yet back — spread over the slots, but never for
/// more than can come to it (gathered, queued and owed), and for at most `linger`. A quiet
/// service owes no one, so it never waits.
#[derive(Debug)]
struct WavePlanner {
    settings: GroupCommitSettings,
    free_slots: usize,
    /// Writes in the batches now committing.
    committing: usize,
    /// Callers answered moments ago who have not sent their next write yet (as far as the
    /// writes received since tell).
    owed: usize,
    /// When a caller was last answered or a write last arrived while some were owed: a wave
    /// that has not moved for a while is not coming back at once.
    wave_moved: Option<Instant>,
}

impl WavePlanner {
    fn new(settings: GroupCommitSettings) -> Self {
        Self {
            settings,
            free_slots: settings.concurrency,
            committing: 0,
            owed: 0,
            wave_moved: None,
        }
    }

    fn slot_freed(&mut self, slot: FreedSlot, now: Instant) {
        self.free_slots += 1;
        self.committing = self.committing.saturating_sub(slot.taken);
        if slot.answered > 0 {
            self.owed += slot.answered;
            self.wave_moved = Some(now);
        }
    }

    fn received(&mut self, writes: usize, now: Instant) {
        self.owed = self.owed.saturating_sub(writes);
        self.wave_moved = (self.owed > 0).then_some(now);
    }

    /// How long the first of a wave may take to come back. Longer than `linger`, the longest a
    /// batch waits for a wave once it starts waiting: callers answered together come back one
    /// after another, and the first may wait for the service to answer all of them.
    const FIRST_RETURN_LINGERS: u32 = 4;

    /// A wave that has not moved for a while is not coming back at once (or is not a wave:
    /// callers that send their next write later, or never).
    fn forget_stale(&mut self, now: Instant) {
        let horizon = self.settings.linger * Self::FIRST_RETURN_LINGERS;
        if self
            .wave_moved
            .is_some_and(|moved| now.saturating_duration_since(moved) > horizon)
        {
            self.stop_expecting();
        }
    }

    /// The callers still owed did not come back within `linger` of the last sign of them.
    fn stop_expecting(&mut self) {
        self.owed = 0;
        self.wave_moved = None;
    }

    fn batch_to_wait_for(&self, gathered: usize, queued: usize) -> usize {
        if self.settings.linger.is_zero() {
            return gathered;
        }
        let can_come = gathered + queued + self.owed;
        let share = (self.committing + can_come).div_ceil(self.settings.concurrency);
        share
            .min(can_come)
            .min(self.settings.max_batch)
            .max(gathered)
    }

    fn dispatched(&mut self, taken: usize) {
        self.free_slots -= 1;
        self.committing += taken;
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn settings(concurrency: usize) -> GroupCommitSettings {
        GroupCommitSettings {
            max_batch: 32,
            concurrency,
            linger: Duration::from_millis(1),
        }
    }

    fn answered(writes: usize) -> FreedSlot {
        FreedSlot {
            taken: writes,
            answered: writes,
        }
    }

    /// A planner whose one batch of `writes` was just answered, `back` of its callers returned.
    fn after_a_batch(
        settings: GroupCommitSettings,
        writes: usize,
        back: usize,
        at: Instant,
    ) -> WavePlanner {
        let mut planner = WavePlanner::new(settings);
        planner.dispatched(writes);
        planner.slot_freed(answered(writes), at);
        planner.received(back, at);
        planner
    }

    #[test]
    fn a_wave_is_shared_evenly_between_the_slots() {
        // 16 callers, two slots whose batches of 8 finish together; 3 writes are back.
        let now = Instant::now();
        let mut planner = WavePlanner::new(settings(2));
        planner.dispatched(8);
        planner.dispatched(8);
        planner.slot_freed(answered(8), now);
        planner.slot_freed(answered(8), now);
        planner.received(3, now);
        assert_eq!(planner.batch_to_wait_for(3, 0), 8);
        planner.received(5, now);
        planner.dispatched(8);
        planner.received(2, now);
        assert_eq!(
            planner.batch_to_wait_for(2, 0),
            8,
            "the second slot waits for the rest"
        );
    }

    #[test]
    fn a_batch_never_waits_for_writes_that_cannot_come_to_it() {
        // Lopsided: 15 writes committing in one slot, the other answered its one caller.
        let now = Instant::now();
        let mut planner = WavePlanner::new(settings(2));
        planner.dispatched(15);
        planner.dispatched(1);
        planner.slot_freed(answered(1), now);
        planner.received(1, now);
        assert_eq!(planner.batch_to_wait_for(1, 0), 1);
        // When the big batch is answered, its wave is shared out.
        planner.dispatched(1);
        planner.slot_freed(answered(15), now);
        planner.received(2, now);
        assert_eq!(planner.batch_to_wait_for(2, 0), 8);
    }

    #[test]
    fn a_wave_that_stopped_moving_for_the_linger_is_not_awaited() {
        let answered_at = Instant::now();
        let mut planner = WavePlanner::new(settings(1));
        planner.dispatched(8);
        planner.slot_freed(answered(8), answered_at);
        planner.received(1, answered_at + Duration::from_micros(3_500));
        planner.forget_stale(answered_at + Duration::from_micros(4_500));
        assert_eq!(
            planner.batch_to_wait_for(1, 0),
            8,
            "the wave still moved within the linger"
        );
        planner.forget_stale(answered_at + Duration::from_millis(8));
        assert_eq!(planner.batch_to_wait_for(1, 0), 1);

        let mut gave_up = after_a_batch(settings(2), 8, 1, answered_at);
        gave_up.stop_expecting();
        assert_eq!(gave_up.batch_to_wait_for(1, 0), 1);
    }

    #[test]
    fn a_quiet_service_without_linger_or_at_the_maximum_waits_for_nothing_more() {
        let now = Instant::now();
        let quiet = WavePlanner::new(settings(2));
        assert_eq!(quiet.batch_to_wait_for(1, 0), 1, "nobody is owed");

        let no_linger = after_a_batch(
            GroupCommitSettings {
                linger: Duration::ZERO,
                ..settings(1)
            },
            8,
            2,
            now,
        );
        assert_eq!(no_linger.batch_to_wait_for(2, 0), 2);

        let small = after_a_batch(
            GroupCommitSettings {
                max_batch: 4,
                ..settings(1)
            },
            8,
            2,
            now,
        );
        assert_eq!(small.batch_to_wait_for(2, 0), 4);
        assert_eq!(
            small.batch_to_wait_for(6, 3),
            6,
            "never less than what it already holds"
        );
    }

    #[test]
    fn a_slot_is_handed_back_even_when_its_batch_panics() {
        let (to, mut freed) = mpsc::channel(1);
        let outcome = std::panic::catch_unwind(move || {
            let _slot = SlotHandBack {
                to,
                freed: FreedSlot {
                    taken: 3,
                    answered: 0,
                },
            };
            panic!("a batch that fails in an unexpected way");
        });
        assert!(outcome.is_err());
        let slot = freed.try_recv().expect("the slot came back");
        assert_eq!((slot.taken, slot.answered), (3, 0));
    }
}
