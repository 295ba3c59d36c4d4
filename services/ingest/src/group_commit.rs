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

use chrono::Utc;
use engram_store::outbox::NewOutboxEvent;
use engram_store::write_path::{
    self, AuditedInsert, AuditedMerge, CapacityTarget, ContextQuery, TrimOutcome,
};
use sqlx::{PgConnection, PgPool};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc, oneshot};
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
    pub linger: std::time::Duration,
}

/// A write waiting for its group commit, with where to send its answer.
struct QueuedWrite {
    command: RememberCommand,
    analysis: Analysis,
    /// The caller's trace context, for the event announcing a new entry (empty when no events
    /// are published).
    trace_headers: HashMap<String, String>,
    answer: oneshot::Sender<Result<RememberResult, IngestError>>,
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
                _in_flight: self.metrics.write_in_flight(),
            })
            .await
            .map_err(|_| IngestError::Unavailable("the write path is shutting down".into()))?;
        outcome.await.map_err(|_| {
            IngestError::Unavailable("the write was abandoned by its group commit".into())
        })?
    }
}

/// Hands what is waiting to the next free commit slot, until every sender is gone.
async fn dispatch(
    mut queue: mpsc::Receiver<QueuedWrite>,
    committer: Arc<GroupCommitter>,
    settings: GroupCommitSettings,
) {
    let slots = Arc::new(Semaphore::new(settings.concurrency));
    let mut sizer = BatchSizer::default();
    loop {
        let slot: OwnedSemaphorePermit = match slots.clone().acquire_owned().await {
            Ok(slot) => slot,
            Err(_) => return,
        };
        let mut batch = Vec::with_capacity(settings.max_batch);
        if queue.recv_many(&mut batch, settings.max_batch).await == 0 {
            return;
        }
        // Under load, writes come back in waves (the callers of the last batch); a batch that
        // leaves with the first of a wave is paid in full for one write, and the rest of the wave
        // waits behind it. So when fewer writes are waiting than recent batches held, give the
        // others a moment to arrive. When the service is quiet the expected size is one and
        // nothing waits.
        let expected = sizer.expected().min(settings.max_batch);
        if batch.len() < expected && !settings.linger.is_zero() {
            let deadline = tokio::time::Instant::now() + settings.linger;
            while batch.len() < expected {
                let wanted = settings.max_batch - batch.len();
                match tokio::time::timeout_at(deadline, queue.recv_many(&mut batch, wanted)).await {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {}
                }
            }
        }
        sizer.observe(batch.len());
        let committer = committer.clone();
        let span = tracing::info_span!("group_commit", writes = batch.len());
        tokio::spawn(
            async move {
                committer.commit(batch).await;
                drop(slot);
            }
            .instrument(span),
        );
    }
}

/// The size recent batches had (an exponentially weighted mean): what the next batch may expect
/// to gather.
#[derive(Debug, Clone, Copy)]
struct BatchSizer {
    mean: f64,
}

impl Default for BatchSizer {
    fn default() -> Self {
        Self { mean: 1.0 }
    }
}

impl BatchSizer {
    /// Weight of the newest batch.
    const WEIGHT: f64 = 0.25;

    fn observe(&mut self, size: usize) {
        self.mean += Self::WEIGHT * (size as f64 - self.mean);
    }

    fn expected(&self) -> usize {
        self.mean.round().max(1.0) as usize
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
    async fn commit(&self, batch: Vec<QueuedWrite>) {
        // A caller that went away (cancelled, past its deadline) gets nothing written.
        let batch: Vec<QueuedWrite> = batch
            .into_iter()
            .filter(|write| !write.answer.is_closed())
            .collect();
        if batch.is_empty() {
            return;
        }
        self.metrics.record_write_batch(batch.len());
        let started = std::time::Instant::now();
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
    fn the_expected_batch_follows_recent_sizes() {
        let mut sizer = BatchSizer::default();
        assert_eq!(sizer.expected(), 1, "a quiet service waits for nothing");
        for _ in 0..20 {
            sizer.observe(16);
        }
        assert_eq!(sizer.expected(), 16);
        for _ in 0..20 {
            sizer.observe(1);
        }
        assert_eq!(
            sizer.expected(),
            1,
            "back to no waiting once the load is gone"
        );
    }

    #[test]
    fn distinct_spaces_make_one_round() {
        assert_eq!(rounds_by_key(["a", "b", "c"].iter()), vec![vec![0, 1, 2]]);
        assert!(rounds_by_key(std::iter::empty::<&str>()).is_empty());
    }
}
