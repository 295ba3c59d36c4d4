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
    Analysis, BackfillHooks, Decision, RememberCommand, RememberResult, create_audit_detail,
    decide, merge_audit_detail, merge_update, new_memory, overage_after_insert,
};

/// How writes are grouped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GroupCommitSettings {
    /// Most writes in one transaction.
    pub max_batch: usize,
    /// Transactions in flight at once (each holds a database connection).
    pub concurrency: usize,
    /// Longest a batch waits for the writes it expects (see [`dispatch`]); zero: never waits.
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
    /// When the write joined the queue (tells a returning caller from one that was waiting).
    queued_at: Instant,
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
        let settings = GroupCommitSettings {
            max_batch: settings.max_batch.max(1),
            concurrency: settings.concurrency.max(1),
            linger: settings.linger,
        };
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
                queued_at: Instant::now(),
                _in_flight: self.metrics.write_in_flight(),
            })
            .await
            .map_err(|_| IngestError::Unavailable("the write path is shutting down".into()))?;
        outcome.await.map_err(|_| {
            IngestError::Unavailable("the write was abandoned by its group commit".into())
        })?
    }
}

/// A commit slot handed back by its batch: how many writes the batch took, how many callers it
/// answered, and when.
#[derive(Debug, Clone, Copy)]
struct FreedSlot {
    taken: usize,
    answered: usize,
    at: Instant,
}

/// Hands what is waiting to the next free commit slot, until every sender is gone.
async fn dispatch(
    mut queue: mpsc::Receiver<QueuedWrite>,
    committer: Arc<GroupCommitter>,
    settings: GroupCommitSettings,
) {
    let (slot_freed, mut free_slots) = mpsc::channel::<FreedSlot>(settings.concurrency);
    for _ in 0..settings.concurrency {
        let _ = slot_freed.try_send(FreedSlot {
            taken: 0,
            answered: 0,
            at: Instant::now(),
        });
    }
    // Writes in the batches now committing.
    let mut committing = 0;
    loop {
        let Some(slot) = free_slots.recv().await else {
            return;
        };
        committing -= slot.taken;
        let mut batch = Vec::with_capacity(settings.max_batch);
        if queue.recv_many(&mut batch, settings.max_batch).await == 0 {
            return;
        }
        let returning = wave_still_expected(
            slot,
            batch.iter().map(|write| write.queued_at),
            Instant::now(),
            settings.linger,
        );
        let wanted = batch_to_wait_for(
            BatchOutlook {
                committing,
                gathered: batch.len(),
                queued: queue.len(),
                returning,
            },
            settings,
        );
        if wanted > batch.len() {
            let deadline = tokio::time::Instant::now() + settings.linger;
            while batch.len() < wanted {
                let room = wanted - batch.len();
                match tokio::time::timeout_at(deadline, queue.recv_many(&mut batch, room)).await {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {}
                }
            }
        }
        let taken = batch.len();
        committing += taken;
        let committer = committer.clone();
        let slot_freed = slot_freed.clone();
        let span = tracing::info_span!("group_commit", writes = taken);
        tokio::spawn(
            async move {
                let answered = committer.commit(batch).await;
                let _ = slot_freed
                    .send(FreedSlot {
                        taken,
                        answered,
                        at: Instant::now(),
                    })
                    .await;
            }
            .instrument(span),
        );
    }
}

/// What a free slot sees when its first writes arrive.
#[derive(Debug, Clone, Copy)]
struct BatchOutlook {
    /// Writes in the other slots' batches.
    committing: usize,
    /// Writes this batch already holds.
    gathered: usize,
    /// Writes still queued behind them.
    queued: usize,
    /// Callers this slot just answered who are expected back at once.
    returning: usize,
}

/// How many writes a batch should hold before it leaves (it waits at most `linger` for them).
///
/// Under load, writes come back in waves: the callers a batch has just answered send their next
/// write at once. A batch that leaves with the first of its wave is paid in full (each batch
/// costs several round trips and a commit whatever its size) for a few writes, and the rest wait a
/// whole batch for the next slot; and slots whose batches differ in size stay that way, one
/// carrying most of the load, the other a few writes at full price. So a batch waits for its
/// share of the writes under way (committing elsewhere, here, queued or returning, spread over
/// the slots), but never for more than can come: the writes here, queued and returning.
fn batch_to_wait_for(outlook: BatchOutlook, settings: GroupCommitSettings) -> usize {
    if settings.linger.is_zero() {
        return outlook.gathered;
    }
    let here = outlook.gathered + outlook.queued + outlook.returning;
    let share = (outlook.committing + here).div_ceil(settings.concurrency.max(1));
    share
        .min(here)
        .min(settings.max_batch)
        .max(outlook.gathered)
}

/// How many callers a slot just answered are still expected back (writes queued since the slot
/// was freed are theirs); none if the slot was freed more than `linger` ago, so a quiet service
/// never waits.
fn wave_still_expected(
    slot: FreedSlot,
    queued_at: impl Iterator<Item = Instant>,
    now: Instant,
    linger: Duration,
) -> usize {
    if linger.is_zero() || now.saturating_duration_since(slot.at) > linger {
        return 0;
    }
    let returned = queued_at.filter(|&queued| queued >= slot.at).count();
    slot.answered.saturating_sub(returned)
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
        // A caller that went away (cancelled, past its deadline) gets nothing written.
        let batch: Vec<QueuedWrite> = batch
            .into_iter()
            .filter(|write| !write.answer.is_closed())
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
                Decision::Skip(skipped) => results[at] = Some(skipped.into()),
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
            })
            .collect();
        let merged = write_path::apply_merges(connection, &audited_merges).await?;
        for ((at, _), memory) in merging.iter().zip(merged) {
            results[*at] = Some(RememberResult::Merged { memory });
        }

        // New entries, then the soft cap of every space they took over it.
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
        let created = write_path::insert_semantic_audited(connection, &inserts).await?;

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
        for (index, ((at, _), memory)) in creates.iter().zip(created).enumerate() {
            results[*at] = Some(RememberResult::Created {
                memory,
                trimmed: trimmed_by_create.remove(&index).unwrap_or_default(),
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
                RememberResult::Created { trimmed, .. } => {
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

    #[test]
    fn a_batch_waits_for_the_callers_its_slot_just_answered() {
        let freed = Instant::now();
        let linger = Duration::from_millis(1);
        let slot = FreedSlot {
            taken: 8,
            answered: 8,
            at: freed,
        };
        let soon = freed + Duration::from_micros(200);
        let before = freed - Duration::from_micros(500);
        assert_eq!(
            wave_still_expected(slot, [soon, soon, soon].into_iter(), soon, linger),
            5,
            "three of the eight are back"
        );
        assert_eq!(
            wave_still_expected(slot, [before, before, soon].into_iter(), soon, linger),
            7,
            "writes queued before the slot was freed are not its wave"
        );
        assert_eq!(
            wave_still_expected(slot, std::iter::repeat_n(soon, 9), soon, linger),
            0,
            "the wave is back"
        );
    }

    #[test]
    fn a_quiet_slot_or_no_linger_waits_for_nothing() {
        let freed = Instant::now();
        let slot = FreedSlot {
            taken: 8,
            answered: 8,
            at: freed,
        };
        let later = freed + Duration::from_millis(5);
        assert_eq!(
            wave_still_expected(slot, [later].into_iter(), later, Duration::from_millis(1)),
            0,
            "freed long ago: its callers are not coming back at once"
        );
        assert_eq!(
            wave_still_expected(slot, [freed].into_iter(), freed, Duration::ZERO),
            0
        );
        let idle = FreedSlot {
            taken: 0,
            answered: 0,
            at: freed,
        };
        assert_eq!(
            wave_still_expected(idle, [freed].into_iter(), freed, Duration::from_millis(1)),
            0,
            "a slot that answered no one expects no one"
        );
    }

    fn settings(concurrency: usize) -> GroupCommitSettings {
        GroupCommitSettings {
            max_batch: 32,
            concurrency,
            linger: Duration::from_millis(1),
        }
    }

    #[test]
    fn a_batch_waits_for_its_share_of_the_writes_under_way() {
        // 16 callers, two slots: the other slot commits 8, this one answered 8, one is back.
        let outlook = BatchOutlook {
            committing: 8,
            gathered: 1,
            queued: 0,
            returning: 7,
        };
        assert_eq!(batch_to_wait_for(outlook, settings(2)), 8);
        // Lopsided slots even out: 15 committing elsewhere, one caller here.
        let lopsided = BatchOutlook {
            committing: 15,
            gathered: 1,
            queued: 0,
            returning: 0,
        };
        assert_eq!(
            batch_to_wait_for(lopsided, settings(2)),
            1,
            "never waits for writes that cannot come"
        );
        let wave_back = BatchOutlook {
            committing: 1,
            gathered: 2,
            queued: 0,
            returning: 13,
        };
        assert_eq!(
            batch_to_wait_for(wave_back, settings(2)),
            8,
            "takes its share and leaves the rest to the other slot"
        );
    }

    #[test]
    fn a_batch_never_waits_without_linger_or_beyond_the_maximum() {
        let outlook = BatchOutlook {
            committing: 0,
            gathered: 2,
            queued: 0,
            returning: 6,
        };
        let no_linger = GroupCommitSettings {
            linger: Duration::ZERO,
            ..settings(1)
        };
        assert_eq!(batch_to_wait_for(outlook, no_linger), 2);
        let small = GroupCommitSettings {
            max_batch: 4,
            ..settings(1)
        };
        assert_eq!(batch_to_wait_for(outlook, small), 4);
        let quiet = BatchOutlook {
            committing: 0,
            gathered: 1,
            queued: 0,
            returning: 0,
        };
        assert_eq!(batch_to_wait_for(quiet, settings(2)), 1);
    }

    #[test]
    fn distinct_spaces_make_one_round() {
        assert_eq!(rounds_by_key(["a", "b", "c"].iter()), vec![vec![0, 1, 2]]);
        assert!(rounds_by_key(std::iter::empty::<&str>()).is_empty());
    }
}
