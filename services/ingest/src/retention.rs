//! The retention job: deletes what each space's retention rules say is kept no longer, and finds
//! entries that have become inactive (`engram_core::retention`).
//!
//! A run goes through the spaces one at a time, in four steps, each in bounded batches (one
//! transaction per batch, holding the space's lock like every write of the space, so a batch
//! never waits on, or hides from, a Remember):
//! 1. raw turns of segments closed longer ago than the turn retention (TURNS_SUMMARIZED);
//! 2. entries older than the maximum age (AGE);
//! 3. entries inactive for longer than the grace period (INACTIVE);
//! 4. entries unused for the inactivity period become inactive.
//!
//! Every deleted entry leaves a tombstone, as Forget does, and an audit event with its reason;
//! each conversation's deleted turns one event; each space's run one event with its counts.
//! Runs are started by every replica, but a session advisory lock lets only one run at a time:
//! the others skip that round. A run that dies releases the lock with its connection.

use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{DateTime, SubsecRound, Utc};
use engram_core::retention::{DataRetention, DeletionReason, RetentionOverrides};
use engram_core::{ConversationId, Scope};
use engram_store::audit::{self, AuditAction};
use engram_store::memories;
use engram_store::retention::{self as store, EntryCutoffs, PreviewCounts, PreviewEntry};
use engram_store::tombstones::{self, NewTombstone};
use serde_json::json;
use sqlx::PgPool;
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
}

impl SpaceRun {
    fn is_empty(&self) -> bool {
        *self == Self::default()
    }
}

/// What one run did.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RunReport {
    pub started_at: DateTime<Utc>,
    pub spaces: Vec<(Scope, SpaceRun)>,
    pub took: Duration,
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
    pub fn new(
        pool: PgPool,
        settings: RetentionSettings,
        tombstone_ttl: chrono::Duration,
        metrics: Arc<IngestMetrics>,
    ) -> Self {
        let days = settings.inactivity().days_below_per_stability_day();
        Self {
            pool,
            seconds_per_stability_day: days.is_finite().then_some(days * 86_400.0),
            settings: Arc::new(settings),
            tombstone_ttl,
            metrics,
        }
    }

    /// The rules every space follows unless it set its own.
    pub fn defaults(&self) -> RetentionOverrides {
        self.settings.defaults()
    }

    fn cutoffs(&self, policy: &DataRetention, now: DateTime<Utc>) -> EntryCutoffs {
        let cutoffs = policy.cutoffs(now);
        EntryCutoffs {
            created_before: cutoffs.created_before,
            inactive_before: cutoffs.inactive_before,
            unused_since: cutoffs.unused_since,
            seconds_per_stability_day: self.seconds_per_stability_day,
            fact_importance_below: self.settings.inactive_fact_importance_below,
        }
    }

    /// Runs every `interval_secs` until `stop` turns true.
    pub async fn run(self, mut stop: watch::Receiver<bool>) {
        let interval = Duration::from_secs(self.settings.interval_secs.max(1));
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
            match self.run_once(Utc::now()).await {
                Ok(Some(report)) => tracing::info!(
                    spaces = report.spaces.len(),
                    entries_deleted = report.entries_deleted(),
                    turns_deleted = report.turns_deleted(),
                    took_ms = report.took.as_millis() as u64,
                    "retention run completed"
                ),
                Ok(None) => tracing::debug!("retention run skipped: another replica is running it"),
                Err(error) => tracing::warn!(%error, "retention run failed; the next one retries"),
            }
        }
    }

    /// One run over every space, judged at `now`; `None` when another run holds the lock.
    #[tracing::instrument(skip_all, err(Display))]
    pub async fn run_once(&self, now: DateTime<Utc>) -> Result<Option<RunReport>, IngestError> {
        // A session lock: held until unlocked or until the connection closes (a replica that dies
        // mid-run releases it).
        let mut lock = self.pool.acquire().await?;
        let locked: bool = sqlx::query_scalar("SELECT pg_try_advisory_lock($1, $2)")
            .bind(LOCK_CLASS)
            .bind(LOCK_RETENTION)
            .fetch_one(&mut *lock)
            .await?;
        if !locked {
            self.metrics.record_retention_run("skipped", None);
            return Ok(None);
        }
        let started = Instant::now();
        let result = self.run_locked(now).await;
        let unlocked = sqlx::query("SELECT pg_advisory_unlock($1, $2)")
            .bind(LOCK_CLASS)
            .bind(LOCK_RETENTION)
            .execute(&mut *lock)
            .await;
        if unlocked.is_err() {
            // Never hand a session that may still hold the lock back to the pool: closing it
            // releases the lock.
            drop(lock.detach());
        }
        match result {
            Ok(spaces) => {
                let took = started.elapsed();
                self.metrics.record_retention_run("completed", Some(took));
                Ok(Some(RunReport {
                    started_at: now,
                    spaces,
                    took,
                }))
            }
            Err(error) => {
                self.metrics.record_retention_run("failed", None);
                Err(error)
            }
        }
    }

    async fn run_locked(&self, now: DateTime<Utc>) -> Result<Vec<(Scope, SpaceRun)>, IngestError> {
        let defaults = self.defaults();
        let mut after: Option<Scope> = None;
        let mut runs = Vec::new();
        loop {
            let page = store::spaces_page(&self.pool, after.as_ref(), SPACES_PAGE).await?;
            let Some(last) = page.last() else {
                return Ok(runs);
            };
            after = Some(last.scope.clone());
            for space in &page {
                let policy = space.overrides.resolve(&defaults);
                if policy.is_off() {
                    continue;
                }
                let run = self.run_space(&space.scope, &policy, now).await?;
                if !run.is_empty() {
                    runs.push((space.scope.clone(), run));
                }
            }
        }
    }

    async fn run_space(
        &self,
        scope: &Scope,
        policy: &DataRetention,
        now: DateTime<Utc>,
    ) -> Result<SpaceRun, IngestError> {
        let mut run = SpaceRun::default();
        let batch = self.settings.batch.max(1);
        if let Some(closed_before) = policy.cutoffs(now).turns_closed_before {
            loop {
                let done = self
                    .delete_turns(scope, closed_before, batch, &mut run)
                    .await?;
                if done < batch {
                    break;
                }
                self.pause().await;
            }
        }
        let cutoffs = self.cutoffs(policy, now);
        if let Some(created_before) = cutoffs.created_before {
            loop {
                let (deleted, taken) = self
                    .delete_entries(scope, DeletionReason::Age, created_before, batch)
                    .await?;
                run.past_max_age += deleted as u64;
                if (taken as i64) < batch {
                    break;
                }
                self.pause().await;
            }
        }
        if let Some(inactive_before) = cutoffs.inactive_before {
            loop {
                let (deleted, taken) = self
                    .delete_entries(scope, DeletionReason::Inactive, inactive_before, batch)
                    .await?;
                run.inactive += deleted as u64;
                if (taken as i64) < batch {
                    break;
                }
                self.pause().await;
            }
        }
        if cutoffs.unused_since.is_some() {
            loop {
                let mut transaction =
                    engram_store::begin_with_spaces_locked(&self.pool, [scope]).await?;
                let marked =
                    store::mark_inactive(&mut transaction, scope, &cutoffs, now, batch).await?;
                transaction.commit().await?;
                run.marked_inactive += marked.len() as u64;
                self.metrics
                    .record_retention_marked_inactive(marked.len() as u64);
                if (marked.len() as i64) < batch {
                    break;
                }
                self.pause().await;
            }
        }
        if !run.is_empty() {
            let mut connection = self.pool.acquire().await?;
            audit::append(
                &mut connection,
                scope,
                AuditAction::RetentionRun,
                None,
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
                }),
            )
            .await?;
        }
        Ok(run)
    }

    async fn pause(&self) {
        if self.settings.batch_pause_ms > 0 {
            tokio::time::sleep(Duration::from_millis(self.settings.batch_pause_ms)).await;
        }
    }

    /// One batch of summarized turns; returns how many conversations it took.
    async fn delete_turns(
        &self,
        scope: &Scope,
        closed_before: DateTime<Utc>,
        batch: i64,
        run: &mut SpaceRun,
    ) -> Result<i64, IngestError> {
        let mut transaction = engram_store::begin_with_spaces_locked(&self.pool, [scope]).await?;
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
        Ok(deleted.len() as i64)
    }

    /// One batch of entries due for `reason` before `cutoff`: how many were deleted, and how many
    /// were selected (a row gone between the selection and the delete, to a concurrent Forget,
    /// is not found again by the next batch).
    async fn delete_entries(
        &self,
        scope: &Scope,
        reason: DeletionReason,
        cutoff: DateTime<Utc>,
        batch: i64,
    ) -> Result<(usize, usize), IngestError> {
        let mut transaction = engram_store::begin_with_spaces_locked(&self.pool, [scope]).await?;
        let due: Vec<Uuid> = match reason {
            DeletionReason::Age => {
                store::due_for_age(&mut transaction, scope, cutoff, batch).await?
            }
            DeletionReason::Inactive => {
                store::due_for_inactive_deletion(&mut transaction, scope, cutoff, batch).await?
            }
            DeletionReason::TurnsSummarized => Vec::new(),
        };
        if due.is_empty() {
            return Ok((0, 0));
        }
        let deleted = memories::delete(&mut transaction, scope, &due).await?;
        let expires_at = (Utc::now() + self.tombstone_ttl).trunc_subsecs(6);
        let tombstones: Vec<NewTombstone> = deleted.iter().map(tombstone_for).collect();
        tombstones::insert_many(&mut transaction, scope, &tombstones, expires_at).await?;
        let events: Vec<(Uuid, serde_json::Value)> = deleted
            .iter()
            .map(|memory| {
                (
                    memory.id,
                    json!({
                        "reason": reason.as_str(),
                        "kind": memory.kind,
                        "created_at": memory.created_at,
                        "inactive_since": memory.inactive_since,
                        "tombstone_expires_at": expires_at,
                    }),
                )
            })
            .collect();
        audit::append_each(
            &mut transaction,
            scope,
            AuditAction::RetentionDelete,
            None,
            &events,
        )
        .await?;
        transaction.commit().await?;
        self.metrics
            .record_retention_deleted(reason, deleted.len() as u64);
        Ok((deleted.len(), due.len()))
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
        let (counts, entries) = store::preview(
            &self.pool,
            scope,
            policy.cutoffs(now).turns_closed_before,
            &self.cutoffs(&policy, now),
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
