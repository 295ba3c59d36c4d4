//! The retention job: deletes what each space's retention rules say is kept no longer, and finds
//! entries that have become inactive (`engram_core::retention`).
//!
//! A run reads the spaces a page at a time, finds in one statement what each has due, and then:
//! 1. deletes entries older than the maximum age (AGE), then entries inactive for longer than
//!    the grace period (INACTIVE), for groups of spaces at a time: one transaction per round of
//!    at most `batch` entries, holding the group's space locks like every write of them;
//! 2. space by space (a few at once): deletes the raw turns of segments closed longer ago than
//!    the turn retention (TURNS_SUMMARIZED), and finds the entries unused for the inactivity
//!    period (they become inactive), each in bounded batches under the space's lock.
//!
//! Every deleted entry leaves a tombstone, as Forget does, and an audit event with its reason;
//! each conversation's deleted turns one event; each space's run one event with its counts.
//! Runs are started by every replica, but a session advisory lock lets only one run at a time:
//! the others skip that round. A run that dies releases the lock with its connection.

use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{DateTime, SubsecRound, Utc};
use engram_core::retention::{DataRetention, DeletionReason, RetentionCutoffs, RetentionOverrides};
use engram_core::{ConversationId, Scope};
use engram_store::audit::{self, AuditAction};
use engram_store::memories;
use engram_store::retention::{
    self as store, DueBy, DueTarget, EntryCutoffs, PreviewCounts, PreviewEntry, SpaceCutoffs,
    SpaceWork,
};
use engram_store::tombstones;
use futures::StreamExt as _;
use serde_json::json;
use sqlx::pool::PoolConnection;
use sqlx::{PgPool, Postgres};
use tokio::sync::watch;
use uuid::Uuid;

use crate::config::RetentionSettings;
use crate::conversations::forget::tombstone_for;
use crate::error::IngestError;
use crate::metrics::IngestMetrics;

/// The key of the session advisory lock only one run holds (the two-integer key space, apart
/// from the per-space locks' one-bigint keys).
const LOCK_CLASS: i32 = 0x656e_6772; // "engr"
const LOCK_RETENTION: i32 = 1;

/// Spaces read per page while a run goes through them.
const SPACES_PAGE: i64 = 500;

/// Spaces whose due entries are deleted together, in one transaction per round (holding their
/// locks): most spaces have a few entries due, and a transaction per space would cost more
/// than the deletions.
const GROUP_SPACES: usize = 50;

/// The first run after start-up waits this long (or the interval, if shorter), so that a fleet
/// of replicas starting together does not all try at once.
const FIRST_RUN_DELAY: Duration = Duration::from_secs(60);

/// What one run did to one space.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SpaceRun {
    pub turns: u64,
    pub conversations: u64,
    pub past_max_age: u64,
    pub inactive: u64,
    pub marked_inactive: u64,
    /// Made active again because the space switched its inactivity rule off.
    pub reactivated: u64,
}

impl SpaceRun {
    fn is_empty(&self) -> bool {
        *self == Self::default()
    }

    fn add(&mut self, other: SpaceRun) {
        self.turns += other.turns;
        self.conversations += other.conversations;
        self.past_max_age += other.past_max_age;
        self.inactive += other.inactive;
        self.marked_inactive += other.marked_inactive;
        self.reactivated += other.reactivated;
    }
}

/// What one run did.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RunReport {
    pub spaces: Vec<(Scope, SpaceRun)>,
    /// Spaces the run could not finish (the error is logged; the next run tries them again).
    pub failed_spaces: u64,
    /// The service began shutting down: the run stopped between two batches.
    pub interrupted: bool,
    pub took: Duration,
}

/// What a run did in each space of one page, and which spaces failed.
struct PageRun {
    runs: Vec<SpaceRun>,
    failed: Vec<bool>,
}

impl RunReport {
    /// Entries deleted (AGE and INACTIVE), in every space.
    pub fn entries_deleted(&self) -> u64 {
        self.spaces
            .iter()
            .map(|(_, run)| run.past_max_age + run.inactive)
            .sum()
    }

    pub fn turns_deleted(&self) -> u64 {
        self.spaces.iter().map(|(_, run)| run.turns).sum()
    }
}

/// What a run at this instant would do to a space.
#[derive(Debug, Clone, PartialEq)]
pub struct RetentionPreview {
    pub policy: DataRetention,
    pub as_of: DateTime<Utc>,
    pub counts: PreviewCounts,
    pub entries: Vec<PreviewEntry>,
}

/// The connection holding the run's session lock. Dropped without [`RunLock::release`] (a
/// panic, a cancelled run), it closes the connection instead of returning it to the pool, so the
/// lock never lingers in a pooled session.
struct RunLock(Option<PoolConnection<Postgres>>);

impl RunLock {
    /// Takes the lock if no other session holds it.
    async fn try_take(pool: &PgPool) -> Result<Option<Self>, IngestError> {
        let mut connection = pool.acquire().await?;
        let locked: bool = sqlx::query_scalar("SELECT pg_try_advisory_lock($1, $2)")
            .bind(LOCK_CLASS)
            .bind(LOCK_RETENTION)
            .fetch_one(&mut *connection)
            .await?;
        Ok(locked.then_some(Self(Some(connection))))
    }

    async fn release(mut self) {
        if let Some(mut connection) = self.0.take() {
            let unlocked: Result<bool, _> = sqlx::query_scalar("SELECT pg_advisory_unlock($1, $2)")
                .bind(LOCK_CLASS)
                .bind(LOCK_RETENTION)
                .fetch_one(&mut *connection)
                .await;
            if !matches!(unlocked, Ok(true)) {
                // Closing the session is what surely releases the lock.
                drop(connection.detach());
            }
        }
    }
}

impl Drop for RunLock {
    fn drop(&mut self) {
        if let Some(connection) = self.0.take() {
            drop(connection.detach());
        }
    }
}

#[derive(Clone)]
pub struct RetentionJob {
    pool: PgPool,
    settings: Arc<RetentionSettings>,
    /// See `InactivityRule::days_below_per_stability_day`, in seconds; `None`: never.
    seconds_per_stability_day: Option<f64>,
    tombstone_ttl: chrono::Duration,
    metrics: Arc<IngestMetrics>,
}

impl std::fmt::Debug for RetentionJob {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("RetentionJob")
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

impl RetentionJob {
    /// Fails when a default is out of range (0 to 36,500 days).
    pub fn new(
        pool: PgPool,
        settings: RetentionSettings,
        tombstone_ttl: chrono::Duration,
        metrics: Arc<IngestMetrics>,
    ) -> anyhow::Result<Self> {
        for (name, days) in [
            (
                "retention.turn_retention_days",
                settings.turn_retention_days,
            ),
            ("retention.max_age_days", settings.max_age_days),
            (
                "retention.inactive_after_days",
                settings.inactive_after_days,
            ),
            (
                "retention.inactive_grace_days",
                settings.inactive_grace_days,
            ),
        ] {
            engram_core::retention::check_days(days)
                .map_err(|reason| anyhow::anyhow!("{name} {reason}"))?;
        }
        let days = settings.inactivity().days_below_per_stability_day();
        Ok(Self {
            pool,
            seconds_per_stability_day: days.is_finite().then_some(days * 86_400.0),
            settings: Arc::new(settings),
            tombstone_ttl,
            metrics,
        })
    }

    /// The rules every space follows unless it set its own.
    pub fn defaults(&self) -> RetentionOverrides {
        self.settings.defaults()
    }

    /// What the entry rules need of a space's cutoffs, with the service's own constants.
    fn entry_cutoffs(&self, cutoffs: &RetentionCutoffs) -> EntryCutoffs {
        EntryCutoffs {
            created_before: cutoffs.created_before,
            inactive_before: cutoffs.inactive_before,
            unused_since: cutoffs.unused_since,
            seconds_per_stability_day: self.seconds_per_stability_day,
            fact_importance_below: self.settings.inactive_fact_importance_below,
        }
    }

    /// Runs every `interval_secs` until `stop` turns true (a run under way stops at its next
    /// batch).
    pub async fn run(self, mut stop: watch::Receiver<bool>) {
        let interval = Duration::from_secs(self.settings.interval_secs);
        let mut ticks = tokio::time::interval_at(
            tokio::time::Instant::now() + FIRST_RUN_DELAY.min(interval),
            interval,
        );
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = ticks.tick() => {}
                _ = stop.changed() => return,
            }
            match self.run_until(Utc::now(), &stop).await {
                Ok(Some(report)) => tracing::info!(
                    spaces = report.spaces.len(),
                    entries_deleted = report.entries_deleted(),
                    turns_deleted = report.turns_deleted(),
                    failed_spaces = report.failed_spaces,
                    interrupted = report.interrupted,
                    took_ms = report.took.as_millis() as u64,
                    "retention run ended"
                ),
                Ok(None) => tracing::debug!("retention run skipped: another replica is running it"),
                Err(error) => tracing::warn!(%error, "retention run failed; the next one retries"),
            }
            if *stop.borrow() {
                return;
            }
        }
    }

    /// One run over every space, judged at `now`; `None` when another run holds the lock.
    pub async fn run_once(&self, now: DateTime<Utc>) -> Result<Option<RunReport>, IngestError> {
        let (_keep, never) = watch::channel(false);
        self.run_until(now, &never).await
    }

    /// [`RetentionJob::run_once`], stopping between two batches once `stop` is true.
    #[tracing::instrument(skip_all, err(Display))]
    pub async fn run_until(
        &self,
        now: DateTime<Utc>,
        stop: &watch::Receiver<bool>,
    ) -> Result<Option<RunReport>, IngestError> {
        // A session lock: held until released or until its connection closes (a replica that
        // dies mid-run releases it).
        let taken = RunLock::try_take(&self.pool).await;
        if taken.is_err() {
            self.metrics.record_retention_run("failed", None);
        }
        let Some(lock) = taken? else {
            self.metrics.record_retention_run("skipped", None);
            return Ok(None);
        };
        let started = Instant::now();
        let result = self.run_locked(now, stop).await;
        lock.release().await;
        match result {
            Ok(mut report) => {
                report.took = started.elapsed();
                let outcome = if report.failed_spaces > 0 {
                    "completed_with_failures"
                } else if report.interrupted {
                    "interrupted"
                } else {
                    "completed"
                };
                self.metrics
                    .record_retention_run(outcome, Some(report.took));
                Ok(Some(report))
            }
            Err(error) => {
                self.metrics.record_retention_run("failed", None);
                Err(error)
            }
        }
    }

    async fn run_locked(
        &self,
        now: DateTime<Utc>,
        stop: &watch::Receiver<bool>,
    ) -> Result<RunReport, IngestError> {
        let defaults = self.defaults();
        let mut report = RunReport::default();
        let mut after: Option<Scope> = None;
        loop {
            if *stop.borrow() {
                report.interrupted = true;
                return Ok(report);
            }
            let page = store::spaces_page(&self.pool, after.as_ref(), SPACES_PAGE).await?;
            let Some(last) = page.last() else {
                return Ok(report);
            };
            after = Some(last.scope.clone());
            let cutoffs: Vec<SpaceCutoffs<'_>> = page
                .iter()
                .map(|space| {
                    let cutoffs = space.overrides.resolve(&defaults).cutoffs(now);
                    SpaceCutoffs {
                        scope: &space.scope,
                        turns_closed_before: cutoffs.turns_closed_before,
                        entries: self.entry_cutoffs(&cutoffs),
                    }
                })
                .collect();
            self.run_page(&cutoffs, now, stop, &mut report).await;
        }
    }

    /// One page of spaces: what is due in each, the deletions by age and by inactivity, then
    /// the per-space steps; a space that fails is counted and left to the next run.
    async fn run_page(
        &self,
        cutoffs: &[SpaceCutoffs<'_>],
        now: DateTime<Utc>,
        stop: &watch::Receiver<bool>,
        report: &mut RunReport,
    ) {
        let work = match store::work_due(&self.pool, cutoffs).await {
            Ok(work) => work,
            Err(error) => {
                tracing::warn!(%error, spaces = cutoffs.len(), "retention could not read a page's work; the next run retries it");
                report.failed_spaces += cutoffs.len() as u64;
                return;
            }
        };
        let mut page = PageRun {
            runs: vec![SpaceRun::default(); cutoffs.len()],
            failed: vec![false; cutoffs.len()],
        };
        // Deletions by age, then by inactivity, many spaces per transaction.
        for (reason, rule) in [
            (DeletionReason::Age, DueBy::Age),
            (DeletionReason::Inactive, DueBy::Inactivity),
        ] {
            self.delete_due(cutoffs, &work, reason, rule, stop, &mut page)
                .await;
        }
        self.run_per_space_steps(cutoffs, &work, now, stop, &mut page)
            .await;
        if let Err(error) = self.audit_runs(cutoffs, &page.runs, now).await {
            // What was deleted is audited entry by entry; the page's summaries are lost.
            tracing::warn!(%error, "retention could not audit a page's run summaries");
        }
        report.failed_spaces += page.failed.iter().filter(|failed| **failed).count() as u64;
        report.spaces.extend(
            cutoffs
                .iter()
                .zip(page.runs)
                .filter(|(_, run)| !run.is_empty())
                .map(|(space, run)| (space.scope.clone(), run)),
        );
    }

    /// The deletions `rule` makes due in the page's spaces, a group of spaces per transaction.
    async fn delete_due(
        &self,
        cutoffs: &[SpaceCutoffs<'_>],
        work: &[SpaceWork],
        reason: DeletionReason,
        rule: DueBy,
        stop: &watch::Receiver<bool>,
        page: &mut PageRun,
    ) {
        let due: Vec<(usize, DateTime<Utc>)> = cutoffs
            .iter()
            .zip(work)
            .enumerate()
            .filter_map(|(index, (space, work))| match rule {
                DueBy::Age if work.past_max_age => {
                    space.entries.created_before.map(|cutoff| (index, cutoff))
                }
                DueBy::Inactivity if work.inactive => {
                    space.entries.inactive_before.map(|cutoff| (index, cutoff))
                }
                _ => None,
            })
            .collect();
        let record = |runs: &mut [SpaceRun], deleted: Vec<(usize, u64)>| {
            for (index, count) in deleted {
                match reason {
                    DeletionReason::Age => runs[index].past_max_age += count,
                    _ => runs[index].inactive += count,
                }
            }
        };
        // A round never takes more than `batch` entries, so never more spaces either.
        let group_size = GROUP_SPACES.min(self.settings.batch as usize);
        for group in due.chunks(group_size) {
            let (deleted, outcome) = self.delete_group(cutoffs, group, reason, rule, stop).await;
            record(&mut page.runs, deleted);
            let Err(error) = outcome else {
                continue;
            };
            // One space's failure (a deadlock, a statement timeout) must not hold back the
            // others of its group: each is tried again alone, and only those that fail alone
            // count as failed (the next run retries them).
            tracing::warn!(%error, spaces = group.len(), "retention deletions failed in a group of spaces; trying them one by one");
            for single in group.chunks(1) {
                let (deleted, outcome) =
                    self.delete_group(cutoffs, single, reason, rule, stop).await;
                record(&mut page.runs, deleted);
                if let Err(error) = outcome {
                    let index = single[0].0;
                    page.failed[index] = true;
                    tracing::warn!(
                        %error,
                        user_id = %cutoffs[index].scope.user_id,
                        space = %cutoffs[index].scope.space,
                        "retention deletions failed in a space; the next run retries it"
                    );
                }
            }
        }
    }

    /// The steps that are rare and per space (turns, finding inactive entries), a few spaces at
    /// a time.
    async fn run_per_space_steps(
        &self,
        cutoffs: &[SpaceCutoffs<'_>],
        work: &[SpaceWork],
        now: DateTime<Utc>,
        stop: &watch::Receiver<bool>,
        page: &mut PageRun,
    ) {
        // The futures are gathered first: a stream over the iterator's closures would not be
        // Send across the await.
        let mut per_space = Vec::new();
        for (index, (space, work)) in cutoffs.iter().zip(work).enumerate() {
            if work.turns || work.becoming_inactive || work.reactivate {
                per_space.push(self.indexed_run(index, space, *work, now, stop));
            }
        }
        let finished: Vec<(usize, Result<SpaceRun, IngestError>)> =
            futures::stream::iter(per_space)
                .buffer_unordered(self.settings.concurrency)
                .collect()
                .await;
        for (index, run) in finished {
            match run {
                Ok(run) => page.runs[index].add(run),
                // One space's failure (a statement timeout, say) must not hold back the others;
                // the next run tries it again.
                Err(error) => {
                    page.failed[index] = true;
                    tracing::warn!(
                        %error,
                        user_id = %cutoffs[index].scope.user_id,
                        space = %cutoffs[index].scope.space,
                        "retention of a space failed; the next run retries it"
                    );
                }
            }
        }
    }

    /// One `RETENTION_RUN` event per space that had something done, in one statement.
    async fn audit_runs(
        &self,
        spaces: &[SpaceCutoffs<'_>],
        runs: &[SpaceRun],
        now: DateTime<Utc>,
    ) -> Result<(), IngestError> {
        let events: Vec<(&Scope, Option<Uuid>, serde_json::Value)> = spaces
            .iter()
            .zip(runs)
            .filter(|(_, run)| !run.is_empty())
            .map(|(space, run)| {
                (
                    space.scope,
                    None,
                    json!({
                        "started_at": now,
                        "deleted": {
                            DeletionReason::TurnsSummarized.as_str(): run.turns,
                            DeletionReason::Age.as_str(): run.past_max_age,
                            DeletionReason::Inactive.as_str(): run.inactive,
                        },
                        "conversations_with_turns_deleted": run.conversations,
                        "marked_inactive": run.marked_inactive,
                        "reactivated": run.reactivated,
                    }),
                )
            })
            .collect();
        if events.is_empty() {
            return Ok(());
        }
        let mut transaction = self.begin([]).await?;
        audit::append_across(&mut transaction, AuditAction::RetentionRun, None, &events).await?;
        transaction.commit().await?;
        Ok(())
    }

    /// Deletes what `rule` makes due in a group of spaces (page indexes with their cutoffs), a
    /// transaction per round holding the group's locks; a space leaves the group when its due
    /// entries run out. Returns how many entries each space lost in the rounds that committed,
    /// and how the last round ended.
    async fn delete_group(
        &self,
        spaces: &[SpaceCutoffs<'_>],
        group: &[(usize, DateTime<Utc>)],
        reason: DeletionReason,
        rule: DueBy,
        stop: &watch::Receiver<bool>,
    ) -> (Vec<(usize, u64)>, Result<(), IngestError>) {
        let mut deleted = vec![0u64; group.len()];
        let outcome = self
            .delete_group_rounds(spaces, group, reason, rule, stop, &mut deleted)
            .await;
        let counts = group
            .iter()
            .zip(deleted)
            .map(|((index, _), count)| (*index, count))
            .collect();
        (counts, outcome)
    }

    async fn delete_group_rounds(
        &self,
        spaces: &[SpaceCutoffs<'_>],
        group: &[(usize, DateTime<Utc>)],
        reason: DeletionReason,
        rule: DueBy,
        stop: &watch::Receiver<bool>,
        deleted_per_space: &mut [u64],
    ) -> Result<(), IngestError> {
        let mut pending: Vec<(usize, DateTime<Utc>, store::Cursor)> = group
            .iter()
            .map(|(index, cutoff)| (*index, *cutoff, None))
            .collect();
        let position: std::collections::HashMap<usize, usize> = group
            .iter()
            .enumerate()
            .map(|(at, (index, _))| (*index, at))
            .collect();
        let batch = self.settings.batch;
        while !pending.is_empty() && !*stop.borrow() {
            // A round takes at most `batch` entries in all.
            let per_space = (batch / pending.len() as i64).max(1);
            let scopes: Vec<&Scope> = pending
                .iter()
                .map(|(index, ..)| spaces[*index].scope)
                .collect();
            let mut transaction = self.begin(scopes.iter().copied()).await?;
            let targets: Vec<DueTarget<'_>> = pending
                .iter()
                .map(|(index, cutoff, after)| DueTarget {
                    scope: spaces[*index].scope,
                    cutoff: *cutoff,
                    after: *after,
                })
                .collect();
            let due = store::due_across(&mut transaction, rule, &targets, per_space).await?;
            let entries: Vec<(&Scope, Uuid)> = due
                .iter()
                .map(|(target, id, _)| (targets[*target as usize].scope, *id))
                .collect();
            let deleted = memories::delete_across(&mut transaction, &entries).await?;
            let target_of: std::collections::HashMap<Uuid, usize> = due
                .iter()
                .map(|(target, id, _)| (*id, *target as usize))
                .collect();
            let expires_at = (Utc::now() + self.tombstone_ttl).trunc_subsecs(6);
            let mut tombstones = Vec::with_capacity(deleted.len());
            let mut events = Vec::with_capacity(deleted.len());
            // Counted once the round committed: a round that fails deleted nothing.
            let mut round_deleted = vec![0u64; pending.len()];
            for memory in &deleted {
                let Some(&target) = target_of.get(&memory.id) else {
                    continue;
                };
                let scope = targets[target].scope;
                tombstones.push((scope, tombstone_for(memory)));
                events.push((
                    scope,
                    Some(memory.id),
                    json!({
                        "reason": reason.as_str(),
                        "kind": memory.kind,
                        "created_at": memory.created_at,
                        "inactive_since": memory.inactive_since,
                        "tombstone_expires_at": expires_at,
                    }),
                ));
                round_deleted[target] += 1;
            }
            tombstones::insert_many(&mut transaction, &tombstones, expires_at).await?;
            audit::append_across(
                &mut transaction,
                AuditAction::RetentionDelete,
                None,
                &events,
            )
            .await?;
            transaction.commit().await?;
            for ((index, ..), count) in pending.iter().zip(&round_deleted) {
                deleted_per_space[position[index]] += count;
            }
            self.metrics
                .record_retention_deleted(reason, deleted.len() as u64);
            // A space whose round was full may have more; the others are done.
            let mut taken = vec![(0i64, None); pending.len()];
            for (target, id, key) in &due {
                let slot = &mut taken[*target as usize];
                slot.0 += 1;
                slot.1 = Some((*key, *id));
            }
            pending = pending
                .into_iter()
                .zip(taken)
                .filter(|(_, (count, _))| *count >= per_space)
                .map(|((index, cutoff, _), (_, cursor))| (index, cutoff, cursor))
                .collect();
            self.pause().await;
        }
        Ok(())
    }

    async fn indexed_run(
        &self,
        index: usize,
        space: &SpaceCutoffs<'_>,
        work: SpaceWork,
        now: DateTime<Utc>,
        stop: &watch::Receiver<bool>,
    ) -> (usize, Result<SpaceRun, IngestError>) {
        if *stop.borrow() {
            return (index, Ok(SpaceRun::default()));
        }
        (index, self.run_space(space, work, now, stop).await)
    }

    /// The per-space steps `work` says have something to do: raw turns, finding inactive
    /// entries, making them active again when the rule is off.
    async fn run_space(
        &self,
        space: &SpaceCutoffs<'_>,
        work: SpaceWork,
        now: DateTime<Utc>,
        stop: &watch::Receiver<bool>,
    ) -> Result<SpaceRun, IngestError> {
        let scope = space.scope;
        let mut run = SpaceRun::default();
        let batch = self.settings.batch;
        if let (true, Some(closed_before)) = (work.turns, space.turns_closed_before) {
            // A batch of `batch` segments may span fewer conversations, so the phase goes on
            // until a batch finds nothing due (each one removes the segments it took).
            while self
                .delete_turns(scope, closed_before, batch, &mut run)
                .await?
                > 0
            {
                if *stop.borrow() {
                    break;
                }
                self.pause().await;
            }
        }
        if work.becoming_inactive && !*stop.borrow() {
            let mut cursor = None;
            loop {
                let mut transaction = self.begin([scope]).await?;
                let (marked, next) = store::mark_inactive(
                    &mut transaction,
                    scope,
                    &space.entries,
                    now,
                    cursor,
                    batch,
                )
                .await?;
                transaction.commit().await?;
                run.marked_inactive += marked.len() as u64;
                self.metrics
                    .record_retention_marked_inactive(marked.len() as u64);
                cursor = next;
                if (marked.len() as i64) < batch || *stop.borrow() {
                    break;
                }
                self.pause().await;
            }
        }
        if work.reactivate {
            // Without the rule nothing is inactive (the space switched it off).
            let mut connection = self.pool.acquire().await?;
            run.reactivated = store::reactivate_all(&mut connection, scope).await?;
        }
        Ok(run)
    }

    /// A transaction of the job: holding the spaces' locks, like every write of them, and
    /// committed without waiting for the WAL flush. A crash can undo the last few hundred
    /// milliseconds of a run (a deletion with its tombstone and audit event, all or nothing; an
    /// entry found inactive, whose grace period then starts at the next run); the next run does
    /// them again. Waiting for a flush per batch would make the disk, not the
    /// work, set the pace: most spaces need one small batch.
    async fn begin<'a>(
        &self,
        scopes: impl IntoIterator<Item = &'a Scope>,
    ) -> Result<sqlx::Transaction<'static, Postgres>, IngestError> {
        let mut transaction = engram_store::begin_with_spaces_locked(
            &self.pool,
            engram_store::SpaceAccess::Exclusive,
            scopes,
        )
        .await?;
        sqlx::query("SET LOCAL synchronous_commit = off")
            .execute(&mut *transaction)
            .await?;
        Ok(transaction)
    }

    async fn pause(&self) {
        if self.settings.batch_pause_ms > 0 {
            tokio::time::sleep(Duration::from_millis(self.settings.batch_pause_ms)).await;
        }
    }

    /// One batch of summarized turns (the `batch` oldest due segments); returns how many
    /// conversations it took (0: nothing was due any more).
    async fn delete_turns(
        &self,
        scope: &Scope,
        closed_before: DateTime<Utc>,
        batch: i64,
        run: &mut SpaceRun,
    ) -> Result<usize, IngestError> {
        let mut transaction = self.begin([scope]).await?;
        let deleted =
            store::delete_summarized_turns(&mut transaction, scope, closed_before, batch).await?;
        for conversation in deleted.iter().filter(|deleted| deleted.turns > 0) {
            audit::append(
                &mut transaction,
                scope,
                AuditAction::RetentionDelete,
                None,
                Some(ConversationId::from_uuid(conversation.conversation_id)),
                json!({
                    "reason": DeletionReason::TurnsSummarized.as_str(),
                    "turns": conversation.turns,
                    "through_turn_index": conversation.through,
                    "episode_excerpts_cleared": conversation.excerpts_cleared,
                }),
            )
            .await?;
        }
        transaction.commit().await?;
        let turns: i64 = deleted.iter().map(|conversation| conversation.turns).sum();
        run.turns += turns as u64;
        run.conversations += deleted.iter().filter(|deleted| deleted.turns > 0).count() as u64;
        self.metrics
            .record_retention_deleted(DeletionReason::TurnsSummarized, turns as u64);
        Ok(deleted.len())
    }

    /// What a run now would do to the space (PreviewRetention). Reads only.
    pub async fn preview(
        &self,
        scope: &Scope,
        overrides: &RetentionOverrides,
        page_size: u32,
    ) -> Result<RetentionPreview, IngestError> {
        let now = Utc::now().trunc_subsecs(6);
        let policy = overrides.resolve(&self.defaults());
        let cutoffs = policy.cutoffs(now);
        let (counts, entries) = store::preview(
            &self.pool,
            scope,
            cutoffs.turns_closed_before,
            &self.entry_cutoffs(&cutoffs),
            i64::from(page_size),
        )
        .await?;
        Ok(RetentionPreview {
            policy,
            as_of: now,
            counts,
            entries,
        })
    }
}
