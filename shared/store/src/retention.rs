//! The statements of retention (`engram_core::retention`): which spaces have rules, which turns
//! and entries a run deletes or finds inactive, and the preview of the same. The conditions are
//! written once (the macros below), so a preview and a run at the same instant select the same
//! rows; each run statement adds only the index-friendly bounds they imply, and a batch limit.

use chrono::{DateTime, Utc};
use engram_core::Scope;
use engram_core::retention::RetentionOverrides;
use sqlx::{PgConnection, PgPool};
use uuid::Uuid;

use crate::StoreError;

/// SQL: entry `m` is older than `$created_before` and neither pinned nor saved (false when the
/// instant is NULL: the rule is off).
macro_rules! due_for_age {
    ($created_before:literal) => {
        concat!(
            "COALESCE(m.created_at < ",
            $created_before,
            "::timestamptz AND NOT m.pinned AND NOT m.manually_saved, false)"
        )
    };
}

/// SQL: entry `m` has been inactive since before `$inactive_before` and is neither pinned nor
/// saved.
macro_rules! due_for_inactive_deletion {
    ($inactive_before:literal) => {
        concat!(
            "COALESCE(m.inactive_since < ",
            $inactive_before,
            "::timestamptz AND NOT m.pinned AND NOT m.manually_saved, false)"
        )
    };
}

/// SQL: entry `m` (with its `memory_retention` row `r`) is active, neither pinned nor saved,
/// created before `$unused_since` and unused since then: no retrieval returned it
/// (`r.last_returned_at`, at most a day stale) and no write touched it (`m.updated_at`: create,
/// merge, pin, review), and
/// - an episode: its retrievability has been below the threshold since before then, i.e. its
///   last review is more than `stability * $seconds_per_stability_day` seconds before it;
/// - a fact: never said again and of importance below `$fact_importance_below`.
macro_rules! becoming_inactive {
    ($unused_since:literal, $seconds_per_stability_day:literal, $fact_importance_below:literal) => {
        concat!(
            "COALESCE(m.inactive_since IS NULL AND NOT m.pinned AND NOT m.manually_saved \
               AND m.created_at < ",
            $unused_since,
            "::timestamptz AND GREATEST(r.last_returned_at, m.updated_at) < ",
            $unused_since,
            "::timestamptz AND CASE WHEN m.kind = 'episodic' \
                 THEN extract(epoch FROM ",
            $unused_since,
            "::timestamptz - m.last_reviewed_at) > m.stability * ",
            $seconds_per_stability_day,
            "::float8 \
                 ELSE m.repeat_count = 0 AND m.importance < ",
            $fact_importance_below,
            "::float8 END, false)"
        )
    };
}

/// SQL: the conversations of space (`$1`, `$2`) with segments closed before `$closed_before`,
/// each with the last turn of the latest such segment (`through`): every turn up to it is due.
macro_rules! summarized_turns_due {
    ($closed_before:literal) => {
        concat!(
            "SELECT conversation_id, max(last_turn_index) AS through FROM summarized_segments \
             WHERE user_id = $1 AND space = $2 AND closed_at < ",
            $closed_before,
            "::timestamptz GROUP BY conversation_id"
        )
    };
}

/// What one space's rules are judged by at one instant.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EntryCutoffs {
    pub created_before: Option<DateTime<Utc>>,
    pub inactive_before: Option<DateTime<Utc>>,
    pub unused_since: Option<DateTime<Utc>>,
    /// Seconds after its last review, per day of stability, at which an episode's
    /// retrievability is below the threshold; `None`: never.
    pub seconds_per_stability_day: Option<f64>,
    pub fact_importance_below: f64,
}

/// A space with rows, and its own retention rules.
#[derive(Debug, Clone, PartialEq)]
pub struct SpaceRules {
    pub scope: Scope,
    pub overrides: RetentionOverrides,
}

#[derive(sqlx::FromRow)]
struct SpaceRulesRow {
    user_id: Uuid,
    space: String,
    turn_retention_days: Option<i32>,
    max_age_days: Option<i32>,
    inactive_after_days: Option<i32>,
    inactive_grace_days: Option<i32>,
}

/// Spaces in (user, space) order after `after`, up to `limit`. A row that no longer makes a
/// valid scope (it cannot: every space is written through a validated scope) is skipped.
pub async fn spaces_page(
    pool: &PgPool,
    after: Option<&Scope>,
    limit: i64,
) -> Result<Vec<SpaceRules>, StoreError> {
    let rows: Vec<SpaceRulesRow> = sqlx::query_as(
        "SELECT user_id, space, turn_retention_days, max_age_days, inactive_after_days, \
                inactive_grace_days FROM spaces \
         WHERE $1::uuid IS NULL OR (user_id, space) > ($1, $2) \
         ORDER BY user_id, space LIMIT $3",
    )
    .bind(after.map(|scope| scope.user_id.as_uuid()))
    .bind(after.map(|scope| scope.space.as_str()).unwrap_or(""))
    .bind(limit)
    .fetch_all(pool)
    .await?;
    Ok(rows
        .into_iter()
        .filter_map(|row| {
            let scope = Scope::parse("scope", &row.user_id.to_string(), &row.space).ok()?;
            Some(SpaceRules {
                scope,
                overrides: crate::spaces::stored_retention([
                    row.turn_retention_days,
                    row.max_age_days,
                    row.inactive_after_days,
                    row.inactive_grace_days,
                ]),
            })
        })
        .collect())
}

/// One space's cutoffs, as a run judges it.
#[derive(Debug, Clone, Copy)]
pub struct SpaceCutoffs<'a> {
    pub scope: &'a Scope,
    pub turns_closed_before: Option<DateTime<Utc>>,
    pub entries: EntryCutoffs,
}

/// Which steps of a run have something to do in a space.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, sqlx::FromRow)]
pub struct SpaceWork {
    pub turns: bool,
    pub past_max_age: bool,
    pub inactive: bool,
    pub becoming_inactive: bool,
    /// The inactivity rule is off and some entries are still inactive.
    pub reactivate: bool,
}

/// What each space has to do (in the order given), found in one statement: most spaces have
/// nothing due on most runs, and finding that out costs one index probe per step, not a
/// transaction per step. Every space must share `seconds_per_stability_day` and
/// `fact_importance_below` (service settings).
pub async fn work_due(
    pool: &PgPool,
    spaces: &[SpaceCutoffs<'_>],
) -> Result<Vec<SpaceWork>, StoreError> {
    let Some(first) = spaces.first() else {
        return Ok(Vec::new());
    };
    let column =
        |pick: fn(&SpaceCutoffs<'_>) -> Option<DateTime<Utc>>| -> Vec<Option<DateTime<Utc>>> {
            spaces.iter().map(pick).collect()
        };
    let work = sqlx::query_as(concat!(
        "SELECT \
             EXISTS (SELECT 1 FROM summarized_segments s WHERE s.user_id = t.user_id \
                     AND s.space = t.space AND s.closed_at < t.turns_before) AS turns, \
             EXISTS (SELECT 1 FROM memories m WHERE m.user_id = t.user_id AND m.space = t.space \
                     AND m.created_at < t.created_before AND ",
        due_for_age!("t.created_before"),
        ") AS past_max_age, \
             EXISTS (SELECT 1 FROM memories m WHERE m.user_id = t.user_id AND m.space = t.space \
                     AND m.inactive_since < t.inactive_before AND ",
        due_for_inactive_deletion!("t.inactive_before"),
        ") AS inactive, \
             EXISTS (SELECT 1 FROM memories m JOIN memory_retention r ON r.user_id = m.user_id AND r.memory_id = m.id \
                     WHERE m.user_id = t.user_id AND m.space = t.space \
                       AND m.created_at < t.unused_since AND ",
        becoming_inactive!("t.unused_since", "$7", "$8"),
        ") AS becoming_inactive, \
             t.unused_since IS NULL AND EXISTS (SELECT 1 FROM memories m WHERE m.user_id = t.user_id \
                     AND m.space = t.space AND m.inactive_since IS NOT NULL) AS reactivate \
         FROM unnest($1::uuid[], $2::text[], $3::timestamptz[], $4::timestamptz[], $5::timestamptz[], \
                     $6::timestamptz[]) WITH ORDINALITY \
              AS t(user_id, space, turns_before, created_before, inactive_before, unused_since, position) \
         ORDER BY t.position"
    ))
    .bind(spaces.iter().map(|s| s.scope.user_id.as_uuid()).collect::<Vec<_>>())
    .bind(spaces.iter().map(|s| s.scope.space.as_str()).collect::<Vec<_>>())
    .bind(column(|s| s.turns_closed_before))
    .bind(column(|s| s.entries.created_before))
    .bind(column(|s| s.entries.inactive_before))
    .bind(column(|s| s.entries.unused_since))
    .bind(first.entries.seconds_per_stability_day)
    .bind(first.entries.fact_importance_below)
    .fetch_all(pool)
    .await?;
    Ok(work)
}

/// Raw turns deleted from one conversation.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct DeletedTurns {
    pub conversation_id: Uuid,
    /// Every turn up to this index is gone.
    pub through: i32,
    pub turns: i64,
    /// Episodes of the conversation whose verbatim excerpt (`messages`) was cleared with them.
    pub excerpts_cleared: i64,
}

/// Deletes the raw turns of the (up to) `segments` oldest segments of the space closed before
/// `closed_before` (their turn embeddings go with them) and forgets those segments; records on
/// each conversation how far its turns are gone. The episodes stay, less their verbatim excerpt
/// of the deleted turns (`messages` emptied): the summary is what is kept. Returns one row per
/// conversation touched.
pub async fn delete_summarized_turns(
    connection: &mut PgConnection,
    scope: &Scope,
    closed_before: DateTime<Utc>,
    segments: i64,
) -> Result<Vec<DeletedTurns>, StoreError> {
    // Oldest segments first, through the (user, space, closed_at) index; a conversation's later
    // segments close later, so its picked ones cover every earlier turn.
    let deleted = sqlx::query_as(include_str!("retention/delete_summarized_turns.sql"))
        .bind(scope.user_id.as_uuid())
        .bind(scope.space.as_str())
        .bind(closed_before)
        .bind(segments)
        .fetch_all(connection)
        .await?;
    Ok(deleted)
}

/// Where a phase of a run got to in a space: the next batch starts after this (ordering key,
/// id), so no batch reads again what an earlier one passed over.
pub type Cursor = Option<(DateTime<Utc>, Uuid)>;

/// The next batch's rows, and the cursor after them.
fn advance(rows: Vec<(Uuid, DateTime<Utc>)>) -> (Vec<Uuid>, Cursor) {
    let cursor = rows.last().map(|(id, key)| (*key, *id));
    (rows.into_iter().map(|(id, _)| id).collect(), cursor)
}

/// Which deletion rule a batch applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DueBy {
    /// Created before the cutoff (oldest first).
    Age,
    /// Inactive since before the cutoff (longest first).
    Inactivity,
}

/// One space of a deletion round: its cutoff, and where its due rows start.
#[derive(Debug, Clone, Copy)]
pub struct DueTarget<'a> {
    pub scope: &'a Scope,
    pub cutoff: DateTime<Utc>,
    pub after: Cursor,
}

/// An entry due: its target's index, its id and its ordering key.
pub type DueEntry = (i64, Uuid, DateTime<Utc>);

/// The next `per_space` entries due by `rule` in each target space, in the rule's order, locked
/// for the transaction: a concurrent pin, review or merge is waited for, then seen (the
/// condition is checked again on the row as it is then). One statement for many spaces: most
/// spaces have a few entries due, and a statement per space would cost more than the deletions.
pub async fn due_across(
    connection: &mut PgConnection,
    rule: DueBy,
    targets: &[DueTarget<'_>],
    per_space: i64,
) -> Result<Vec<DueEntry>, StoreError> {
    if targets.is_empty() {
        return Ok(Vec::new());
    }
    // The targets' next due rows, by the rule's key (`m.<key>`) and condition.
    macro_rules! next_due {
        ($key:literal, $condition:expr) => {
            concat!(
                "SELECT t.position - 1 AS target, d.id, d.key \
                 FROM unnest($1::uuid[], $2::text[], $3::timestamptz[], $4::timestamptz[], $5::uuid[]) \
                      WITH ORDINALITY AS t(user_id, space, cutoff, after_key, after_id, position) \
                 CROSS JOIN LATERAL ( \
                     SELECT m.id, m.", $key, " AS key FROM memories m \
                     WHERE m.user_id = t.user_id AND m.space = t.space AND m.", $key, " < t.cutoff \
                       AND (t.after_key IS NULL OR (m.", $key, ", m.id) > (t.after_key, t.after_id)) AND ",
                $condition,
                " ORDER BY m.", $key, ", m.id LIMIT $6 FOR UPDATE OF m) d \
                 ORDER BY t.position, d.key, d.id"
            )
        };
    }
    let sql = match rule {
        DueBy::Age => next_due!("created_at", due_for_age!("t.cutoff")),
        DueBy::Inactivity => next_due!("inactive_since", due_for_inactive_deletion!("t.cutoff")),
    };
    let due = sqlx::query_as(sql)
        .bind(
            targets
                .iter()
                .map(|t| t.scope.user_id.as_uuid())
                .collect::<Vec<_>>(),
        )
        .bind(
            targets
                .iter()
                .map(|t| t.scope.space.as_str())
                .collect::<Vec<_>>(),
        )
        .bind(targets.iter().map(|t| t.cutoff).collect::<Vec<_>>())
        .bind(
            targets
                .iter()
                .map(|t| t.after.map(|(key, _)| key))
                .collect::<Vec<_>>(),
        )
        .bind(
            targets
                .iter()
                .map(|t| t.after.map(|(_, id)| id))
                .collect::<Vec<_>>(),
        )
        .bind(per_space)
        .fetch_all(connection)
        .await?;
    Ok(due)
}

/// Marks up to `limit` unused entries of the space after `after` inactive as of `now` (oldest
/// first, through the (user, space, created_at) index: an unused entry was created before the
/// cutoff). Rows a writer holds are skipped (the next run sees them again).
pub async fn mark_inactive(
    connection: &mut PgConnection,
    scope: &Scope,
    cutoffs: &EntryCutoffs,
    now: DateTime<Utc>,
    after: Cursor,
    limit: i64,
) -> Result<(Vec<Uuid>, Cursor), StoreError> {
    let Some(unused_since) = cutoffs.unused_since else {
        return Ok((Vec::new(), None));
    };
    let (after_key, after_id) = after.unzip();
    let rows: Vec<(Uuid, DateTime<Utc>)> = sqlx::query_as(concat!(
        "UPDATE memories target SET inactive_since = $6 FROM ( \
             SELECT m.id FROM memories m JOIN memory_retention r ON r.user_id = m.user_id AND r.memory_id = m.id \
             WHERE m.user_id = $1 AND m.space = $2 AND m.created_at < $3 \
               AND ($7::timestamptz IS NULL OR (m.created_at, m.id) > ($7, $8)) AND ",
        becoming_inactive!("$3", "$4", "$5"),
        " ORDER BY m.created_at, m.id LIMIT $9 FOR UPDATE OF m SKIP LOCKED) due \
         WHERE target.user_id = $1 AND target.space = $2 AND target.id = due.id \
         RETURNING target.id, target.created_at"
    ))
    .bind(scope.user_id.as_uuid())
    .bind(scope.space.as_str())
    .bind(unused_since)
    .bind(cutoffs.seconds_per_stability_day)
    .bind(cutoffs.fact_importance_below)
    .bind(now)
    .bind(after_key)
    .bind(after_id)
    .bind(limit)
    .fetch_all(connection)
    .await?;
    let mut rows = rows;
    rows.sort_by_key(|(id, created_at)| (*created_at, *id));
    Ok(advance(rows))
}

/// Makes every inactive entry of the space active again (its inactivity rule was switched off:
/// nothing is inactive without it). Returns how many.
pub async fn reactivate_all(
    connection: &mut PgConnection,
    scope: &Scope,
) -> Result<u64, StoreError> {
    let result = sqlx::query(
        "UPDATE memories SET inactive_since = NULL \
         WHERE user_id = $1 AND space = $2 AND inactive_since IS NOT NULL",
    )
    .bind(scope.user_id.as_uuid())
    .bind(scope.space.as_str())
    .execute(connection)
    .await?;
    Ok(result.rows_affected())
}

/// How long a retrieval's note that it returned an entry stays good enough: it is rewritten only
/// when older, so a busy entry costs at most one write a day (`retrieval::write_read_traces`).
/// The inactivity rule counts in days.
pub(crate) const RETURNED_REFRESH_SECS: f64 = 86_400.0;

/// What a run would do to a space (counts), as [`preview`] reports it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PreviewCounts {
    pub turns: i64,
    pub conversations_with_turns: i64,
    pub past_max_age: i64,
    pub inactive_past_grace: i64,
    pub becoming_inactive: i64,
}

/// One entry a run would delete or find inactive.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct PreviewEntry {
    pub id: Uuid,
    pub kind: String,
    /// `AGE`, `INACTIVE` or `BECOMES_INACTIVE`.
    pub reason: String,
    pub title: Option<String>,
    pub text: String,
    pub created_at: DateTime<Utc>,
    pub inactive_since: Option<DateTime<Utc>>,
}

/// SQL: every entry of space (`$1`, `$2`) a run would act on, with its `reason` (the first rule
/// that applies, in the order a run applies them), given the cutoffs `$3` (created before), `$4`
/// (inactive before), `$5` (unused since), `$6` (seconds per stability day), `$7` (fact
/// importance below).
macro_rules! classified_entries {
    () => {
        concat!(
            "SELECT m.id, m.kind, m.title, left(m.text, 200) AS text, m.created_at, m.inactive_since, \
                    CASE WHEN ",
            due_for_age!("$3"),
            " THEN 'AGE' WHEN ",
            due_for_inactive_deletion!("$4"),
            " THEN 'INACTIVE' ELSE 'BECOMES_INACTIVE' END AS reason \
             FROM memories m JOIN memory_retention r ON r.user_id = m.user_id AND r.memory_id = m.id \
             WHERE m.user_id = $1 AND m.space = $2 AND (",
            due_for_age!("$3"),
            " OR ",
            due_for_inactive_deletion!("$4"),
            " OR ",
            becoming_inactive!("$5", "$6", "$7"),
            ")"
        )
    };
}

/// What a run at `turns_closed_before` / `cutoffs` would do to the space, and its first `limit`
/// entries (AGE, then INACTIVE, then BECOMES_INACTIVE; oldest first within each). Reads only.
pub async fn preview(
    pool: &PgPool,
    scope: &Scope,
    turns_closed_before: Option<DateTime<Utc>>,
    cutoffs: &EntryCutoffs,
    limit: i64,
) -> Result<(PreviewCounts, Vec<PreviewEntry>), StoreError> {
    let mut transaction = crate::begin(pool).await?;
    // One snapshot for the counts and the page.
    sqlx::query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        .execute(&mut *transaction)
        .await?;
    let (conversations_with_turns, turns): (i64, i64) = sqlx::query_as(concat!(
        "WITH due AS (",
        summarized_turns_due!("$3"),
        ") SELECT count(DISTINCT due.conversation_id), count(t.turn_index) \
         FROM due JOIN conversation_turns t ON t.user_id = $1 AND t.space = $2 \
             AND t.conversation_id = due.conversation_id AND t.turn_index <= due.through"
    ))
    .bind(scope.user_id.as_uuid())
    .bind(scope.space.as_str())
    .bind(turns_closed_before)
    .fetch_one(&mut *transaction)
    .await?;
    let by_reason: Vec<(String, i64)> = sqlx::query_as(concat!(
        "SELECT reason, count(*) FROM (",
        classified_entries!(),
        ") classified GROUP BY reason"
    ))
    .bind(scope.user_id.as_uuid())
    .bind(scope.space.as_str())
    .bind(cutoffs.created_before)
    .bind(cutoffs.inactive_before)
    .bind(cutoffs.unused_since)
    .bind(cutoffs.seconds_per_stability_day)
    .bind(cutoffs.fact_importance_below)
    .fetch_all(&mut *transaction)
    .await?;
    let entries: Vec<PreviewEntry> = sqlx::query_as(concat!(
        "SELECT * FROM (",
        classified_entries!(),
        ") classified \
         ORDER BY CASE reason WHEN 'AGE' THEN 0 WHEN 'INACTIVE' THEN 1 ELSE 2 END, created_at, id \
         LIMIT $8"
    ))
    .bind(scope.user_id.as_uuid())
    .bind(scope.space.as_str())
    .bind(cutoffs.created_before)
    .bind(cutoffs.inactive_before)
    .bind(cutoffs.unused_since)
    .bind(cutoffs.seconds_per_stability_day)
    .bind(cutoffs.fact_importance_below)
    .bind(limit)
    .fetch_all(&mut *transaction)
    .await?;
    transaction.commit().await?;
    let count = |reason: &str| {
        by_reason
            .iter()
            .find(|(name, _)| name == reason)
            .map_or(0, |(_, count)| *count)
    };
    Ok((
        PreviewCounts {
            turns,
            conversations_with_turns,
            past_max_age: count("AGE"),
            inactive_past_grace: count("INACTIVE"),
            becoming_inactive: count("BECOMES_INACTIVE"),
        },
        entries,
    ))
}
