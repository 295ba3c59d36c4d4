//! Group commit of Remembers: concurrent writes share one transaction and one set of statements.
//!
//! A write costs Postgres far more in per-statement and per-transaction work (round trips,
//! executor start-up, locks on the table and its indexes, the commit's WAL flush) than in the rows
//! it touches. So writes wait in a queue, and a dispatcher hands whatever is waiting (up to
//! `write_batch_max`) to the next free commit slot (`write_batch_concurrency` of them). When the
//! service is idle a write goes alone at once, adding no latency; under load, writes that arrive
//! while the slots are busy leave together, and the batch grows with the load.
//!
//! A batch locks all its spaces (in key order, so batches never deadlock), then runs in rounds:
//! each round holds at most one write per space (the first round the first write of each space,
//! and so on), and runs the whole write path for all of them at once — the context query, the
//! merges, the inserts, the soft caps. A later round sees what earlier rounds wrote, exactly as
//! if the writes had been made one after another in queue order.
//!
//! If the database refuses a statement of a batch, the batch is rolled back and its writes are
//! retried one at a time, in queue order, so one write the database refuses cannot fail the
//! others. A batch that cannot reach the database (connection lost, pool exhausted) fails as a
//! whole, and a batch whose commit could not be confirmed is never retried: it may have landed.
//!
//! A write leaves with its batch once the batch starts: a caller who goes away after that (a
//! cancelled request, a passed deadline) may still find the write made, as with any database
//! write whose client disconnects while it commits. Callers already gone when a batch starts, or
//! when a failed batch is retried, are skipped.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::Utc;
use engram_server::deadline::WriteMark;
use engram_store::audit::{self, AuditAction};
use engram_store::outbox::NewOutboxEvent;
use engram_store::write_path::{
    self, AuditedInsert, AuditedMerge, CapacityTarget, ContextQuery, TrimOutcome,
};
use sqlx::{PgConnection, PgPool};
use tokio::sync::{mpsc, oneshot};
use tracing::Instrument as _;
use uuid::Uuid;

use crate::config::MemorySettings;
use crate::error::IngestError;
use crate::metrics::{InFlightWrite, IngestMetrics};
use crate::write_path::{
    Analysis, BackfillHooks, Decision, RememberCommand, RememberResult, Skipped,
    create_audit_detail, decide, merge_audit_detail, merge_update, new_memory,
    overage_after_insert, suppress_audit_detail,
};

/// How writes are grouped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GroupCommitSettings {
    /// Most writes in one transaction.
    pub max_batch: usize,
    /// Transactions in flight at once (each holds a database connection).
    pub concurrency: usize,
    /// The longest a batch waits for the writes it expects, from when it starts waiting (see
    /// [`WavePlanner`]). Zero: never waits.
    pub linger: Duration,
}

/// A write waiting for its group commit, with where to send its answer.
struct QueuedWrite {
    command: RememberCommand,
    analysis: Analysis,
    /// The caller's trace context, for the event announcing a new entry (empty when no events
    /// are published).
    trace_headers: HashMap<String, String>,
    answer: oneshot::Sender<Result<RememberResult, IngestError>>,
    /// The caller's request, told when its write reaches a transaction (from then on it may land
    /// whatever becomes of the caller).
    write_mark: Option<WriteMark>,
    /// Counts the write in flight until the committer is done with it.
    _in_flight: InFlightWrite,
}

/// Why a batch did not commit.
#[derive(Debug)]
enum BatchFailure {
    /// The database refused a statement; nothing was written.
    Refused(IngestError),
    /// The batch could not reach the database (or failed otherwise before its commit); nothing
    /// was written.
    NotWritten(IngestError),
    /// The commit was sent but not confirmed: the writes may or may not be stored.
    CommitUnconfirmed(IngestError),
}

impl BatchFailure {
    /// Before the commit: a statement refused by the database, or a failure of the batch itself.
    fn before_commit(error: IngestError) -> Self {
        match &error {
            IngestError::Store(engram_store::StoreError::Database(sqlx::Error::Database(_))) => {
                BatchFailure::Refused(error)
            }
            _ => BatchFailure::NotWritten(error),
        }
    }

    fn error(self) -> IngestError {
        match self {
            BatchFailure::Refused(error) | BatchFailure::NotWritten(error) => error,
            BatchFailure::CommitUnconfirmed(error) => {
                tracing::error!(%error, "a group commit was sent but not confirmed");
                IngestError::CommitUnconfirmed
            }
        }
    }
}

/// Where Remembers wait for their group commit; cheap to clone. The dispatcher stops when the
/// last clone is dropped (after the writes already queued are done).
#[derive(Debug, Clone)]
pub(crate) struct WriteQueue {
    sender: mpsc::Sender<QueuedWrite>,
    metrics: Arc<IngestMetrics>,
}

impl WriteQueue {
    /// Starts the dispatcher on the current Tokio runtime.
    pub(crate) fn start(committer: GroupCommitter, settings: GroupCommitSettings) -> Self {
        // Room for a few full batches per slot; beyond that, callers wait to enqueue (their
        // request deadline still applies).
        let (sender, receiver) = mpsc::channel(settings.max_batch * settings.concurrency * 4);
        let metrics = committer.metrics.clone();
        tokio::spawn(dispatch(receiver, Arc::new(committer), settings));
        Self { sender, metrics }
    }

    /// Queues a write and waits for its outcome.
    pub(crate) async fn write(
        &self,
        command: RememberCommand,
        analysis: Analysis,
        trace_headers: HashMap<String, String>,
    ) -> Result<RememberResult, IngestError> {
        let (answer, outcome) = oneshot::channel();
        self.sender
            .send(QueuedWrite {
                command,
                analysis,
                trace_headers,
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
async fn dispatch(
    mut queue: mpsc::Receiver<QueuedWrite>,
    committer: Arc<GroupCommitter>,
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

/// Carries out batches of writes.
#[derive(Debug)]
pub(crate) struct GroupCommitter {
    pub(crate) pool: PgPool,
    pub(crate) settings: Arc<MemorySettings>,
    pub(crate) metrics: Arc<IngestMetrics>,
    pub(crate) hooks: Arc<BackfillHooks>,
}

impl GroupCommitter {
    /// Writes the batch and answers its callers; returns how many it answered.
    async fn commit(&self, batch: Vec<QueuedWrite>) -> usize {
        // A caller that went away (cancelled, past its deadline) gets nothing written. The mark
        // is set before the check, so a caller whose deadline passes in between hears UNKNOWN.
        let batch: Vec<QueuedWrite> = batch
            .into_iter()
            .filter(|write| {
                if let Some(mark) = &write.write_mark {
                    mark.set();
                }
                !write.answer.is_closed()
            })
            .collect();
        let answered = batch.len();
        if batch.is_empty() {
            return 0;
        }
        self.metrics.record_write_batch(batch.len());
        let started = Instant::now();
        let writes: Vec<&QueuedWrite> = batch.iter().collect();
        let written = self.write_in_one_transaction(&writes).await;
        tracing::debug!(
            writes = batch.len(),
            elapsed_us = started.elapsed().as_micros() as u64,
            ok = written.is_ok(),
            "group commit"
        );
        match written {
            Ok(results) => {
                for (write, result) in batch.into_iter().zip(results) {
                    let _ = write.answer.send(Ok(result));
                }
            }
            Err(BatchFailure::Refused(error)) if batch.len() > 1 => {
                tracing::warn!(%error, writes = batch.len(), "the database refused a group commit; writing each alone");
                for write in batch {
                    if write.answer.is_closed() {
                        continue;
                    }
                    let result = self
                        .write_in_one_transaction(&[&write])
                        .await
                        .map(|mut results| results.remove(0))
                        .map_err(BatchFailure::error);
                    let _ = write.answer.send(result);
                }
            }
            Err(failure) => {
                // One failure for everyone: each caller gets its own copy of it.
                let shared = Arc::new(failure.error());
                for write in batch {
                    let _ = write.answer.send(Err(IngestError::Shared(shared.clone())));
                }
            }
        }
        answered
    }

    /// The whole batch in one transaction; one result per write, in order.
    async fn write_in_one_transaction(
        &self,
        writes: &[&QueuedWrite],
    ) -> Result<Vec<RememberResult>, BatchFailure> {
        let (transaction, results) = self
            .write_uncommitted(writes)
            .await
            .map_err(BatchFailure::before_commit)?;
        transaction
            .commit()
            .await
            .map_err(|error| BatchFailure::CommitUnconfirmed(error.into()))?;
        self.after_commit(&results);
        Ok(results)
    }

    /// Every statement of the batch, up to (not including) its commit.
    async fn write_uncommitted(
        &self,
        writes: &[&QueuedWrite],
    ) -> Result<
        (
            sqlx::Transaction<'static, sqlx::Postgres>,
            Vec<RememberResult>,
        ),
        IngestError,
    > {
        let mut transaction = engram_store::begin_with_spaces_locked(
            &self.pool,
            writes.iter().map(|w| &w.command.scope),
        )
        .await?;
        let mut results: Vec<Option<RememberResult>> = vec![None; writes.len()];
        for round in rounds(writes) {
            self.write_round(&mut transaction, writes, &round, &mut results)
                .await?;
        }
        let results = results
            .into_iter()
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| {
                IngestError::Store(engram_store::StoreError::Corrupt(
                    "a write of the batch was left without an outcome".into(),
                ))
            })?;
        Ok((transaction, results))
    }

    /// The write path for one write per space (`round` indexes `writes`).
    async fn write_round(
        &self,
        connection: &mut PgConnection,
        writes: &[&QueuedWrite],
        round: &[usize],
        results: &mut [Option<RememberResult>],
    ) -> Result<(), IngestError> {
        let queries: Vec<ContextQuery<'_>> = round
            .iter()
            .map(|&at| ContextQuery {
                scope: &writes[at].command.scope,
                conversation: writes[at].command.conversation,
                simhash: writes[at].analysis.simhash,
                text_digest: &writes[at].analysis.digest,
            })
            .collect();
        let contexts = write_path::write_contexts(connection, &queries).await?;

        let mut creates = Vec::new();
        let mut merging = Vec::new();
        for (&at, context) in round.iter().zip(&contexts) {
            match decide(&writes[at].command, context) {
                Decision::Skip(skipped) => {
                    if let Skipped::Tombstone { expires_at } = skipped {
                        // Audited, though nothing is written: the user acted, and "forget that"
                        // in the same conversation must know that "that" was not saved.
                        let write = writes[at];
                        audit::append(
                            connection,
                            &write.command.scope,
                            AuditAction::Suppress,
                            None,
                            write.command.conversation,
                            suppress_audit_detail(expires_at),
                        )
                        .await?;
                    }
                    results[at] = Some(skipped.into());
                }
                Decision::Merge(existing) => merging.push((at, existing)),
                Decision::Create => creates.push((at, context)),
            }
        }

        // Merges, into the near-duplicates the context query read under the spaces' locks.
        let retention = self.settings.retention();
        let now = Utc::now();
        let updates: Vec<_> = merging
            .iter()
            .map(|(at, existing)| {
                let write = writes[*at];
                merge_update(&write.command, &write.analysis, existing, &retention, now)
            })
            .collect();
        let audited_merges: Vec<AuditedMerge<'_>> = merging
            .iter()
            .zip(&updates)
            .map(|((at, existing), update)| AuditedMerge {
                scope: &writes[*at].command.scope,
                id: existing.id,
                update,
                conversation: writes[*at].command.conversation,
                audit_detail: merge_audit_detail(update),
                pins: update.pinned && !existing.pinned,
            })
            .collect();

        // New entries (written in the same statement as the merges), then the soft cap of every
        // space they took over it.
        let new_memories: Vec<_> = creates
            .iter()
            .map(|(at, _)| new_memory(&writes[*at].command, &writes[*at].analysis, &retention, now))
            .collect();
        let events: Vec<Option<NewOutboxEvent>> = creates
            .iter()
            .zip(&new_memories)
            .map(|((at, _), memory)| {
                self.hooks.publish_events.then(|| {
                    crate::bus::embedding_requested(
                        memory.id,
                        &writes[*at].command.scope,
                        writes[*at].trace_headers.clone(),
                    )
                })
            })
            .collect();
        let inserts: Vec<AuditedInsert<'_>> = creates
            .iter()
            .zip(&new_memories)
            .zip(&events)
            .map(|(((at, _), memory), event)| AuditedInsert {
                scope: &writes[*at].command.scope,
                memory,
                audit_detail: create_audit_detail(&writes[*at].analysis),
                event: event.as_ref(),
            })
            .collect();
        let written = write_path::write_entries(connection, &audited_merges, &inserts).await?;
        for ((at, _), memory) in merging.iter().zip(written.merged) {
            results[*at] = Some(RememberResult::Merged { memory });
        }

        let over_cap: Vec<(usize, CapacityTarget<'_>)> = creates
            .iter()
            .enumerate()
            .filter_map(|(index, (at, context))| {
                let overage = overage_after_insert(context, self.settings.soft_cap);
                (overage > 0).then(|| {
                    (
                        index,
                        CapacityTarget {
                            scope: &writes[*at].command.scope,
                            overage,
                        },
                    )
                })
            })
            .collect();
        let targets: Vec<CapacityTarget<'_>> = over_cap.iter().map(|(_, target)| *target).collect();
        let outcomes = write_path::enforce_soft_caps(connection, &targets, &retention).await?;
        let mut trimmed_by_create: HashMap<usize, Vec<Uuid>> = HashMap::new();
        for ((index, target), outcome) in over_cap.iter().zip(outcomes) {
            self.report_trim(target, outcome.clone());
            trimmed_by_create.insert(*index, outcome.trimmed);
        }
        for (index, ((at, _), memory)) in creates.iter().zip(written.created).enumerate() {
            let trimmed = trimmed_by_create.remove(&index).unwrap_or_default();
            results[*at] = Some(if trimmed.contains(&memory.id) {
                RememberResult::TrimmedAtCapacity { trimmed }
            } else {
                RememberResult::Created { memory, trimmed }
            });
        }
        Ok(())
    }

    /// Alerts when a protected entry would have been a victim of the soft cap, and notes a space
    /// that stays over it.
    fn report_trim(&self, target: &CapacityTarget<'_>, outcome: TrimOutcome) {
        let scope = target.scope;
        if !outcome.protected_would_be_victims.is_empty() {
            tracing::warn!(
                user_id = %scope.user_id,
                space = %scope.space,
                protected = ?outcome.protected_would_be_victims,
                "capacity alert: pinned or saved entries have the lowest scores and would have been trimmed"
            );
            self.metrics
                .record_pinned_trim_alerts(outcome.protected_would_be_victims.len() as u64);
        }
        let shortfall = target.overage - outcome.trimmed.len() as i64;
        if shortfall > 0 {
            tracing::info!(
                user_id = %scope.user_id,
                space = %scope.space,
                over_by = shortfall,
                "space stays over its soft cap: the remaining entries are pinned or saved"
            );
        }
    }

    fn after_commit(&self, results: &[RememberResult]) {
        let mut created = 0;
        for result in results {
            match result {
                RememberResult::Created { trimmed, .. }
                | RememberResult::TrimmedAtCapacity { trimmed } => {
                    created += 1;
                    self.metrics.record_created();
                    if !trimmed.is_empty() {
                        self.metrics.record_trimmed(trimmed.len() as u64);
                    }
                }
                RememberResult::Merged { .. } => self.metrics.record_merged(),
                RememberResult::SuppressedByTombstone { .. }
                | RememberResult::SkippedMemoryDisabled
                | RememberResult::SkippedIncognito => {}
            }
        }
        if created > 0
            && let Some(wake) = &self.hooks.new_entry_wake
        {
            wake.notify_one();
        }
    }
}

/// Splits a batch into rounds of at most one write per space, keeping queue order within a space:
/// round k holds the k-th write of every space that has one.
fn rounds(writes: &[&QueuedWrite]) -> Vec<Vec<usize>> {
    rounds_by_key(writes.iter().map(|write| &write.command.scope))
}

fn rounds_by_key<K: std::hash::Hash + Eq>(keys: impl Iterator<Item = K>) -> Vec<Vec<usize>> {
    let mut seen: HashMap<K, usize> = HashMap::new();
    let mut rounds: Vec<Vec<usize>> = Vec::new();
    for (at, key) in keys.enumerate() {
        let round = seen.entry(key).or_insert(0);
        if *round == rounds.len() {
            rounds.push(Vec::new());
        }
        rounds[*round].push(at);
        *round += 1;
    }
    rounds
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounds_hold_one_write_per_space_in_queue_order() {
        let keys = ["a", "b", "a", "c", "a", "b"];
        assert_eq!(
            rounds_by_key(keys.iter()),
            vec![vec![0, 1, 3], vec![2, 5], vec![4]]
        );
    }

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

    #[test]
    fn distinct_spaces_make_one_round() {
        assert_eq!(rounds_by_key(["a", "b", "c"].iter()), vec![vec![0, 1, 2]]);
        assert!(rounds_by_key(std::iter::empty::<&str>()).is_empty());
    }
}
