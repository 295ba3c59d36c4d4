//! One batch of Remembers, written in one transaction by the group commit.
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

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Instant;

use chrono::Utc;
use engram_core::RetentionPolicy;
use engram_proto::v1;
use engram_store::audit::{self, AuditAction};
use engram_store::memories::{MemoryRecord, MergeUpdate, NewSemanticMemory};
use engram_store::outbox::NewOutboxEvent;
use engram_store::write_path::{
    self, AuditedInsert, AuditedMerge, CapacityTarget, ContextQuery, Superseding, TrimOutcome,
    WriteContext,
};
use prost::Message as _;
use sqlx::{PgConnection, PgPool};
use uuid::Uuid;

use super::{
    Analysis, BackfillHooks, Decision, RememberCommand, RememberResult, Skipped,
    create_audit_detail, decide, merge_audit_detail, merge_update, new_memory,
    overage_after_insert, suppress_audit_detail,
};
use crate::config::MemorySettings;
use crate::error::IngestError;
use crate::group_commit::{BatchCommitter, Queued, take_callers_still_waiting};
use crate::metrics::IngestMetrics;

/// A Remember waiting for its batch: the command, what the pure analysis found, and the caller's
/// trace context for the event announcing a new entry (empty when no events are published).
pub(crate) struct QueuedRemember {
    pub(crate) command: RememberCommand,
    pub(crate) analysis: Analysis,
    pub(crate) trace_headers: HashMap<String, String>,
}

use engram_bus::queues::routes::{
    EMBEDDING_REQUESTED as EMBEDDING_REQUESTED_KEY, EMBEDDING_REQUESTED_TYPE,
};

/// The EmbeddingRequested event for a new entry, stored in the outbox by the transaction that
/// writes the entry. `trace_headers` carry the trace of the request that wrote it (see
/// [`engram_bus::current_trace_headers`]).
pub fn embedding_requested(
    memory_id: Uuid,
    scope: &engram_core::Scope,
    trace_headers: HashMap<String, String>,
) -> NewOutboxEvent {
    let event = v1::EmbeddingRequested {
        memory_id: memory_id.to_string(),
        scope: Some(v1::Scope {
            user_id: scope.user_id.to_string(),
            space: scope.space.to_string(),
        }),
        kind: v1::MemoryKind::Semantic.into(),
        requested_at: Some(engram_server::time::to_proto(chrono::Utc::now())),
    };
    NewOutboxEvent {
        message_id: Uuid::now_v7(),
        routing_key: EMBEDDING_REQUESTED_KEY.into(),
        type_name: EMBEDDING_REQUESTED_TYPE.into(),
        payload: event.encode_to_vec(),
        trace_headers,
    }
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

/// Carries out batches of Remembers.
#[derive(Debug)]
pub(crate) struct RememberBatches {
    pub(crate) pool: PgPool,
    pub(crate) settings: Arc<MemorySettings>,
    pub(crate) metrics: Arc<IngestMetrics>,
    pub(crate) hooks: Arc<BackfillHooks>,
}

impl BatchCommitter for RememberBatches {
    type Write = QueuedRemember;
    type Output = RememberResult;

    async fn commit(&self, batch: Vec<Queued<QueuedRemember, RememberResult>>) -> usize {
        let batch = take_callers_still_waiting(batch);
        let answered = batch.len();
        if batch.is_empty() {
            return 0;
        }
        self.metrics.record_write_batch(batch.len());
        let started = Instant::now();
        let writes: Vec<&QueuedRemember> = batch.iter().map(|queued| &queued.write).collect();
        let written = self.write_in_one_transaction(&writes).await;
        tracing::debug!(
            writes = batch.len(),
            elapsed_us = started.elapsed().as_micros() as u64,
            ok = written.is_ok(),
            "group commit"
        );
        match written {
            Ok(results) => {
                for (queued, result) in batch.into_iter().zip(results) {
                    queued.answer(Ok(result));
                }
            }
            Err(BatchFailure::Refused(error)) if batch.len() > 1 => {
                tracing::warn!(%error, writes = batch.len(), "the database refused a group commit; writing each alone");
                for queued in batch {
                    if queued.caller_left() {
                        continue;
                    }
                    let result = self
                        .write_in_one_transaction(&[&queued.write])
                        .await
                        .map(|mut results| results.remove(0))
                        .map_err(BatchFailure::error);
                    queued.answer(result);
                }
            }
            Err(failure) => {
                // One failure for everyone: each caller gets its own copy of it.
                let shared = Arc::new(failure.error());
                for queued in batch {
                    queued.answer(Err(IngestError::Shared(shared.clone())));
                }
            }
        }
        answered
    }
}

impl RememberBatches {
    /// The whole batch in one transaction; one result per write, in order.
    async fn write_in_one_transaction(
        &self,
        writes: &[&QueuedRemember],
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
        writes: &[&QueuedRemember],
    ) -> Result<
        (
            sqlx::Transaction<'static, sqlx::Postgres>,
            Vec<RememberResult>,
        ),
        IngestError,
    > {
        let mut transaction = engram_store::begin_with_spaces_locked(
            &self.pool,
            engram_store::SpaceAccess::WriteEntries,
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

    /// The write path for one write per space (`round` indexes `writes`): each write's context
    /// read at once, each decided (skip, merge or create), the merges and inserts in one
    /// statement, then the soft caps and the facts the new ones supersede.
    async fn write_round(
        &self,
        connection: &mut PgConnection,
        writes: &[&QueuedRemember],
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
        let RoundPlan { merging, creates } =
            plan_round(connection, writes, round, &contexts, results).await?;

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
        let audited_merges = audited_merges(writes, &merging, &updates);

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
                self.hooks.announce_embeddings().then(|| {
                    embedding_requested(
                        memory.id,
                        &writes[*at].command.scope,
                        writes[*at].trace_headers.clone(),
                    )
                })
            })
            .collect();
        let inserts = audited_inserts(writes, &creates, &new_memories, &events);
        let written = write_path::write_entries(connection, &audited_merges, &inserts).await?;
        for ((at, _), memory) in merging.iter().zip(written.merged) {
            results[*at] = Some(RememberResult::Merged { memory });
        }

        let mut trimmed_by_create = self
            .enforce_soft_caps(connection, writes, &creates, &retention)
            .await?;
        // A new fact that states another value of a subject supersedes the older ones (unless
        // the soft cap took it at once: then the older ones stay as they were).
        let trimmed_now: HashSet<Uuid> = trimmed_by_create.values().flatten().copied().collect();
        let superseding: Vec<Superseding<'_>> = creates
            .iter()
            .zip(&new_memories)
            .filter(|(_, memory)| !trimmed_now.contains(&memory.id))
            .filter_map(|((at, _), memory)| {
                Some(Superseding {
                    scope: &writes[*at].command.scope,
                    new_fact: memory.id,
                    subject: memory.fact_subject.as_deref()?,
                    value: memory.fact_value.as_deref()?,
                    conversation: writes[*at].command.conversation,
                })
            })
            .collect();
        let superseded = write_path::supersede_facts(connection, &superseding).await?;
        if !superseded.is_empty() {
            self.metrics
                .record_facts_superseded(superseded.len() as u64);
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

    /// Trims every space the round's new entries took over its soft cap; returns what each
    /// create's space lost, by the create's index in `creates`.
    async fn enforce_soft_caps(
        &self,
        connection: &mut PgConnection,
        writes: &[&QueuedRemember],
        creates: &[(usize, &WriteContext)],
        retention: &RetentionPolicy,
    ) -> Result<HashMap<usize, Vec<Uuid>>, IngestError> {
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
        let outcomes = write_path::enforce_soft_caps(connection, &targets, retention).await?;
        let mut trimmed_by_create = HashMap::new();
        for ((index, target), outcome) in over_cap.iter().zip(outcomes) {
            self.report_trim(target, outcome.clone());
            trimmed_by_create.insert(*index, outcome.trimmed);
        }
        Ok(trimmed_by_create)
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
fn rounds(writes: &[&QueuedRemember]) -> Vec<Vec<usize>> {
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

/// What a round writes: the merges (the write's index and the near-duplicate it folds into)
/// and the creates (the write's index and its context).
struct RoundPlan<'c> {
    merging: Vec<(usize, &'c MemoryRecord)>,
    creates: Vec<(usize, &'c WriteContext)>,
}

/// Decides each write of the round against its context. A skipped write gets its result here;
/// one a tombstone blocks is audited, though nothing is written: the user acted, and "forget
/// that" in the same conversation must know that "that" was not saved.
async fn plan_round<'c>(
    connection: &mut PgConnection,
    writes: &[&QueuedRemember],
    round: &[usize],
    contexts: &'c [WriteContext],
    results: &mut [Option<RememberResult>],
) -> Result<RoundPlan<'c>, IngestError> {
    let mut plan = RoundPlan {
        merging: Vec::new(),
        creates: Vec::new(),
    };
    for (&at, context) in round.iter().zip(contexts) {
        match decide(&writes[at].command, context) {
            Decision::Skip(skipped) => {
                if let Skipped::Tombstone { expires_at } = skipped {
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
            Decision::Merge(existing) => plan.merging.push((at, existing)),
            Decision::AlreadyHeld(existing) => {
                results[at] = Some(RememberResult::Merged {
                    memory: existing.clone(),
                });
            }
            Decision::Create => plan.creates.push((at, context)),
        }
    }
    Ok(plan)
}

/// The merges of a round with their audit events.
fn audited_merges<'a>(
    writes: &[&'a QueuedRemember],
    merging: &[(usize, &MemoryRecord)],
    updates: &'a [MergeUpdate],
) -> Vec<AuditedMerge<'a>> {
    merging
        .iter()
        .zip(updates)
        .map(|((at, existing), update)| AuditedMerge {
            scope: &writes[*at].command.scope,
            id: existing.id,
            update,
            conversation: writes[*at].command.conversation,
            audit_detail: merge_audit_detail(&writes[*at].command, update),
            pins: update.pinned && !existing.pinned,
        })
        .collect()
}

/// The new entries of a round with their audit events and, when announced, their outbox
/// events.
fn audited_inserts<'a>(
    writes: &[&'a QueuedRemember],
    creates: &[(usize, &WriteContext)],
    new_memories: &'a [NewSemanticMemory],
    events: &'a [Option<NewOutboxEvent>],
) -> Vec<AuditedInsert<'a>> {
    creates
        .iter()
        .zip(new_memories)
        .zip(events)
        .map(|(((at, _), memory), event)| AuditedInsert {
            scope: &writes[*at].command.scope,
            memory,
            audit_detail: create_audit_detail(&writes[*at].command, &writes[*at].analysis),
            event: event.as_ref(),
        })
        .collect()
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
    fn distinct_spaces_make_one_round() {
        assert_eq!(rounds_by_key(["a", "b", "c"].iter()), vec![vec![0, 1, 2]]);
        assert!(rounds_by_key(std::iter::empty::<&str>()).is_empty());
    }
}
